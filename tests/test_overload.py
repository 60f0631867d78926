"""Overload detection: a queue that grows over the run is reported, with the measured rates and
what to do; a server that keeps up, or one long request at the end, is not."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sim.metrics import overload


def _frame(arrivals: list[float], queues: list[float], finish_pad: float = 1.0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_s": arrivals,
            "queue_s": queues,
            "finish_s": [a + q + finish_pad for a, q in zip(arrivals, queues, strict=True)],
        }
    )


def test_a_growing_queue_is_overload_with_the_rates() -> None:
    # 100 requests, one per second (arrival rate 100 / 99 s); each waits 2 s longer than the
    # one before, so the last one finishes at 99 + 198 + 1 = 298 s: served 100 / 298 s
    n = 100
    arrivals = [float(i) for i in range(n)]
    queues = [2.0 * i for i in range(n)]
    out = overload(_frame(arrivals, queues), sim_duration_s=298.0)
    assert out["overloaded"] is True
    assert out["arrival_rate_rps"] == pytest.approx(100 / 99)
    assert out["service_rate_rps"] == pytest.approx(100 / 298)
    # medians of the first and last ten queueing delays: 2*4.5 and 2*94.5
    assert out["queue_first_tenth_s"] == pytest.approx(9.0)
    assert out["queue_last_tenth_s"] == pytest.approx(189.0)
    msg = out["overload_message"]
    assert "1.01/s" in msg and "0.34/s" in msg and "workload.rate_scale" in msg
    assert f"{0.8 * (100 / 298) / (100 / 99):.2g}" in msg


def test_a_server_that_keeps_up_is_not_overloaded() -> None:
    n = 100
    out = overload(_frame([float(i) for i in range(n)], [0.05] * n), sim_duration_s=100.5)
    assert out["overloaded"] is False and out["overload_message"] == ""
    assert out["service_rate_rps"] == pytest.approx(100 / 100.5)


def test_one_long_request_at_the_end_is_not_overload() -> None:
    # the run ends long after the last arrival (a 500 s decode), but nobody queued
    n = 100
    out = overload(_frame([float(i) for i in range(n)], [0.0] * n), sim_duration_s=600.0)
    assert out["overloaded"] is False


def test_too_few_requests_say_nothing() -> None:
    out = overload(_frame([0.0, 1.0], [0.0, 50.0]), sim_duration_s=100.0)
    assert out["overloaded"] is False and math.isnan(out["arrival_rate_rps"])


def _closed(queues: list[float], service: float) -> pd.DataFrame:
    """Closed loop: each request arrives as the one before it finished (the run never outlasts
    the arrivals), TTFT = its queueing + ``service``."""
    arrivals, t = [], 0.0
    for q in queues:
        arrivals.append(t)
        t += q + service
    df = pd.DataFrame({"arrival_s": arrivals, "queue_s": queues})
    df["ttft_s"] = df["queue_s"] + service
    df["finish_s"] = df["arrival_s"] + df["ttft_s"]
    return df


def test_closed_loop_overload_is_seen_in_the_queue() -> None:
    """Arrival rate = service rate by construction in closed loop: the open-loop rule sees
    nothing; a growing queue, or one ten times the requests' own service, is overload."""
    growing = _closed([0.05 * i for i in range(100)], 0.2)
    end = float(growing["finish_s"].iloc[-1])
    assert overload(growing, end)["overloaded"] is False  # the open-loop rule: no stretch
    out = overload(growing, end, closed_loop=True)
    assert out["overloaded"] is True
    assert out["overload_message"].startswith("overloaded (closed loop): queueing grows")
    level = _closed([5.0] * 100, 0.2)  # saturated: level, but 25x the service time
    out = overload(level, float(level["finish_s"].iloc[-1]), closed_loop=True)
    assert out["overloaded"] is True and "25x the requests' own prefill" in out["overload_message"]
    idle = _closed([0.01] * 100, 0.2)
    assert overload(idle, float(idle["finish_s"].iloc[-1]), closed_loop=True)["overloaded"] is False


def test_closed_loop_overload_end_to_end() -> None:
    """The agentic trace (think times: closed loop) on a small Qwen3-32B pool: at 4x its
    session rate the queue grows to seconds, which the run now reports; at 1x it keeps up."""
    from pathlib import Path

    from hicache.config import load_config
    from sim.engine import run_simulation
    from traces.io import read_trace

    root = Path(__file__).resolve().parent.parent
    trace = read_trace(root / "traces" / "data" / "synthetic" / "agentic.jsonl")
    base = ["model.name=qwen3-32b", "gpu.device_tokens=65536"]
    busy = run_simulation(load_config(None, [*base, "workload.rate_scale=4"]), trace, None, False)
    assert busy["closed_loop"] is True and busy["overloaded"] is True
    assert "closed loop" in busy["overload_message"]
    calm = run_simulation(load_config(None, base), trace, None, False)
    assert calm["closed_loop"] is True and calm["overloaded"] is False


def test_a_backlog_on_a_long_trace_is_overload_without_the_stretch() -> None:
    """1,000 arrivals over 999 s whose queueing grows to 150 s: the run outlasts the arrivals by
    only 1.15x (below the stretch), but the last tenth waits more than a tenth of the span."""
    n = 1000
    arrivals = [float(i) for i in range(n)]
    queues = [0.15 * i for i in range(n)]
    out = overload(_frame(arrivals, queues), sim_duration_s=1.15 * 999)
    assert out["overloaded"] is True
    calm = overload(_frame(arrivals, [0.5] * n), sim_duration_s=1.15 * 999)
    assert calm["overloaded"] is False
