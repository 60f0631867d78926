"""The SGLang 0.5.23 side: the real ``UnifiedRadixCache`` with HiCache (L1 device + L2 host, no
L3) on CPU, behind :class:`RealUnifiedCache`.

Only the environment of the cache is replaced, never its code:

* **construction** -- exactly the server's order: ``UnifiedRadixCache(CacheInitParams(...))``
  (components ``(FULL,)``, ``tree_core_backend`` = ``core``), then the real
  ``init_hicache(server_args, params)``, which runs ``attach_hybrid_pool_to_unified_cache``: the
  real host pool (``MHATokenToKVPoolHost`` in a ``HostPoolGroup``) and the real
  ``HybridCacheController``. The global server args (read by ``init_hicache`` only) are a real
  ``ServerArgs(enable_hierarchical_cache=True, hicache_write_policy=..., hicache_ratio=...)``.
  The device KV pool is a real one-layer ``MHATokenToKVPool`` (head 1 x dim 1, fp16).
* **device allocator** -- :class:`FifoDeviceAllocator`, a ``BaseTokenToKVPoolAllocator`` over
  :class:`~conformance.v0523.pools.FifoPages` (slot = page * page_size + i). A free of a slot
  tensor returns its pages in order of first appearance (``free_segment``'s ``[::page_size]``
  order, which is also what ``free`` does here: no sorting).
* **host pool bookkeeping** -- the real host pool object's ``alloc`` / ``free`` /
  ``available_size`` / ``clear`` are replaced (on the instance) by a ``FifoPages`` of
  ``host_pages`` pages; the host pool is sized by the real formula
  (``page_num = int(device_tokens * ratio) // page_size + 1``) with the ratio chosen so that
  ``page_num == host_pages``.
* **copies** -- the controller's ``l2_transfer_engine`` is :class:`ManualL2Engine`: it copies
  nothing and returns completions whose ``finish_event`` is a :class:`ManualEvent`. Everything
  above it is the real controller: ``write(flush=False)`` queues a ``CacheOperation``,
  ``start_writing`` merges **all** queued ops into one ``CacheOperation`` and appends **one**
  ``HiCacheAck`` per merge (one "write op"); ``load`` queues and ``start_loading`` (from
  ``ready_to_load_host_cache``) merges all queued loads into one op and one ack (one "load
  op"). The cache's real ``writing_check`` / ``loading_check`` / ``check_hicache_events`` poll
  ``finish_event.query()`` FIFO from the front, exactly as on a GPU. An ack becomes ready only
  when the driver calls :meth:`RealUnifiedCache.finish_writes` / ``finish_loads`` (oldest
  first), or when the cache itself blocks on it: ``ManualEvent.synchronize()`` completes the
  event (the blocking ``writing_check(write_back=True)`` in write_back eviction waits for the
  copy, so after it the copy is done). The per-layer load events (``LayerDoneCounter``) are real
  CPU events recorded at submission (the forward's per-layer wait never blocks here).
* ``pool_host/common._cuda_host_register`` is a no-op (CUDA host pinning; "Torch not compiled
  with CUDA"). ``sgl_kernel.kvcacheio`` is never reached, because no copy runs.
* **clock** -- the Python TreeCore's clock is already logical: one process-global float64
  counter in ``unified_cache/components/base.py`` (``get_and_increase_time_counter``: returns the
  value, then adds 1.0; starts at 1.0). It is reset to 1.0 once each cache is built (after
  ``init_hicache``), so the first operation's first tick is 1.0 and every run is reproducible
  (the root's own times are not reported). No ``time.monotonic`` read reaches a node
  field. The Rust core keeps its own clock and exposes none of it (see :meth:`snapshot`).

Node handles are canonical: a node is its full token path from the root, a tuple of ints (root:
``()``).

Everything imported here is heavy (torch, sglang): import this module only inside
``.venv-conformance-0.5.23``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import os
import re
import sys
import tempfile
from array import array
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

from conformance.v0523 import import_stubs

import_stubs.install()

import warnings  # noqa: E402

import numpy  # noqa: E402
import torch  # noqa: E402

# "Only CUDA ... support AWQ/GGUF" warnings of quantization modules on the import chain
warnings.filterwarnings("ignore", message="Only CUDA")

import sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller  # noqa: E402
import sglang.srt.mem_cache.pool_host.group  # noqa: E402
import sglang.srt.mem_cache.rust_tree_core.adapter  # noqa: E402
import sglang.srt.mem_cache.unified_cache.components.full  # noqa: E402
import sglang.srt.mem_cache.unified_cache.unified_tree_core  # noqa: E402,F401
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.l2_transfer import TransferCompletion  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pool_host import common as _pool_host_common  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import base as _components_base  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from conformance.v0523.pools import FifoPages  # noqa: E402

import_stubs.check_real()

FULL = ComponentType.FULL
Path = tuple[int, ...]

# CUDA host pinning of the host pool's buffer: not available on a CPU torch.
_pool_host_common._cuda_host_register = lambda *args, **kwargs: None  # type: ignore[assignment]
logging.getLogger("sglang").setLevel(logging.ERROR)
torch.set_num_threads(1)

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


def sglang_version() -> str:
    import sglang

    return str(getattr(sglang, "__version__", "unknown"))


def reset_python_core_clock() -> None:
    """The Python TreeCore's logical clock back to its import-time value (float64 1.0)."""
    _components_base._LAST_ACCESS_TIME_COUNTER_FLOAT = numpy.float64(1.0)


