"""Shared test configuration.

Hypothesis profiles: ``ci`` (what ``make test`` and CI use) is derandomized, so a run is
reproducible and a red CI is never a fluke; ``dev`` explores new examples on every run and
keeps a database of failures. Select with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
