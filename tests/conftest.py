"""Shared test configuration.

Hypothesis profiles: ``ci`` (what ``make test`` and CI use) is derandomized, so a run is
reproducible and a red CI is never a fluke; ``dev`` explores new examples on every run and
keeps a database of failures. Select with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

# The suite's main run tests the interpreted modules, the reference; `make test` then runs the
# policy and simulator tests again with HICACHE_NATIVE=require (the compiled build). Set before
# anything imports hicache, which decides once.
os.environ.setdefault("HICACHE_NATIVE", "off")

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``interpreted_only`` tests (they patch methods, which compiled classes do not look
    up, or subclass a compiled class) when this run uses the compiled build."""
    from hicache.policy import NATIVE

    if not NATIVE.active:
        return
    skip = pytest.mark.skip(reason="patches or subclasses a compiled class")
    for item in items:
        if "interpreted_only" in item.keywords:
            item.add_marker(skip)
