"""Decode chains with an empty queue (issue 14): several page-boundary segments run under one
timeout (``Scheduler._plan_span``). They must change nothing: every request, the clock, the
match count, the free list, every router read and every compute span must equal those of
one segment per timeout (``span_ok`` off)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hicache.config import load_config
from sim.engine import Engine, run_simulation
from sim.scheduler import Scheduler
from tests.sim.harness import observe_run
from traces.io import read_trace

DATA = Path(__file__).resolve().parents[2] / "traces/data"
CONV = DATA / "mooncake/conversation_trace.jsonl"
SHARED = DATA / "synthetic/shared-prefix.jsonl"


def _run(path: Path, sets: list[str], span: bool, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    got: dict[str, Any] = {"spanned": 0}
    with mp.context() as m:
        init = Engine.__init__

        def set_span(self: Engine, *args: Any, **kw: Any) -> None:
            kw["record_spans"] = True
            init(self, *args, **kw)
            for inst in self.instances:
                inst.sched.span_ok = span and inst.sched.span_ok

        m.setattr(Engine, "__init__", set_span)
        plan = Scheduler._plan_span

        def counting(self: Scheduler, *args: Any) -> tuple[list[Any], bool]:
            segs, cut = plan(self, *args)
            got["spanned"] += len(segs) > 1
            return segs, cut

        m.setattr(Scheduler, "_plan_span", counting)
        observe_run(m, got)
        summary = run_simulation(load_config(None, sets), read_trace(path), None, progress=False)
    summary.pop("wall_time_s", None)
    got["summary"] = summary
    return got


CASES: dict[str, tuple[Path, list[str]]] = {
    # the demo's load: the queue is mostly empty, requests decode at many page offsets
    "quarter_rate": (CONV, ["workload.max_requests=500", "workload.rate_scale=0.25"]),
    # page 1: every step is a boundary for every request
    "page_1": (CONV, ["workload.max_requests=150", "workload.rate_scale=0.25",
                      "cache.page_size=1"]),
    # a device pool so small that boundaries run short: the chain must stop there, evict or
    # retract as the loop's own memory check does
    "short_pool": (SHARED, ["gpu.device_tokens=16384", "workload.closed_loop=off"]),
    # write_back (evictions wait on copies: stalls) with LFU keys
    "write_back_lfu": (CONV, ["workload.max_requests=300", "workload.rate_scale=0.25",
                              "cache.write_policy=write_back", "cache.eviction=lfu",
                              "cache.page_size=16"]),
    # two instances: every arrival is a router read of both
    "cluster": (CONV, ["workload.max_requests=400", "workload.rate_scale=0.5",
                       "cluster.instances=2", "router.policy=tier_aware"]),
}  # fmt: skip


@pytest.mark.interpreted_only  # switches the fast paths off by patching methods
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_spanned_segments_change_nothing(
    case: str, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sets = CASES[case]
    sets = [*sets, f"sglang.version={version}"]
    ref = _run(path, sets, span=False, mp=monkeypatch)
    new = _run(path, sets, span=True, mp=monkeypatch)
    assert ref["spanned"] == 0
    assert new["spanned"] > 0, "the case never ran two segments under one timeout"
    assert json.dumps(new["summary"], sort_keys=True) == json.dumps(ref["summary"], sort_keys=True)
    assert new["clocks"] == ref["clocks"]
    assert new["matches"] == ref["matches"]
    assert new["free"] == ref["free"]
    assert new["router_reads"] == ref["router_reads"]
    assert new["spans"] == ref["spans"]
    a, b = ref["requests"], new["requests"]
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        assert a[col].equals(b[col]), col  # exact, NaN equal to NaN


def test_closed_loop_on_a_fleet_runs_one_segment_per_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On several instances a closed-loop turn may arrive unannounced (its predecessor finished
    on another instance, in the middle of this one's segment): segments are never merged."""
    sets = ["gpu.device_tokens=8192", "cluster.instances=2", "router.policy=round_robin"]
    got = _run(DATA / "synthetic/multiturn.jsonl", sets, True, monkeypatch)
    assert got["summary"]["requests"] > 0
    assert got["spanned"] == 0
