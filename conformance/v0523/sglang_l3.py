"""The SGLang 0.5.23 side with the L3 tier: :class:`RealUnifiedCacheL3`, the real
``UnifiedRadixCache`` built by ``init_hicache`` with ``--hicache-storage-backend file`` (its
``--hicache-storage-backend-extra-config`` carrying the prefetch threshold and the timeout
knobs), in a temporary directory.

Only the environment of the cache is replaced, never its code (see ``sglang_side``):

* **threads** -- ``HiCacheController._start_storage_threads`` creates its queues and starts no
  thread; the driver runs the threads' loop bodies one step at a time, calling the controller's
  own methods for the work:
  - :meth:`query_step` is ``prefetch_thread_func``'s body (``_storage_hit_query``, one
    ``batch_exists`` over the span; the MIN over ranks is the identity in one process);
  - :meth:`read_step` is ``prefetch_io_aux_func`` + ``_page_transfer`` one batch at a time
    (``_page_transfer_kv_batch`` of ``batch_pages`` pages, the per-batch ``PrefetchAck``, the
    completion ack; ``prefetch_sync_thread_func``'s reduce is the identity, so acks go straight
    to ``ack_prefetch_queue``). A step makes at most one backend read; batches that need none
    (the op was terminated, or a read came back short) are run in the same step;
  - :meth:`backup_step` is ``backup_thread_func`` + ``_page_backup`` one batch at a time.
* **pinning** -- ``get_dummy_flat_data_page`` allocates without ``pin_memory`` (CUDA only).
* **clock** -- ``PollTimer`` (the timeout policy's timer) reads ``time.perf_counter``; the
  ``poll_timer`` module's ``time`` is replaced by the driver's logical clock.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import types
from array import array
from typing import Any

# first: importing it installs the stubs the sglang modules below need (see sglang_side)
from conformance.v0523 import sglang_side

RealUnifiedCache = sglang_side.RealUnifiedCache

import torch  # noqa: E402
from sglang.srt.managers import cache_controller as _cc  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    CacheRequestHandle,
    InitLoadBackParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolName  # noqa: E402
from sglang.srt.mem_cache.pool_host import mha as _mha_host  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.utils import poll_timer as _poll_timer  # noqa: E402

try:
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import PrefetchAck
except ImportError:  # pragma: no cover - where 0.5.23 defines it
    from sglang.srt.managers.cache_controller import PrefetchAck


class _Clock(types.ModuleType):
    """``time`` for ``poll_timer``: ``perf_counter`` is the driver's logical time."""

    def __init__(self) -> None:
        super().__init__("time")
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        import time

        return getattr(time, name)


CLOCK = _Clock()
_poll_timer.time = CLOCK  # type: ignore[attr-defined]


def _queues_only(self: Any) -> None:
    """``_start_storage_threads`` without the threads (their queues, as the real one makes)."""
    from queue import Queue

    assert self.enable_storage
    self.prefetch_queue = Queue()
    self.backup_queue = Queue()
    self.prefetch_buffer = Queue()
    self.prefetch_sync_queue = Queue()
    self.prefetch_hit_queue = Queue()
    self.ack_prefetch_queue = Queue()
    self.ack_backup_queue = Queue()
    self.host_mem_release_queue = Queue()
    init_extra = getattr(self, "_init_extra_host_mem_release_queues", None)
    if init_extra is not None:
        init_extra()


_cc.HiCacheController._start_storage_threads = _queues_only  # type: ignore[method-assign]


def _no_pinning(pool_cls: Any) -> None:
    """``pin_memory`` needs CUDA: the host pool's staging pages are plain CPU tensors here."""
    real = pool_cls.get_dummy_flat_data_page

    def dummy(self: Any) -> torch.Tensor:
        pinned = self.pin_memory
        self.pin_memory = False
        try:
            return real(self)
        finally:
            self.pin_memory = pinned

    pool_cls.get_dummy_flat_data_page = dummy


