"""Repeated runs over resampled traces: ``--seeds K`` on ``run``, ``sweep`` and ``plan``.

The simulator is deterministic, so one run of a trace is one draw of what a server sees: the
order in which the recorded users happened to overlap in time. Replica ``i`` of a run
(:func:`replica_settings`) sets ``run.seed = base + i`` and ``router.seed = router base + i``
and turns on ``workload.resample_sessions``, under which :func:`sim.engine.run_simulation`
replays :func:`replica_trace`: the requests the run uses with their sessions' start offsets
permuted by ``run.seed`` (:func:`traces.resample.resample_sessions`; seed 0 is the trace as
recorded). So a replica is a config (``config.json`` records it and reruns it), whichever
command made it.

Over the replicas, :func:`seed_intervals` gives each figure's median and its middle 90 %
(:data:`SEED_INTERVAL`), and :func:`median_summary` one summary of medians that a plan judges
its targets on. Standard library and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traces.schema import Trace

#: the figures ``--seeds`` reports a median and an interval for (``summary.json`` ``seeds``)
SEED_METRICS = (
    "hit_rate",
    "device_hit_rate",
    "host_hit_rate",
    "storage_hit_rate",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "throughput_output_tok_s",
)
#: the interval's ends, as quantiles over the runs: the middle 90 %
SEED_INTERVAL = (0.05, 0.95)


def replica_settings(run_seed: int, router_seed: int, i: int) -> dict[str, Any]:
    """The config keys of replica ``i`` (0 = the first) of a run whose config has
    ``run.seed = run_seed`` and ``router.seed = router_seed``."""
    return {
        "run.seed": run_seed + i,
        "router.seed": router_seed + i,
        "workload.resample_sessions": True,
    }


def replica_overrides(run_seed: int, router_seed: int, i: int) -> list[str]:
    """:func:`replica_settings` as ``section.key=value`` overrides."""
    return [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in replica_settings(run_seed, router_seed, i).items()
    ]


def replica_trace(trace: Trace, seed: int, max_requests: int = 0) -> Trace:
    """What a run with ``workload.resample_sessions`` replays: ``trace`` itself for seed 0,
    else :func:`traces.resample.resample_sessions` of the requests the run uses (the first
    ``max_requests`` if > 0, so that every replica replays the same requests)."""
    from traces.resample import resample_sessions

    if seed == 0:
        return trace
    return resample_sessions(replace(trace, requests=trace.requests[: max_requests or None]), seed)


def _quantiles(values: Iterable[Any]) -> dict[str, float]:
    """Median and :data:`SEED_INTERVAL` quantiles of the finite numbers in ``values`` (numpy's
    linear interpolation, so the median lies within them; NaN when there are none)."""
    import numpy as np

    arr = np.array([float(v) for v in values if _is_number(v)], dtype=float)
    arr = arr[np.isfinite(arr)]
    if not len(arr):
        return {"median": math.nan, "lo": math.nan, "hi": math.nan}
    lo, mid, hi = np.quantile(arr, [SEED_INTERVAL[0], 0.5, SEED_INTERVAL[1]])
    return {"median": float(mid), "lo": float(lo), "hi": float(hi)}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def seed_intervals(
    runs: Sequence[dict[str, Any]], keys: Sequence[str] = SEED_METRICS
) -> dict[str, dict[str, float]]:
    """Per figure ``keys`` of ``runs`` (one summary per seed): the median and the
    :data:`SEED_INTERVAL` quantiles (``lo``, ``hi``), over the runs where the figure is a
    number (NaN when none)."""
    return {key: _quantiles(r.get(key) for r in runs) for key in keys}


def seed_block(
    summaries: Sequence[dict[str, Any]], seeds: Sequence[int], keys: Sequence[str] = SEED_METRICS
) -> dict[str, Any]:
    """``summary.json``'s ``seeds`` block: the method, each run's figures ``keys`` (with its
    seed, request count and overload verdict) and the intervals over them."""
    from traces.resample import RESAMPLE_METHOD

    keep = ("requests", *keys, "overloaded")
    return {
        "method": RESAMPLE_METHOD,
        "interval": list(SEED_INTERVAL),
        "runs": [
            {"seed": seed, **{k: s[k] for k in keep if k in s}}
            for seed, s in zip(seeds, summaries, strict=True)
        ],
        "intervals": seed_intervals(summaries, keys),
    }


def median_summary(summaries: Sequence[dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """One summary standing for the replicas ``summaries`` (seeds ``seeds``): every numeric
    figure their median, ``overloaded`` when more than half of them are (the same majority
    the medians follow), everything else the first replica's; its ``seeds`` block covers
    every numeric figure, so a plan can show the interval of whatever its targets name."""
    if len(summaries) == 1:
        return dict(summaries[0])
    out = dict(summaries[0])
    numeric = [k for k, v in out.items() if _is_number(v)]
    for k in numeric:
        out[k] = _quantiles(s.get(k) for s in summaries)["median"]
    over = sum(bool(s.get("overloaded")) for s in summaries)
    out["overloaded"] = 2 * over > len(summaries)
    out["seeds"] = seed_block(summaries, seeds, numeric)
    return out


__all__ = [
    "SEED_INTERVAL",
    "SEED_METRICS",
    "median_summary",
    "replica_overrides",
    "replica_settings",
    "replica_trace",
    "seed_block",
    "seed_intervals",
]
