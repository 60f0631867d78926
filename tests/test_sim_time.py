"""Simulated time at any magnitude: no absolute epsilon against a growing clock, a run that does
not depend on the trace's epoch, and a watchdog that turns a stalled clock into an error."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import simpy

from hicache.config import load_config
from sim.engine import SimulationStalled, run_simulation
from sim.link import DuplexLink, Job
from traces.io import read_trace
from traces.schema import Trace

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def _shifted(trace: Trace, shift_ms: float) -> Trace:
    reqs = [replace(r, timestamp=r.timestamp + shift_ms) for r in trace]
    return Trace(reqs, trace.header, path=None)


def _quantized(trace: Trace) -> Trace:
    """Timestamps on a 1/1024 ms grid: exactly representable after a shift by 1e9 ms too, so
    the shifted trace says the same thing (a float cannot hold 1e9 + 0.123 ms exactly)."""
    reqs = [replace(r, timestamp=round(r.timestamp * 1024) / 1024) for r in trace]
    return Trace(reqs, trace.header, path=None)


def test_shifting_every_timestamp_by_a_million_seconds_changes_no_ttft(tmp_path: Path) -> None:
    trace = _quantized(read_trace(DATA / "synthetic" / "multiturn.jsonl"))
    cfg = load_config(None, ["gpu.device_tokens=8192", "workload.closed_loop=off"])
    base = run_simulation(cfg, trace, tmp_path / "a", progress=False)
    moved = run_simulation(cfg, _shifted(trace, 1e9), tmp_path / "b", progress=False)
    import pandas as pd

    a = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    b = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    assert len(a) == len(b) == len(trace)
    assert b["ttft_s"].to_numpy() == pytest.approx(a["ttft_s"].to_numpy(), rel=1e-9)
    for key in ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "hit_rate"):
        assert moved[key] == pytest.approx(base[key], rel=1e-9)


@pytest.mark.parametrize("start", [0.0, 2.0**14 + 0.1, 1e6 + 0.123456789, 3e8 + 0.7])
def test_link_finishes_every_job_at_any_clock_magnitude(start: float) -> None:
    """Jobs of awkward durations in both directions, coupled: each ends once, with a bounded
    number of timers, and the total service matches the work at the coupled rates. With the
    old absolute 1e-12 s completion test this loops forever from ~2^14 s on."""
    env = simpy.Environment(initial_time=start)
    link = DuplexLink(env, eta={"d2h": 0.7, "h2d": 0.55})
    done: list[Job] = []
    works = [0.1 / 3, 1.0 / 7, 2.0 / 9, 1e-3 / 3, 5.0 / 11]

    def feed() -> simpy.events.ProcessGenerator:
        for i in range(40):
            for d in ("d2h", "h2d"):
                w = works[(i + (d == "h2d")) % len(works)]
                link.submit(Job(d, w, 1, on_done=done.append))
            yield env.timeout(works[i % len(works)] / 2)

    env.process(feed())
    for _ in range(20_000):  # bounded: a re-arming loop fails here instead of hanging
        if env.peek() == float("inf"):
            break
        env.step()
    assert len(done) == 80
    assert link.events <= 4 * 80  # a few timers per job, never a re-arming loop
    tol = 8 * math.ulp(env.now)  # what a float clock can resolve at this magnitude
    for j in done:
        assert j.end >= j.start >= j.enqueued >= start
        took = j.end - j.start
        lo, hi = j.work_s, j.work_s / min(link.eta.values())
        assert lo - tol <= took <= hi + tol


def _spaced_trace(tmp_path: Path, gap_s: float, n: int) -> Path:
    path = tmp_path / "spaced.jsonl"
    rows = [
        {"timestamp": i * gap_s * 1000, "input_length": 1024, "output_length": 8,
         "hash_ids": [i % 3, 100 + i]}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_whose_clock_passes_hours_finishes(tmp_path: Path) -> None:
    # 40 requests an hour apart: the clock reaches ~39 h, far past 2^14 s
    trace = read_trace(_spaced_trace(tmp_path, 3600.0, 40))
    cfg = load_config(None, ["gpu.device_tokens=4096", "cache.write_policy=write_back"])
    s = run_simulation(cfg, trace, None, progress=False)
    assert s["finished_requests"] == 40
    assert s["sim_duration_s"] > 39 * 3600
    assert 0 < s["ttft_mean_s"] < 1.0


def test_a_stalled_clock_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that re-arms a zero-length timer forever (the shape of the old link bug)
    stops the run with an error naming the time, after the watchdog's event limit."""
    from sim import engine as engine_mod

    trace = read_trace(_spaced_trace(tmp_path, 1.0, 5))
    cfg = load_config(None, ["gpu.device_tokens=4096"])
    real_init = engine_mod.Engine.__init__

    def init(self: engine_mod.Engine, *args: object, **kw: object) -> None:
        real_init(self, *args, **kw, stall_events=10_000)  # type: ignore[arg-type]

        def spin() -> simpy.events.ProcessGenerator:
            yield self.env.timeout(2.5)
            while True:
                yield self.env.timeout(0)

        self.env.process(spin())

    monkeypatch.setattr(engine_mod.Engine, "__init__", init)
    with pytest.raises(SimulationStalled, match=r"stalled at t=2\.500s .* without the clock"):
        run_simulation(cfg, trace, None, progress=False)
