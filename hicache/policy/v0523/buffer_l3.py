"""The L3 tier of SGLang 0.5.23 in ``--hicache-host-memory-mode buffer_only``, dense path: the
branches ``UnifiedRadixCache`` takes in that mode (``mem_cache/unified_radix_cache.py``) and
``BufferModePipeline``'s load path (``mem_cache/buffer_mode/pipeline.py``).

:class:`BufferStorageAttachment` is :class:`~hicache.policy.v0523.l3.StorageAttachment` with:

* the anchor: a device node qualifies (nothing is ever backed up), :meth:`prefetch_kvcache`;
* issue: no rate limit, no host lock, no occupancy (:meth:`prefetch_from_storage`);
* the hit drain: the beliefs healed from the query; parked hits first, in order; a hit is
  allocated whole (no partial, no host eviction) after the anchor pin and the device-cover
  check, else parked (:meth:`_drain_hit`, :meth:`_try_alloc`);
* completion: the fetched pages are *staged* for admission (:meth:`_handle_prefetch_result`);
* admission: :meth:`prepare_staged` (the plan) and :meth:`init_load_back_staged` (device pages,
  the H2D, the insert); the bounce is freed at the H2D ack (:meth:`finish_load_back`);
* the backups (``buffer_mode.BufferPipeline``) and their storage acks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, NamedTuple

from hicache.policy.radix import child_key, match_len
from hicache.policy.v0523.buffer_mode import LOAD_POOL_USAGE_FRACTION, BufferPipeline
from hicache.policy.v0523.l3 import StorageAttachment, _Ongoing
from hicache.policy.v0523.l3_controller import PrefetchOp0523, StorageController0523
from hicache.policy.v0523.node import UNode

if TYPE_CHECKING:
    from hicache.policy.v0523.cache import UnifiedRadixCache
    from hicache.policy.v0523.tree import Match

#: Share of the device pool staged prefetches may pin (``SGLANG_HICACHE_BUFFER_ANCHOR_LOCK_CAP``,
#: environ.py:840; pipeline.py:296-309).
ANCHOR_LOCK_CAP = 0.5
#: Device-capacity deferrals of a staged prefetch at admission before it is dropped
#: (``max_staged_admission_defers``, pipeline.py:326).
MAX_STAGED_ADMISSION_DEFERS = 32


class Staged(NamedTuple):
    """``_StagedPrefetch``: a completed fetch parked until admission (only the bounce)."""

    rid: Hashable
    key: tuple[Hashable, ...]
    matched_len: int
    num_tokens: int
    occupied: int
    host_pages: list[int]
    hash_values: list[Any]
    op_id: int


class StagedPlan(NamedTuple):
    """``StagedPrefetchPlan``: the request's device prefix and the staged tokens past it."""

    key: tuple[Hashable, ...]
    device_prefix_len: int
    node: UNode
    full_tokens: int
    storage_hit: int


class _LoadBack(NamedTuple):
    rid: Hashable
    num_tokens: int
    occupied: int
    host_pages: list[int]
    device_pages: list[int]


