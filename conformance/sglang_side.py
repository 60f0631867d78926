"""The SGLang side: the real ``sglang.srt.mem_cache.hiradix_cache.HiRadixCache`` on CPU.

Only the environment around the class is replaced, never its code:

* **pools** -- :class:`StubPool` hands out token-slot tensors page by page, in exactly the order
  our ``PageAllocator`` does (device: freed pages first at page size > 1, FIFO at page size 1;
  host: FIFO), so page ids compare one to one. It also notices double frees (a flag, see
  ``known_differences``).
* **controller** -- :class:`ManualStubController` stands in for ``HiCacheController``: it
  reserves pages synchronously like the real one, queues one ack per write and one merged ack
  per ``start_loading``, and finishes copies only when the driver says so; the cache's own
  ``writing_check`` / ``loading_check`` then pop finished acks from the FIFO front.
* **clock** -- the ``time`` seen by ``radix_cache`` and ``hiradix_cache`` is a logical clock:
  every ``time.monotonic()`` read in ``hiradix_cache`` (each touch) takes the next tick, and the
  two reads in ``TreeNode.__init__`` (last access, then creation) share one tick, which is our
  core's rule (a new node is one touch). Ticks therefore compare exactly, not just in order.
* **construction** -- the real ``HiRadixCache.__init__`` runs, with ``HiCacheController`` and
  the host-pool factory in its module replaced by the stubs above, a world size of 1, and
  ``atexit`` registration disabled (thousands of caches are built per run).

On an L3 configuration (``cfg.prefetch_policy`` set) the cache is built with
``hicache_storage_backend="file"`` and the L3 knobs in the extra config (parsed by the real
``_parse_storage_backend_extra_config``), so every tree-side storage method is the real one, and
the controller is :class:`StorageStubController`: the manual controller plus
``HiCacheController``'s storage half with its three threads replaced by steps the driver takes:

* the real ``HiCacheController`` methods ``prefetch``, ``terminate_prefetch``,
  ``append_host_mem_release``, ``prefetch_rate_limited``, ``write_storage``,
  ``_storage_hit_query``, ``_generic_page_get`` and ``_generic_page_set`` run unchanged on the
  stub's attributes, with the real ``PrefetchOperation`` / ``StorageOperation``;
* the thread functions (``prefetch_thread_func``, ``prefetch_io_aux_func``,
  ``backup_thread_func``) and the batch loops of ``_page_transfer`` / ``_page_backup`` are
  reproduced line by line, one backend call per step (``query_step`` calls the real
  ``_storage_hit_query`` on a one-batch view of the operation; every completed query is checked
  against the real ``_storage_hit_query`` on the whole operation when no backup wrote since it
  started); ``STORAGE_BATCH_SIZE`` is patched to the configuration's batch size;
* the backend is the real ``HiCacheFile`` in a temporary directory (its files are the L3
  content); the host pool stub serves flat data pages (``get_data_page`` / ``set_from_flat_
  data_page``);
* seconds: ``PrefetchOperation.start_time`` (``cache_controller``'s ``time.monotonic``) and the
  timeout check (``_prefetch_timeout_check_linear_func``'s ``time.monotonic``) read the driver's
  logical seconds, while every other ``time.monotonic`` read in ``hiradix_cache`` stays an LRU
  tick.

Everything imported here is heavy (torch, sglang): this module is only imported inside
``.venv-conformance``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import threading
import time
import types
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from queue import Queue
from typing import Any

import torch

from conformance import import_stubs
from conformance.driver import MatchView, Node, Side, State, node_label
from conformance.ops import Config, run_length

import_stubs.install()

from sglang.srt.managers import cache_controller as _cc  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as _hs  # noqa: E402
from sglang.srt.mem_cache import hiradix_cache as _hr  # noqa: E402
from sglang.srt.mem_cache import radix_cache as _rc  # noqa: E402
from sglang.srt.mem_cache import utils as _mu  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402

import_stubs.check_real()
# load_back's "FAILED to load" warnings are expected here, thousands of times
logging.getLogger("sglang").setLevel(logging.ERROR)
torch.set_num_threads(1)


def sglang_version() -> str:
    import sglang

    return str(getattr(sglang, "__version__", "unknown"))


# ------------------------------------------------------------------------------------ clock --
class LogicalClock:
    """One counter; ``tick`` returns the next value. Reset per cache (our core starts at 0)."""

    def __init__(self) -> None:
        self.now = 0

    def tick(self) -> int:
        self.now += 1
        return self.now


class _ClockedTime(types.ModuleType):
    """A stand-in for the ``time`` module inside one SGLang module: ``monotonic`` reads the
    logical clock, everything else is the real ``time``. With ``pair_reads_per_frame``, a
    second read from the same stack frame (``TreeNode.__init__`` reads twice) gets the same
    tick as the first."""

    def __init__(self, clock: LogicalClock, pair_reads_per_frame: bool) -> None:
        super().__init__("time")
        self._clock = clock
        self._pair = pair_reads_per_frame
        self._frame: Any = None

    def monotonic(self) -> float:
        if self._pair:
            frame = sys._getframe(1)
            if frame is self._frame:
                self._frame = None
                return self._clock.now
            self._frame = frame
        return self._clock.tick()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class Seconds:
    """The driver's clock in seconds (L3 prefetch start times and timeouts)."""

    now = 0.0


