"""The host<->device link as a SimPy model: one in-order copy queue per direction, full duplex.

CUDA copies in one direction serialise (one copy engine per direction, in-order streams); the
two directions run at the same time, each slower while the other is busy. A job's service time
alone is ``alpha + runs * gamma + bytes / beta`` (from :mod:`hicache.latency`, computed by the
caller);
while the opposite direction has a job in service, the job progresses at rate ``eta`` (< 1) of
its own. Events happen only when a job starts or ends (at most a few per job): each direction
keeps one pending timer, re-armed through a generation counter when the other direction's state
changes (SimPy timeouts cannot be cancelled; stale ones are ignored). A job ends when its current
timer fires (completion by event identity, never by comparing leftover work to an epsilon).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import simpy

DIRECTIONS = ("d2h", "h2d")


@dataclass(slots=True, eq=False)
class Job:
    """One copy on the link. ``work_s`` is its uncoupled service time."""

    direction: str
    work_s: float
    nbytes: int
    pages: int = 0
    runs: int = 1
    kind: str = ""
    on_done: Callable[[Job], None] | None = None
    done: simpy.Event | None = None
    """Succeeds when the job completes (after ``on_done``), for a process that waits on it."""
    enqueued: float = 0.0
    start: float = -1.0
    end: float = -1.0
    until: float = -1.0
    """A drain placeholder's fixed end (:meth:`DuplexLink.complete_all_now`); -1: a copy."""


class _Direction:
    __slots__ = ("busy_since", "busy_time", "gen", "job", "name", "queue", "rate", "remaining", "t")

    def __init__(self, name: str) -> None:
        self.name = name
        self.queue: deque[Job] = deque()
        self.job: Job | None = None
        self.remaining = 0.0
        self.rate = 1.0
        self.t = 0.0
        self.gen = 0
        self.busy_time = 0.0
        self.busy_since = 0.0


class DuplexLink:
    """Two FIFO copy queues with duplex coupling ``eta[direction]`` (1.0 = no interference)."""

    def __init__(
        self,
        env: simpy.Environment,
        eta: dict[str, float] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.env = env
        self.eta = {"d2h": 1.0, "h2d": 1.0, **(eta or {})}
        self.dirs = {d: _Direction(d) for d in DIRECTIONS}
        self.on_change = on_change
        self.events = 0  # timers armed (for tests: bounded per job)

    # ------------------------------------------------------------------------------ public --
    def submit(self, job: Job) -> Job:
        """Queue ``job`` behind everything already queued in its direction."""
        d = self.dirs[job.direction]
        job.enqueued = self.env.now
        d.queue.append(job)
        if d.job is None:
            self._start_next(d)
        return job

    def busy(self, direction: str) -> bool:
        return self.dirs[direction].job is not None

    def busy_time(self, direction: str) -> float:
        """Seconds this direction has had a job in service so far."""
        d = self.dirs[direction]
        extra = self.env.now - d.busy_since if d.job is not None else 0.0
        return d.busy_time + extra

    def drain_time(self, direction: str) -> float:
        """When everything queued in ``direction`` will have finished, assuming the other
        direction's current busy state persists (used for blocking waits)."""
        d = self.dirs[direction]
        now = self.env.now
        if d.job is None:
            return now
        self._advance(d)
        rate = self._rate(d)
        return self._current_end(d, rate) + sum(j.work_s for j in d.queue) / rate

    def _current_end(self, d: _Direction, rate: float) -> float:
        """When the job in service in ``d`` ends at ``rate`` (a drain placeholder: its end)."""
        job = d.job
        assert job is not None
        if job.until >= 0:
            return max(self.env.now, job.until)
        return self.env.now + d.remaining / rate

    def complete_all_now(self, direction: str) -> float:
        """Finish every job queued in ``direction`` at its projected drain time, at once.

        Models a blocking ``synchronize`` by the caller: the jobs' callbacks run now (their
        ``end`` is set to their projected finish), and the direction stays busy until the drain
        time through one placeholder that ends there whatever the other direction does
        meanwhile, so later copies start after the drained ones ended. Returns the drain time.
        """
        d = self.dirs[direction]
        now = self.env.now
        if d.job is None:
            return now
        self._advance(d)
        rate = self._rate(d)
        t = self._current_end(d, rate)
        jobs = [] if d.job.until >= 0 else [d.job]  # an earlier placeholder has no callbacks
        d.job.end = t
        for j in d.queue:
            j.start = t
            t += j.work_s / rate
            j.end = t
            jobs.append(j)
        d.queue.clear()
        blocker = Job(direction, 0.0, 0, kind="drain", until=t)
        blocker.start = now
        d.job = blocker
        d.remaining = 0.0
        d.t = now
        self._arm(d)
        for j in jobs:
            _complete(j)
        return t

    # ---------------------------------------------------------------------------- internals --
    def _advance(self, d: _Direction) -> None:
        now = self.env.now
        if d.job is not None and d.job.until < 0:
            d.remaining -= (now - d.t) * d.rate
        d.t = now

    def _rate(self, d: _Direction) -> float:
        """``d``'s service rate now: ``eta`` while the other direction has a job, else 1."""
        return self.eta[d.name] if self.dirs[_other(d.name)].job is not None else 1.0

    def _arm(self, d: _Direction) -> None:
        d.gen += 1
        gen = d.gen
        d.rate = self._rate(d)
        until = d.job.until if d.job is not None else -1.0
        delay = max(0.0, until - self.env.now if until >= 0 else d.remaining / d.rate)
        ev = self.env.timeout(delay)
        self.events += 1
        ev.callbacks.append(partial(self._on_timer_cb, d, gen))

    def _on_timer_cb(self, d: _Direction, gen: int, _event: simpy.Event) -> None:
        self._on_timer(d, gen)

    def _on_timer(self, d: _Direction, gen: int) -> None:
        if gen != d.gen or d.job is None:
            return  # stale: re-armed since
        # the current timer was armed for exactly the job's remaining work at a rate that has
        # not changed since (any change re-arms it), so its firing *is* the job's completion.
        # No comparison of the leftover float against an epsilon: at large simulated times the
        # spacing of float times exceeds any fixed epsilon and such a test never passes.
        d.remaining = 0.0
        d.t = self.env.now
        job = d.job
        job.end = self.env.now
        d.job = None
        d.busy_time += self.env.now - d.busy_since
        self._start_next(d)
        self._retune(self.dirs[_other(d.name)])
        _complete(job)
        if self.on_change is not None:
            self.on_change()

    def _start_next(self, d: _Direction) -> None:
        if not d.queue:
            return
        job = d.queue.popleft()
        job.start = self.env.now
        d.job = job
        d.remaining = job.work_s
        d.t = self.env.now
        d.busy_since = self.env.now
        self._arm(d)
        self._retune(self.dirs[_other(d.name)])

    def _retune(self, d: _Direction) -> None:
        """Re-arm ``d`` if the other direction's busy state changed its service rate (a drain
        placeholder's end is fixed)."""
        if d.job is None or d.job.until >= 0:
            return
        if self._rate(d) != d.rate:
            self._advance(d)
            self._arm(d)


def _complete(job: Job) -> None:
    if job.on_done is not None:
        job.on_done(job)
    if job.done is not None:
        job.done.succeed()


def _other(direction: str) -> str:
    return "h2d" if direction == "d2h" else "d2h"