def _slots_to_pages(slots: torch.Tensor, page_size: int) -> list[int]:
    """Page ids of a slot tensor, in order of first appearance; the slots must be whole,
    page-aligned pages (what the tree stores)."""
    flat = [int(s) for s in slots.reshape(-1).tolist()]
    if len(flat) % page_size:
        raise RuntimeError(f"free of a partial page: {len(flat)} slots, page {page_size}")
    pages = []
    for k in range(0, len(flat), page_size):
        page = flat[k] // page_size
        if flat[k : k + page_size] != list(range(page * page_size, (page + 1) * page_size)):
            raise RuntimeError(f"slots {flat[k : k + page_size]} are not one whole page")
        pages.append(page)
    return pages


def _pages_to_slots(pages: list[int], page_size: int) -> torch.Tensor:
    return torch.tensor(
        [p * page_size + i for p in pages for i in range(page_size)], dtype=torch.int64
    )


# ------------------------------------------------------------------------------- pools --
class FifoDeviceAllocator(BaseTokenToKVPoolAllocator):
    """The device KV allocator over ``FifoPages``: ``alloc`` takes pages from the front,
    every free appends the freed pages (first-appearance order) to the end."""

    def __init__(self, num_pages: int, page_size: int, kvcache: Any) -> None:
        super().__init__(
            size=num_pages * page_size,
            page_size=page_size,
            dtype=torch.float16,
            device="cpu",
            kvcache=kvcache,
            need_sort=False,
        )
        self.debug_mode = False
        self.pages = FifoPages(num_pages)
        self.free_log: list[list[int]] = []

    # -- allocation --
    def available_size(self) -> int:
        return self.pages.available() * self.page_size

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size % self.page_size:
            raise RuntimeError(f"alloc of {need_size} slots: not a page multiple")
        pages = self.pages.alloc(need_size // self.page_size)
        if pages is None:
            return None
        return _pages_to_slots(pages, self.page_size)

    def alloc_pages(self, num_pages: int) -> list[int] | None:
        return self.pages.alloc(num_pages)

    # -- free --
    def _free_pages(self, pages: list[int]) -> None:
        self.free_log.append(list(pages))
        self.pages.free(pages)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(self._copy_for_free_group(free_index))
            return
        self._free_pages(_slots_to_pages(free_index, self.page_size))

    def free_segment(self, free_index: torch.Tensor, *, start_pos: int) -> None:
        assert start_pos % self.page_size == 0
        self.free(free_index)

    def free_page_ids(self, page_ids: torch.Tensor) -> None:
        self._free_pages([int(p) for p in page_ids.reshape(-1).tolist()])

    def clear(self) -> None:
        if hasattr(self, "pages"):
            self.pages.clear()
        self.free_group = None

    def get_all_free_pages(self) -> torch.Tensor:
        return torch.tensor(self.pages.free_list(), dtype=torch.int64)

    def merge_and_sort_free(self) -> None:
        pass


def _install_fifo_host_pool(host_pool: Any, num_pages: int) -> FifoPages:
    """Replace the real host pool's slot bookkeeping by a ``FifoPages`` (on the instance)."""
    page_size = host_pool.page_size
    if host_pool.page_num != num_pages:
        raise RuntimeError(f"host pool has {host_pool.page_num} pages, wanted {num_pages}")
    pages = FifoPages(num_pages)

    def alloc(need_size: int, **kwargs: Any) -> torch.Tensor | None:
        assert need_size % page_size == 0, "host alloc of a partial page"
        got = pages.alloc(need_size // page_size)
        return None if got is None else _pages_to_slots(got, page_size)

    def free(indices: torch.Tensor) -> int:
        if indices.numel() == 0:
            return 0
        pages.free(_slots_to_pages(indices, page_size))
        return int(indices.numel())

    host_pool.alloc = alloc
    host_pool.free = free
    host_pool.available_size = lambda: pages.available() * page_size
    host_pool.clear = pages.clear
    return pages


# ----------------------------------------------------------------------------- copies --
class ManualEvent:
    """A transfer's finish event that completes when told (or when waited on)."""

    def __init__(self) -> None:
        self.done = False
        self.completed_by_sync = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self.done = True
            self.completed_by_sync = True

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait(self, *args: Any, **kwargs: Any) -> None:
        pass

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class Transfer(NamedTuple):
    kind: str  # "write" (D->H) or "load" (H->D)
    event: ManualEvent
    host_pages: list[int]
    device_pages: list[int]


class ManualL2Engine:
    """Stands in for ``L2TransferEngine``: records each submission (one per merged op), copies
    nothing, and hands back a completion whose finish event the driver completes."""

    def __init__(self, page_size: int, on_submit: Any) -> None:
        self.page_size = page_size
        self.device_to_host_stream = torch.cpu.Stream()
        self.host_to_device_stream = torch.cpu.Stream()
        self.transfers: list[Transfer] = []
        self._on_submit = on_submit

    def _submit(self, kind: str, transfers: list[Any]) -> TransferCompletion:
        if len(transfers) != 1:
            raise RuntimeError(f"expected one KV transfer per op, got {len(transfers)}")
        t = transfers[0]
        record = Transfer(
            kind,
            ManualEvent(),
            _slots_to_pages(t.host_indices, self.page_size),
            _slots_to_pages(t.device_indices, self.page_size),
        )
        self.transfers.append(record)
        self._on_submit(record)
        return TransferCompletion(ManualEvent(), record.event, False)

    def submit_device_to_host(self, transfers: list[Any]) -> TransferCompletion:
        return self._submit("write", transfers)

    def submit_host_to_device(
        self,
        transfers: list[Any],
        *,
        transfer_layer_id_max: int,
        start_event: Any = None,
        on_layer_done: Any = None,
    ) -> TransferCompletion:
        completion = self._submit("load", transfers)
        if on_layer_done is not None:
            for layer_id in range(transfer_layer_id_max):
                on_layer_done(layer_id)
        return completion

    def finish(self, kind: str, count: int | None) -> int:
        """Complete the oldest ``count`` (None: all) unfinished transfers of ``kind``."""
        done = 0
        for t in self.transfers:
            if t.kind != kind or t.event.done:
                continue
            if count is not None and done >= count:
                break
            t.event.done = True
            done += 1
        return done


# ----------------------------------------------------------------------------- rust io --
@contextlib.contextmanager
def _capture_stdout() -> Iterator[io.StringIO]:
    """Capture both Python-level and fd-1 output (the Rust core prints through either)."""
    buf = io.StringIO()
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with contextlib.redirect_stdout(buf):
                yield buf
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            buf.write(tmp.read().decode())


_PRETTY = re.compile(r"^(\s*)\[(\d+)\]\s+(\d+)\s+full_lock=(-?\d+)\s+(\w+)=(yes|no)\s*$")


# ---------------------------------------------------------------------------- adapter --
def _host_pages_ratio(host_pages: int, device_tokens: int, page_size: int) -> float:
    """A ``hicache_ratio`` for which the real sizing gives ``host_pages`` pages:
    page_num = int(device_tokens * ratio) // page_size + 1."""
    return ((host_pages - 1) * page_size + 0.5) / device_tokens


class RealUnifiedCache:
    """The real 0.5.23 ``UnifiedRadixCache`` + HiCache (L1/L2), driven like the scheduler.

    ``page_size`` tokens per page; ``device_pages`` / ``host_pages`` pool sizes in pages;
    ``write_policy`` in write_through | write_through_selective | write_back; ``eviction_policy``
    in lru lfu fifo mru filo priority slru tlru (``eviction_policy_config``: the
    ``--radix-eviction-policy-config`` dict); ``core``: "python" | "rust"
    (``CacheInitParams.tree_core_backend``)."""

    def __init__(
        self,
        *,
        page_size: int,
        device_pages: int,
        host_pages: int,
        write_policy: str,
        eviction_policy: str,
        core: str,
        eviction_policy_config: dict[str, Any] | None = None,
        extra_server_args: dict[str, Any] | None = None,
    ) -> None:
        """``extra_server_args``: more ``ServerArgs`` fields (the L3 side sets its storage
        flags here)."""
        if write_policy not in WRITE_POLICIES:
            raise ValueError(write_policy)
        if core not in ("python", "rust"):
            raise ValueError(core)
        if host_pages < 1 or device_pages < 1:
            raise ValueError("pools need at least one page")
        self.page_size = page_size
        self.device_pages = device_pages
        self.host_pages = host_pages
        self.write_policy = write_policy
        self.eviction_policy = eviction_policy
        self.core = core
        device_tokens = device_pages * page_size

        server_args = ServerArgs(
            model_path="dummy",
            page_size=page_size,
            enable_hierarchical_cache=True,
            hicache_ratio=_host_pages_ratio(host_pages, device_tokens, page_size),
            hicache_write_policy=write_policy,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            radix_eviction_policy=eviction_policy,
            **(extra_server_args or {}),
        )
        set_global_server_args_for_scheduler(server_args)
        self.kv_pool = MHATokenToKVPool(
            size=device_tokens,
            page_size=page_size,
            dtype=torch.float16,
            head_num=1,
            head_dim=1,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        self.allocator = FifoDeviceAllocator(device_pages, page_size, self.kv_pool)
        self.req_to_token_pool = ReqToTokenPool(
            size=1, max_context_len=8, device="cpu", enable_memory_saver=False
        )
        self.params = CacheInitParams(
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page_size,
            disable=False,
            tree_components=(FULL,),
            eviction_policy=eviction_policy,
            eviction_policy_config=eviction_policy_config,
            tree_core_backend=core,
        )
        self.cache = UnifiedRadixCache(params=self.params)
        if self.cache._tree_core_backend != core:
            raise RuntimeError(f"asked for the {core} core, got {self.cache._tree_core_backend}")
        self.cache.init_hicache(server_args, self.params)
        atexit.unregister(self.cache.shutdown)
        cc = self.cache.cache_controller
        assert cc is not None and cc.write_policy == write_policy
        self.cc = cc
        self.host_pool = cc.mem_pool_host.anchor_entry.host_pool
        self.host = _install_fifo_host_pool(self.host_pool, host_pages)
        self.engine = ManualL2Engine(page_size, self._on_transfer)
        cc.l2_transfer_engine = self.engine
        self.tree = self.cache.tree_core
        # the logical clock starts at 1.0 with the first operation after construction
        reset_python_core_clock()
        # page -> full token path up to the end of that page (see _tokens_of)
        self._dev_path: dict[int, Path] = {}
        self._host_path: dict[int, Path] = {}
        self._locks: dict[int, Any] = {}
        self._next_lock = 0
        self._rid = 0

    # ------------------------------------------------------------------ page paths --
    def _on_transfer(self, t: Transfer) -> None:
        for h, d in zip(t.host_pages, t.device_pages, strict=True):
            if t.kind == "write" and d in self._dev_path:
                self._host_path[h] = self._dev_path[d]
            elif t.kind == "load" and h in self._host_path:
                self._dev_path[d] = self._host_path[h]

    def _key(self, tokens: list[int], limit: int | None = None, extra_key: Any = None) -> RadixKey:
        return RadixKey(array("q", tokens), extra_key, limit=limit)

    def _pages(self, slots: torch.Tensor | None) -> list[int] | None:
        if slots is None:
            return None
        if not isinstance(slots, torch.Tensor):
            slots = torch.tensor(list(slots), dtype=torch.int64)
        return _slots_to_pages(slots, self.page_size)

    # ---------------------------------------------------------------- tree access --
    def _root_id(self) -> int:
        return int(self.tree.root_node_handle())

    def _raw_nodes(self) -> dict[int, dict[str, Any]]:
        """Every node (root included) by id: parent, own tokens, device/host pages, lock refs,
        and (Python core only) the policy fields."""
        if self.core == "python":
            return self._raw_nodes_python()
        return self._raw_nodes_rust()

    def _raw_nodes_python(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            cd = node.component_data[FULL]
            out[node.id] = {
                "parent": None if node.parent is None else node.parent.id,
                "tokens": [] if node.key is None else [int(t) for t in node.key.token_ids],
                "device": self._pages(cd.value),
                "host": self._pages(cd.host_value),
                "lock_ref": int(cd.lock_ref),
                "host_lock_ref": int(cd.host_lock_ref),
                "hit_count": int(node.hit_count),
                "priority": int(node.priority),
                "last_access": float(node.last_access_time),
                "creation": float(node.creation_time),
                "write_through_pending_id": node.write_through_pending_id,
                "load_back_pending_id": node.load_back_pending_id,
            }
            stack.extend(node.children.values())
        return out

    def _raw_nodes_rust(self) -> dict[int, dict[str, Any]]:
        with _capture_stdout() as buf:
            self.tree.pretty_print()
        listed: dict[int, tuple[int, int]] = {}
        for line in buf.getvalue().splitlines():
            m = _PRETTY.match(line)
            if m is None:
                if line.strip():
                    raise RuntimeError(f"unexpected pretty_print line {line!r}")
                continue
            listed[int(m.group(2))] = (int(m.group(3)), int(m.group(4)))
        root = self._root_id()
        ids = [i for i in listed if i != root]
        infos = {}
        if ids:
            for path in self.tree.collect_path_info(ids):
                for info in path:
                    infos[int(info.node_id)] = info
        out: dict[int, dict[str, Any]] = {
            root: {
                "parent": None,
                "tokens": [],
                "device": None,
                "host": None,
                "lock_ref": listed[root][1],
                "path_end": 0,
            }
        }
        for nid in ids:
            info = infos[nid]
            spec = self.tree.build_storage_backup_spec(nid, False)
            host = None if spec is None else self._pages(spec.host_value)
            tokens = None if spec is None else [int(t) for t in spec.token_ids]
            out[nid] = {
                "parent": int(info.parent_id),
                "tokens": tokens,
                "device": self._pages(self.tree.get_component_device_value(nid, FULL)),
                "host": host,
                "lock_ref": listed[nid][1],
                "path_start": int(info.path_start),
                "path_end": int(info.path_end),
            }
            assert listed[nid][0] == info.path_end - info.path_start
        return out

    def _tokens_from_pages(self, raw: dict[str, Any]) -> list[int] | None:
        """A node's own tokens from the token path recorded for its last device page."""
        start, end = raw["path_start"], raw["path_end"]
        for pages, registry in ((raw["device"], self._dev_path), (raw["host"], self._host_path)):
            if pages:
                path = registry.get(pages[-1])
                if path is not None and len(path) == end:
                    return list(path[start:end])
        return None

    def _tree(self) -> tuple[dict[int, dict[str, Any]], dict[int, Path]]:
        """(raw nodes, id -> full token path)."""
        raw = self._raw_nodes()
        root = self._root_id()
        paths: dict[int, Path] = {root: ()}

        def path_of(nid: int) -> Path:
            if nid in paths:
                return paths[nid]
            node = raw[nid]
            if node["tokens"] is None:
                node["tokens"] = self._tokens_from_pages(node)
                if node["tokens"] is None:
                    raise RuntimeError(f"cannot tell the tokens of rust node {nid}")
            p = path_of(node["parent"]) + tuple(node["tokens"])
            paths[nid] = p
            return p

        for nid in raw:
            path_of(nid)
        # keep the page registry fresh from what the tree says
        ps = self.page_size
        for nid, node in raw.items():
            p = paths[nid]
            start = len(p) - len(node["tokens"])
            for registry, pages in (
                (self._dev_path, node["device"]),
                (self._host_path, node["host"]),
            ):
                for j, page in enumerate(pages or ()):
                    registry[page] = p[: start + (j + 1) * ps]
        return raw, paths

    def _path(self, node_id: Any) -> Path | None:
        _, paths = self._tree()
        return paths.get(int(node_id))

    def _id(self, path: Path) -> int:
        if tuple(path) == ():
            return self._root_id()
        _, paths = self._tree()
        for nid, p in paths.items():
            if p == tuple(path):
                return nid
        raise KeyError(f"no node with path {path}")

    # ------------------------------------------------------------------ allocation --
    def alloc_device(self, num_pages: int) -> list[int] | None:
        """The request's own pages (the scheduler's ``allocator.alloc``); no eviction."""
        return self.allocator.alloc_pages(num_pages)

    def free_device(self, pages: list[int]) -> None:
        """Give request-owned pages back (``allocator.free``)."""
        self.allocator.free(_pages_to_slots(list(pages), self.page_size))

    # ------------------------------------------------------------------ match / insert --
    def match(
        self, tokens: list[int], limit: int | None = None, extra_key: Any = None
    ) -> dict[str, Any]:
        """``cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key, limit=limit)))``.

        ``limit`` is the raw-token cap the scheduler puts on the key (``Req.init_next_round_input``
        -> ``match_kv_cache(max_prefix_len=input_len - 1)`` -> ``_req_radix_key``: ``limit =
        input_len - 1``, min with ``logprob_start_len``); None = the whole key. ``req`` is not
        passed (it is only read by sessions and the external linker)."""
        r = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens, limit, extra_key)))
        _, paths = self._tree()
        device_pages = self._pages(self.cache.path_device_indices(r.last_device_node)) or []
        assert len(device_pages) * self.page_size == r.device_prefix_len
        return {
            "device_pages": device_pages,
            "host_hit": int(r.host_hit_length),
            "last_device": paths[int(r.last_device_node)],
            "best": paths[int(r.best_match_node)],
        }

    def touch(self, tokens: list[int]) -> None:
        """``cache.touch_prefix(RadixKey(tokens))`` (the waiting-queue refresh: the match walk
        of the whole key, its splits and stamps applied, nothing returned)."""
        self.cache.touch_prefix(self._key(tokens, None, None))

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        *,
        prev_prefix_len: int,
        inserted_len: int,
        priority: int,
        extra_key: Any = None,
    ) -> dict[str, Any]:
        """``cache.insert(InsertParams(key=RadixKey(tokens), value=slots(pages),
        prev_prefix_len=..., inserted_len=..., priority=...))`` -- what ``checkpoint_into_tree``
        builds (key page-aligned by the caller; ``value`` = the request's slots for the whole
        key, the matched prefix's being the tree's own). The insert itself frees the duplicate
        slots of ``[prev_prefix_len, prefix_len)`` (``FreeDeviceKV``), so the caller must not."""
        ps = self.page_size
        if len(tokens) != len(pages) * ps:
            raise ValueError("tokens must be page-aligned and match the pages")
        for j, page in enumerate(pages):
            self._dev_path.setdefault(page, tuple(tokens[: (j + 1) * ps]))
            if self._dev_path[page] != tuple(tokens[: (j + 1) * ps]):
                # a page may be reused once freed: the newest owner wins
                self._dev_path[page] = tuple(tokens[: (j + 1) * ps])
        r = self.cache.insert(
            InsertParams(
                key=self._key(tokens, None, extra_key),
                value=_pages_to_slots(list(pages), ps),
                prev_prefix_len=prev_prefix_len,
                inserted_len=inserted_len,
                priority=priority,
            )
        )
        return {"prefix_len": int(r.prefix_len), "last_device": self._path(r.last_device_node)}

    # ---------------------------------------------------------------------- locks --
    def lock(self, path: Path) -> int:
        """``cache.lock(node_id)`` (a ``TreeLock``: ``inc_lock_ref`` + its receipt); returns a
        handle for :meth:`unlock`."""
        tree_lock = self.cache.lock(self._id(path))
        self._next_lock += 1
        self._locks[self._next_lock] = tree_lock
        return self._next_lock

    def unlock(self, handle: int) -> None:
        """``cache.unlock(tree_lock)`` (``dec_lock_ref`` with the receipt)."""
        self.cache.unlock(self._locks.pop(handle))

    # -------------------------------------------------------------------- eviction --
    def evict_for_alloc(self, num_tokens: int) -> int:
        """``cache.evict_for_alloc(EvictParams(num_tokens=num_tokens))`` (what
        ``allocator.evict_to_free_tokens`` calls with the shortfall): walks until
        ``available >= available_before + num_tokens``. Returns ``num_tokens_evicted``."""
        return int(
            self.cache.evict_for_alloc(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
        )

    def evict(self, num_tokens: int) -> int:
        """``cache.evict(EvictParams(num_tokens=num_tokens))``: walks until that many tokens
        are evicted (no availability target)."""
        return int(self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted)

    def evict_host(self, num_tokens: int) -> int:
        """``cache.evict_host(num_tokens)`` (FULL): host tokens freed."""
        return int(self.cache.evict_host(num_tokens))

    # ------------------------------------------------------------------- load back --
    def init_load_back(
        self, tokens: list[int], limit: int | None = None, extra_key: Any = None
    ) -> tuple[list[int], Path]:
        """The admission's load-back (``schedule_policy.add_one_req``): ``match_prefix`` with
        the key limit, then, if ``host_hit_length > 0`` (``req.needs_host_load_back()``), under
        ``_lock_node(best_match_node, lock_host=True)`` (``inc_host_lock_ref`` + ``lock``, released
        after) ``init_load_back(InitLoadBackParams(best_match_node=best, host_hit_length=host_hit,
        mem_quota=None, req=req))`` with ``req.last_node = last_device_node`` (the memory-budget
        check before it is not modelled). Returns (device pages loaded, the node
        ``req.last_node`` becomes). The request's own lock on that node is *not* taken here
        (the scheduler takes it later; call :meth:`lock`)."""
        m = self.cache.match_prefix(MatchPrefixParams(key=self._key(tokens, limit, extra_key)))
        best = m.best_match_node
        last = m.last_device_node
        if m.host_hit_length <= 0:
            return [], self._path(last)  # type: ignore[return-value]
        self._rid += 1
        req = SimpleNamespace(
            rid=f"r{self._rid}",
            last_node=last,
            swa_host_hit_length=0,
            mamba_host_hit_length=0,
            kv=SimpleNamespace(mamba_pool_idx=None),
        )
        host_lock = self.cache.inc_host_lock_ref(best).to_dec_params()
        try:
            tree_lock = self.cache.lock(best)
            try:
                loaded = self.cache.init_load_back(
                    InitLoadBackParams(
                        best_match_node=best, host_hit_length=int(m.host_hit_length), req=req
                    )
                )
            finally:
                self.cache.unlock(tree_lock)
        finally:
            self.cache.dec_host_lock_ref(best, host_lock)
        assert loaded is not None
        n, node = loaded
        pages: list[int] = []
        if n:
            pages = self._pages(self.tree.collect_full_device_indices(node, last)) or []
        return pages, self._path(node)  # type: ignore[return-value]

    # -------------------------------------------------------------- hicache events --
    def flush_pending_backups(self) -> None:
        """``cache.flush_pending_backups()``: ``start_writing`` merges every queued write."""
        self.cache.flush_pending_backups()

    def writing_check(self, write_back: bool = False) -> None:
        """``cache.writing_check(write_back=...)``; the non-blocking form pops the ready acks
        from the front; the blocking form submits the queue and waits for (completes) all."""
        self.cache.writing_check(write_back=write_back)

    def loading_check(self) -> None:
        """``cache.loading_check()``: pops the ready load acks from the front."""
        self.cache.loading_check()

    def check_hicache_events(self) -> None:
        """``cache.check_hicache_events()``: ``flush_pending_backups``, then writing_check and
        loading_check with the ready counts."""
        self.cache.check_hicache_events()

    def ready_to_load(self) -> int:
        """``cache.ready_to_load_host_cache()`` -> ``start_loading``: producer index or -1."""
        return int(self.cache.ready_to_load_host_cache())

    def finish_writes(self, count: int | None = None) -> int:
        """Complete the oldest ``count`` (None: all) submitted D->H ops (merged ops)."""
        return self.engine.finish("write", count)

    def finish_loads(self, count: int | None = None) -> int:
        """Complete the oldest ``count`` (None: all) submitted H->D ops (merged ops)."""
        return self.engine.finish("load", count)

    # -------------------------------------------------------------------- state --
    def state_ok(self) -> None:
        """``cache.sanity_check()`` (raises on a broken invariant)."""
        self.cache.sanity_check()

    def snapshot(self) -> dict[str, Any]:
        """Canonical state. ``nodes``: DFS pre-order, children sorted by tokens, root excluded.
        Rust core: ``host_lock_ref``, ``hit_count``, ``priority``, ``last_access``, ``creation``
        are None (the production binding exposes no per-node accessor for them)."""
        raw, paths = self._tree()
        root = self._root_id()
        children: dict[int, list[int]] = {}
        for nid, node in raw.items():
            if node["parent"] is not None:
                children.setdefault(node["parent"], []).append(nid)
        nodes = []

        def visit(nid: int) -> None:
            for c in sorted(children.get(nid, ()), key=lambda c: raw[c]["tokens"]):
                node = raw[c]
                nodes.append(
                    {
                        "path": paths[c],
                        "tokens": list(node["tokens"]),
                        "device": node["device"],
                        "host": node["host"],
                        "lock_ref": node["lock_ref"],
                        "host_lock_ref": node.get("host_lock_ref"),
                        "hit_count": node.get("hit_count"),
                        "priority": node.get("priority"),
                        "last_access": node.get("last_access"),
                        "creation": node.get("creation"),
                    }
                )
                visit(c)

        visit(root)

        def p(nid: Any) -> Path | None:
            return paths.get(int(nid))

        cc = self.cc
        return {
            "nodes": nodes,
            "root_lock_ref": raw[root]["lock_ref"],
            "evictable_size": int(self.cache.evictable_size()),
            "protected_size": int(self.cache.full_protected_size()),
            "device_free": self.allocator.pages.free_list(),
            "host_free": self.host.free_list(),
            "write_queue": [[p(n) for n in op.node_ids] for op in cc.write_queue],
            "writes_in_flight": [[p(n) for n in ack.node_ids] for ack in cc.ack_write_queue],
            "writes_done": [ack.finish_event.query() for ack in cc.ack_write_queue],
            "load_queue": [[p(n) for n in op.node_ids] for op in cc.load_queue],
            "loads_in_flight": [[p(n) for n in ack.node_ids] for ack in cc.ack_load_queue],
            "loads_done": [ack.finish_event.query() for ack in cc.ack_load_queue],
            "ongoing_write_through": [
                (p(ack_id), sorted(p(n) or () for n in wt.publish_node_ids))
                for ack_id, wt in self.cache.ongoing_write_through.items()
            ],
            "ongoing_load_back": [p(n) for n in self.cache.ongoing_load_back],
        }


def common_view(snap: dict[str, Any]) -> dict[str, Any]:
    """The part of a snapshot both cores expose (for a Python-vs-Rust comparison)."""
    out = dict(snap)
    out["nodes"] = [
        {k: v for k, v in n.items() if k in ("path", "tokens", "device", "host", "lock_ref")}
        for n in snap["nodes"]
    ]
    return out