class _SecondsTime(types.ModuleType):
    """``time`` inside ``cache_controller``: ``monotonic`` is :class:`Seconds`."""

    def __init__(self) -> None:
        super().__init__("time")

    def monotonic(self) -> float:
        return Seconds.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _HiradixTime(_ClockedTime):
    """``time`` inside ``hiradix_cache``: an LRU tick per read, except in the prefetch timeout
    check, which reads :class:`Seconds` (the one ``time.monotonic`` there that means seconds)."""

    def monotonic(self) -> float:
        if sys._getframe(1).f_code is _TIMEOUT_CODE:
            return Seconds.now
        return self._clock.tick()


_TIMEOUT_CODE = _hr.HiRadixCache._prefetch_timeout_check_linear_func.__code__
CLOCK = LogicalClock()
_rc.time = _ClockedTime(CLOCK, pair_reads_per_frame=True)  # type: ignore[assignment]
_hr.time = _HiradixTime(CLOCK, pair_reads_per_frame=False)  # type: ignore[assignment]
_cc.time = _SecondsTime()  # type: ignore[assignment]


# ----------------------------------------------------------------------- L3 key -> prefix --
#: page key (SHA-256 hex) -> the token prefix it stands for; None is the empty prefix. Filled by
#: recording wrappers around the two places keys are computed (the controller's
#: ``get_hash_str`` and ``hiradix_cache.compute_node_hash_values``); only observes. Cleared when
#: an L3 side is built (one SGLang side is alive at a time).
PREFIX: dict[str | None, tuple[int, ...]] = {None: ()}


def _remember(key: str, prior: str | None, tokens: Any) -> None:
    if key not in PREFIX:
        PREFIX[key] = PREFIX[prior] + tuple(int(t) for t in tokens)


def _recording_hash_str(token_ids: Any, prior_hash: str | None = None) -> str:
    key: str = _mu.get_hash_str(token_ids, prior_hash)
    _remember(key, prior_hash, token_ids)
    return key


_real_compute_node_hash_values = _hr.compute_node_hash_values


def _recording_compute_node_hash_values(node: Any, page_size: int) -> list[str]:
    values: list[str] = _real_compute_node_hash_values(node, page_size)
    prior = None
    parent = node.parent
    hv = None if parent is None else parent.hash_value
    if hv is not None and len(parent.key) > 0 and len(hv) > 0:
        prior = hv[-1]
    tokens = node.key.token_ids
    for i, key in enumerate(values):
        _remember(key, prior, tokens[i * page_size : (i + 1) * page_size])
        prior = key
    return values


_hr.compute_node_hash_values = _recording_compute_node_hash_values


def prefix_label(keys: Any) -> str:
    """The token prefix a page-key list ends with."""
    return run_length(PREFIX[keys[-1]]) if keys else ""


_hr.atexit = types.SimpleNamespace(register=lambda *a, **k: None)  # type: ignore[assignment]