class BufferStorageAttachment(StorageAttachment):
    """The buffer-only L3 half of one 0.5.23 cache (see the module docstring)."""

    buffer_only = True

    def __init__(
        self,
        cache: UnifiedRadixCache,
        controller: StorageController0523,
        *,
        device_tokens: int,
        max_context_len: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(cache, controller, **kwargs)
        host = controller.host
        controller.prefetch_capacity_limit = int(LOAD_POOL_USAGE_FRACTION * host.capacity_tokens)
        self.pipeline = BufferPipeline(cache, self, device_tokens)
        self.anchor_lock_cap = max(
            0, min(int(ANCHOR_LOCK_CAP * device_tokens), device_tokens - max_context_len)
        )
        self._reset_load()

    def _reset_load(self) -> None:
        self.pending_hit_allocs: deque[PrefetchOp0523] = deque()
        self.prefix_ctx: dict[Hashable, tuple[Hashable, ...]] = {}
        self.staged: dict[Hashable, Staged] = {}
        self.staged_defers: dict[Hashable, int] = {}
        self.occupied: dict[Hashable, int] = {}
        self.ongoing_load_back: dict[int, _LoadBack] = {}
        self.anchor_locks: dict[Hashable, tuple[UNode, int]] = {}
        self.anchor_locked_tokens = 0
        self.parked = 0
        self.staged_dropped = 0

    def reset(self) -> None:
        super().reset()
        self.pipeline.reset()
        self.pipeline.beliefs.inflight.clear()
        self._reset_load()

    # ----------------------------------------------------------------- rate limit --
    def rate_limited(self) -> bool:
        """``prefetch_rate_limited`` in buffer mode: host pages in use, less write staging,
        against 0.9 x the pool (cache_controller.py:1269-1283)."""
        host = self.ctrl.host
        used = host.capacity_tokens - host.available_size() - self.pipeline.write_staged_tokens
        return max(0, used) >= self.ctrl.prefetch_capacity_limit

    # ------------------------------------------------------------------- issue --
    def prefetch_kvcache(
        self,
        rid: Hashable,
        key: tuple[Hashable, ...],
        match: Match,
        match_end: int,
        now: float,
        storage_hit_end: int | None = None,
    ) -> int:
        """``_prefetch_kvcache`` in buffer mode: a root best match with a device match
        re-anchors on the device node (scheduler.py:3346-3371); every node has page keys."""
        ps = self.page_size
        matched: int = len(match.device_pages) * ps + match.host_hit_length
        anchor = match.best
        if anchor is self.tree.root and match.last_device is not self.tree.root:
            anchor = match.last_device
        self.prefetch_from_storage(
            rid,
            anchor,
            key[matched // ps :],
            max(0, match_end - matched),
            matched,
            now,
            storage_hit_end,
            prefix=key[: matched // ps],
        )
        return matched

    def prefetch_from_storage(
        self,
        rid: Hashable,
        anchor: UNode,
        symbols: tuple[Hashable, ...],
        new_tokens: int,
        storage_start: int,
        now: float,
        storage_hit_end: int | None = None,
        prefix: tuple[Hashable, ...] = (),
    ) -> None:
        """``prefetch_from_storage`` (unified_radix_cache.py:2081-2255), buffer branches."""
        ctrl, stats = self.ctrl, self.stats
        span = self._prefetch_span(rid, symbols, new_tokens, storage_start, storage_hit_end)
        if span is None:
            return
        symbols, length, assume = span
        op = ctrl.prefetch(rid, symbols, self.last_hash(anchor), now, assume_stored=assume)
        op.stats_requested_tokens = length
        op.storage_start = storage_start
        self.ongoing_prefetch[rid] = _Ongoing(anchor, length, op, None)
        self.occupied[rid] = 0
        self.prefix_ctx[rid] = tuple(prefix)
        stats.prefetch_issued += 1
        if assume:
            stats.prefetch_assumed_stored += 1
        if ctrl.immediate:
            ctrl.run_all()

    def _prefetch_busy(self, rid: Hashable) -> bool:
        """A prefetch under way, or a finished one's load staged for admission."""
        return rid in self.ongoing_prefetch or rid in self.staged

    # ------------------------------------------------------------------- retire --
    def _retire(self, rid: Hashable, release: list[int] | None) -> None:
        """``_retire_ongoing_prefetch``: no anchor host lock; occupancy is the allocation."""
        self.ongoing_prefetch.pop(rid)
        self.prefix_ctx.pop(rid, None)
        self.release_anchor_lock(rid)
        if release:
            self.ctrl.append_host_mem_release(release)
        occ = self.occupied.pop(rid, 0)
        self.ctrl.prefetch_tokens_occupied = max(0, self.ctrl.prefetch_tokens_occupied - occ)

    def release_anchor_lock(self, rid: Hashable) -> None:
        lock = self.anchor_locks.pop(rid, None)
        if lock is None:
            return
        self.tree.dec_lock_ref(lock[0])
        self.anchor_locked_tokens -= lock[1]

    def _release_held(self, rid: Hashable) -> bool:
        """An aborted request's staged hold goes first: when it had one, that was all."""
        return self.release_staged_hold(rid)

    def release_staged_hold(self, rid: Hashable) -> bool:
        """Free a staged hold outright: anchor pin, bounce, occupancy (pipeline.py:2010-2025)."""
        self.release_anchor_lock(rid)
        self.staged_defers.pop(rid, None)
        f = self.staged.pop(rid, None)
        if f is None:
            return False
        self.cache.free_host(f.host_pages)
        self.ctrl.prefetch_tokens_occupied -= f.occupied
        return True

    # -------------------------------------------------------------------- drain --
    def drain(self, sizes: tuple[int, int, int, int] | None = None) -> None:
        """``_drain_storage_control_queues_impl`` in buffer mode: parked hits, then that many
        hit results, prefetch acks, backup acks (the staging freed) and host releases."""
        n_hit, n_ack, n_backup, n_release = sizes if sizes is not None else self.queue_sizes()
        c = self.ctrl
        parked = self.pending_hit_allocs
        while parked:
            if not self._try_alloc(parked[0]):
                break
            parked.popleft()
        for _ in range(n_hit):
            self._drain_hit(c.prefetch_hit_queue.popleft())
        for _ in range(n_ack):
            ack = c.ack_prefetch_queue.popleft()
            op = ack.op
            info = self.ongoing_prefetch.get(op.rid)
            current = info is not None and info.op is op
            if ack.completed_tokens is not None and current:
                op.completed_tokens = ack.completed_tokens
            if ack.completed_req:
                if current:
                    self.stats.inserted_early += 1
                    self._handle_prefetch_result(op)
                c.append_host_mem_release(op.host_pages[op.completed_tokens // self.page_size :])
        for _ in range(n_backup):
            self.pipeline.finish_storage_write_ack(c.ack_backup_queue.popleft().op_id)
        freed: list[int] = []
        for _ in range(n_release):
            freed += c.host_mem_release_queue.popleft()
        if freed:
            self.cache.free_host(freed)

    def _heal(self, op: PrefetchOp0523) -> None:
        """``_invalidate_absent_from_hit_query``: a query that ran (not assumed, not cut by a
        deadline) is the verdict on the span's keys."""
        if op.deadline_expired or not op.queried:
            return
        chain = self.ctrl.hasher.chain(op.last_hash, op.symbols)
        self.pipeline.beliefs.heal_from_query(chain, len(op.hit_keys))

    def _drain_hit(self, op: PrefetchOp0523) -> None:
        op.hit_done = True
        self._heal(op)
        rid, stats = op.rid, self.stats
        if rid not in self.ongoing_prefetch:
            return
        if op.terminated:
            if not op.deadline_expired:
                self.retries.poll_miss(rid)
                stats.retries_armed += 1
            self.revoke_pending_prefetch(rid)
            return
        if op.storage_hit_count < self.prefetch_threshold:
            stats.revoked_below_threshold += 1
            self.retries.poll_miss(rid)
            stats.retries_armed += 1
            self.revoke_pending_prefetch(rid)
            return
        if self.pending_hit_allocs or not self._try_alloc(op):
            self.parked += 1
            self.pending_hit_allocs.append(op)

    def _try_alloc(self, op: PrefetchOp0523) -> bool:
        """``_try_alloc_storage_hit`` in buffer mode (unified_radix_cache.py:3043-3110): False
        parks the hit for the next drain."""
        rid = op.rid
        info = self.ongoing_prefetch.get(rid)
        if info is None:
            return True
        if op.terminated:
            self.revoke_pending_prefetch(rid)
            return True
        if self.rate_limited():
            return False
        state, full_match = self.try_lock_anchor(rid, op.storage_hit_count)
        if state == "anchor_lost":
            end = op.storage_start + op.storage_hit_count
            self.revoke_pending_prefetch(rid)
            self.retries.refetch(rid, end)
            return True
        if state == "cap_busy":
            return False
        if self.staged_span_covered(rid, op.storage_hit_count):
            self.revoke_pending_prefetch(rid)
            return True
        hit = self._trim_head(rid, op, info, full_match)
        return self._allocate_and_queue(op, info, hit)

    def match_full_device_prefix(self, key: tuple[Hashable, ...]) -> tuple[int, UNode, int]:
        """``match_full_device_prefix``: read-only device walk; (tokens matched, deepest node,
        that node's whole path length in tokens)."""
        ps, node, off, pinned = self.page_size, self.tree.root, 0, 0
        while off < len(key):
            child = node.children.get(child_key(key, off, None))
            if child is None or child.value is None:
                break
            plen = match_len(child.key, key, off)
            if plen == 0:
                break
            node = child
            pinned += len(child.key)
            off += plen
            if plen < len(child.key):
                break
        return off * ps, node, pinned * ps

    def try_lock_anchor(self, rid: Hashable, remaining: int) -> tuple[str, int]:
        """``try_lock_anchor`` (pipeline.py:1341-1417): pin the device prefix the fetch will
        splice onto, or say why not."""
        assert rid not in self.anchor_locks
        prefix = self.prefix_ctx[rid]
        op = self.ongoing_prefetch[rid].op
        key = prefix + tuple(op.symbols[: remaining // self.page_size])
        matched, node, pinned = self.match_full_device_prefix(key)
        if matched < len(prefix) * self.page_size:
            return "anchor_lost", matched
        if pinned == 0:
            return "no_anchor", matched
        if self.anchor_locked_tokens + pinned > self.anchor_lock_cap:
            return ("cap_skip" if pinned > self.anchor_lock_cap else "cap_busy"), matched
        self.tree.inc_lock_ref(node)
        self.anchor_locks[rid] = (node, pinned)
        self.anchor_locked_tokens += pinned
        return "locked", matched

    def staged_span_covered(self, rid: Hashable, span: int) -> bool:
        """The live device tree covers prefix + hit already (a real match, pipeline.py:1419)."""
        info = self.ongoing_prefetch.get(rid)
        if info is None or span <= 0:
            return False
        key = self.prefix_ctx[rid] + tuple(info.op.symbols[: span // self.page_size])
        m = self.cache.match_prefix(key)
        return len(m.device_pages) >= len(key)

    def _trim_head(self, rid: Hashable, op: PrefetchOp0523, info: _Ongoing, full_match: int) -> int:
        """``_trim_buffer_prefetch_full_head``: drop the hit's pages now on device (the
        prefetch key loses them too, unified_radix_cache.py:2978-2987)."""
        hit = op.storage_hit_count
        trim = min(hit, max(0, full_match - op.storage_start))
        if trim == 0:
            return hit
        pages = trim // self.page_size
        self.prefix_ctx[rid] = self.prefix_ctx[rid] + tuple(op.symbols[:pages])
        op.symbols = op.symbols[pages:]
        op.hit_keys = op.hit_keys[pages:]
        op.hit_pages = len(op.hit_keys)
        op.storage_hit_count -= trim
        op.storage_start += trim
        info.tokens -= trim
        return hit - trim

    def _allocate_and_queue(self, op: PrefetchOp0523, info: _Ongoing, hit: int) -> bool:
        """``allocate_and_queue_prefetch``: the whole hit or nothing (no host eviction)."""
        rid, ctrl = op.rid, self.ctrl
        if hit > ctrl.host.capacity_tokens:
            self.stats.revoked_no_host_space += 1
            self.revoke_pending_prefetch(rid)
            return True
        pages = ctrl.host.alloc(hit)
        if pages is None:
            self.release_anchor_lock(rid)
            return False
        op.storage_hit_count = hit
        op.hit_keys = op.hit_keys[: hit // self.page_size]
        op.hit_pages = len(op.hit_keys)
        op.host_pages = pages
        op.allocated = True
        info.host_pages = pages
        self.occupied[rid] = hit
        ctrl.prefetch_tokens_occupied += hit
        ctrl.start_transfer(op)
        if ctrl.immediate:
            ctrl.run_all()
        return True

    # ---------------------------------------------------------------- completion --
    def _handle_prefetch_result(self, op: PrefetchOp0523) -> None:
        """``stage_completed_prefetch`` (pipeline.py:1593-1690): nothing enters the tree; the
        fetched pages are held for admission."""
        rid, ps = op.rid, self.page_size
        info = self.ongoing_prefetch.pop(rid)
        pages = info.host_pages
        assert pages is not None
        num = op.completed_tokens
        prefix = self.prefix_ctx.pop(rid, None)
        occ = self.occupied.pop(rid, 0)
        if num == 0 or prefix is None:
            self.release_anchor_lock(rid)
            self.ctrl.append_host_mem_release(pages[: num // ps])
            self.ctrl.prefetch_tokens_occupied -= occ
            self.loaded_tokens[rid] = 0
            self.loaded_start.pop(rid, None)
            return
        n = num // ps
        f = Staged(rid, prefix + tuple(op.symbols[:n]), len(prefix) * ps, num, occ,
                   pages[:n], list(op.hit_keys[:n]), op.op_id)  # fmt: skip
        self.pipeline.beliefs.add(f.hash_values)
        self.staged[rid] = f
        self.loaded_tokens[rid] = num
        self.loaded_start[rid] = op.storage_start
        self.stats.loaded_from_storage += num

    # ----------------------------------------------------------------- admission --
    def prepare_staged(self, rid: Hashable, device_prefix: int) -> StagedPlan | bool | None:
        """``prepare_staged_prefetch`` (pipeline.py:1473-1545) with the request's device match:
        None (no staged span, or the device covers it), False (the device prefix shrank: the
        hold is dropped, a re-fetch armed, the request skips this pass), or the plan."""
        f = self.staged.get(rid)
        if f is None:
            return None
        end = f.matched_len + f.num_tokens
        if device_prefix >= end:
            self.release_staged_hold(rid)
            return None
        matched, node, _ = self.match_full_device_prefix(f.key)
        if matched < f.matched_len:
            self.release_staged_hold(rid)
            self.retries.refetch(rid, end)
            return False
        full = end - matched
        if full == 0:
            self.release_staged_hold(rid)
            return None
        return StagedPlan(f.key, matched, node, full, end - device_prefix)

    def defer_staged(self, rid: Hashable) -> None:
        """``defer_staged_admission``: keep the bounce for 32 device-capacity retries."""
        if rid not in self.staged:
            return
        n = self.staged_defers.get(rid, 0) + 1
        self.staged_defers[rid] = n
        if n >= MAX_STAGED_ADMISSION_DEFERS:
            self.staged_dropped += 1
            self.release_staged_hold(rid)

    def init_load_back_staged(self, rid: Hashable, plan: StagedPlan) -> tuple[int, UNode] | None:
        """``BufferModePipeline.init_load_back`` (pipeline.py:1725-1874): device pages for the
        staged tokens (the shortfall evicted first), the H2D queued, the span inserted now.
        None: short of device pages (deferred; the caller returns OTHER)."""
        cache, ps = self.cache, self.page_size
        f = self.staged[rid]
        device = cache.controller.device
        if device.available_size() < plan.full_tokens:
            cache.evict_for_alloc(plan.full_tokens - device.available_size())
        trim = (plan.device_prefix_len - f.matched_len) // ps
        pages = None
        if device.available_size() >= plan.full_tokens:
            pages = cache.controller.load(f.host_pages[trim:], -f.op_id - 1)
        if pages is None:
            self.defer_staged(rid)
            return None
        del self.staged[rid]
        self.staged_defers.pop(rid, None)
        prefix = self.tree.path_device_pages(plan.node, self.tree.root)
        prefix = prefix[: plan.device_prefix_len // ps]
        cache.insert(plan.key, prefix + pages, prev_prefix_len=plan.device_prefix_len)
        self.ongoing_load_back[-f.op_id - 1] = _LoadBack(
            rid, plan.full_tokens, f.occupied, f.host_pages, pages
        )
        m = cache.match_prefix(plan.key)
        canonical = self.tree.path_device_pages(m.last_device, self.tree.root)[len(prefix) :]
        self.release_anchor_lock(rid)
        if len(m.device_pages) < len(plan.key) or canonical != pages:
            raise RuntimeError(f"buffer load-back ownership violation for request {rid!r}")
        cache.stats.load_back_calls += 1
        cache.stats.loaded_tokens += len(pages) * ps
        return len(canonical) * ps, m.last_device

    def finish_load_back(self, ack_id: int) -> bool:
        """``try_finish_load_back``: an H2D ack of a staged load frees its bounce."""
        lb = self.ongoing_load_back.pop(ack_id, None)
        if lb is None:
            return False
        self.cache.free_host(lb.host_pages)
        self.ctrl.prefetch_tokens_occupied -= lb.occupied
        return True

    def is_idle(self) -> bool:
        return self.pipeline.is_idle() and not (
            self.pending_hit_allocs or self.staged or self.ongoing_load_back or self.anchor_locks
        )


__all__ = [
    "ANCHOR_LOCK_CAP",
    "MAX_STAGED_ADMISSION_DEFERS",
    "BufferStorageAttachment",
    "Staged",
    "StagedPlan",
]
