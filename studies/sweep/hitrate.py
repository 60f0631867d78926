"""The cache-only hit-rate grid as a kind of sweep job: one :class:`sim.hitrate.HitRateConfig`
replayed over one loaded trace per job, on the same local executor as the timed sweep jobs
(:func:`studies.sweep.executors.run_local`).

The trace's replay requests (page symbols) are built once per page size in this process,
before the pool forks, so the workers share them and no job re-reads or re-hashes the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from studies.sweep.executors import map_local

if TYPE_CHECKING:
    from sim.hitrate import HitRateConfig

# page size -> the trace's requests (sim.hitrate.requests_for); filled by run_hitrate_grid
# before the workers fork
_REQUESTS: dict[int, list[Any]] = {}
_TRACE: list[Any] = []  # the trace itself (workload.output_reuse needs its sessions)


def hitrate_job(cfg: HitRateConfig) -> dict[str, Any]:
    """One row: the config's fields, then :meth:`sim.hitrate.HitRateResult.as_dict`."""
    from sim.hitrate import replay

    res = replay(_REQUESTS[cfg.page_size], cfg, _TRACE[0] if _TRACE else None)
    return {**asdict(cfg), **res.as_dict()}


def run_hitrate_grid(
    trace: Any, configs: Sequence[HitRateConfig], jobs: int = 0, progress: bool | None = None
) -> list[dict[str, Any]]:
    """Replay every config over one loaded trace (a ``traces.schema.Trace``); one row per
    config, in the order of ``configs``.

    More than one config runs on a process pool (``jobs`` workers, default all cores), forked
    after the trace's requests are built. ``progress``: one bar over configs (None = only on a
    terminal). Raises ``ValueError`` for an invalid config before anything runs.
    """
    from tqdm import tqdm

    from sim.hitrate import requests_for

    for cfg in configs:
        cfg.validate()
    try:
        _TRACE[:] = [trace]
        for cfg in configs:
            if cfg.page_size not in _REQUESTS:
                _REQUESTS[cfg.page_size] = requests_for(trace, cfg.page_size)
        quiet = progress is False or None  # None: a bar only on a terminal
        bar = tqdm(total=len(configs), desc="configs", unit="cfg", disable=quiet)
        try:
            return map_local(hitrate_job, configs, jobs, bar.update, needs_parent_state=True)
        finally:
            bar.close()
    finally:
        _REQUESTS.clear()
        _TRACE.clear()


__all__ = ["hitrate_job", "run_hitrate_grid"]
