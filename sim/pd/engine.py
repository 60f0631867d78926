"""A PD cluster in one SimPy environment: prefill servers, decode servers, the KV links, the
routers, the arrivals (open or closed loop) and each request's way through them.

A request, at its arrival (the gateway's PD mode sends it to a prefill and a decode server at
once, each picked by its own router):

1. decode server: into its prealloc queue (:class:`~sim.pd.decode_side.DecodeRole`);
   pre-allocated when its KV fits;
2. prefill server: bootstrapped ``bootstrap_s`` after the pre-allocation (plus the pair's
   one-time ``handshake_s``), it enters the prefill server's waiting queue
   (``pop_bootstrapped``: only a request whose decode side sent its KV indices,
   ``KVPoll.WaitingForInput``, prefill.py:497-558), and is prefilled there with that server's
   HiCache as without PD, for one output token (``max_new_tokens = 1``, prefill.py:478-482);
3. its KV goes over the prefill server's link (:mod:`sim.pd.transfer`) into the pages
   pre-allocated for it;
4. decode server: merged into the running batch (its first token streamed), decoded to the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import Any

import simpy

from hicache.lifecycle import PagedTrace
from hicache.output_keys import no_output_keys
from hicache.policy.radix import PageKey
from sim.engine import close_loops
from sim.instance import Instance
from sim.pd.decode_cache import RadixDecodeRole
from sim.pd.decode_side import DecodeRole
from sim.pd.offload import DecodeOffload
from sim.pd.request import PdReq
from sim.pd.transfer import KvLinks, TransferCost, transfer_chunks
from sim.routers import Router
from sim.scheduler import SimReq


@dataclass(frozen=True)
class RoleSpec:
    """What builds one role's instances (``Instance``'s keyword arguments but the callbacks)."""

    instances: int
    kwargs: dict[str, Any]


class PdEngine:
    """One PD simulation. ``paged``/``keys``/``aborted``: the requests (as
    :class:`sim.engine.SimReqSource` takes them); ``rank_bytes``: KV bytes per token that one
    link carries; ``chunk_size``: the prefill role's ``chunked_prefill_size``."""

    def __init__(
        self,
        paged: PagedTrace,
        keys: Callable[[int], PageKey],
        *,
        prefill: RoleSpec,
        decode: RoleSpec,
        routers: tuple[Router, Router],
        cost: TransferCost,
        rank_bytes: int,
        chunk_size: int,
        reserved_decode_tokens: int,
        closed_loop: bool,
        aborted: frozenset[int] = frozenset(),
        decode_radix_cache: bool = False,
        outs: Callable[[int], list[Hashable]] = no_output_keys,
        offload: Callable[[simpy.Environment, Instance, int], DecodeOffload] | None = None,
        retraction_backup: str = "host_pool",
    ) -> None:
        self.env = simpy.Environment()
        env = self.env
        self.paged, self.keys, self.aborted = paged, keys, aborted
        self.outs = outs  # the decode side's output page symbols (workload.output_reuse)
        self.prefill = [
            Instance(env, i, on_finished=self._prefill_done, next_arrival=_never,
                     **prefill.kwargs)
            for i in range(prefill.instances)
        ]  # fmt: skip
        decode_insts = [
            Instance(env, i, on_finished=self._decode_done, next_arrival=_never,
                     **decode.kwargs)
            for i in range(decode.instances)
        ]  # fmt: skip
        role = RadixDecodeRole if decode_radix_cache else DecodeRole
        self.decode = [role(d, reserved_decode_tokens, self._preallocated, retraction_backup)
                       for d in decode_insts]  # fmt: skip
        for d in self.decode:
            if isinstance(d, RadixDecodeRole):
                d.on_failed = self._restore_failed
        # the decode servers' KV offload managers (pd.decode_offload_kvcache)
        self.offloads = [offload(env, d, i) for i, d in enumerate(decode_insts)] if offload else []
        # each role's L3 setup (sim.pd.run.role_storage; for the summary), set by the builder
        self.storage_setups: tuple[Any, Any] = (None, None)
        for inst in self.prefill:  # arrivals come unannounced (after their bootstrap)
            inst.sched.announced = inst.sched.span_ok = False
        self.routers = routers
        self.links = KvLinks(env, prefill.instances)
        self.cost = cost
        self.rank_bytes = rank_bytes
        self.page_size = int(prefill.kwargs["page_size"])
        self.chunk_size = chunk_size
        self.closed_loop = closed_loop
        self.records: list[PdReq] = []
        self._of_pre: dict[int, PdReq] = {}  # id(SimReq) -> its PD request, per role
        self._of_dec: dict[int, PdReq] = {}
        self._paired: set[tuple[int, int]] = set()
        self._total = len(paged)
        self._ended = 0
        self._all_done = env.event()
        self._next_turn: dict[int, list[int]] = {}

    # -------------------------------------------------------------------- arrivals --
    def _build(self, i: int) -> PdReq:
        p = self.paged[i]
        pre = SimReq(p, keys=self.keys, aborted=i in self.aborted)
        pre.output_length = 1  # the prefill server stops at the first token
        dec = SimReq(p, keys=self.keys, out_symbols=self.outs(i))
        return PdReq(pre, dec, arrival=self.env.now, out_symbols=dec.out_symbols)

    def _arrive(self, i: int) -> None:
        r = self._build(i)
        self.records.append(r)
        now = self.env.now
        r.pre.arrival = r.dec.arrival = now
        r.prefill = self.routers[0].route(r.pre.with_symbols(), self.prefill, now)
        r.decode = self.routers[1].route(r.dec.with_symbols(), [d.inst for d in self.decode],
                                         now)  # fmt: skip
        self.prefill[r.prefill].routed += 1
        dec = self.decode[r.decode]
        ps = self.page_size
        need = -(-(r.dec.input_length + r.dec.output_length) // ps) * ps + dec.reserved
        if r.pre.aborted or need > dec.inst.device.capacity_tokens:
            # its KV and the reserve could never fit the decode pool, even alone: SGLang
            # aborts only a prompt over the pool (decode.py:962-997) and would leave this one
            # waiting forever at pre-allocation or resumption; it is rejected here
            r.rejected = True
            self.prefill[r.prefill].done += 1
            self._end(r)
            return
        self._of_pre[id(r.pre)] = r
        self._of_dec[id(r.dec)] = r
        dec.add(r)

    def _plan(self) -> list[tuple[float, int]]:
        """(arrival time, index) of the requests that arrive by their timestamp: all of them
        in open loop; in closed loop each session's first turn (the others follow)."""
        times = self.paged.arrivals
        if not self.closed_loop:
            return sorted((times[i], i) for i in range(len(times)))
        sessions: dict[Any, list[int]] = {}
        first: list[tuple[float, int]] = []
        for i in range(len(times)):
            s = self.paged[i].session
            if s is None:
                first.append((times[i], i))
            else:
                sessions.setdefault(s, []).append(i)
        for turns in sessions.values():
            turns.sort(key=lambda j: (self.paged[j].turn or 0, j))
            first.append((times[turns[0]], turns[0]))
            self._next_turn[turns[0]] = turns[1:]
        return sorted(first)

    def _arrivals(self, plan: list[tuple[float, int]]) -> Generator[simpy.Event, Any, None]:
        for t, i in plan:
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self._arrive(i)

    # ----------------------------------------------------------------- the way through --
    def _preallocated(self, r: PdReq) -> None:
        """Its decode pages are reserved: the prefill server sees it bootstrapped after the
        indices' message (and, first for this pair, the handshake)."""
        delay = self.cost.bootstrap_s
        pair = (r.prefill, r.decode)
        if pair not in self._paired:
            self._paired.add(pair)
            delay += self.cost.handshake_s
        self.env.process(self._bootstrap(r, delay))

    def _bootstrap(self, r: PdReq, delay: float) -> Generator[simpy.Event, Any, None]:
        if delay > 0:
            yield self.env.timeout(delay)
        r.bootstrap_s = self.env.now
        inst, pre = self.prefill[r.prefill], r.pre
        pre.arrival = self.env.now  # the prefill server's waiting queue takes it now
        need = pre.input_length + pre.output_length + inst.sched.p.page_size
        if pre.aborted or need >= inst.device.capacity_tokens:
            inst._finished(pre)  # rejected (Instance.admit's rule)
            return
        inst.sched.arrive(pre)

    def _prefill_done(self, pre: SimReq) -> None:
        r = self._of_pre.pop(id(pre))
        if pre.finish < 0:  # rejected by its prefill server
            r.rejected = True
            self._of_dec.pop(id(r.dec), None)
            self.decode[r.decode].cancel(r)
            self._end(r)
            return
        ps = self.page_size
        # whole pages past the prefix the decode side holds (_num_pages_to_send; 0 without
        # the decode radix cache)
        pages = -(-(pre.input_length - r.decode_prefix) // ps)
        r.transfer_bytes = pages * ps * self.rank_bytes
        r.transfer_bytes_saved = -(-pre.input_length // ps) * ps * self.rank_bytes - (
            r.transfer_bytes
        )
        extend = pre.input_length - max(pre.device_hit, 0)
        r.transfer_chunks = transfer_chunks(
            extend, max(pre.device_hit, 0), self.chunk_size, r.decode_prefix, ps
        )
        seconds = self.cost.seconds(r.transfer_bytes, r.transfer_chunks)

        def started(t: float) -> None:
            r.transfer_start_s = t

        def done(t: float) -> None:
            r.transfer_end_s = t
            self.decode[r.decode].kv_arrived(r)

        self.links.send(r.prefill, seconds, started, done)

    def _restore_failed(self, r: PdReq) -> None:
        """The decode server aborted ``r``: its promised L3 prefix could not be restored
        (sim.pd.decode_l3); it ends without a first token."""
        self._of_dec.pop(id(r.dec), None)
        self._end(r)

    def _decode_done(self, dec: SimReq) -> None:
        r = self._of_dec.pop(id(dec))
        self.decode[r.decode].finished(dec)
        if self.offloads:
            self.offloads[r.decode].finished(
                self.keys(r.rid), r.out_symbols, dec.input_length, dec.output_length
            )
        r.finish_s = self.env.now
        self._end(r)

    def _end(self, r: PdReq) -> None:
        self._ended += 1
        if self._ended == self._total:
            self._all_done.succeed()
        # a rejected turn's follower still comes (the client goes on; every turn counts in
        # _total, so the run would otherwise never end), as in sim.engine
        nxt = self._next_turn.pop(r.rid, None)
        if nxt:
            follower = nxt[0]
            self._next_turn[follower] = nxt[1:]
            delay = self.paged[follower].think_time_s
            self.env.process(self._later(follower, delay))

    def _later(self, i: int, delay: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(delay)
        self._arrive(i)

    # ------------------------------------------------------------------------- run --
    def run(self) -> float:
        """Simulate until every request has ended; returns the simulated duration."""
        env = self.env
        env.process(self._arrivals(self._plan()))
        loops = [env.process(inst.sched.run()) for inst in self.prefill]
        loops += [env.process(d.inst.sched.run()) for d in self.decode]
        try:
            if self._total:
                try:
                    env.run(until=self._all_done)
                except RuntimeError as e:
                    if self._all_done.triggered:
                        raise
                    raise RuntimeError(self._stall_message()) from e
        finally:
            close_loops(loops)  # a compiled loop left waiting would keep this engine alive
            for inst in [*self.prefill, *(d.inst for d in self.decode)]:
                inst.release()
        return float(env.now)

    def _stall_message(self) -> str:
        queues = ", ".join(
            f"decode {i}: {len(d.queue)} pre-allocating, {len(d.transfer)} in transfer, "
            f"{len(d.retracted)} retracted, {len(d.inst.sched.running)} running"
            for i, d in enumerate(self.decode)
        )
        return (
            f"PD simulation stalled at t={self.env.now:.3f}s with "
            f"{self._total - self._ended} unfinished requests ({queues})"
        )

    def role_frames(self, role: str, *, take: bool = False) -> dict[str, Any]:
        """The role's instance tables, with an ``instance`` column (as a fleet's)."""
        import pandas as pd

        insts = self.prefill if role == "prefill" else [d.inst for d in self.decode]
        parts = [inst.recorder.frames(take=take) for inst in insts]
        out: dict[str, Any] = {}
        for name in parts[0]:
            dfs = [f[name].assign(instance=i) for i, f in enumerate(parts)]
            full = [d for d in dfs if len(d)]
            out[name] = pd.concat(full, ignore_index=True) if len(full) > 1 else (full or dfs)[0]
        req = out["requests"]
        if len(req) and not req["rid"].is_monotonic_increasing:
            out["requests"] = req.sort_values("rid", kind="stable").reset_index(drop=True)
        return out


def _never() -> float:
    return math.inf
