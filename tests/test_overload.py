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
