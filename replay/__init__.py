"""Real-copy replay and calibration (needs the optional ``replay`` extra: torch)."""