# ------------------------------------------------------------------------------------ pools --
class StubPool:
    """A page pool that speaks token slots (what SGLang's allocators return) but hands pages out
    in ``PageAllocator`` order: take from the head; free appends at the tail (FIFO) or, with
    ``front``, puts the freed batch sorted and de-duplicated at the head."""

    device = "cpu"

    def __init__(self, side: Side, name: str, num_pages: int, page_size: int, front: bool):
        self.side = side
        self.name = name
        self.num_pages = num_pages
        self.page_size = page_size
        self.front = front
        self.free_pages: list[int] = list(range(num_pages))
        self.kv_cache: Any = None
        self.size = num_pages * page_size
        self.data = torch.zeros(num_pages * page_size, dtype=torch.uint8)

    # token slots <-> page ids
    def to_slots(self, pages: list[int]) -> torch.Tensor:
        ps = self.page_size
        return torch.tensor([p * ps + j for p in pages for j in range(ps)], dtype=torch.int64)

    def to_pages(self, slots: Any) -> list[int]:
        ps = self.page_size
        flat = [int(x) for x in (slots.tolist() if hasattr(slots, "tolist") else slots)]
        pages = [flat[i] // ps for i in range(0, len(flat), ps)]
        if flat != [p * ps + j for p in pages for j in range(ps)]:
            raise AssertionError(f"{self.name}: slots are not whole pages: {flat}")
        return pages

    # the allocator interface SGLang uses
    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            raise AssertionError(f"{self.name}: alloc of {need_size} is not page-aligned")
        n = need_size // self.page_size
        if n > len(self.free_pages):
            return None
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return self.to_slots(pages)

    def free(self, free_index: Any) -> None:
        pages = self.to_pages(free_index)
        free_now = set(self.free_pages)
        if any(p in free_now for p in pages) or len(set(pages)) != len(pages):
            self.side.flag(f"{self.name}_double_free")
        if self.front:
            self.free_pages = sorted(set(pages)) + self.free_pages
        else:
            self.free_pages += pages

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def clear(self) -> None:
        self.free_pages = list(range(self.num_pages))

    def get_kvcache(self) -> Any:
        return self.kv_cache

    # flat data pages, what the generic storage page get/set use (one byte per token slot)
    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_size, dtype=torch.uint8)

    def get_data_page(self, index: Any, flat: bool = True) -> torch.Tensor:
        i = int(index)
        return self.data[i : i + self.page_size].clone()

    def set_from_flat_data_page(self, index: Any, data_page: torch.Tensor) -> None:
        i = int(index)
        self.data[i : i + self.page_size] = data_page


# ------------------------------------------------------------------------------- controller --
class _Event:
    """A copy's finish event: done only when the driver (or a blocking wait) says so."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def record(self) -> None:
        pass


class ManualStubController:
    """Takes ``HiCacheController`` 's constructor arguments and its L1/L2 interface."""

    def __init__(
        self,
        token_to_kv_pool_allocator: StubPool,
        mem_pool_host: StubPool,
        page_size: int,
        tp_group: Any = None,
        write_policy: str = "write_through_selective",
        **kwargs: Any,
    ) -> None:
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_host = mem_pool_host
        self.page_size = page_size
        self.write_policy = write_policy
        self.enable_storage = False
        self.write_queue: list[Any] = []
        self.load_queue: list[tuple[int, Any, Any]] = []
        self.ack_write_queue: list[tuple[_Event, _Event, list[int]]] = []
        self.ack_load_queue: list[tuple[_Event, _Event, list[int]]] = []
        self._producer = -1

    def write(
        self, device_indices: Any, priority: int | None = None, node_id: int = -1, **extra: Any
    ) -> Any:
        host = self.mem_pool_host.alloc(len(device_indices))
        if host is None:
            return None
        self.ack_write_queue.append((_Event(), _Event(), [node_id]))
        return host

    def load(
        self, host_indices: Any, priority: int | None = None, node_id: int = -1, **extra: Any
    ) -> Any:
        device = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device is None:
            return None
        self.load_queue.append((node_id, host_indices, device))
        return device

    def start_loading(self) -> int:
        if not self.load_queue:
            return -1
        self._producer = (self._producer + 1) % 3
        node_ids = [node_id for node_id, _, _ in self.load_queue]
        self.load_queue.clear()
        self.ack_load_queue.append((_Event(), _Event(), node_ids))
        return self._producer

    def evict_device(self, device_indices: Any) -> int:
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices: Any, backup_only: bool = True) -> int:
        self.mem_pool_host.free(host_indices)
        return len(host_indices)

    def reset(self) -> None:
        self.write_queue.clear()
        self.load_queue.clear()
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()

    # what the driver calls (ManualController's counterparts)
    @staticmethod
    def _finish(queue: list[tuple[_Event, _Event, list[int]]], count: int | None) -> int:
        n = 0
        for _, finish, _ in queue:
            if count is not None and n >= count:
                break
            if not finish.done:
                finish.done = True
                n += 1
        return n

    def finish_writes(self, count: int | None) -> int:
        return self._finish(self.ack_write_queue, count)

    def finish_loads(self, count: int | None) -> int:
        return self._finish(self.ack_load_queue, count)


class _Stage:
    """An operation a storage stage is working on, and where in it (tokens or pages)."""

    def __init__(self, op: Any, last_hash: str | None = None) -> None:
        self.op = op
        self.pos = 0
        self.last_hash = last_hash
        self.hash_value: list[str] = []
        self.count = 0
        self.writes_at_start = 0


_HCC = _cc.HiCacheController


