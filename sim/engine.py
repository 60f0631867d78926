"""Assembles one timed run: SimPy environment, HBM/DRAM pools (the policy core's allocators),
the duplex PCIe link, the SimController, arrivals, the scheduler and the recorder.

``run_simulation(cfg, trace, out_dir)`` writes the run directory (ARCHITECTURE.md §5):
``config.json``, ``summary.json``, ``requests.parquet``, ``timeline.parquet``,
``transfers.parquet`` and optionally ``trace.json`` (Chrome trace).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Generator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import simpy

from hicache.lifecycle import paged_requests
from hicache.policy import HiRadixCache, PageAllocator
from hicache.policy.allocator import device_pool
from sim.controller import SimController
from sim.costs import Costs, build_costs
from sim.link import DuplexLink
from sim.metrics import (
    Recorder,
    RequestRow,
    TimelineRow,
    summarize,
    write_json_atomic,
    write_parquet_atomic,
)
from sim.scheduler import Scheduler, SchedulerParams, SimReq

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from traces.schema import Trace


class Engine:
    """One simulation: build with the pieces, then :meth:`run`."""

    def __init__(
        self,
        reqs: list[SimReq],
        *,
        device_tokens: int,
        host_tokens: int,
        page_size: int,
        write_policy: str,
        eviction: str,
        costs: Costs,
        sched: SchedulerParams,
        closed_loop: bool,
        timeline_max_rows: int = 20_000,
        progress: bool | None = None,
        load_back_threshold: int = 10,
        stall_events: int = 0,
    ) -> None:
        self.env = simpy.Environment()
        self.stall_events = stall_events  # the watchdog's limit (0: by the trace's size)
        self.recorder = Recorder(timeline_max_rows=timeline_max_rows)
        p = page_size
        self.device = device_pool(device_tokens // p, p)
        self.host = PageAllocator(host_tokens // p, p, "host") if host_tokens else None
        self.link = DuplexLink(self.env, eta={"d2h": costs.eta_d2h, "h2d": costs.eta_h2d},
                               on_change=self._on_link_change)  # fmt: skip
        self.ctrl = SimController(self.env, self.device, self.host, self.link, costs,
                                  self.recorder)  # fmt: skip
        self.cache = HiRadixCache(
            self.ctrl,
            write_policy=write_policy,
            eviction_policy=eviction,
            load_back_threshold=load_back_threshold,
        )
        self.sched = Scheduler(self.env, self.cache, costs, sched, self.ctrl, self._finished,
                               self._sample, self._next_arrival)  # fmt: skip
        self.reqs = reqs
        self.closed_loop = closed_loop
        self.progress = progress
        self._arrived = 0
        self._finished_n = 0
        self._all_done = self.env.event()
        self._next_turn: dict[Any, list[SimReq]] = {}
        self._open: list[SimReq] = []
        self._arrived_open = 0
        self._bar: Any = None

    # -------------------------------------------------------------------------- arrivals --
    def _plan(self) -> None:
        if self.closed_loop:
            sessions: dict[Any, list[SimReq]] = {}
            for r in self.reqs:
                if r.req.session is None:
                    self._open.append(r)
                else:
                    sessions.setdefault(r.req.session, []).append(r)
            for turns in sessions.values():
                turns.sort(key=lambda r: (r.req.turn or 0, r.rid))
                self._open.append(turns[0])  # first turn at its timestamp
                self._next_turn[id(turns[0])] = turns[1:]
            self._open.sort(key=lambda r: (r.arrival, r.rid))
        else:
            self._open = sorted(self.reqs, key=lambda r: (r.arrival, r.rid))

    def _admit(self, r: SimReq) -> None:
        r.arrival = self.env.now
        self._arrived += 1
        need = r.input_length + r.output_length + self.sched.p.page_size
        if need >= self.device.capacity_tokens:
            # its KV could never fit the pool, even alone with an empty cache: SGLang rejects
            # requests longer than its KV pool at arrival; we record it as rejected (finish = -1)
            self._finished(r)
            return
        self.sched.arrive(r)

    def _next_arrival(self) -> float:
        # the next open-loop arrival (closed-loop turns only follow finishes)
        idx = self._arrived_open
        return self._open[idx].arrival if idx < len(self._open) else math.inf

    def _finished(self, r: SimReq) -> None:
        self._finished_n += 1
        if self._finished_n == len(self.reqs):
            self._all_done.succeed()
        if self._bar is not None:
            self._bar.update(1)
        if r.finish < 0:  # rejected at arrival
            r.device_hit = 0
        self.recorder.add_request(
            RequestRow(r.rid, r.arrival, r.admitted, r.first_token, r.finish, r.prefill_s,
                       r.load_stall_s, r.input_length, r.output_length, r.device_hit, r.host_hit,
                       r.host_hit_recomputed, r.computed, r.retractions)
        )  # fmt: skip
        nxt = self._next_turn.pop(id(r), None) if r.finish >= 0 else None
        if nxt:
            follower = nxt[0]
            self._next_turn[id(follower)] = nxt[1:]
            delay = follower.req.think_time_s

            def later(
                env: simpy.Environment = self.env, f: SimReq = follower
            ) -> Generator[simpy.Event, Any, None]:
                yield env.timeout(delay)
                self._admit(f)

            self.env.process(later())

    def _on_link_change(self) -> None:
        # a finished copy can unblock admission (pins released at the next check)
        if self.sched.waiting:
            self.sched.wake()

    def _sample(self) -> None:
        if not self.recorder.due():
            return
        c, dev = self.cache, self.device
        free = dev.available_size()
        tree = c.total_size()
        self.recorder.sample(
            TimelineRow(self.env.now, free, c.evictable_size(), c.protected_size(),
                        dev.capacity_tokens - free - tree,
                        (self.host.capacity_tokens - self.host.available_size()) if self.host
                        else 0,
                        len(self.sched.waiting), len(self.sched.running),
                        self.link.busy_time("d2h"), self.link.busy_time("h2d"))
        )  # fmt: skip

    # ------------------------------------------------------------------------------- run --
    def _run_watched(self, total: int) -> None:
        """``env.run(until=all done)`` with a watchdog: more than ``stall_events`` events in a
        row at one simulated time means the clock has stopped (a model bug, such as a timer
        re-armed forever); that is an error naming the time, not a hang."""
        env, done = self.env, self._all_done
        limit = self.stall_events or max(1_000_000, 50 * total)
        step = env.step
        last, same = env.now, 0
        while not done.processed:
            try:
                step()
            except simpy.core.EmptySchedule:
                why = "the head request cannot be admitted"
                raise RuntimeError(_stall_message(self, total, why)) from None
            if env.now != last:
                last, same = env.now, 0
                continue
            same += 1
            if same > limit:
                why = f"{same:,} events without the clock advancing (a model bug; please report)"
                raise SimulationStalled(_stall_message(self, total, why))

    def run(self) -> float:
        """Simulate until every request has finished; returns the simulated duration."""
        from tqdm import tqdm

        self._plan()
        self._arrived_open = 0
        env = self.env

        def arrivals() -> Generator[simpy.Event, Any, None]:
            for r in self._open:
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                self._arrived_open += 1
                self._admit(r)

        env.process(arrivals())
        env.process(self.sched.run())
        total = len(self.reqs)
        self._bar = tqdm(total=total, desc="requests", unit="req", disable=self.progress is False
                         or None, mininterval=0.5)  # fmt: skip
        try:
            if total:
                self._run_watched(total)
        finally:
            self._bar.close()
        return float(env.now)


def _stall_message(engine: Engine, total: int, why: str) -> str:
    s = engine.sched
    return (
        f"simulation stalled at t={engine.env.now:.3f}s with {total - engine._finished_n} "
        f"unfinished requests ({len(s.waiting)} waiting, {len(s.running)} running): {why}"
    )


class SimulationStalled(RuntimeError):
    """The simulated clock stopped advancing (a model bug): raised instead of hanging."""


def trace_checksum(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_closed_loop(mode: str, trace: Trace, n_used: int) -> bool:
    """Whether arrivals run in closed loop: ``on``/``off`` as given; ``auto`` is closed loop
    exactly when the requests the run uses record a think time (traces/README.md: turn k
    arrives ``think_time_ms`` after turn k-1 finishes). A session id alone does not make a
    trace closed-loop: a generator run with ``--no-closed-loop`` keeps session ids but drops the
    think times, and its timestamps are the arrival process to replay."""
    if mode != "auto":
        return mode in (True, "true", "on")
    return any(r.think_time_ms is not None for r in trace.requests[:n_used])


def run_simulation(
    cfg: SimConfig, trace: Trace, out_dir: Path | None = None, progress: bool | None = None
) -> dict[str, Any]:
    """Run ``cfg`` over ``trace``; write the run directory if ``out_dir``; return the summary."""
    from hicache.config import config_to_dict, resolve_pools

    t0 = time.perf_counter()
    device_tokens, host_tokens, _ = resolve_pools(cfg)
    costs = build_costs(cfg)
    ps = cfg.cache.page_size
    paged = paged_requests(
        trace, ps, rate_scale=cfg.workload.rate_scale, limit=cfg.workload.max_requests
    )
    reqs = [SimReq(r) for r in paged]
    closed_loop = resolve_closed_loop(cfg.workload.closed_loop, trace, len(paged))
    sp = cfg.scheduler
    engine = Engine(
        reqs,
        device_tokens=device_tokens,
        host_tokens=host_tokens if cfg.cache.enable_host else 0,
        page_size=ps,
        write_policy=cfg.cache.write_policy,
        eviction=cfg.cache.eviction,
        costs=costs,
        # every scheduler knob of the config, plus what the scheduler needs from other sections
        sched=SchedulerParams(page_size=ps, outputs=cfg.workload.outputs, **asdict(sp)),
        load_back_threshold=cfg.cache.load_back_threshold,
        closed_loop=closed_loop,
        timeline_max_rows=cfg.run.timeline_max_rows,
        progress=progress,
    )
    duration = engine.run()
    frames = engine.recorder.frames()
    frames["requests"] = frames["requests"].sort_values("rid", kind="stable").reset_index(drop=True)
    summary = summarize(frames, duration, time.perf_counter() - t0)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "config": config_to_dict(cfg),
            "device_tokens": device_tokens,
            "host_tokens": host_tokens if cfg.cache.enable_host else 0,
            # relative to the run folder: no machine path in results that travel (plus checksum)
            "trace": os.path.relpath(trace.path, out_dir) if trace.path else "",
            "trace_sha256": trace_checksum(Path(trace.path)) if trace.path else None,
            "closed_loop": closed_loop,
            # the served model's shape as read (model.config may name a file elsewhere)
            "model": asdict(cfg.model.spec),
        }  # fmt: skip
        from hicache import __version__

        conf["version"] = __version__
        write_json_atomic(conf, out_dir / "config.json")
        for name, df in frames.items():
            write_parquet_atomic(df, out_dir / f"{name}.parquet")
        write_json_atomic(summary, out_dir / "summary.json")
        if cfg.run.chrome_trace:
            write_json_atomic(chrome_trace(engine), out_dir / "trace.json")
    return summary


def chrome_trace(engine: Engine) -> dict[str, Any]:
    """Chrome / Perfetto trace: one track for compute, one per link direction (times in us)."""
    events: list[dict[str, Any]] = []
    tids = {"compute": 1, "d2h": 2, "h2d": 3}
    for name, tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
                       "args": {"name": name}})  # fmt: skip
    for kind, start, end, bs in engine.sched.spans:
        events.append({"ph": "X", "name": kind, "pid": 1, "tid": 1, "ts": start * 1e6,
                       "dur": (end - start) * 1e6, "args": {"batch_size": bs}})  # fmt: skip
    for t in engine.recorder.transfers:
        events.append({"ph": "X", "name": t.kind, "pid": 1, "tid": tids[t.direction],
                       "ts": t.start_s * 1e6, "dur": (t.end_s - t.start_s) * 1e6,
                       "args": {"bytes": t.bytes, "pages": t.pages, "runs": t.runs}})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}
