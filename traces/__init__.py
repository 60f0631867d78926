"""Trace formats, readers, generators and statistics."""
