"""What the scheduler reads from the config (:class:`SchedulerParams`).

Apart from :mod:`sim.scheduler` because it subclasses the config's dataclass, which a compiled
module cannot (``hicache.policy.native`` compiles the scheduler); ``sim.scheduler`` re-exports
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.config import SchedulerConfig


@dataclass(frozen=True, kw_only=True)
class SchedulerParams(SchedulerConfig):
    """What the scheduler reads: every ``[scheduler]`` knob of the config (see
    ``hicache.config.SchedulerConfig`` for what each means and why its default is what it is), plus
    what it needs from other sections."""

    page_size: int
    outputs: str = "cache"
    lpm_max_queue: int = 128  # SGLang falls back to FCFS above this many waiting requests
