"""The fast scheduler against the reference one (issue 25): same per-request times (relative
1e-9) and counters on random workloads (``sim/differential.py``; the full run of hundreds of
seeds is ``bench/differential.py``), a planted bug that the comparison catches, and the
closed-loop artefacts the fast scheduler once had (a turn arriving inside a decode segment
waited for its end), each pinned on the reference's one-step spans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hicache.config import load_config
from sim.differential import Case, compare, random_case, run_case
from sim.engine import Engine, run_simulation
from tests.sim.harness import observe_run
from traces.io import read_trace

MULTITURN = Path(__file__).resolve().parents[2] / "traces/data/synthetic/multiturn.jsonl"

#: seeds of the slice: together they cover what the full run draws (checked below)
SLICE = (2, 3, 7, 14, 16, 22, 31, 32, 36, 53, 54)


def _covered(cases: list[Case]) -> set[str]:
    seen = set()
    for c in cases:
        sets = " ".join(c.sets)
        closed = any(r.think_time_ms is not None for r in c.trace.requests)
        for what, hit in {
            "closed loop": closed and "closed_loop=off" not in sets,
            "open loop": not closed or "closed_loop=off" in sets,
            "0.5.14": "version=0.5.14" in sets,
            "0.5.23": "version=0.5.23" in sets,
            "L3": "storage.backend" in sets,
            "cluster": "cluster.instances" in sets,
            "chunk 512": "chunked_prefill_size=512" in sets,
            "lpm": "policy=lpm" in sets,
            "write_back": "write_policy=write_back" in sets,
            "mixed chunk": "enable_mixed_chunk=true" in sets and "prefill_size=-1" not in sets,
            # the per-request TP votes of the prefetch checks hold the scheduler
            "TP votes": "model.tp=2" in sets
            and "storage.backend" in sets
            and (
                ("version=0.5.14" in sets and "policy=best_effort" not in sets)
                or "prefetch_policy=timeout" in sets
            ),
        }.items():
            if hit:
                seen.add(what)
    return seen


def test_the_slice_covers_every_kind_of_case() -> None:
    assert _covered([random_case(s) for s in SLICE]) == {
        "closed loop", "open loop", "0.5.14", "0.5.23", "L3", "cluster", "chunk 512", "lpm",
        "write_back", "mixed chunk", "TP votes",
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLICE)
def test_fast_equals_reference(seed: int) -> None:
    case = random_case(seed)
    ref, fast = run_case(case, "reference"), run_case(case, "fast")
    assert len(ref["requests"]) == len(case.trace.requests)
    assert compare(ref, fast) == [], f"{case.what} {' '.join(case.sets)}"


def test_a_segment_deaf_to_closed_loop_turns_fails_the_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted bug: decode segments that know only open-loop arrivals (as before issue 25)
    run past a closed-loop turn's arrival, and the comparison says so."""
    case = random_case(7)  # closed loop, one instance
    assert "cluster.instances" not in " ".join(case.sets)
    ref = run_case(case, "reference")
    assert compare(ref, run_case(case, "fast")) == []
    with monkeypatch.context() as m:
        m.setattr(Engine, "_next_arrival", lambda self: self._open[0].arrival if self._open
                  else float("inf"))  # fmt: skip
        deaf = run_case(case, "fast")
    assert any("admitted_s" in d for d in compare(ref, deaf))


def _waits(sets: list[str], tmp_path: Path, mp: pytest.MonkeyPatch) -> tuple[Any, list[Any]]:
    """The fast engine's requests on the multiturn trace and the reference's compute spans
    (one per decode step), after checking that both engines give the same requests."""
    trace = read_trace(MULTITURN)
    runs = {}
    for engine in ("reference", "fast"):
        got: dict[str, Any] = {}
        with mp.context() as m:
            observe_run(m, got)
            cfg = load_config(None, [*sets, "run.chrome_trace=true", f"scheduler.engine={engine}"])
            run_simulation(cfg, trace, tmp_path / engine, progress=False)
        runs[engine] = got
    ref, fast = runs["reference"], runs["fast"]
    assert compare({"requests": ref["requests"], "summary": {}},
                   {"requests": fast["requests"], "summary": {}}) == []  # fmt: skip
    return fast["requests"], ref["spans"][0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets",
    [
        [],  # Llama-3-8B on an H100, page 64: the new user's first run
        ["cache.page_size=16"],
        ["cache.page_size=128"],
        ["model.name=qwen3-32b", "model.tp=2", "gpu.name=h200"],
    ],
    ids=["default", "page16", "page128", "qwen3-32b-tp2-h200"],
)
def test_an_idle_server_admits_every_turn_at_the_next_step(
    sets: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the multiturn trace (closed loop, mostly idle) no request waits past the forward
    under way at its arrival and the prefills ahead of it: no decode step starts between a
    request's arrival and its admission. Before issue 25 turns waited for the end of a decode
    segment (up to a page of steps): a mean queue of 73 ms and a worst of 425 ms against
    ~8 ms steps, growing with the page size."""
    reqs, spans = _waits(sets, tmp_path, monkeypatch)
    decode_starts = sorted(start for kind, start, _, _ in spans if kind == "decode")
    assert len(decode_starts) > 10 * len(reqs)  # the reference's spans: one per decode step
    import bisect

    late = []
    for rid, arrival, admitted in zip(reqs["rid"], reqs["arrival_s"], reqs["admitted_s"],
                                      strict=True):  # fmt: skip
        # a step starting at the arrival instant is the forward under way: the loop had
        # passed recv_requests (a turn with no think time arrives as its predecessor ends)
        i = bisect.bisect_right(decode_starts, arrival + 1e-9)
        if i < len(decode_starts) and decode_starts[i] < admitted - 1e-12:
            late.append((rid, arrival, admitted, decode_starts[i]))
    assert late == []
    queue = reqs["admitted_s"] - reqs["arrival_s"]
    assert queue.max() < 0.2  # one step (~8-25 ms) and a few prefills, not a page of steps


@pytest.mark.slow
def test_more_load_on_an_idle_fleet_never_lowers_the_p90(tmp_path: Path) -> None:
    """16 instances behind cache_aware, the multiturn trace at 1x, 2x and 4x the first turns'
    rate: the TTFT p90 does not fall as the load grows (before issue 25 it did, because a turn
    arriving inside another instance's decode segment waited for its end)."""
    trace = read_trace(MULTITURN)
    p90 = []
    for rate in (1, 2, 4):
        cfg = load_config(None, ["cluster.instances=16", "router.policy=cache_aware",
                                 f"workload.rate_scale={rate}"])  # fmt: skip
        p90.append(run_simulation(cfg, trace, None, progress=False)["ttft_p90_s"])
    assert p90 == sorted(p90), p90
