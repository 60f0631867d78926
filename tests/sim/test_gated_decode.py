"""Decode chains behind a blocked queue (issue 14): while the queue head cannot be admitted,
the scheduler runs decode steps in chains and predicts each admission attempt it skips
(``sim.admission.Gate``). The chains must change nothing: every request's times and hits,
the tree's logical clock and its match count must equal those of the one-step loop, which
re-tries admission after every step (the gate switched off)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hicache.config import load_config
from hicache.policy import HiRadixCache
from sim.engine import Engine, run_simulation
from sim.scheduler import Scheduler, SchedulerParams
from tests.sim import harness
from tests.sim.harness import observe_run
from traces.io import read_trace

CONV = Path(__file__).resolve().parents[2] / "traces/data/mooncake/conversation_trace.jsonl"


@pytest.fixture(scope="module")
def trace() -> Any:
    return read_trace(CONV)


def _run(trace: Any, sets: list[str], gated: bool, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """One run; returns its requests table, summary, each instance's clock and match count,
    and how many admission attempts the gates skipped."""
    got: dict[str, Any] = {"skipped": 0, "chained": 0}
    with mp.context() as m:
        if not gated:
            m.setattr(Scheduler, "_gate", lambda self: None)
        plan = Scheduler._plan_gated

        def counting_plan(self: Scheduler, *args: Any) -> tuple[list[float], list[int]]:
            ends, cum = plan(self, *args)
            got["chained"] += len(ends) > 1
            return ends, cum

        m.setattr(Scheduler, "_plan_gated", counting_plan)
        observe_run(m, got)
        repeat = HiRadixCache.repeat_match

        def counting(self: HiRadixCache, times: int, ticks: int) -> None:
            got["skipped"] += times
            repeat(self, times, ticks)

        m.setattr(HiRadixCache, "repeat_match", counting)
        # the gate is 0.5.14's (0.5.23 runs every admission attempt)
        cfg = load_config(None, ["sglang.version=0.5.14", *sets])
        summary = run_simulation(cfg, trace, None, progress=False)
    summary.pop("wall_time_s", None)
    got["summary"] = summary
    return got


CASES = {
    # overloaded at the recorded rate: the queue head waits for room most of the time
    "defaults": ["workload.max_requests=400"],
    # a running cap: no attempt matches while the batch is full
    "cap": ["workload.max_requests=300", "scheduler.max_running_requests=6"],
    # LFU keys read hit counts and access times; write_back evicts through host copies
    "lfu_write_back": ["workload.max_requests=300", "cache.eviction=lfu",
                       "cache.write_policy=write_back", "cache.page_size=16"],
    # outputs clipped: reservations of long outputs stay flat until they drop under the clip
    "clip": ["workload.max_requests=300", "scheduler.clip_max_new_tokens=96",
             "gpu.device_tokens=120000"],
    # two instances: every arrival ends a chain's segment (the router reads running KV)
    "cluster": ["workload.max_requests=400", "cluster.instances=2",
                "router.policy=tier_aware"],
}  # fmt: skip


@pytest.mark.interpreted_only  # switches the fast paths off by patching methods
@pytest.mark.parametrize("case", sorted(CASES))
def test_gated_chains_change_nothing(
    trace: Any, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _run(trace, CASES[case], gated=False, mp=monkeypatch)
    new = _run(trace, CASES[case], gated=True, mp=monkeypatch)
    assert ref["skipped"] == ref["chained"] == 0
    assert new["chained"] > 0, "the case never chained steps behind a blocked queue"
    if case != "cap":  # under the cap no attempt matches
        assert new["skipped"] > 0
    assert json.dumps(new["summary"], sort_keys=True) == json.dumps(ref["summary"], sort_keys=True)
    assert new["clocks"] == ref["clocks"]
    assert new["matches"] == ref["matches"]
    assert new["free"] == ref["free"]
    # what a router read of each instance at each arrival
    assert new["router_reads"] == ref["router_reads"]
    if case == "cluster":
        assert ref["router_reads"]
    a, b = ref["requests"], new["requests"]
    assert list(a.columns) == list(b.columns)
    for col in a.columns:
        assert a[col].equals(b[col]), col  # exact, NaN equal to NaN


# ------------------------------------------------------------------- the gate, step by step --


def _loop_attempt(e: Engine, j: int, ratio: float, total: int) -> int:
    """What the loop's attempt after ``j`` more decode steps would do, from the loop's own
    budget arithmetic (``PrefillBudget.rem_total``): 0 no room (no match), 1 the head matched
    and did not fit, -1 it fits."""
    s = e.sched
    for r in s.running:
        r.decoded += j
    keep, s.new_token_ratio = s.new_token_ratio, ratio
    try:
        rem = e.device.available_size() + e.cache.evictable_size() - s._reserved() - 0.0
    finally:
        s.new_token_ratio = keep
        for r in s.running:
            r.decoded -= j
    if not rem > 0:
        return 0
    return -1 if total < rem else 1


@pytest.mark.parametrize("clip", [4096, 150])
def test_the_gate_predicts_every_attempt_the_loop_would_make(clip: int) -> None:
    # Three running requests with 200-400 outputs left and a head that does not fit. Across
    # the ballasts, the room after j steps crosses the head's need at many steps, often
    # within a token (the float sum's fractional part), or starts below zero (no match);
    # the gate must agree with the loop's arithmetic at every step (the clip keeps long
    # outputs' reservations flat).
    seen = set()
    # ballast: 0..39 pages, or the room after the reservations less 5 / plus 10 / plus 30
    # pages (no room at first, then room after some steps)
    for pages, past_room in [*((n, False) for n in range(0, 40, 3)), (-5, True), (10, True),
                             (30, True)]:  # fmt: skip
        e = harness.engine(
            [], page_size=1, device_tokens=3000, host_tokens=0,
            sched=SchedulerParams(page_size=1, init_new_token_ratio=0.9,
                                  new_token_ratio_decay_steps=97, clip_max_new_tokens=clip),
        )  # fmt: skip
        harness.prefill_all(e, harness.req(1, 0, 300, 401), harness.req(2, 0, 200, 301),
                            harness.req(3, 0, 100, 199))  # fmt: skip
        if past_room:
            pages += int(e.device.available_size() - e.sched._reserved())
        harness.ballast(e, pages)
        e.sched.arrive(harness.req(4, 0, 2000, 60))
        before = e.cache.stats.match_calls
        assert e.sched._get_new_batch_prefill() is None
        gate = e.sched._gate()
        assert gate is not None
        assert gate.total == (2000 + 60 + 1 if e.cache.stats.match_calls > before else -1)
        for j in range(0, 198):
            want = _loop_attempt(e, j, gate.ratio(j), gate.total)
            assert gate.check(j) == want, (pages, j)
            seen.add(want)
    assert seen == {0, 1, -1}
