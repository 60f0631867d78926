"""The L3 tier's tree side as SGLang 0.5.23 runs it (``UnifiedRadixCache`` storage methods,
``mem_cache/unified_radix_cache.py``; ``storage_prefetch.py``), dense path, cache host mode.

:class:`StorageAttachment` is attached to one
:class:`~hicache.policy.v0523.cache.UnifiedRadixCache` (``cache.storage``); its method names
are SGLang's. What differs from 0.5.14 (SGLANG_0523.md §2.10):

* backups go out per *published fragment* after each write-through ack
  (:meth:`write_backup_storage`, host-locked until the backup ack);
* :meth:`prefetch_from_storage` reserves occupancy and host-locks the anchor, but allocates no
  host pages: the hit is sized when the query result is drained (:meth:`drain`), revoked there
  when terminated or below the threshold;
* the fetched pages enter the tree as soon as the completion ack is drained
  (:meth:`_handle_prefetch_result`, the tree's ``insert_host``), or at admission with what
  arrived when the stop policy ends the wait (:meth:`check_prefetch_progress`);
* the timeout is ``base + per_page x requested pages`` from the first blocked admission poll;
* misses, rate-limited issues and failed host allocations arm a retry
  (:class:`StoragePrefetchRetries`), issued by the scheduler every ``interval`` passes up to
  ``max_attempts``.

Requests are keyed by their id (SGLang's ``CacheRequestHandle`` adds an attempt id that changes
only when a request is re-queued; the drivers give such a request a new id). Metrics-only
bookkeeping (``_storage_prefetch_hit_remaining_by_reqid``, outcome counters) is left out; it
decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hicache.policy.v0523.l3_controller import PrefetchOp0523, StorageController0523
from hicache.policy.v0523.node import UNode

if TYPE_CHECKING:
    from hicache.policy.v0523.cache import UnifiedRadixCache
    from hicache.policy.v0523.tree import Match

#: ``--hicache-storage-prefetch-retry-poll-interval`` / ``--...-max-attempts`` defaults (0.5.20+,
#: managers/scheduler.py:3393-3424; arg_groups/fields/memory.py).
RETRY_POLL_INTERVAL = 8
RETRY_MAX_ATTEMPTS = 8
#: The timeout stop policy's defaults: 1 s plus 0.25 s per 1,024 requested tokens
#: (unified_radix_cache.py:316-318; storage_attachment.py:289-293).
TIMEOUT_BASE_S = 1.0
TIMEOUT_PER_KI_TOKEN_S = 0.25
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")

#: 0.5.14's defects that are still open in 0.5.23 with an L3 tier (SGLANG_0523.md §3), counted
#: where a run meets them (the behaviour is SGLang's: reproduced, not avoided).
DEFECTS_0523: dict[str, str] = {
    "B6": "under write_back a request whose deepest match is an unbacked device node issues no "
    "L3 prefetch at all (scheduler.py:3362-3391 prefetches only from a backed-up or root "
    "anchor); counted with the tokens it could have asked for (reproduced)",
}


@dataclass
class _Retry:
    immediate: bool
    storage_hit_end: int | None = None
    due_step: int | None = None


class Waiting(Protocol):
    """What a retry pass reads of a waiting request."""

    rid: Hashable
    storage_prefetch_retry_attempts: int


class StoragePrefetchRetries:
    """``StoragePrefetchRetries`` (``storage_prefetch.py``): pending re-issues by request id."""

    def __init__(self) -> None:
        self.pending: dict[Hashable, _Retry] = {}
        self.step = 0

    def poll_miss(self, rid: Hashable, storage_hit_end: int | None = None) -> None:
        self.pending[rid] = _Retry(False, storage_hit_end)

    def refetch(self, rid: Hashable, storage_hit_end: int | None = None) -> None:
        self.pending[rid] = _Retry(True, storage_hit_end)

    def cancel(self, rid: Hashable) -> None:
        self.pending.pop(rid, None)

    def clear(self) -> None:
        self.pending.clear()

    def pop_ready(
        self, waiting: Any, interval: int, max_attempts: int
    ) -> list[tuple[Any, int | None]]:
        """``waiting``: the queue (a sequence of :class:`Waiting`, list or deque)."""
        """One scheduler pass: the waiting requests whose retry is due, in queue order (a
        speculative retry of the queue head is dropped)."""
        self.step += 1
        if not waiting or not self.pending:
            return []
        head = self.pending.get(waiting[0].rid)
        if head is not None and not head.immediate:
            self.cancel(waiting[0].rid)
        if not any(r.due_step is None or r.due_step <= self.step for r in self.pending.values()):
            return []
        ready: list[tuple[Any, int | None]] = []
        for req in waiting:
            retry = self.pending.get(req.rid)
            if retry is None:
                continue
            if req.storage_prefetch_retry_attempts >= max_attempts:
                self.cancel(req.rid)
                continue
            if not retry.immediate:
                if interval <= 0:
                    self.cancel(req.rid)
                    continue
                if retry.due_step is None:
                    retry.due_step = self.step + interval
                if retry.due_step > self.step:
                    continue
            self.cancel(req.rid)
            ready.append((req, retry.storage_hit_end))
        return ready


class _PrefetchWait:
    """``_StoragePrefetchWait`` with its ``PollTimer`` (``started_at`` None: not running)."""

    __slots__ = ("expired", "started_at", "timeout_s")

    def __init__(self, timeout_s: float = 0.0) -> None:
        self.timeout_s = timeout_s
        self.started_at: float | None = None
        self.expired = False


class _Ongoing:
    """``_OngoingPrefetch``: anchor, requested tokens, host pages (None until the hit is
    allocated), the operation and the anchor's host-lock receipt."""

    __slots__ = ("anchor", "host_pages", "op", "tokens", "uuid")

    def __init__(self, anchor: UNode, tokens: int, op: PrefetchOp0523, uuid: int | None) -> None:
        self.anchor = anchor
        self.tokens = tokens
        self.host_pages: list[int] | None = None
        self.op = op
        self.uuid = uuid