class StorageStubController(ManualStubController):
    """:class:`ManualStubController` plus ``HiCacheController``'s storage half (see the module
    docstring): real methods on the stub's attributes, threads replaced by driver steps."""

    # the real methods, unchanged
    prefetch = _HCC.prefetch
    terminate_prefetch = _HCC.terminate_prefetch
    append_host_mem_release = _HCC.append_host_mem_release
    prefetch_rate_limited = _HCC.prefetch_rate_limited
    _storage_hit_query = _HCC._storage_hit_query
    _generic_page_get = _HCC._generic_page_get
    _generic_page_set = _HCC._generic_page_set
    write_storage = _HCC.write_storage

    def __init__(
        self,
        token_to_kv_pool_allocator: StubPool,
        mem_pool_host: StubPool,
        page_size: int,
        tp_group: Any = None,
        write_policy: str = "write_through_selective",
        *,
        side: Side,
        storage_dir: str,
        storage_backend: str | None = None,
        prefetch_threshold: int = 256,
        model_name: str | None = None,
        storage_backend_extra_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            token_to_kv_pool_allocator, mem_pool_host, page_size, tp_group, write_policy
        )
        self.side = side
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.storage_dir = storage_dir
        self.req_ns: dict[str, str | None] = {}
        """request id -> its extra key (KD-L3-EXTRA-KEY flags)."""
        self.written_ns: dict[str, set[str | None]] = {}
        """page key -> the extra keys of the nodes whose backups wrote it."""
        self.writes = 0
        self._query: _Stage | None = None
        self._read: _Stage | None = None
        self._backup: _Stage | None = None
        self._resetting = False
        if storage_backend is not None:
            self._attach(
                storage_backend, prefetch_threshold, model_name, storage_backend_extra_config
            )

    def _attach(
        self,
        storage_backend: str,
        prefetch_threshold: int,
        model_name: str | None,
        extra_config: dict[str, Any] | None,
    ) -> None:
        """``attach_storage_backend`` for the file backend, without starting threads."""
        self.storage_backend_type = storage_backend
        self.get_hash_str = _recording_hash_str
        self.storage_config = _hs.HiCacheStorageConfig(
            tp_rank=0,
            tp_size=1,
            pp_rank=0,
            pp_size=1,
            attn_cp_rank=0,
            attn_cp_size=1,
            is_mla_model=False,
            enable_storage_metrics=False,
            is_page_first_layout=True,
            model_name=model_name,
            extra_config=extra_config,
        )
        self.backup_skip = False
        self.storage_backend = _hs.HiCacheFile(self.storage_config, file_path=self.storage_dir)
        self.storage_backend.register_mem_pool_host(self.mem_pool_host)
        self.enable_storage = True
        self.prefetch_threshold = max(prefetch_threshold, self.page_size)
        self.prefetch_capacity_limit = max(
            0, int(0.8 * (self.mem_pool_host.size - self.mem_pool_device.size))
        )
        self.prefetch_tokens_occupied = 0
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.has_draft = False
        # _start_storage_threads' queues (prefetch_thread_func makes the prefetch buffer)
        self.prefetch_queue: Queue[Any] = Queue()
        self.backup_queue: Queue[Any] = Queue()
        self.prefetch_revoke_queue: Queue[Any] = Queue()
        self.ack_backup_queue: Queue[Any] = Queue()
        self.host_mem_release_queue: Queue[Any] = Queue()
        self.prefetch_buffer: Queue[Any] = Queue()
        self._suffix = self.storage_backend.config_suffix + ".bin"

    # -- prefetch_thread_func, one batch_exists per step ---------------------------------------
    def query_step(self) -> bool:
        q = self._query
        if q is None:
            if self.prefetch_queue.empty():
                return False
            op = self.prefetch_queue.get_nowait()
            q = self._query = _Stage(op, op.last_hash)
            q.writes_at_start = self.writes
        op = q.op
        tokens = op.token_ids
        end = min(q.pos + self.page_size * _cc.STORAGE_BATCH_SIZE, len(tokens))
        view = _copy_op(op)
        view.token_ids = tokens[q.pos : end]
        view.last_hash = q.last_hash
        view.prefix_keys = None
        hashes, count = self._storage_hit_query(view)  # the real code, one batch
        if not self._resetting:
            # a page our side keeps in another namespace (or, root anchor: the request's own
            # namespace dropped from the key) -- KD-L3-EXTRA-KEY
            ns = self.req_ns.get(op.request_id)
            if any(ns not in self.written_ns.get(k, ()) for k in hashes):
                self.side.flag("l3_cross_namespace_hit")
        q.hash_value.extend(hashes)
        q.count += count
        full = count == end - q.pos
        q.pos = end
        if hashes:
            q.last_hash = hashes[-1]
        if full and end < len(tokens):
            return True
        self._query = None
        if q.writes_at_start == self.writes:  # the loop above must be _storage_hit_query's
            real = self._storage_hit_query(op)
            assert real == (q.hash_value, q.count), (
                f"stepped query {q.hash_value, q.count} != {real}"
            )
        self._finish_query(op, q.hash_value, q.count)
        return True

    def _finish_query(self, operation: Any, hash_value: list[str], storage_hit_count: int) -> None:
        """``prefetch_thread_func`` after ``_storage_hit_query`` (the MIN over ranks is the
        identity in one process)."""
        if storage_hit_count < self.prefetch_threshold:
            self.prefetch_revoke_queue.put(operation.request_id)
            self.append_host_mem_release(operation.host_indices)
        else:
            operation.hash_value = hash_value[: (storage_hit_count // self.page_size)]
            self.append_host_mem_release(operation.host_indices[storage_hit_count:])
            operation.host_indices = operation.host_indices[:storage_hit_count]
            self.prefetch_buffer.put(operation)

    # -- prefetch_io_aux_func + _page_transfer, one batch_get per step -------------------------
    def read_step(self) -> bool:
        r = self._read
        if r is None:
            if self.prefetch_buffer.empty():
                return False
            r = self._read = _Stage(self.prefetch_buffer.get_nowait())
        operation, i, ps = r.op, r.pos, self.page_size
        batch_hashes = operation.hash_value[i : i + _cc.STORAGE_BATCH_SIZE]
        batch_host_indices = operation.host_indices[i * ps : (i + len(batch_hashes)) * ps]
        prev_completed_tokens = operation.completed_tokens
        extra_info = _hs.HiCacheStorageExtraInfo(prefix_keys=operation.prefix_keys)
        self.page_get_func(operation, batch_hashes, batch_host_indices, extra_info)
        stop = operation.completed_tokens != prev_completed_tokens + len(batch_hashes) * ps
        if stop:
            operation.mark_terminate()
        r.pos = i + len(batch_hashes)
        if stop or r.pos >= len(operation.hash_value):
            self._read = None
            self.append_host_mem_release(operation.host_indices[operation.completed_tokens :])
        return True

    # -- backup_thread_func + _page_backup, one batch_set per step -----------------------------
    def backup_step(self) -> bool:
        b = self._backup
        if b is None:
            if self.backup_queue.empty():
                return False
            b = self._backup = _Stage(self.backup_queue.get_nowait())
        operation, i, ps = b.op, b.pos, self.page_size
        done = True
        if not self.backup_skip and i < len(operation.hash_value):
            batch_hashes = operation.hash_value[i : i + _cc.STORAGE_BATCH_SIZE]
            batch_host_indices = operation.host_indices[i * ps : (i + len(batch_hashes)) * ps]
            extra_info = _hs.HiCacheStorageExtraInfo(prefix_keys=operation.prefix_keys)
            success = self.page_set_func(batch_hashes, batch_host_indices, extra_info)
            self.writes += 1
            if success:
                operation.completed_tokens += ps * len(batch_hashes)
                b.pos = i + len(batch_hashes)
                ns = operation.token_ids.extra_key
                for k in batch_hashes:
                    self.written_ns.setdefault(k, set()).add(ns)
                done = b.pos >= len(operation.hash_value)
        if done:
            self._backup = None
            self.ack_backup_queue.put(operation)
        return True

    def l3_put(self, tokens: list[int]) -> None:
        """Pages written to the backend by someone else (keys chained from the root the way
        ``_storage_hit_query`` chains them; one ``batch_set`` of flat data pages)."""
        ps = self.page_size
        keys: list[str] = []
        last = None
        for i in range(0, len(tokens) - len(tokens) % ps, ps):
            last = self.get_hash_str(tokens[i : i + ps], last)
            keys.append(last)
        if keys:
            pages = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
            assert self.storage_backend.batch_set(keys, pages)
            self.writes += 1
            for k in keys:
                self.written_ns.setdefault(k, set()).add(None)

    def reset(self) -> None:
        """``HiCacheController.reset``: the L1/L2 queues; then the joins -- the prefetch thread
        runs every query still queued, the backup thread finishes the operation it is on (flag
        ``reset_backup_in_progress``) -- the storage queues cleared, occupancy 0. The prefetch
        IO thread is not joined in SGLang (D3/D4, a race); here it stops at the reset, its
        operations are dropped (the outcome without the race: KD-L3-RESET-IO)."""
        super().reset()
        if not self.enable_storage:
            return
        self._resetting = True
        try:
            while self.query_step():
                pass
            if self._backup is not None:
                self.side.flag("reset_backup_in_progress")
                while self._backup is not None:
                    self.backup_step()
        finally:
            self._resetting = False
        for q in (
            self.prefetch_queue,
            self.backup_queue,
            self.prefetch_revoke_queue,
            self.ack_backup_queue,
            self.host_mem_release_queue,
        ):
            q.queue.clear()
        self.prefetch_tokens_occupied = 0
        self._read = None
        self.prefetch_buffer = Queue()

    # -- state ---------------------------------------------------------------------------------
    def stages(self) -> State:
        ps = self.page_size
        query = [] if self._query is None else [self._query]
        query += [_Stage(op) for op in self.prefetch_queue.queue]
        read = [] if self._read is None else [self._read]
        read += [_Stage(op) for op in self.prefetch_buffer.queue]
        backup = [] if self._backup is None else [self._backup]
        backup += [_Stage(op) for op in self.backup_queue.queue]
        return {
            "query": [[q.op.request_id, q.pos // ps, len(q.op.token_ids) // ps] for q in query],
            "read": [[r.op.request_id, r.pos, len(r.op.hash_value)] for r in read],
            "backup": [
                [prefix_label(b.op.hash_value), len(b.op.hash_value), b.pos] for b in backup
            ],
        }

    def l3_content(self) -> list[str]:
        n = len(self._suffix)
        names = (f[:-n] for f in os.listdir(self.storage_dir) if f.endswith(self._suffix))
        return sorted({run_length(PREFIX[key]) for key in names})


def _copy_op(op: Any) -> Any:
    """A shallow copy of an operation (same lock and flag objects; no new id)."""
    view = object.__new__(type(op))
    view.__dict__.update(op.__dict__)
    return view


@contextmanager
def _single_rank() -> Iterator[None]:
    """``torch.distributed.get_world_size`` is 1 while the cache is built (no process group)."""
    dist = torch.distributed
    real = dist.get_world_size
    dist.get_world_size = lambda *a, **k: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.get_world_size = real  # type: ignore[assignment]


def build_cache(
    cfg: Config, side: Side, storage_dir: str | None = None
) -> tuple[Any, StubPool, StubPool]:
    """A real ``HiRadixCache`` over stub pools and the manual controller, clock at 0 (with the
    L3 tier on the file backend in ``storage_dir`` on an L3 configuration)."""
    ps = cfg.page_size
    device = StubPool(side, "device", cfg.device_pages, ps, front=ps > 1)
    host = StubPool(side, "host", cfg.host_pages, ps, front=False)
    device.kv_cache = _hr.MHATokenToKVPool()  # a stand-in class: passes the MHA isinstance
    device.kv_cache.size = cfg.device_pages * ps
    extra_config = None
    if cfg.l3:
        assert storage_dir is not None
        _hr.HiCacheController = partial(  # type: ignore[misc, assignment]
            StorageStubController, side=side, storage_dir=storage_dir
        )
        _cc.STORAGE_BATCH_SIZE = cfg.batch_pages  # type: ignore[misc]
        extra_config = json.dumps(
            {
                "prefetch_threshold": cfg.threshold_pages * ps,
                "prefetch_timeout_base": cfg.timeout_base,
                "prefetch_timeout_per_ki_token": cfg.timeout_per_ki_token,
                "prefetch_timeout_max": cfg.timeout_max,
            }
        )
    else:
        _hr.HiCacheController = ManualStubController  # type: ignore[misc, assignment]
    _hr.get_mha_host_pool_cls = lambda kv_cache: lambda *a, **k: host  # type: ignore[assignment]
    server_args = types.SimpleNamespace(
        hicache_ratio=cfg.host_pages / cfg.device_pages,
        hicache_size=0,
        hicache_mem_layout="page_first",
        hicache_storage_backend="file" if cfg.l3 else None,
        hicache_storage_backend_extra_config=extra_config,
        hicache_storage_prefetch_policy=cfg.prefetch_policy or "timeout",
        hicache_write_policy=cfg.write_policy,
        hicache_io_backend="kernel",
        served_model_name="conformance",
        extra_metric_labels=None,
    )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=device,
        page_size=ps,
        eviction_policy=cfg.strategy,
    )
    CLOCK.now = 0
    with _single_rank():
        cache = _hr.HiRadixCache(params, server_args)
    cache.load_cache_event = threading.Event()
    return cache, device, host


# -------------------------------------------------------------------------------------- side --
class SglangSide(Side):
    """Adapts the real class to the driver's primitives (token slots <-> page ids)."""

    name = "sglang"

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        storage_dir = None
        if cfg.l3:
            self._tmp = tempfile.TemporaryDirectory(prefix="conformance-l3-")
            storage_dir = self._tmp.name
            PREFIX.clear()
            PREFIX[None] = ()
        self.cache, self.device, self.host = build_cache(cfg, self, storage_dir)
        self.ctrl: ManualStubController = self.cache.cache_controller

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _key(self, tokens: list[int], extra_key: str | None, limit: int | None = None) -> Any:
        return _rc.RadixKey(array("q", tokens), extra_key, limit=limit)

    def _pages(self, slots: Any) -> list[int]:
        return self.device.to_pages(slots)

    # -- cache calls ---------------------------------------------------------------------------
    def match(self, tokens: list[int], extra_key: str | None, limit: int | None) -> MatchView:
        m = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens, extra_key, limit)))
        return MatchView(
            self._pages(m.device_indices),
            int(m.host_hit_length),
            m.last_device_node,
            m.last_host_node,
            m.best_match_node,
        )

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        chunked: bool,
        priority: int,
        extra_key: str | None,
    ) -> int:
        params = InsertParams(
            key=self._key(tokens, extra_key),
            value=self.device.to_slots(pages),
            chunked=chunked,
            priority=priority,
        )
        return int(self.cache.insert(params).prefix_len)

    def inc_lock(self, node: Node) -> int:
        return int(self.cache.inc_lock_ref(node).delta)

    def dec_lock(self, node: Node) -> int:
        return int(self.cache.dec_lock_ref(node).delta)

    def evict(self, num_tokens: int) -> int:
        return int(self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def evict_host(self, num_tokens: int) -> None:
        self.cache.evict_host(num_tokens)

    def init_load_back(self, node: Node, host_hit: int) -> tuple[list[int], Node]:
        slots, last = self.cache.init_load_back(
            InitLoadBackParams(best_match_node=node, host_hit_length=host_hit)
        )
        return self._pages(slots), last

    def ready_to_load(self) -> int:
        return int(self.cache.ready_to_load_host_cache())

    # -- pools and controller -----------------------------------------------------------------
    def alloc_device(self, num_pages: int) -> list[int] | None:
        slots = self.device.alloc(num_pages * self.page_size)
        return None if slots is None else self._pages(slots)

    def free_device(self, pages: list[int]) -> None:
        self.device.free(self.device.to_slots(pages))

    def clear_device(self) -> None:
        self.device.clear()

    def device_free_list(self) -> list[int]:
        return list(self.device.free_pages)

    def host_free_list(self) -> list[int]:
        return list(self.host.free_pages)

    def finish_writes(self, count: int | None) -> int:
        return self.ctrl.finish_writes(count)

    def finish_loads(self, count: int | None) -> int:
        return self.ctrl.finish_loads(count)

    # -- introspection -------------------------------------------------------------------------
    def root(self) -> Node:
        return self.cache.root_node

    def node_tokens(self, node: Node) -> list[int]:
        return list(node.key.token_ids)

    def node_extra_key(self, node: Node) -> str | None:
        extra: str | None = node.key.extra_key
        return extra

    def node_fields(self, node: Node) -> dict[str, Any]:
        return {
            "value": None if node.value is None else self.device.to_pages(node.value),
            "host_value": None if node.host_value is None else self.host.to_pages(node.host_value),
            "lock_ref": node.lock_ref,
            "host_ref": node.host_ref_counter,
            "hit_count": node.hit_count,
            # the root's priority, inherited by a node fetched under it (KD-ROOT)
            "priority": "root" if node.priority == -sys.maxsize else node.priority,
            "pending_write": node.write_through_pending_id,
            "last_access": node.last_access_time,
            "creation": node.creation_time,
        }

    def is_evicted(self, node: Node) -> bool:
        return bool(node.evicted)

    def in_tree(self, node: Node) -> bool:
        root = self.cache.root_node
        while node is not root:
            parent = node.parent
            if (
                parent is None
                or parent.children.get(node.key.child_key(self.page_size)) is not node
            ):
                return False
            node = parent
        return True

    def device_prefix(self, tokens: list[int], extra_key: str | None) -> list[int]:
        ps = self.page_size
        n = len(tokens) // ps * ps
        node, off, pages = self.cache.root_node, 0, []
        while off < n:
            child = node.children.get(self._key(tokens[off:n], extra_key).child_key(ps))
            if child is None or child.value is None:
                break
            size = len(child.key)
            if list(child.key.token_ids) != tokens[off : off + size]:
                break
            pages += self._pages(child.value)
            node, off = child, off + size
        return pages

    def evictable_leaves(self) -> Iterable[Node]:
        return list(self.cache.evictable_leaves)

    def evictable_host_leaves(self) -> Iterable[Node]:
        return list(self.cache.evictable_host_leaves)

    def eviction_key(self, node: Node) -> Any:
        return self.cache.eviction_strategy.get_priority(node)

    def sizes(self) -> tuple[int, int]:
        return int(self.cache.evictable_size_), int(self.cache.protected_size_)

    def write_records(self) -> list[tuple[int, Node, int, list[Node]]]:
        return [
            (ack, lock, int(backup), list(publish))
            for ack, (lock, backup, publish) in self.cache.ongoing_write_through.items()
        ]

    def load_records(self) -> list[tuple[int, Node]]:
        return list(self.cache.ongoing_load_back.items())

    def write_acks(self) -> list[tuple[list[int], bool]]:
        return [(list(ids), fin.done) for _, fin, ids in self.ctrl.ack_write_queue]

    def load_acks(self) -> list[tuple[list[int], bool]]:
        return [(list(ids), fin.done) for _, fin, ids in self.ctrl.ack_load_queue]

    def queued_loads(self) -> list[int]:
        return [node_id for node_id, _, _ in self.ctrl.load_queue]

    # -- L3 storage tier -----------------------------------------------------------------------
    def _sctrl(self) -> StorageStubController:
        ctrl = self.ctrl
        assert isinstance(ctrl, StorageStubController), "not an L3 configuration"
        return ctrl

    def prefetch(
        self, rid: str, tokens: list[int], extra_key: str | None, m: MatchView, now: float
    ) -> bool:
        """``Scheduler._prefetch_kvcache`` after ``init_next_round_input``'s match."""
        Seconds.now = now
        self._sctrl().req_ns[rid] = extra_key
        last_host_node = m.last_host
        last_hash = last_host_node.get_last_hash_value()
        matched_len = len(m.device_pages) * self.page_size + m.host_hit
        match_end = max(len(tokens) - 1, 0)
        new_input_tokens = array("q", tokens[matched_len:match_end])
        self.cache.prefetch_from_storage(rid, last_host_node, new_input_tokens, last_hash, None)
        return rid in self.cache.ongoing_prefetch

    def check_prefetch(self, rid: str, now: float) -> bool:
        Seconds.now = now
        entry = self.cache.ongoing_prefetch.get(rid)
        before = set(map(id, self._nodes())) if entry is not None else set()
        done = bool(self.cache.check_prefetch_progress(rid))
        if done and entry is not None and rid not in self.cache.ongoing_prefetch:
            _, key, _, op = entry
            if op.completed_tokens > 0 and key.extra_key != self._sctrl().req_ns.get(rid):
                self.flag("l3_extra_key_dropped")
            root = self.cache.root_node
            for n in self._nodes():
                if id(n) in before or n.value is not None:
                    continue
                parent = n.parent
                if parent is not root and parent.host_value is None:
                    self.flag("fetched_under_device_only")
        return done

    def _nodes(self) -> list[Node]:
        out, stack = [], [self.cache.root_node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def pop_credit(self, rid: str) -> int:
        return int(self.cache.pop_prefetch_loaded_tokens(rid))

    def abort(self, rid: str) -> None:
        self.cache.release_aborted_request(rid)

    def drain(self) -> None:
        self.cache.drain_storage_control_queues()

    def query_step(self) -> bool:
        return self._sctrl().query_step()

    def read_step(self) -> bool:
        return self._sctrl().read_step()

    def backup_step(self) -> bool:
        return self._sctrl().backup_step()

    def l3_put(self, tokens: list[int]) -> None:
        self._sctrl().l3_put(tokens)

    def extra_state(self) -> State:
        ctrl = self.ctrl
        if not isinstance(ctrl, StorageStubController):
            return {}
        cache = self.cache
        prefetch: dict[str, Any] = {}
        stale: dict[str, Any] = {}
        for rid, (anchor, key, host_indices, op) in cache.ongoing_prefetch.items():
            view = [
                node_label(self, anchor),
                len(key),
                self.host.to_pages(host_indices),
                op.completed_tokens,
                op.is_terminated(),
                len(op.hash_value),
            ]
            (prefetch if self.in_tree(anchor) else stale)[rid] = view
        backups: list[str] = []
        stale_backups: list[str] = []
        for node in cache.ongoing_backup.values():
            (backups if self.in_tree(node) else stale_backups).append(node_label(self, node))
        release: list[int] = []
        for page in ctrl.host_mem_release_queue.queue:
            release += self.host.to_pages(page)
        return {
            "l3_prefetch": prefetch,
            "l3_backups": sorted(backups),
            "l3_occupied": ctrl.prefetch_tokens_occupied,
            "l3_credits": dict(cache.prefetch_loaded_tokens_by_reqid),
            "l3_root_host_ref": cache.root_node.host_ref_counter,
            "l3_queues": {
                "revoke": list(ctrl.prefetch_revoke_queue.queue),
                "release": release,
                "backup_acks": [
                    [prefix_label(op.hash_value), op.completed_tokens]
                    for op in ctrl.ack_backup_queue.queue
                ],
            },
            "l3_stages": ctrl.stages(),
            "l3_content": ctrl.l3_content(),
            "stale": {"l3_prefetch": stale, "l3_backups": sorted(stale_backups)},
        }