def _one_rank() -> None:
    """The storage config reads this process's place in the parallel groups: one rank."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    try:
        _ = par.tp_rank
    except RuntimeError:
        par.override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)


_one_rank()
_no_pinning(_mha_host.MHATokenToKVPoolHost)


class _Read:
    def __init__(self, op: Any) -> None:
        self.op = op
        self.i = 0
        self.ok = True
        self.pages = 0


class _Backup:
    def __init__(self, op: Any) -> None:
        self.op = op
        self.i = 0


class RealUnifiedCacheL3(RealUnifiedCache):
    """The real cache with L3 (see the module docstring). ``l3``: ``prefetch_policy``,
    ``threshold`` (tokens), ``batch_pages``, ``timeout_base``, ``timeout_per_ki_token``."""

    def __init__(
        self, *, l3: dict[str, Any], host_memory_mode: str = "cache", **kwargs: Any
    ) -> None:
        """``host_memory_mode`` ``buffer_only``: ``--hicache-host-memory-mode buffer_only``
        (the real ``BufferModePipeline``; the caller passes the write policy the launch
        resolves, write_back -> write_through)."""
        self.dir = tempfile.mkdtemp(prefix="hicache-l3-")
        extra = {
            "prefetch_threshold": l3["threshold"],
            "prefetch_timeout_base": l3["timeout_base"],
            "prefetch_timeout_per_ki_token": l3["timeout_per_ki_token"],
            "file_storage_path": self.dir,
        }
        super().__init__(
            extra_server_args={
                "hicache_storage_backend": "file",
                "hicache_storage_prefetch_policy": l3["prefetch_policy"],
                "hicache_storage_backend_extra_config": json.dumps(extra),
                "hicache_host_memory_mode": host_memory_mode,
            },
            **kwargs,
        )
        assert self.cache.enable_storage and self.cc.enable_storage
        self.batch_pages = l3["batch_pages"]
        self.backend = self.cc.storage_backend
        self._suffix = self.backend.config_suffix
        self._read: _Read | None = None
        self._backup: _Backup | None = None
        self.bp = self.cache.buffer_pipeline
        assert (self.bp is not None) == (host_memory_mode == "buffer_only")
        #: storage key (hex) -> its token prefix, for the buffer state's beliefs
        self._key_prefix: dict[str, tuple[int, ...]] = {}
        self._reqs: dict[str, Any] = {}
        #: SGLang-side situations a known difference explains (KD-BUF-STALE-OP)
        self.flags: set[str] = set()
        if self.bp is not None:
            real_revoke = self.cache.revoke_pending_prefetch

            def revoke(request: Any) -> None:
                try:
                    real_revoke(request)
                except AssertionError:
                    # unified_radix_cache.py:3005: a revoked request whose current info
                    # holds a bounce allocated for an earlier, revoked operation
                    self.flags.add("stale_op_bounce_revoked")
                    raise

            self.cache.revoke_pending_prefetch = revoke
        CLOCK.now = 0.0

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __del__(self) -> None:
        self.close()

    @staticmethod
    def _h(rid: str) -> CacheRequestHandle:
        return CacheRequestHandle(rid, 0)

    # ----------------------------------------------------------------- scheduler side --
    def prefetch(
        self, rid: str, tokens: list[int], limit: int, now: float, storage_hit_end: int | None
    ) -> dict[str, Any]:
        """``Scheduler._prefetch_kvcache``: ``init_next_round_input``'s match, then
        ``prefetch_from_storage`` anchored at ``last_host_node`` if it is backed up or the
        root (token lists as the request holds them: ``array('q')``, which the tree's key
        match requires)."""
        CLOCK.now = now
        cache, ps = self.cache, self.page_size
        r = cache.match_prefix(MatchPrefixParams(key=self._key(tokens, limit)))
        matched = int(r.device_prefix_len) + int(r.host_hit_length)
        anchor = r.last_host_node
        _, paths = self._tree()
        buffer = self.bp is not None
        if buffer:
            self._register_keys(tokens[:limit])
            if cache.is_root(anchor) and not cache.is_root(r.last_device_node):
                anchor = r.last_device_node  # scheduler.py:3346-3358
        if (
            cache.is_backuped(anchor)
            or cache.is_root(anchor)
            or (buffer and cache.get_last_hash_value(anchor) is not None)
        ):
            cache.prefetch_from_storage(
                self._h(rid),
                anchor,
                array("q", tokens[matched:limit]),
                cache.get_last_hash_value(anchor),
                None,
                matched_prefix_tokens=array("q", tokens[:matched]),
                extra_key=None,
                cache_salt=None,
                storage_hit_end=storage_hit_end,
            )
        assert matched % ps == 0
        return {"best": paths[int(r.best_match_node)], "matched": matched}

    def check_prefetch(self, rid: str, now: float) -> bool:
        CLOCK.now = now
        return bool(self.cache.check_prefetch_progress(self._h(rid)))

    def pop_span(self, rid: str) -> tuple[int, int | None]:
        n, start = self.cache.pop_prefetch_loaded_span(self._h(rid))
        return int(n), (None if start is None else int(start))

    def finish_admission(self, rid: str) -> None:
        self.cache.finish_storage_prefetch_admission(self._h(rid), fulfilled_tokens=0, reason=None)

    def abort(self, rid: str) -> None:
        self.cache.release_aborted_request(self._h(rid))

    def retry_pass(self, waiting: list[Any], interval: int, max_attempts: int) -> list[Any]:
        ready = self.cache.storage_prefetch_retries.pop_ready(waiting, interval, max_attempts)
        return [(r.rid, end) for r, end in ready]

    def cancel_retry(self, rid: str) -> None:
        self.cache.storage_prefetch_retries.cancel(rid)

    # -------------------------------------------------------------------- the threads --
    def query_step(self) -> bool:
        """``prefetch_thread_func``: ops that need no backend call, then at most one query."""
        cc, ps = self.cc, self.page_size
        did = False
        while not cc.prefetch_queue.empty():
            op = cc.prefetch_queue.queue[0]
            call = not op.is_terminated() and not op.assume_stored
            cc.prefetch_queue.get_nowait()
            did = True
            if op.is_terminated():
                hash_value, count = [], 0
            else:
                hash_value, count = cc._storage_hit_query(op)
            op.hash_value = hash_value[: count // ps]
            op.storage_hit_count = count
            cc.prefetch_hit_queue.put(op)
            if call:
                break
        return did

    def _ack(self, op: Any, tokens: int | None, done: bool) -> None:
        ack = PrefetchAck(rid=op.request_id, operation=op)
        if tokens is not None:
            ack.completed_tokens = tokens
        if done:
            ack.completed_req = True
        self.cc.ack_prefetch_queue.put(ack)

    def read_step(self) -> bool:
        """``_page_transfer``: at most one ``batch_get``; batches needing none run too."""
        cc, ps, bp = self.cc, self.page_size, self.batch_pages
        did = called = False
        while True:
            r = self._read
            if r is None:
                if cc.prefetch_buffer.empty() or called:
                    return did
                r = self._read = _Read(cc.prefetch_buffer.get_nowait())
                did = True
            op = r.op
            n = len(op.hash_value)
            while r.i < n:
                if r.ok and op.is_terminated():
                    r.ok = False
                if r.ok:
                    if called:
                        return did
                    batch = op.hash_value[r.i : r.i + bp]
                    slots = op.host_indices[r.i * ps : (r.i + len(batch)) * ps]
                    info = HiCacheStorageExtraInfo(prefix_keys=None)
                    hits = cc._page_transfer_kv_batch(op, batch, slots, info, [])
                    called = did = True
                    if hits != len(batch):
                        r.ok = False
                    r.pages += hits
                self._ack(op, r.pages * ps, False)
                r.i += bp
            self._ack(op, None, True)
            self._read = None
            did = True

    def backup_step(self) -> bool:
        """``_page_backup``: one ``batch_set``; the ack when the op is through or fails."""
        cc, ps, bp = self.cc, self.page_size, self.batch_pages
        b = self._backup
        if b is None:
            if cc.backup_queue.empty():
                return False
            b = self._backup = _Backup(cc.backup_queue.get_nowait())
        op = b.op
        done = True
        if b.i < len(op.hash_value):
            batch = op.hash_value[b.i : b.i + bp]
            slots = op.host_indices[b.i * ps : (b.i + len(batch)) * ps]
            info = HiCacheStorageExtraInfo(prefix_keys=None)
            if cc.page_set_func(batch, slots, info):
                op.completed_tokens += ps * len(batch)
                b.i += len(batch)
                done = b.i >= len(op.hash_value)
        if done:
            self._backup = None
            cc.ack_backup_queue.put(op)
        return True

    def l3_put(self, tokens: list[int]) -> None:
        """Pages another server stored (keys chained from the root, no namespace)."""
        ps = self.page_size
        aligned = tokens[: len(tokens) - len(tokens) % ps]
        if not aligned:
            return
        keys = get_storage_hash_str(RadixKey(array("q", aligned)), None, page_size=ps)
        self._register_keys(aligned)
        pages = [self.host_pool.get_dummy_flat_data_page() for _ in keys]
        assert self.backend.batch_set(keys, pages)

    # ------------------------------------------------------------ buffer_only admission --
    def _register_keys(self, tokens: list[int]) -> None:
        """Remember the token prefix of each page key of ``tokens`` (root-anchored chain, no
        namespace: every key the L3 sequences make)."""
        ps = self.page_size
        aligned = list(tokens[: len(tokens) - len(tokens) % ps])
        if not aligned:
            return
        keys = get_storage_hash_str(RadixKey(array("q", aligned)), None, page_size=ps)
        for j, k in enumerate(keys):
            self._key_prefix.setdefault(k, tuple(aligned[: (j + 1) * ps]))

    def insert(self, tokens: list[int], pages: list[int], **kwargs: Any) -> dict[str, Any]:
        if self.bp is not None:
            self._register_keys(tokens)
        return super().insert(tokens, pages, **kwargs)

    def prepare_staged(self, rid: str, m: dict[str, Any]) -> dict[str, Any]:
        """The admission loop's ``buffer_pipeline.prepare_staged_prefetch(req)`` on a stand-in
        ``Req`` holding what ``init_next_round_input`` left (``m``: the match with the
        ``input_len - 1`` limit); the request is kept for :meth:`staged_load_back`."""
        bp, ps = self.bp, self.page_size
        assert bp is not None
        req = types.SimpleNamespace(
            rid=rid,
            cache_request_handle=self._h(rid),
            prefix_len=len(m["device_pages"]) * ps,
            last_node=self._id(m["last_device"]),
            best_match_node=self._id(m["best"]),
            host_hit_length=int(m["host_hit"]),
            swa_host_hit_length=0,
            mamba_host_hit_length=0,
            auxiliary_swa_host_hit_length=0,
            host_loaded_length=0,
            host_hit_is_storage=False,
            storage_hit_length=0,
            storage_hit_start=None,
            staged_prefetch_plan=None,
            extra_key=None,
            cache_salt=None,
            kv=types.SimpleNamespace(cache_protected_len=0, mamba_pool_idx=None),
        )
        self._reqs.pop(rid, None)
        if not bp.prepare_staged_prefetch(req):
            return {"ready": False}
        pages = self._pages(self.cache.prefix_device_indices(req)) or []
        if req.staged_prefetch_plan is not None:
            self._reqs[rid] = req
        _, paths = self._tree()
        return {
            "ready": True,
            "device_pages": pages,
            "last_device": paths[int(req.last_node)],
            "host_hit": int(req.host_hit_length),
        }

    def defer_staged(self, rid: str) -> None:
        """``_defer_staged_for_capacity_if_idle`` -> ``defer_staged_admission(req, pool)``."""
        assert self.bp is not None
        req = self._reqs.pop(rid, None)
        if req is not None:
            self.bp.defer_staged_admission(req, "prefill_budget")

    def staged_load_back(self, rid: str) -> tuple[list[int], Any] | None:
        """``add_one_req``: under ``_lock_node(req.last_node)``, ``needs_host_load_back`` ->
        under ``_lock_node(req.best_match_node, lock_host=True)`` ``init_load_back(
        InitLoadBackParams(best_match_node, host_hit_length, req=req))``; None: deferred."""
        cache = self.cache
        req = self._reqs.pop(rid)
        key_tokens = [int(t) for t in req.staged_prefetch_plan.key.token_ids]
        outer = cache.lock(req.last_node)
        try:
            best = req.best_match_node
            host_lock = cache.inc_host_lock_ref(best).to_dec_params()
            try:
                inner = cache.lock(best)
                try:
                    loaded = cache.init_load_back(
                        InitLoadBackParams(
                            best_match_node=best,
                            host_hit_length=int(req.host_hit_length),
                            req=req,
                        )
                    )
                finally:
                    cache.unlock(inner)
            finally:
                cache.dec_host_lock_ref(best, host_lock)
        finally:
            cache.unlock(outer)
        if loaded is None:
            return None
        n, node = loaded
        path = cache.path_device_indices(node)
        pages = self._pages(path) or []
        ps = self.page_size
        loaded_pages = pages[len(pages) - int(n) // ps :]
        # the loaded pages' token paths (the Rust core's nodes are read back through them)
        for j, page in enumerate(pages):
            self._dev_path[page] = tuple(key_tokens[: (j + 1) * ps])
        return loaded_pages, self._path(node)

    def buffer_state(self) -> dict[str, Any]:
        bp = self.bp
        assert bp is not None
        _, paths = self._tree()
        beliefs = self.cache.storage_existence_cache.pool(PoolName.KV)

        def kp(k: str) -> Any:
            return self._key_prefix.get(k, "?")

        def p(nid: Any) -> Any:
            return paths.get(int(nid))

        def launched(e: Any) -> tuple[Any, ...]:
            keys = e.keys_by_pool.get(PoolName.KV, [])
            return (p(e.intent.snapshot.node_id), self._pages_of(e.host_indices),
                    int(e.occupied_units), [kp(k) for k in keys])  # fmt: skip

        inflight = list(bp.inflight_backup_pools)
        return {
            "pending_writes": [
                (
                    p(i.snapshot.node_id),
                    len(i.snapshot.key),
                    len(i.keys),
                    p(i.snapshot.parent_node_id),
                )
                for i in bp.pending_write_queue
            ],
            "inflight_nodes": sorted(p(n) for n in inflight if p(n) is not None),
            "inflight_gone": sum(1 for n in inflight if p(n) is None),
            "backlog_tokens": int(bp.write_backlog_tokens_),
            "staged_write_tokens": int(bp.write_staged_tokens_),
            "d2h": sorted((int(a), *launched(e)) for a, e in bp.ongoing_write_through.items()),
            "storage_writes": sorted((launched(e) for e in bp.ongoing_backup.values()), key=repr),
            "believed": [kp(k) for k in beliefs._entries],
            "believed_inflight": sorted((kp(k), int(n)) for k, n in beliefs._inflight.items()),
            "parked": [op.request_id for op in bp.pending_hit_allocs],
            "prefix_ctx": sorted((h.rid, len(c[0])) for h, c in bp._prefetch_prefix_ctx.items()),
            "staged": sorted(
                (
                    h.rid,
                    int(f.matched_len),
                    int(f.num_tokens),
                    int(f.occupied_tokens),
                    self._pages_of(f.host_indices),
                    [kp(k) for k in f.hash_values],
                )
                for h, f in bp.staged_prefetches.items()
            ),
            "defers": sorted((h.rid, int(n)) for h, n in bp._staged_admission_defers.items()),
            "load_backs": sorted(
                (
                    lb.request.rid,
                    int(lb.num_tokens),
                    int(lb.occupied_tokens),
                    self._pages_of(lb.host_indices),
                    self._pages_of(lb.device_indices),
                )
                for lb in bp.ongoing_buffer_load_back.values()
            ),
            "anchor_locks": sorted(
                (h.rid, p(lk.node_id), int(lk.tokens)) for h, lk in bp.anchor_locks.items()
            ),
            "anchor_locked_tokens": int(bp.anchor_locked_tokens_),
        }

    # ------------------------------------------------------------------------- state --
    def _pages_of(self, slots: Any) -> list[int] | None:
        if slots is None:
            return None
        if isinstance(slots, torch.Tensor):
            return self._pages(slots)
        return self._pages(torch.tensor(list(slots), dtype=torch.int64))

    def l3_state(self) -> dict[str, Any]:
        cache, cc = self.cache, self.cc
        _, paths = self._tree()
        ongoing = []
        for h, info in cache.ongoing_prefetch.items():
            op = info.operation
            ongoing.append(
                (
                    h.rid,
                    paths.get(int(info.anchor_node_id)),
                    len(info.prefetch_key),
                    self._pages_of(info.host_indices),
                    int(op.completed_tokens),
                    op.is_terminated(),
                    int(op.storage_hit_count),
                )
            )
        read = []
        if self._read is not None:
            read.append((self._read.op.request_id, self._read.i, self._read.pages))
        read += [(op.request_id, 0, 0) for op in cc.prefetch_buffer.queue]
        backup = []
        if self._backup is not None:
            backup.append((len(self._backup.op.hash_value), self._backup.i))
        backup += [(len(op.hash_value), 0) for op in cc.backup_queue.queue]
        release: list[int] = []
        for slots in cc.host_mem_release_queue.queue:
            release += self._pages_of(slots) or []
        waits = sorted(
            (h.rid, w.timer.started_at, float(w.timeout_s), bool(w.expired))
            for h, w in cache._storage_prefetch_wait.items()
        )
        retries = sorted(
            (rid, r.immediate, r.storage_hit_end, r.due_step)
            for rid, r in cache.storage_prefetch_retries._pending.items()
        )
        store = sum(1 for f in os.listdir(self.dir) if self._suffix in f)
        return {
            "ongoing_prefetch": sorted(ongoing),
            "occupied": int(cc.prefetch_tokens_occupied),
            "query_queue": [(op.request_id, len(op.token_ids)) for op in cc.prefetch_queue.queue],
            "hit_queue": [
                (op.request_id, int(op.storage_hit_count)) for op in cc.prefetch_hit_queue.queue
            ],
            "read_queue": read,
            "ack_queue": [
                (a.operation.request_id, a.completed_tokens, bool(a.completed_req))
                for a in cc.ack_prefetch_queue.queue
            ],
            "backup_queue": backup,
            "ack_backup": cc.ack_backup_queue.qsize(),
            "ongoing_backup": sorted(
                paths.get(int(n)) or () for n, _ in cache.ongoing_backup.values()
            ),
            "release_queue": release,
            "waits": waits,
            "retries": retries,
            "retry_step": cache.storage_prefetch_retries._step,
            "loaded": sorted(
                (h.rid, int(v)) for h, v in cache.prefetch_loaded_tokens_by_reqid.items()
            ),
            "loaded_start": sorted(
                (h.rid, int(v)) for h, v in cache.prefetch_loaded_storage_start_by_reqid.items()
            ),
            "store_pages": store,
        }

    def snapshot(self) -> dict[str, Any]:
        out = {**super().snapshot(), "l3": self.l3_state()}
        if self.bp is not None:
            out["buffer"] = self.buffer_state()
        return out
