"""Tests of the `traces` package."""
