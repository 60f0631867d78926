"""Assembles one timed run: SimPy environment, HBM/DRAM pools (the policy core's allocators),
the duplex PCIe link, the SimController, arrivals, the scheduler and the recorder.

``run_simulation(cfg, trace, out_dir)`` writes the run directory (ARCHITECTURE.md §5):
``config.json``, ``summary.json``, ``requests.parquet``, ``timeline.parquet``,
``transfers.parquet``, ``metrics.prom`` (SGLang's Prometheus metrics of the run: :mod:`sim.prom`)
and optionally ``trace.json`` (Chrome trace).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import simpy

from hicache.lifecycle import PagedTrace, page_keys
from hicache.output_keys import no_output_keys, output_keys_for
from hicache.policy import PageAllocator
from hicache.policy.radix import PageKey
from sim.cache_types import AnyCache
from sim.controller import SimController
from sim.costs import Costs, build_costs
from sim.instance import Instance
from sim.link import DuplexLink
from sim.metrics import (
    Recorder,
    sglang_cached_tokens,
    summarize,
    warmup_mask,
    write_json_atomic,
    write_parquet_atomic,
)
from sim.prom import render, run_families
from sim.routers import Router, build_router
from sim.scheduler import Scheduler, SchedulerParams, SimReq
from sim.seeds import replica_trace
from sim.storage_setup import StorageSetup, storage_summary
from traces import fsutil
from traces.context import ContextLimit, Limited, apply_context_limit
from traces.store import BuiltOnRead

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from traces.schema import Trace


class Engine:
    """One simulation of ``instances`` servers behind a router (one server: no router); build
    with the pieces, then :meth:`run`. With one instance, ``cache``, ``sched``, ``device``,
    ``host``, ``link``, ``ctrl`` and ``recorder`` are that server's."""

    def __init__(
        self,
        reqs: Sequence[SimReq],
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
        instances: int = 1,
        router: Router | None = None,
        storage: StorageSetup | None = None,
        record_spans: bool = True,
        sglang_version: str = "0.5.14",
        eviction_params: dict[str, int] | None = None,
    ) -> None:
        """``record_spans``: keep every compute span (the Chrome trace's compute track: a row
        per prefill and decode call, growing with the run); off, nothing is kept."""
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        if instances > 1 and router is None:
            raise ValueError("a cluster of several instances needs a router")
        self.env = simpy.Environment()
        self.stall_events = stall_events  # the watchdog's limit (0: by the trace's size)
        self.instances = [
            Instance(self.env, i, device_tokens=device_tokens, host_tokens=host_tokens,
                     page_size=page_size, write_policy=write_policy, eviction=eviction,
                     costs=costs, sched=sched, on_finished=self._finished,
                     next_arrival=self._next_arrival, timeline_max_rows=timeline_max_rows,
                     load_back_threshold=load_back_threshold, storage=storage,
                     sglang_version=sglang_version, eviction_params=eviction_params)
            for i in range(instances)
        ]  # fmt: skip
        if not record_spans:
            for inst in self.instances:
                inst.sched.record_spans = False
        for inst in self.instances:
            # a closed-loop turn is announced when its predecessor finishes; with several
            # instances that is another instance's finish, in the middle of this one's segment:
            # segments then run one per timeout and listen for arrivals
            inst.sched.announced = inst.sched.span_ok = not (closed_loop and instances > 1)
        self.storage = storage
        self.router = router
        self.reqs: Sequence[SimReq] = reqs  # handed to the arrival plan at run(), then let go
        self._total = len(reqs)
        self.closed_loop = closed_loop
        self.progress = progress
        self._arrived = 0
        self._finished_n = 0
        self._all_done = self.env.event()
        self._next_turn: dict[Any, list[SimReq]] = {}
        # closed-loop turns scheduled (their predecessor finished) and not arrived yet: their
        # arrival times, a heap (with the order they were scheduled in, SimPy's tie order)
        self._turns: list[tuple[float, int]] = []
        self._turns_made = 0
        # open-loop arrivals still to come, in order (each is let go once admitted, so a
        # finished request's state is freed: its row is in the recorder)
        self._open: deque[SimReq] | _Arrivals = deque()
        self._bar: Any = None

    # the single server's parts (what tests and one-instance callers use)
    @property
    def cache(self) -> AnyCache:
        return self.instances[0].cache

    @property
    def sched(self) -> Scheduler:
        return self.instances[0].sched

    @property
    def device(self) -> PageAllocator:
        return self.instances[0].device

    @property
    def host(self) -> PageAllocator | None:
        return self.instances[0].host

    @property
    def link(self) -> DuplexLink:
        return self.instances[0].link

    @property
    def ctrl(self) -> SimController:
        return self.instances[0].ctrl

    @property
    def recorder(self) -> Recorder:
        return self.instances[0].recorder

    def _sample(self) -> None:
        self.instances[0]._sample()

    # -------------------------------------------------------------------------- arrivals --
    def _plan(self) -> None:
        if self.closed_loop:
            sessions: dict[Any, list[SimReq]] = {}
            first: list[SimReq] = []
            for r in self.reqs:
                if r.req.session is None:
                    first.append(r)
                else:
                    sessions.setdefault(r.req.session, []).append(r)
            for turns in sessions.values():
                turns.sort(key=lambda r: (r.req.turn or 0, r.rid))
                first.append(turns[0])  # first turn at its timestamp
                self._next_turn[id(turns[0])] = turns[1:]
            self._open = deque(sorted(first, key=lambda r: (r.arrival, r.rid)))
        elif isinstance(self.reqs, SimReqSource):
            self._open = _Arrivals(self.reqs)
        else:
            self._open = deque(sorted(self.reqs, key=lambda r: (r.arrival, r.rid)))
        self.reqs = []

    def _admit(self, r: SimReq) -> None:
        self._arrived += 1
        if self.router is None:
            self.instances[0].admit(r)
            return
        i = self.router.route(r.with_symbols(), self.instances, self.env.now)
        self.instances[i].admit(r)

    def _next_arrival(self) -> float:
        """The next arrival known now: the next open-loop one, or a closed-loop turn whose
        predecessor has finished (a decode segment ends at it, so that its request is seen at
        the next step). A turn not scheduled yet (its predecessor still running, maybe on
        another instance) is not known: a segment it lands in is cut by its wake-up."""
        t = self._open[0].arrival if self._open else math.inf
        return min(t, self._turns[0][0]) if self._turns else t

    def _finished(self, r: SimReq) -> None:
        self._finished_n += 1
        if self._finished_n == self._total:
            self._all_done.succeed()
        if self._bar is not None:
            self._bar.update(1)
        # a rejected turn's follower still comes, its think time after the rejection (the
        # client goes on; every turn counts in _total, so the run would otherwise never end)
        nxt = self._next_turn.pop(id(r), None)
        if nxt:
            follower = nxt[0]
            self._next_turn[id(follower)] = nxt[1:]
            delay = follower.req.think_time_s
            heapq.heappush(self._turns, (self.env.now + delay, self._turns_made))
            self._turns_made += 1

            def later(
                env: simpy.Environment = self.env, f: SimReq = follower
            ) -> Generator[simpy.Event, Any, None]:
                yield env.timeout(delay)
                heapq.heappop(self._turns)  # the earliest scheduled: this one
                self._admit(f)

            self.env.process(later())

    def frames(self, *, take: bool = False) -> dict[str, Any]:
        """Every instance's tables, with an ``instance`` column, requests sorted by rid.
        ``take``: the recorders hand their rows over and are empty afterwards (the run's
        last call: a long run's rows are not held twice)."""
        import pandas as pd

        parts = [inst.recorder.frames(take=take) for inst in self.instances]
        out: dict[str, Any] = {}
        for name in parts[0]:
            dfs = [f[name].assign(instance=i) for i, f in enumerate(parts)]
            full = [d for d in dfs if len(d)]  # an idle instance's empty table has no dtypes
            out[name] = pd.concat(full, ignore_index=True) if len(full) > 1 else (full or dfs)[0]
        req = out["requests"]
        if not req["rid"].is_monotonic_increasing:
            out["requests"] = req.sort_values("rid", kind="stable").reset_index(drop=True)
        if self.storage is not None:
            from sim.storage import STORAGE_CALL_COLUMNS

            out["storage_calls"] = pd.DataFrame(self.storage.rows, columns=STORAGE_CALL_COLUMNS)
        return out

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
        env = self.env

        def arrivals() -> Generator[simpy.Event, Any, None]:
            pending = self._open
            while pending:
                r = pending[0]
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                pending.popleft()
                self._admit(r)

        env.process(arrivals())
        loops = [env.process(inst.sched.run()) for inst in self.instances]
        total = self._total
        self._bar = tqdm(total=total, desc="requests", unit="req", disable=self.progress is False
                         or None, mininterval=0.5)  # fmt: skip
        try:
            if total:
                self._run_watched(total)
        finally:
            self._bar.close()
            close_loops(loops)
            for inst in self.instances:
                inst.release()
        return float(env.now)


