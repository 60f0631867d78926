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

Everything imported here is heavy (torch, sglang): this module is only imported inside
``.venv-conformance``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from conformance import import_stubs
from conformance.driver import MatchView, Node, Side
from conformance.ops import Config

import_stubs.install()

from sglang.srt.mem_cache import hiradix_cache as _hr  # noqa: E402
from sglang.srt.mem_cache import radix_cache as _rc  # noqa: E402
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


CLOCK = LogicalClock()
_rc.time = _ClockedTime(CLOCK, pair_reads_per_frame=True)  # type: ignore[assignment]
_hr.time = _ClockedTime(CLOCK, pair_reads_per_frame=False)  # type: ignore[assignment]
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


def build_cache(cfg: Config, side: Side) -> tuple[Any, StubPool, StubPool]:
    """A real ``HiRadixCache`` over stub pools and the manual controller, clock at 0."""
    ps = cfg.page_size
    device = StubPool(side, "device", cfg.device_pages, ps, front=ps > 1)
    host = StubPool(side, "host", cfg.host_pages, ps, front=False)
    device.kv_cache = _hr.MHATokenToKVPool()  # a stand-in class: passes the MHA isinstance
    _hr.HiCacheController = ManualStubController  # type: ignore[misc, assignment]
    _hr.get_mha_host_pool_cls = lambda kv_cache: lambda *a, **k: host  # type: ignore[assignment]
    server_args = types.SimpleNamespace(
        hicache_ratio=cfg.host_pages / cfg.device_pages,
        hicache_size=0,
        hicache_mem_layout="page_first",
        hicache_storage_backend=None,
        hicache_storage_backend_extra_config=None,
        hicache_storage_prefetch_policy="timeout",
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
        self.cache, self.device, self.host = build_cache(cfg, self)
        self.ctrl: ManualStubController = self.cache.cache_controller

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

    def writing_check(self, write_back: bool = False) -> None:
        self.cache.writing_check(write_back=write_back)

    def loading_check(self) -> None:
        self.cache.loading_check()

    def check_events(self) -> None:
        self.cache.check_hicache_events()

    def protect_host(self, node: Node) -> None:
        node.protect_host()

    def release_host(self, node: Node) -> None:
        node.release_host()

    def reset(self) -> None:
        self.cache.reset()

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

    def children(self, node: Node) -> list[Node]:
        return list(node.children.values())

    def parent(self, node: Node) -> Node | None:
        return node.parent

    def node_id(self, node: Node) -> int:
        return int(node.id)

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
            "priority": node.priority,
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
