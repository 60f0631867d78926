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
    MatchPrefixParams,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo  # noqa: E402
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

    def __init__(self, *, l3: dict[str, Any], **kwargs: Any) -> None:
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
            },
            **kwargs,
        )
        assert self.cache.enable_storage and self.cc.enable_storage
        self.batch_pages = l3["batch_pages"]
        self.backend = self.cc.storage_backend
        self._suffix = self.backend.config_suffix
        self._read: _Read | None = None
        self._backup: _Backup | None = None
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
        if cache.is_backuped(anchor) or cache.is_root(anchor):
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
        pages = [self.host_pool.get_dummy_flat_data_page() for _ in keys]
        assert self.backend.batch_set(keys, pages)

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
        return {**super().snapshot(), "l3": self.l3_state()}