def close_loops(loops: Sequence[simpy.Process]) -> None:
    """Close the schedulers' loops (their SimPy processes), which wait for ever once the run
    is over, and let their generators go. A suspended generator compiled by mypyc holds its
    scheduler in a way the cycle collector does not see, so while its process keeps it, every
    compiled run's engine (its caches, trees and requests) outlives the run
    (tests/sim/test_lazy_requests.py counts them). Nothing runs a process after its run."""
    for proc in loops:
        gen = proc._generator  # SimPy's own reference: the one that keeps the loop alive
        gen.close()
        proc._generator = None  # type: ignore[assignment]


class SimReqSource(BuiltOnRead[SimReq]):
    r"""The requests of a :class:`~hicache.lifecycle.PagedTrace` as :class:`SimReq`\ s, each
    built when read (with ``keys`` to build its page keys when first needed). An engine given
    one builds each request when it arrives (open loop), so the requests in memory are the
    live ones, not the whole trace."""

    def __init__(
        self,
        paged: PagedTrace,
        keys: Callable[[int], PageKey],
        aborted: frozenset[int] = frozenset(),
        outs: Callable[[int], list[Hashable]] = no_output_keys,
    ) -> None:
        self.paged = paged
        self.keys = keys
        self.aborted = aborted  # indices SGLang aborts at arrival (traces.context)
        self.outs = outs  # output page symbols (workload.output_reuse, hicache.output_keys)

    def __len__(self) -> int:
        return len(self.paged)

    def _get(self, i: int) -> SimReq:
        return SimReq(self.paged[i], keys=self.keys, aborted=i in self.aborted,
                      out_symbols=self.outs(i))  # fmt: skip