@dataclass
class StorageStats0523:
    """Tree-side L3 totals (tokens unless named otherwise)."""

    prefetch_issued: int = 0
    prefetch_below_threshold: int = 0
    prefetch_rate_limited: int = 0
    prefetch_assumed_stored: int = 0
    revoked: int = 0
    revoked_below_threshold: int = 0
    revoked_no_host_space: int = 0
    hit_truncated: int = 0
    terminated: int = 0
    deadline_expired: int = 0
    inserted_early: int = 0
    insert_dropped: int = 0
    aborted: int = 0
    loaded_from_storage: int = 0
    duplicate_tokens_freed: int = 0
    backup_ops: int = 0
    backup_tokens: int = 0
    retries_armed: int = 0
    # the scheduler-thread all-reduces of the prefetch checks: the timeout policy's MAX vote
    # of each check that finds the prefetch running (unified_radix_cache.py:2295-2311; no
    # other policy votes, and the termination reduces nothing on this thread); each blocks
    # the scheduler at tp > 1
    prefetch_tp_votes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class StorageAttachment:
    """The L3 half of one 0.5.23 cache (see the module docstring)."""

    buffer_only = False
    """True for ``buffer_l3.BufferStorageAttachment`` (``--hicache-host-memory-mode
    buffer_only``)."""

    def __init__(
        self,
        cache: UnifiedRadixCache,
        controller: StorageController0523,
        *,
        prefetch_policy: str = "best_effort",
        prefetch_threshold: int = 256,
        timeout_base: float = TIMEOUT_BASE_S,
        timeout_per_ki_token: float = TIMEOUT_PER_KI_TOKEN_S,
    ) -> None:
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"unknown prefetch policy {prefetch_policy!r}; choose one of "
                f"{', '.join(PREFETCH_POLICIES)}"
            )
        self.cache = cache
        self.tree = cache.tree
        self.ctrl = controller
        self.page_size = cache.page_size
        self.prefetch_policy = prefetch_policy
        self.prefetch_threshold = prefetch_threshold
        self.timeout_base = timeout_base
        self.timeout_per_page = self.page_size / 1024 * timeout_per_ki_token
        self.ongoing_prefetch: dict[Hashable, _Ongoing] = {}
        self.ongoing_backup: dict[int, tuple[UNode, int | None]] = {}
        self.waits: dict[Hashable, _PrefetchWait] = {}
        self.retries = StoragePrefetchRetries()
        self.loaded_tokens: dict[Hashable, int] = {}
        self.loaded_start: dict[Hashable, int] = {}
        self.stats = StorageStats0523()

    # ------------------------------------------------------------------------- page keys --
    def node_hash_values(self, node: UNode) -> list[int]:
        """``node.hash_value``: its page keys chained from its parent's last key (computed
        when first needed: a key is a function of the node's path, so this equals SGLang's
        computing it when the node is made)."""
        hv = node.hash_value
        if hv is not None:
            return hv
        path: list[UNode] = []
        n = node
        root = self.tree.root
        while n is not root and n.hash_value is None:
            path.append(n)
            assert n.parent is not None
            n = n.parent
        last = self.ctrl.hasher.seed(None) if n is root else n.hash_value[-1]  # type: ignore[index]
        for x in reversed(path):
            x.hash_value = self.ctrl.hasher.chain(last, x.key)
            last = x.hash_value[-1]
        assert node.hash_value is not None
        return node.hash_value

    def last_hash(self, node: UNode) -> int:
        if node is self.tree.root:
            return self.ctrl.hasher.seed(None)
        return self.node_hash_values(node)[-1]

    # ---------------------------------------------------------------------------- backup --
    def write_backup_storage(self, node: UNode) -> None:
        """After a write-through ack: back the node's host pages up to L3 (one op per published
        fragment), host-locked until the backup ack."""
        if node.host_value is None:
            return
        op_id = self.ctrl.write_storage(node.host_value, self.node_hash_values(node))
        self.ongoing_backup[op_id] = (node, self.tree.inc_host_lock_ref(node))
        self.stats.backup_ops += 1
        self.stats.backup_tokens += len(node.host_value) * self.page_size
        if self.ctrl.immediate:
            self.ctrl.run_all()

    # -------------------------------------------------------------------------- prefetch --
    def prefetch_from_storage(
        self,
        rid: Hashable,
        anchor: UNode,
        symbols: tuple[Hashable, ...],
        new_tokens: int,
        storage_start: int,
        now: float,
        storage_hit_end: int | None = None,
    ) -> None:
        """Issue the existence query for the pages ``symbols`` (the request's pages after the
        matched ``storage_start`` tokens; ``new_tokens`` is the unaligned span up to the match
        limit). ``storage_hit_end``: a retry's known hit end (the span up to it is taken as
        stored)."""
        ctrl, stats = self.ctrl, self.stats
        span = self._prefetch_span(rid, symbols, new_tokens, storage_start, storage_hit_end)
        if span is None:
            return
        symbols, length, assume = span
        if ctrl.prefetch_rate_limited():
            stats.prefetch_rate_limited += 1
            self.retries.poll_miss(rid, storage_hit_end)
            stats.retries_armed += 1
            return
        uuid = self.tree.inc_host_lock_ref(anchor)
        op = ctrl.prefetch(rid, symbols, self.last_hash(anchor), now, assume_stored=assume)
        op.stats_requested_tokens = length
        op.storage_start = storage_start
        self.ongoing_prefetch[rid] = _Ongoing(anchor, length, op, uuid)
        ctrl.prefetch_tokens_occupied += length
        stats.prefetch_issued += 1
        if assume:
            stats.prefetch_assumed_stored += 1
        if ctrl.immediate:
            ctrl.run_all()

    def _prefetch_busy(self, rid: Hashable) -> bool:
        """The request has a prefetch under way: a second is not issued."""
        return rid in self.ongoing_prefetch

    def _prefetch_span(
        self,
        rid: Hashable,
        symbols: tuple[Hashable, ...],
        new_tokens: int,
        storage_start: int,
        storage_hit_end: int | None,
    ) -> tuple[tuple[Hashable, ...], int, bool] | None:
        """The opening of ``prefetch_from_storage`` that both host modes share
        (unified_radix_cache.py:2081-2155): the request's retry cancelled; nothing when its
        wait has expired or a prefetch is under way; a retry's known hit end taken as stored;
        the span cut to whole pages, nothing below ``prefetch_threshold``. Returns the pages'
        symbols, the span in tokens and whether it is taken as stored."""
        ps = self.page_size
        self.retries.cancel(rid)
        wait = self.waits.get(rid)
        if wait is not None and wait.expired:
            return None
        if self._prefetch_busy(rid):
            return None
        assume = storage_hit_end is not None and (
            storage_start < storage_hit_end <= storage_start + new_tokens
        )
        if assume:
            assert storage_hit_end is not None
            new_tokens = storage_hit_end - storage_start
        pages = new_tokens // ps
        length = pages * ps
        assume = assume and storage_start + length == storage_hit_end
        if length < self.prefetch_threshold:
            self.stats.prefetch_below_threshold += 1
            return None
        return symbols[:pages], length, assume

    def _start_wait(self, op: PrefetchOp0523, now: float) -> None:
        """The timeout policy's timer starts at the first blocked admission poll."""
        if self.prefetch_policy == "timeout" and op.rid not in self.waits:
            pages = op.stats_requested_tokens // self.page_size
            wait = _PrefetchWait(self.timeout_base + pages * self.timeout_per_page)
            wait.started_at = now
            self.waits[op.rid] = wait

    def _deadline_expired(self, op: PrefetchOp0523, now: float) -> bool:
        if op.allocated and op.completed_tokens >= len(op.hit_keys) * self.page_size:
            return False  # the KV has landed
        wait = self.waits.get(op.rid)
        return wait is not None and (
            wait.expired or (wait.started_at is not None and now - wait.started_at > wait.timeout_s)
        )

    def deadline_of(self, rid: Hashable) -> float | None:
        """When a waiting timeout-policy prefetch's deadline passes (None: no timer yet)."""
        wait = self.waits.get(rid)
        if wait is None or wait.started_at is None:
            return None
        return wait.started_at + wait.timeout_s

    def _can_terminate(self, op: PrefetchOp0523, now: float) -> bool:
        if self.prefetch_policy == "best_effort":
            return True
        if self.prefetch_policy == "wait_complete":
            return False
        return self._deadline_expired(op, now)

    def check_prefetch_progress(self, rid: Hashable, now: float) -> bool:
        """At admission: True when the request may go ahead (no prefetch, or it ended here)."""
        info = self.ongoing_prefetch.get(rid)
        if info is None:
            return True
        op = info.op
        if not op.terminated:
            if self.prefetch_policy == "timeout":
                self.stats.prefetch_tp_votes += 1  # _can_terminate_prefetch's MAX all-reduce
            if not self._can_terminate(op, now):
                self._start_wait(op, now)
                return False
            if self.prefetch_policy == "timeout":
                op.deadline_expired = True
                self.retries.cancel(rid)
                self.waits.setdefault(rid, _PrefetchWait()).expired = True
                self.stats.deadline_expired += 1
        op.mark_terminate()
        self.stats.terminated += 1
        if not op.allocated:
            if not op.deadline_expired:
                self.retries.poll_miss(rid)
                self.stats.retries_armed += 1
            self.revoke_pending_prefetch(rid)
        else:
            self._handle_prefetch_result(op)
        return True

    def _handle_prefetch_result(self, op: PrefetchOp0523) -> None:
        """Insert what arrived (``completed_tokens``) into the tree; free the overlap."""
        rid, ps = op.rid, self.page_size
        info = self.ongoing_prefetch[rid]
        pages = info.host_pages
        assert pages is not None
        done = op.completed_tokens // ps
        prefix, dropped = self.tree.insert_host(
            info.anchor, op.symbols[:done], pages[:done], op.hit_keys[:done]
        )
        if dropped:
            self.stats.insert_dropped += done * ps
            self.ctrl.append_host_mem_release(pages[:done])
            loaded = 0
        else:
            self.cache.free_host(pages[: prefix // ps])
            self.stats.duplicate_tokens_freed += prefix
            loaded = op.completed_tokens - prefix
        self.tree.dec_host_lock_ref(info.anchor, info.uuid)
        del self.ongoing_prefetch[rid]
        self.ctrl.prefetch_tokens_occupied -= info.tokens
        self.loaded_tokens[rid] = loaded
        self.stats.loaded_from_storage += loaded
        if loaded > 0:
            self.loaded_start[rid] = op.storage_start + prefix
        else:
            self.loaded_start.pop(rid, None)

    def pop_prefetch_loaded_span(self, rid: Hashable) -> tuple[int, int | None]:
        """The L3-loaded tokens of an admitted request and where they start."""
        return self.loaded_tokens.pop(rid, 0), self.loaded_start.pop(rid, None)

    def finish_admission(self, rid: Hashable) -> None:
        """``finish_storage_prefetch_admission``: the wait budget closes."""
        self.waits.pop(rid, None)

    def release_aborted_request(self, rid: Hashable) -> None:
        self.waits.pop(rid, None)
        self.loaded_tokens.pop(rid, None)
        self.loaded_start.pop(rid, None)
        self.retries.cancel(rid)
        if self._release_held(rid):
            return
        info = self.ongoing_prefetch.get(rid)
        if info is None:
            return
        self.stats.aborted += 1
        info.op.mark_terminate()
        if not info.op.allocated:
            self.revoke_pending_prefetch(rid)
            return
        assert info.host_pages is not None
        self._retire(rid, info.host_pages[: info.op.completed_tokens // self.page_size])

    def _release_held(self, rid: Hashable) -> bool:
        """What an aborted request holds besides its prefetch (cache mode: nothing); True
        when that was all it held."""
        return False

    def _retire(self, rid: Hashable, release: list[int] | None) -> None:
        """``_retire_ongoing_prefetch``."""
        info = self.ongoing_prefetch.pop(rid)
        self.tree.dec_host_lock_ref(info.anchor, info.uuid)
        if release:
            self.ctrl.append_host_mem_release(release)
        self.ctrl.prefetch_tokens_occupied = max(
            0, self.ctrl.prefetch_tokens_occupied - info.tokens
        )

    def revoke_pending_prefetch(self, rid: Hashable) -> None:
        if rid in self.ongoing_prefetch:
            self.stats.revoked += 1
            self._retire(rid, None)

    # ----------------------------------------------------------------------------- drain --
    def queue_sizes(self) -> tuple[int, int, int, int]:
        """The four queue lengths ``check_hicache_events`` takes before it drains."""
        c = self.ctrl
        return (
            len(c.prefetch_hit_queue),
            len(c.ack_prefetch_queue),
            len(c.ack_backup_queue),
            len(c.host_mem_release_queue),
        )

    def drain(self, sizes: tuple[int, int, int, int] | None = None) -> None:
        """``_drain_storage_control_queues_impl``: that many hit results, prefetch acks,
        backup acks and host releases (all when ``sizes`` is None), in that order."""
        n_hit, n_ack, n_backup, n_release = sizes if sizes is not None else self.queue_sizes()
        c = self.ctrl
        for _ in range(n_hit):
            self._drain_hit(c.prefetch_hit_queue.popleft())
        for _ in range(n_ack):
            ack = c.ack_prefetch_queue.popleft()
            op = ack.op
            info = self.ongoing_prefetch.get(op.rid)
            current = info is not None and info.op is op
            if ack.completed_tokens is not None and current:
                assert op.completed_tokens <= ack.completed_tokens
                op.completed_tokens = ack.completed_tokens
            if ack.completed_req:
                if current:
                    self.stats.inserted_early += 1
                    self._handle_prefetch_result(op)
                assert info is not None or op.allocated
                c.append_host_mem_release(op.host_pages[op.completed_tokens // self.page_size :])
        for _ in range(n_backup):
            bop = c.ack_backup_queue.popleft()
            entry = self.ongoing_backup.pop(bop.op_id, None)
            if entry is not None:
                self.tree.dec_host_lock_ref(entry[0], entry[1])
        freed: list[int] = []
        for _ in range(n_release):
            freed += c.host_mem_release_queue.popleft()
        if freed:
            self.cache.free_host(freed)

    def _drain_hit(self, op: PrefetchOp0523) -> None:
        """One query result: revoke (terminated, below the threshold, no host room) or allocate
        the hit and start the transfer."""
        op.hit_done = True
        rid, stats = op.rid, self.stats
        if rid not in self.ongoing_prefetch:
            return
        hit = op.storage_hit_count
        if op.terminated:
            if not op.deadline_expired:
                self.retries.poll_miss(rid)
                stats.retries_armed += 1
            self.revoke_pending_prefetch(rid)
            return
        if hit < self.prefetch_threshold:
            stats.revoked_below_threshold += 1
            self.retries.poll_miss(rid)
            stats.retries_armed += 1
            self.revoke_pending_prefetch(rid)
            return
        info = self.ongoing_prefetch[rid]
        pages, alloc_len = self.ctrl.allocate_storage_hit(
            op, hit, self.prefetch_threshold, self.cache.evict_host
        )
        if pages is None:
            stats.revoked_no_host_space += 1
            self.revoke_pending_prefetch(rid)
            self.retries.poll_miss(rid, op.storage_start + op.storage_hit_count)
            stats.retries_armed += 1
            return
        if alloc_len < hit:
            stats.hit_truncated += hit - alloc_len
        op.storage_hit_count = alloc_len
        op.hit_keys = op.hit_keys[: alloc_len // self.page_size]
        op.hit_pages = len(op.hit_keys)
        op.host_pages = pages
        op.allocated = True
        info.host_pages = pages
        self.ctrl.start_transfer(op)
        if self.ctrl.immediate:
            self.ctrl.run_all()

    def reset(self) -> None:
        """``_reset_full``'s storage part: every tracked prefetch and backup is dropped with
        the controller's queues (the host pool is cleared by the cache)."""
        self.ctrl.reset()
        self.ongoing_prefetch.clear()
        self.ongoing_backup.clear()
        self.waits.clear()
        self.retries.clear()
        self.loaded_tokens.clear()
        self.loaded_start.clear()


def prefetch_kvcache(
    attachment: StorageAttachment,
    rid: Hashable,
    key: tuple[Hashable, ...],
    match: Match,
    match_end: int,
    now: float,
    storage_hit_end: int | None = None,
) -> int:
    """The scheduler's ``_prefetch_kvcache`` after its match ``match`` of paged ``key``
    (``init_next_round_input``, made by the caller with its side effects): anchored at the best
    match, if that is backed up or the root, fetch the pages after the matched ones up to
    ``match_end`` tokens. Returns the matched length (``storage_prefetch_last_match_len``)."""
    if attachment.buffer_only:
        return attachment.prefetch_kvcache(  # type: ignore[attr-defined, no-any-return]
            rid, key, match, match_end, now, storage_hit_end
        )
    ps = attachment.page_size
    matched: int = len(match.device_pages) * ps + match.host_hit_length
    anchor = match.best
    if anchor.host_value is None and anchor is not attachment.tree.root:
        if not attachment.tree.is_write_back:
            return matched  # an unbacked prefix: nothing after it is in L3 (write-through)
        # still open in 0.5.23 (SGLANG_0523.md §3, b6): under write_back a device-only best
        # match issues no prefetch at all, whatever L3 holds after it
        span = (match_end - matched) // ps * ps
        if span >= attachment.prefetch_threshold:
            defects = attachment.cache.defects
            defects["B6"] = defects.get("B6", 0) + 1
            tokens = attachment.cache.defect_tokens
            tokens["B6"] = tokens.get("B6", 0) + span
    else:
        attachment.prefetch_from_storage(
            rid,
            anchor,
            key[matched // ps :],
            max(0, match_end - matched),
            matched,
            now,
            storage_hit_end,
        )
    return matched


Evictor = Callable[[int], int]

__all__ = [
    "DEFECTS_0523",
    "PREFETCH_POLICIES",
    "RETRY_MAX_ATTEMPTS",
    "RETRY_POLL_INTERVAL",
    "StorageAttachment",
    "StoragePrefetchRetries",
    "StorageStats0523",
    "prefetch_kvcache",
]
