"""One fresh fit of the compute models per test session (about a second), shared by the tests
that compare against it."""

from __future__ import annotations

import pytest

from hicache.compute.fit import fit_compute_profile
from hicache.compute.profile import ComputeProfile, load_compute


@pytest.fixture(scope="session")
def fresh() -> ComputeProfile:
    return fit_compute_profile("h100-sxm")


@pytest.fixture(scope="session")
def shipped() -> ComputeProfile:
    return load_compute("h100-sxm")