class _Arrivals:
    """Open-loop arrivals from a :class:`SimReqSource` in (arrival, rid) order, read like the
    engine's deque (``[0]``, ``popleft``, truth): a request is built when it is first looked at
    and let go when taken."""

    def __init__(self, source: SimReqSource) -> None:
        self._source = source
        times = source.paged.arrivals
        n = len(times)
        in_order = all(times[i] <= times[i + 1] for i in range(n - 1))
        # a stable sort by time keeps equal times in rid (= index) order, as the deque's key
        order = range(n) if in_order else sorted(range(n), key=times.__getitem__)
        self._order: Sequence[int] = order
        self._next = 0
        self._head: SimReq | None = None

    def __bool__(self) -> bool:
        return self._next < len(self._order)

    def __len__(self) -> int:
        return len(self._order) - self._next

    def __getitem__(self, i: int) -> SimReq:
        if i != 0:
            raise IndexError("only the next arrival can be read")
        if self._head is None:
            if not self:
                raise IndexError("no arrivals left")
            self._head = self._source[self._order[self._next]]
        return self._head

    def popleft(self) -> SimReq:
        head = self[0]
        self._head = None
        self._next += 1
        return head


def _stall_message(engine: Engine, total: int, why: str) -> str:
    waiting = sum(len(i.sched.waiting) for i in engine.instances)
    running = sum(len(i.sched.running) for i in engine.instances)
    return (
        f"simulation stalled at t={engine.env.now:.3f}s with {total - engine._finished_n} "
        f"unfinished requests ({waiting} waiting, {running} running): {why}"
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
    return any(r.think_time_ms is not None for r in itertools.islice(trace.requests, n_used))


def context_summary(limited: Limited) -> dict[str, int]:
    """``summary.json``'s counts of what ``workload.max_context`` did to the requests the run
    replays: aborted at arrival (also counted in ``rejected_requests``), prompts cut
    (``auto_truncate``) and outputs capped."""
    return {
        "context_aborted": len(limited.aborted),
        "context_truncated": limited.truncated,
        "context_capped_outputs": limited.capped,
    }


def run_simulation(
    cfg: SimConfig,
    trace: Trace,
    out_dir: Path | None = None,
    progress: bool | None = None,
    frames_out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` over ``trace``; write the run directory if ``out_dir``; return the summary.
    ``frames_out``: a dict that receives the run's tables (``requests``, ``transfers``, ...)."""
    if cfg.pd.enabled:  # prefill/decode disaggregation: its own engine (sim.pd)
        from sim.pd import run_pd_simulation

        if cfg.workload.max_context:
            raise ValueError(
                "workload.max_context is not modelled in a PD run yet (each role would apply "
                "it against its own pool): set it to 0 or run without pd.enabled"
            )
        if cfg.workload.resample_sessions:  # a --seeds replica (sim.seeds)
            trace = replica_trace(trace, cfg.run.seed, cfg.workload.max_requests)
        return run_pd_simulation(cfg, trace, out_dir, progress, frames_out)
    from hicache.config import config_to_dict, resolve_pools

    t0 = time.perf_counter()
    device_tokens, host_tokens, _ = resolve_pools(cfg)
    costs = build_costs(cfg)
    ps = cfg.cache.page_size
    if cfg.workload.resample_sessions:  # a --seeds replica (sim.seeds)
        trace = replica_trace(trace, cfg.run.seed, cfg.workload.max_requests)
    limited = None
    if cfg.workload.max_context:  # SGLang's --context-length (traces.context)
        limit = ContextLimit.of(cfg.workload.max_context, device_tokens)
        used = replace(trace, requests=trace.requests[: cfg.workload.max_requests or None])
        limited = apply_context_limit(used, limit, cfg.workload.auto_truncate)
        trace = limited.trace
    # each request is built when it arrives and freed once finished and recorded; its keys
    # are built when it first needs them and dropped at its finish
    paged = PagedTrace(
        trace, ps, rate_scale=cfg.workload.rate_scale, limit=cfg.workload.max_requests
    )
    outs = output_keys_for(cfg.workload.output_reuse, trace, ps, cfg.workload.max_requests)
    reqs = SimReqSource(
        paged, page_keys(trace, ps), limited.aborted if limited else frozenset(), outs
    )
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
        instances=cfg.cluster.instances,
        router=build_router(cfg.router, cfg.cluster.instances, ps)
        if cfg.cluster.instances > 1
        else None,
        storage=StorageSetup.from_config(cfg, costs.bytes_per_page),
        record_spans=cfg.run.chrome_trace and out_dir is not None,
        sglang_version=cfg.sglang.version,
        eviction_params=cfg.cache.eviction_params(),
    )
    duration = engine.run()
    frames = engine.frames(take=True)
    if cfg.sglang.version == "0.5.14":  # its cached_tokens_details split (sim.metrics)
        req = frames["requests"]
        frames["requests"] = req.assign(**sglang_cached_tokens(req, cfg.sglang.version))
    warmup = cfg.workload.warmup_s
    early = warmup_mask(frames["requests"], warmup)
    if early is not None:  # the table keeps every request; these count in no figure
        frames["requests"] = frames["requests"].assign(warmup=early)
    if frames_out is not None:
        frames_out.update(frames)
    summary = summarize(frames, duration, time.perf_counter() - t0, closed_loop, warmup)
    summary["sglang_version"] = cfg.sglang.version
    if limited is not None:
        summary.update(context_summary(limited))
    # the L3 block and the defect counters are the whole run's (the cache's own counters)
    summary.update(storage_summary(engine, frames))
    if cfg.cluster.instances > 1:
        summary.update(
            fleet_summary(frames, duration, cfg.router.policy, cfg.cluster.instances,
                          warmup_s=warmup)
        )  # fmt: skip
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
        from hicache.policy import NATIVE

        conf["version"] = __version__
        # whether the compiled build ran (the same decisions either way; only speed differs)
        conf["compiled_core"] = NATIVE.active
        write_json_atomic(conf, out_dir / "config.json")
        for name, df in frames.items():
            write_parquet_atomic(df, out_dir / f"{name}.parquet")
        write_json_atomic(summary, out_dir / "summary.json")
        fams = run_families(
            frames["requests"], frames["transfers"], sglang_version=cfg.sglang.version,
            model_name=cfg.model.spec.name, page_size=ps, device_tokens=device_tokens,
            host_tokens=host_tokens if cfg.cache.enable_host else 0,
            warmup_end_s=summary.get("warmup_end_s"), storage=summary.get("storage"),
        )  # fmt: skip
        fsutil.write_text_atomic(render(fams), out_dir / "metrics.prom")
        if cfg.run.chrome_trace:
            write_json_atomic(chrome_trace(engine), out_dir / "trace.json")
    return summary


def fleet_summary(
    frames: dict[str, Any],
    duration: float,
    policy: str,
    instances: int,
    closed_loop: bool = False,
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """What a cluster adds to ``summary.json``: the instance count and router, each instance's
    own summary (hit rates, latencies and its own overload check, ``per_instance``; an
    instance the router sent nothing is there too, with ``requests`` 0), the instances that got
    no request (``idle_instances``), the load imbalance (most-loaded instance's routed requests
    and prompt tokens over the mean of all ``instances``: 1 = even, ``instances`` = one took
    everything), and ``overloaded`` if any instance is (with the instances named).
    ``warmup_s``: each instance's summary leaves out the warm-up window's arrivals, the
    window of the whole fleet (its first arrival), so the counts are the measured ones."""
    req, tr = frames["requests"], frames["transfers"]
    parts = dict(iter(req.groupby("instance", sort=True)))
    start = float(req["arrival_s"].min()) if warmup_s > 0 and len(req) else None
    per = []
    for i in range(instances):
        part = parts.get(i, req.iloc[0:0])
        own = {"requests": part.reset_index(drop=True), "transfers": tr[tr["instance"] == i]}
        one = summarize(own, duration, 0.0, closed_loop, warmup_s, start)
        one.pop("wall_time_s", None)
        per.append({"instance": i, **one})
    counts = [p["requests"] for p in per]
    tokens = [p["prompt_tokens"] for p in per]
    over = [p["instance"] for p in per if p["overloaded"]]
    idle = [p["instance"] for p in per if p["requests"] == 0]
    out: dict[str, Any] = {
        "instances": instances,
        "router": policy,
        "per_instance": per,
        "idle_instances": idle,
        "imbalance_requests": max(counts) * instances / sum(counts) if sum(counts) else 1.0,
        "imbalance_prompt_tokens": max(tokens) * instances / sum(tokens) if sum(tokens) else 1.0,
        "overloaded_instances": over,
    }
    if over:
        out["overloaded"] = True
        out["overload_message"] = (
            f"overloaded: {len(over)} of {instances} instances ({_first(over)}) cannot keep up "
            f"with what the {policy} router sends them; more instances or another router would"
        )
    return out


def _first(items: list[int], most: int = 8) -> str:
    """``0, 3, 5`` (at most ``most`` of them, then ``...``)."""
    return ", ".join(map(str, items[:most])) + (", ..." if len(items) > most else "")


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
