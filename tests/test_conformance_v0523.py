"""The 0.5.23 conformance harness without SGLang: our core on both sides must agree, and a
difference planted on one side must be reported (the harness can fail)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from conformance.v0523 import run
from conformance.v0523.ours_side import OursUnifiedCache


def test_self_test_agrees_and_exercises_the_tiers(tmp_path: Any) -> None:
    assert run.main(["--self-test", "--sequences", "1", "--steps", "60", "--page-sizes", "1,4",
                     "--evictions", "lru", "--out", str(tmp_path)]) == 0  # fmt: skip
    report = (tmp_path / "conformance.json").read_text()
    assert '"mismatches": []' in report


class _Skewed(OursUnifiedCache):
    """Our side with one decision changed: evictions ask for one page more."""

    def evict(self, num_tokens: int) -> int:
        return super().evict(num_tokens + self.page_size)


def test_a_planted_difference_is_reported() -> None:
    combo = run.Combo("write_through", "lru", 1)
    found = [
        run.run_sequence(
            combo, seed, 80, run.ours,
            lambda c: _Skewed(page_size=c.page_size, device_pages=c.device_pages,
                              host_pages=c.host_pages, write_policy=c.write_policy,
                              eviction_policy=c.eviction_policy),
        )
        for seed in range(4)
    ]  # fmt: skip
    hits = [f for f in found if f]
    assert hits, "the skewed side went unnoticed"
    assert all("diff" in h and "step" in h for h in hits)


REAL_VENV = Path(__file__).resolve().parents[1] / ".venv-conformance-0.5.23"


@pytest.mark.skipif(
    not (REAL_VENV / ".ready-0.5.23").exists(),
    reason="needs .venv-conformance-0.5.23 (make conformance SGLANG_VERSION=0.5.23)",
)
def test_hitrate_equals_the_real_class_on_a_trace_slice() -> None:
    # the real UnifiedRadixCache serves the first 300 requests of a bundled trace with the
    # replay's steps; device and host hit rates must equal ours within 0.002 (trace_check
    # exits 1 otherwise) for every write policy
    root = REAL_VENV.parent
    out = subprocess.run(
        [str(REAL_VENV / "bin/python"), "-m", "conformance.v0523.trace_check",
         "traces/data/mooncake/synthetic_trace.jsonl", "--limit", "300",
         "--device-tokens", "2e5", "--host-tokens", "8e5", "--core", "rust"],
        capture_output=True, text=True, cwd=root, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" ok (") == 3


def test_l3_self_test_agrees_and_exercises_the_storage_tier(tmp_path: Any) -> None:
    args = ["--l3", "--self-test", "--sequences", "1", "--steps", "80", "--page-sizes", "1",
            "--evictions", "lru", "--out", str(tmp_path)]  # fmt: skip
    assert run.main(args) == 0
    import json

    report = json.loads((tmp_path / "conformance-l3.json").read_text())
    assert report["mismatches"] == []
    cov = report["totals"]["ours"]["coverage"]
    # the sequences reach the paths the L3 check is there for
    keys = ("l3_prefetch_issued", "l3_hit_allocs", "l3_loaded_from_storage", "l3_backup_ops",
            "l3_retries_armed", "retries_issued", "l3_terminated")  # fmt: skip
    for key in keys:
        assert cov.get(key, 0) > 0, key


def test_l3_planted_difference_is_reported() -> None:
    from conformance.v0523 import run_l3

    class _Eager(OursUnifiedCache):
        """Our side with one L3 decision changed: the rate limit at 0.8 of the host pool."""

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            assert self.l3 is not None
            self.l3.ctrl.prefetch_capacity_limit = int(0.8 * self.host.capacity_tokens)  # type: ignore[union-attr]

    def eager(c: Any) -> _Eager:
        return _Eager(page_size=c.page_size, device_pages=c.device_pages,
                      host_pages=c.host_pages, write_policy=c.write_policy,
                      eviction_policy=c.eviction_policy, l3=c.l3)  # fmt: skip

    combo = run_l3.L3Combo("write_through", "lru", 1, host_pages=16, threshold_pages=2)
    found = [run_l3.run_l3_sequence(combo, seed, 80, run_l3.ours_l3, eager) for seed in range(8)]
    assert any(found), "the eager rate limit went unnoticed"


@pytest.mark.skipif(
    not (REAL_VENV / ".ready-0.5.23").exists(),
    reason="needs .venv-conformance-0.5.23 (make conformance SGLANG_VERSION=0.5.23)",
)
def test_l3_sequences_equal_the_real_class(tmp_path: Any) -> None:
    root = REAL_VENV.parent
    out = subprocess.run(
        [str(REAL_VENV / "bin/python"), "-m", "conformance.v0523.run", "--l3",
         "--cores", "python,rust", "--sequences", "1", "--steps", "60", "--page-sizes", "1",
         "--evictions", "lru", "--out", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "0 mismatching" in out.stdout
