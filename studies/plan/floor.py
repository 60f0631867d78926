"""The zero-load floor of a TTFT target: what no instance count can beat.

On an idle server a request waits for nobody, and the best any cache can do for it is to hold
every prefix that an earlier request of the trace computed (an infinite cache that never
evicts: :func:`traces.stats.infinite_capacity_prefixes`, page-aligned, the last prompt token
always recomputed, as SGLang matches). What remains is its own prefill: the new tokens in
chunks of ``scheduler.chunked_prefill_size`` on top of the cached prefix, each chunk one pass of
the configuration's cost model (:meth:`sim.costs.Costs.prefill_time`, the HiCache checks per
pass included). Host loads, queueing and batching with others only add to it.

So request i's TTFT is at least its floor ``f_i``, and a TTFT percentile (or the mean) of a run
is at least that percentile (mean) of the ``f_i``: when it exceeds a target, adding instances
cannot meet it; a larger ``model.tp`` (or a smaller chunk) can. Requests are taken in the
trace's order, which is the order an idle server sees them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from studies.plan.targets import Target
    from traces.schema import Trace

__all__ = ["TTFT_KEY", "request_floors", "target_floor"]

#: The TTFT keys a floor exists for: ``ttft_mean_s`` and ``ttft_p<NN>_s``.
TTFT_KEY = re.compile(r"ttft_(mean|p(\d+))_s")


def request_floors(cfg: SimConfig, trace: Trace) -> list[float]:
    """``f_i`` for every replayed request (``workload.max_requests``), seconds."""
    from sim.costs import build_costs
    from traces.stats import infinite_capacity_prefixes

    limit = cfg.workload.max_requests or None
    requests = list(trace.requests[:limit])
    cached = infinite_capacity_prefixes(requests, cfg.cache.page_size, trace.block_size)
    costs = build_costs(cfg)
    chunk = cfg.scheduler.chunked_prefill_size
    out = []
    for req, hit in zip(requests, cached, strict=True):
        new, prefix, t = req.input_length - hit, hit, 0.0
        while new > 0:
            take = new if chunk < 1 else min(chunk, new)
            t += costs.prefill_time([(take, prefix)])
            prefix += take
            new -= take
        out.append(t)
    return out


def target_floor(target: Target, floors: Sequence[float]) -> float | None:
    """The floor of ``target``'s key over the request floors (the same percentile rule as the
    run's summary: pandas' linear quantile), or None for a key that is not a TTFT."""
    import pandas as pd

    m = TTFT_KEY.fullmatch(target.key)
    if m is None or target.op != "<=" or not floors:
        return None
    s = pd.Series(floors, dtype=float)
    return float(s.mean()) if m[1] == "mean" else float(s.quantile(int(m[2]) / 100))
