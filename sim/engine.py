"""Assembles one timed run: SimPy environment, HBM/DRAM pools (the policy core's allocators),
the duplex PCIe link, the SimController, arrivals, the scheduler and the recorder.

``run_simulation(cfg, trace, out_dir)`` writes the run directory (ARCHITECTURE.md §5):
``config.json``, ``summary.json``, ``requests.parquet``, ``timeline.parquet``,
``transfers.parquet`` and optionally ``trace.json`` (Chrome trace).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import simpy

from hicache.policy import HiRadixCache, PageAllocator, PageKey
from hicache.policy.allocator import device_pool
from hicache.policy.controller import BaseController, LoadBatch, WriteOp
from sim.link import DuplexLink, Job
from sim.metrics import Recorder, summarize, write_json_atomic, write_parquet_atomic
from sim.scheduler import Scheduler, SchedulerParams, SimReq


def count_runs(a: Sequence[int], b: Sequence[int]) -> int:
    """Contiguous runs of a paired page copy: a new run wherever either side is not
    consecutive (one ``cudaMemcpyAsync`` per run for the direct backend)."""
    if not a:
        return 0
    runs = 1
    for i in range(1, len(a)):
        if a[i] != a[i - 1] + 1 or b[i] != b[i - 1] + 1:
            runs += 1
    return runs


@dataclass
class Costs:
    """The latency model bound to one configuration (what the scheduler and controller need)."""

    num_layers: int
    bytes_per_page: int
    prefill_fn: Callable[[list[tuple[int, int]]], float]
    decode_fn: Callable[[int, int], float]
    write_fn: Callable[[int, int], float]
    load_fn: Callable[[int, int], float]
    eta_d2h: float = 1.0
    eta_h2d: float = 1.0

    def prefill_time(self, reqs: list[tuple[int, int]]) -> float:
        return self.prefill_fn(reqs)

    def decode_coeffs(self, batch_size: int) -> tuple[float, float]:
        a = self.decode_fn(batch_size, 0)
        return a, self.decode_fn(batch_size, 1) - a


class SimController(BaseController):
    """The TransferController on the SimPy link: writes become D2H jobs and ack at completion;
    a batch's loads become one layer-wise H2D job; ``wait_writes`` blocks simulated time."""

    def __init__(
        self,
        device: PageAllocator,
        host: PageAllocator | None,
        link: DuplexLink,
        costs: Costs,
        recorder: Recorder,
    ) -> None:
        super().__init__(device, host)
        self.link = link
        self.costs = costs
        self.recorder = recorder
        self._stall_until = 0.0
        self._last_load: Job | None = None

    def _record(self, job: Job) -> None:
        self.recorder.add_transfer(
            (job.direction, job.kind, job.nbytes, job.pages, job.runs, job.enqueued, job.start,
             job.end)
        )  # fmt: skip
        for ev in job.meta.get("waiters", ()):
            ev.succeed()

    def _issue_write(self, op: WriteOp) -> None:
        nbytes = len(op.device_pages) * self.costs.bytes_per_page
        runs = count_runs(op.device_pages, op.host_pages)

        def done(job: Job, op: WriteOp = op) -> None:
            op.done = True
            self._record(job)

        self.link.submit(
            Job("d2h", self.costs.write_fn(nbytes, runs), nbytes, len(op.device_pages), runs,
                "write", done)
        )  # fmt: skip

    def _issue_load(self, batch: LoadBatch) -> None:
        dev = [p for op in batch.ops for p in op.device_pages]
        host = [p for op in batch.ops for p in op.host_pages]
        nbytes = len(dev) * self.costs.bytes_per_page
        runs = count_runs(dev, host)

        def done(job: Job, batch: LoadBatch = batch) -> None:
            batch.done = True
            self._record(job)

        job = Job("h2d", self.costs.load_fn(nbytes, runs), nbytes, len(dev), runs, "load", done,
                  {"waiters": []})  # fmt: skip
        self._last_load = job
        self.link.submit(job)

    def _wait_all_writes(self) -> None:
        t = self.link.complete_all_now("d2h")
        self._stall_until = max(self._stall_until, t)

    def launch_loads(self) -> Job | None:
        """``ready_to_load_host_cache``: the batch's merged load job, or None."""
        self._last_load = None
        self.start_loading()
        return self._last_load

    def take_stall(self) -> float:
        """Time until which the scheduler is blocked by a write_back wait (then cleared)."""
        t, self._stall_until = self._stall_until, 0.0
        return t


def _trace_requests(trace: Any, page_size: int, rate_scale: float, limit: int) -> list[SimReq]:
    from traces.keys import page_symbols

    out = []
    bs = trace.block_size
    for i, r in enumerate(trace):
        if limit and i >= limit:
            break
        out.append(
            SimReq(
                rid=i,
                arrival=r.timestamp / 1000.0 / rate_scale,
                input_length=r.input_length,
                output_length=max(1, r.output_length),
                symbols=PageKey(page_symbols(r, page_size, bs)),
                session=r.session_id,
                turn=r.turn,
                think_time_s=(r.think_time_ms or 0.0) / 1000.0 / rate_scale,
            )
        )
    return out


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
    ) -> None:
        self.env = simpy.Environment()
        self.recorder = Recorder(timeline_max_rows=timeline_max_rows)
        p = page_size
        self.device = device_pool(device_tokens // p, p)
        self.host = PageAllocator(host_tokens // p, p, "host") if host_tokens else None
        self.link = DuplexLink(self.env, eta={"d2h": costs.eta_d2h, "h2d": costs.eta_h2d},
                               on_change=self._on_link_change)  # fmt: skip
        self.ctrl = SimController(self.device, self.host, self.link, costs, self.recorder)
        self.cache = HiRadixCache(
            self.ctrl,
            write_policy=write_policy,
            eviction_policy=eviction,
            load_back_threshold=load_back_threshold,
        )
        self.sched = Scheduler(self.env, self.cache, costs, sched, self.ctrl, self._finished,
                               self._sample)  # fmt: skip
        self.reqs = reqs
        self.closed_loop = closed_loop
        self.progress = progress
        self._arrived = 0
        self._finished_n = 0
        self.rejected = 0
        self._all_done = self.env.event()
        self._next_turn: dict[Any, list[SimReq]] = {}
        self._open: list[SimReq] = []
        self._bar: Any = None

    # -------------------------------------------------------------------------- arrivals --
    def _plan(self) -> None:
        if self.closed_loop:
            sessions: dict[Any, list[SimReq]] = {}
            for r in self.reqs:
                if r.session is None:
                    self._open.append(r)
                else:
                    sessions.setdefault(r.session, []).append(r)
            for turns in sessions.values():
                turns.sort(key=lambda r: (r.turn or 0, r.rid))
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
            self.rejected += 1
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
        out = r.output_length
        nan = math.nan
        if r.finish < 0:  # rejected at arrival
            ttft = tpot = e2e = queue = nan
            r.device_hit = 0
        else:
            ttft = r.first_token - r.arrival
            tpot = (r.finish - r.first_token) / (out - 1) if out > 1 else nan
            e2e = r.finish - r.arrival
            queue = r.admitted - r.arrival
        self.recorder.add_request(
            (r.rid, r.arrival, r.admitted, r.first_token, r.finish, ttft, tpot, e2e, queue,
             r.prefill_s, r.load_stall_s, r.input_length, out, r.device_hit, r.host_hit,
             r.host_hit_recomputed, r.computed, r.retractions)
        )  # fmt: skip
        nxt = self._next_turn.pop(id(r), None) if r.finish >= 0 else None
        if nxt:
            follower = nxt[0]
            self._next_turn[id(follower)] = nxt[1:]
            delay = follower.think_time_s

            def later(env: simpy.Environment = self.env, f: SimReq = follower) -> Any:
                yield env.timeout(delay)
                self._admit(f)

            self.env.process(later())

    def _on_link_change(self) -> None:
        # a finished copy can unblock admission (pins released at the next check)
        if self.sched.waiting:
            self.sched.wake()

    def _sample(self) -> None:
        c, dev = self.cache, self.device
        free = dev.available_size()
        tree = c.total_size()
        self.recorder.sample(
            (self.env.now, free, c.evictable_size(), c.protected_size(),
             dev.capacity_tokens - free - tree,
             (self.host.capacity_tokens - self.host.available_size()) if self.host else 0,
             len(self.sched.waiting), len(self.sched.running),
             self.link.busy_time("d2h"), self.link.busy_time("h2d"))
        )  # fmt: skip

    # ------------------------------------------------------------------------------- run --
    def run(self) -> float:
        """Simulate until every request has finished; returns the simulated duration."""
        from tqdm import tqdm

        self._plan()
        self._arrived_open = 0
        env = self.env

        def arrivals() -> Any:
            for r in self._open:
                if r.arrival > env.now:
                    yield env.timeout(r.arrival - env.now)
                self._arrived_open += 1
                self._admit(r)

        self.sched.next_arrival = self._next_arrival
        env.process(arrivals())
        env.process(self.sched.run())
        total = len(self.reqs)
        self._bar = tqdm(total=total, desc="requests", unit="req", disable=self.progress is False
                         or None, mininterval=0.5)  # fmt: skip
        try:
            if total:
                try:
                    env.run(until=self._all_done)
                except RuntimeError as e:
                    if self._all_done.triggered:
                        raise
                    s = self.sched
                    raise RuntimeError(
                        f"simulation stalled at t={env.now:.3f}s with {total - self._finished_n} "
                        f"unfinished requests ({len(s.waiting)} waiting, {len(s.running)} "
                        "running): the head request cannot be admitted"
                    ) from e
        finally:
            self._bar.close()
        return float(env.now)


def build_costs(cfg: Any) -> Costs:
    """The latency model for a resolved :class:`hicache.config.SimConfig`."""
    from hicache import latency
    from hicache.config import resolve_pools
    from hicache.hardware import get_gpu, get_model

    model = get_model(cfg.model.name)
    gpu = get_gpu(cfg.gpu.name)
    tp = cfg.model.tp
    _, _, kv_bytes = resolve_pools(cfg)
    prof = latency.load_profile(cfg.run.profile or None, cfg.gpu.name, cfg.link.name)
    backend = cfg.link.io_backend
    d2h = prof.link(backend, "d2h")
    h2d = prof.link(backend, "h2d")
    layers = model.num_layers

    def write_fn(nbytes: int, runs: int) -> float:
        return latency.write_op_time(d2h, nbytes, runs, layers)

    def load_fn(nbytes: int, runs: int) -> float:
        return latency.load_op_time(h2d, nbytes, runs, layers)

    return Costs(
        num_layers=layers,
        bytes_per_page=kv_bytes * cfg.cache.page_size,
        prefill_fn=lambda reqs: latency.prefill_time(model, gpu, prof, reqs, tp),
        decode_fn=lambda bs, kv: latency.decode_step_time(model, gpu, prof, bs, kv, tp),
        write_fn=write_fn,
        load_fn=load_fn,
        eta_d2h=d2h.eta,
        eta_h2d=h2d.eta,
    )


def trace_checksum(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_simulation(
    cfg: Any, trace: Any, out_dir: Path | None = None, progress: bool | None = None
) -> dict[str, Any]:
    """Run ``cfg`` over ``trace``; write the run directory if ``out_dir``; return the summary."""
    from hicache.config import config_to_dict, resolve_pools

    t0 = time.perf_counter()
    device_tokens, host_tokens, _ = resolve_pools(cfg)
    costs = build_costs(cfg)
    ps = cfg.cache.page_size
    reqs = _trace_requests(trace, ps, cfg.workload.rate_scale, cfg.workload.max_requests)
    has_sessions = any(r.session is not None for r in reqs)
    closed = cfg.workload.closed_loop
    closed_loop = has_sessions if closed == "auto" else closed in (True, "true", "on")
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
            "trace": str(getattr(trace, "path", "")),
            "trace_sha256": trace_checksum(Path(trace.path)) if getattr(trace, "path", None)
            else None,
            "closed_loop": closed_loop,
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
    for direction, kind, nbytes, pages, runs, _enq, start, end in engine.recorder.transfers:
        events.append({"ph": "X", "name": kind, "pid": 1, "tid": tids[direction],
                       "ts": start * 1e6, "dur": (end - start) * 1e6,
                       "args": {"bytes": nbytes, "pages": pages, "runs": runs}})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}
