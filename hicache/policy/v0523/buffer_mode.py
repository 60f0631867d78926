"""SGLang 0.5.23's ``--hicache-host-memory-mode buffer_only`` write path, dense FULL/KV path
(``mem_cache/buffer_mode/pipeline.py`` ``BufferModePipeline``, ``storage_existence_cache.py``).

Host RAM only stages copies: a backup goes device -> host staging -> storage and its staging is
freed at the storage ack; nothing is ever host-backed in the tree. One method per SGLang step
(BUFFER_ONLY.md has the file:line of each):

* :meth:`BufferPipeline.enqueue_backup_intent` -- admission of one node of a ``BackupKV`` chain
  into the FIFO (existence beliefs, parent cover, backlog cap, oversize);
* :meth:`BufferPipeline.flush_pending_writes` -- the end of ``check_hicache_events``: the queue's
  refresh (dead spans swept, split spans replaced by their pieces), then head-of-line launches
  of D2H staging within the write window;
* :meth:`BufferPipeline.finish_backup_ack` (D2H ack: unlock, storage write) and
  :meth:`BufferPipeline.finish_storage_write_ack` (storage ack: beliefs, staging freed).

The load path (staged prefetches, consumed at admission) is ``buffer_l3``'s.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, NamedTuple

from hicache.policy.v0523.node import UNode

if TYPE_CHECKING:
    from hicache.policy.v0523.cache import UnifiedRadixCache

#: Write-staging floor, a share of the host pool (``HICACHE_WRITE_STAGING_POOL_FRACTION``,
#: managers/cache_controller.py:266).
WRITE_STAGING_POOL_FRACTION = 0.2
#: Loads may fill the host pool to this share before hits park
#: (``HICACHE_LOAD_POOL_USAGE_FRACTION``, managers/cache_controller.py:263, 624-630).
LOAD_POOL_USAGE_FRACTION = 0.9
#: Entries per pool of the existence beliefs (``HICACHE_EXISTENCE_CACHE_MAX_ENTRIES``,
#: storage_existence_cache.py:41).
EXISTENCE_MAX_ENTRIES = 512 * 1024
#: Synthetic ack ids of buffer-mode D2H writes: ``-(1 << 40) - seq`` (pipeline.py:1087-1088).
BACKUP_ACK_BASE = -(1 << 40)


class ExistenceBeliefs:
    """``PoolExistenceBeliefs`` of the KV pool: an LRU of page keys believed stored, plus the
    refcounted keys in flight (D2H launch to storage ack)."""

    def __init__(self, max_entries: int = EXISTENCE_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[Any, None] = OrderedDict()
        self.inflight: dict[Any, int] = {}

    def add(self, keys: Any) -> None:
        e = self.entries
        for k in keys:
            e[k] = None
            e.move_to_end(k)
        for _ in range(len(e) - self.max_entries):
            e.popitem(last=False)

    def contains(self, key: Any) -> bool:
        if key not in self.entries:
            return False
        self.entries.move_to_end(key)
        return True

    def covered(self, keys: Any) -> bool:
        """Every key believed stored or in flight (believed ones are LRU-touched, in order,
        until the first key that is neither)."""
        e, inflight = self.entries, self.inflight
        for k in keys:
            if k in e:
                e.move_to_end(k)
            elif k not in inflight:
                return False
        return True

    def track_inflight(self, keys: Any) -> None:
        for k in keys:
            self.inflight[k] = self.inflight.get(k, 0) + 1

    def untrack_inflight(self, keys: Any) -> None:
        for k in keys:
            n = self.inflight.get(k, 0) - 1
            if n <= 0:
                self.inflight.pop(k, None)
            else:
                self.inflight[k] = n

    def heal_from_query(self, chain: list[Any], hit_pages: int) -> None:
        """``ChainPagesPolicy.heal_from_query`` with a verdict: forget the keys past the hit,
        learn the ones up to it."""
        for k in chain[hit_pages:]:
            self.entries.pop(k, None)
        self.add(chain[:hit_pages])

    def clear(self) -> None:
        self.entries.clear()
        self.inflight.clear()


class Snapshot(NamedTuple):
    """``BufferBackupSnapshot``: the node and what it was at admission (a split shortens its
    key; its ancestors then hold the head)."""

    node: UNode
    key_len: int
    keys: list[Any]
    parent: UNode
    parent_is_root: bool
    parent_last_hash: Any


class ParentState(NamedTuple):
    parent: UNode
    parent_is_root: bool
    parent_last_hash: Any


class Launched:
    """``_UnifiedBufferBackupEntry``: a launched intent and its staging pages."""

    __slots__ = ("host_pages", "intent", "units")

    def __init__(self, intent: Snapshot, host_pages: list[int], units: int) -> None:
        self.intent = intent
        self.host_pages = host_pages
        self.units = units


class BufferPipeline:
    """``BufferModePipeline``'s write path (see the module docstring); ``storage`` is the
    cache's buffer-mode :class:`~hicache.policy.v0523.buffer_l3.BufferStorageAttachment`."""

    def __init__(self, cache: UnifiedRadixCache, storage: Any, device_tokens: int) -> None:
        self.cache = cache
        self.tree = cache.tree
        self.storage = storage
        self.page_size = cache.page_size
        #: leak backstop, 2 x the device pool (unified_radix_cache.py:541-544)
        self.write_backlog_cap = 2 * device_tokens
        self.beliefs = ExistenceBeliefs()
        self.backups_dropped = 0
        """Tokens of intents dropped (SGLang's ``log_backup_dropped_tokens``)."""
        self.reset()

    def reset(self) -> None:
        self.pending: deque[Snapshot] = deque()
        self.span_refs: dict[tuple[int, int], int] = {}
        self.inflight: set[int] = set()
        """Nodes with a KV write queued, staged or awaiting its storage ack."""
        self._walk: set[int] | None = None
        self.ongoing_write_through: dict[int, Launched] = {}
        self.ongoing_backup: dict[int, Launched] = {}
        self._ack_seq = 0
        self.write_staged_tokens = 0
        self.write_backlog_tokens = 0

    @property
    def host(self) -> Any:
        return self.cache.controller.host

    def is_idle(self) -> bool:
        return not (
            self.pending or self.inflight or self.ongoing_write_through or self.ongoing_backup
        )

    # -------------------------------------------------------------------- snapshots --
    def _last_hash(self, node: UNode) -> Any:
        if node is self.tree.root:
            return None
        return self.storage.node_hash_values(node)[-1]

    def snapshot(self, node: UNode) -> Snapshot | None:
        """``snapshot_buffer_backup``: None for the root, a node gone or without device KV."""
        if node is self.tree.root or self.tree.nodes.get(node.id) is not node:
            return None
        if node.value is None or not node.key:
            return None
        parent = node.parent
        assert parent is not None
        keys = list(self.storage.node_hash_values(node))
        is_root = parent is self.tree.root
        return Snapshot(node, len(node.key), keys, parent, is_root, self._last_hash(parent))

    def _validate(self, s: Snapshot) -> ParentState | None:
        """``validate_buffer_backup``: None when the node is gone, lost its device KV, or was
        split (its key is shorter)."""
        node = s.node
        if self.tree.nodes.get(node.id) is not node or node.value is None:
            return None
        if len(node.key) != s.key_len or node.parent is None:
            return None
        p = node.parent
        return ParentState(p, p is self.tree.root, self._last_hash(p))

    def _parent_covered(self, st: Any) -> bool:
        """``_backup_parent_covered``: the parent is the root, has a KV write pending, or its
        last page key is believed stored."""
        if st.parent_is_root or st.parent.id in self.inflight:
            return True
        return st.parent_last_hash is not None and self.beliefs.contains(st.parent_last_hash)

    # ------------------------------------------------------------ admission (FIFO) --
    def begin_insert_walk(self) -> None:
        self._walk = set()

    def end_insert_walk(self) -> None:
        self._walk = None

    def _retain_span(self, s: Snapshot) -> None:
        span = (s.node.id, s.key_len)
        refs = self.span_refs.get(span, 0)
        if refs == 0:
            self.write_backlog_tokens += s.key_len * self.page_size
        self.span_refs[span] = refs + 1

    def _release_span(self, s: Snapshot) -> None:
        span = (s.node.id, s.key_len)
        refs = self.span_refs[span]
        if refs == 1:
            del self.span_refs[span]
            self.write_backlog_tokens -= s.key_len * self.page_size
        else:
            self.span_refs[span] = refs - 1

    def enqueue_backup_intent(self, node: UNode) -> None:
        """``enqueue_backup_intent`` (pipeline.py:688-750)."""
        walk = self._walk
        if walk is not None:
            if node.id in walk:
                return
            walk.add(node.id)
        s = self.snapshot(node)
        if s is None or self.beliefs.covered(s.keys):
            return  # nothing to write (_write_intents empty)
        covered = self._parent_covered(s)
        if node.id in self.inflight:
            return
        tokens = len(s.keys) * self.page_size
        span = (node.id, s.key_len)
        if span not in self.span_refs and self.write_backlog_tokens >= self.write_backlog_cap:
            self.backups_dropped += tokens
            return
        if not covered or tokens > self.host.capacity_tokens:
            self.backups_dropped += tokens
            return
        self.pending.append(s)
        self.inflight.add(node.id)
        self._retain_span(s)

    def backup_chain(self, chain: list[UNode]) -> None:
        """``_execute_and_commit_kv_backup`` in buffer mode: every node of the chain, parent
        first, is offered to the FIFO; nothing is host-backed."""
        for node in chain:
            self.enqueue_backup_intent(node)

    # ----------------------------------------------------------------- the refresh --
    def _split_pieces(self, s: Snapshot) -> list[Snapshot] | None:
        """``_split_pieces``: the live nodes that now spell the admitted span, parents first."""
        pieces: list[Snapshot] = []
        node, remaining = s.node, s.key_len
        while remaining > 0:
            piece = self.snapshot(node)
            if piece is None or piece.key_len > remaining:
                return None
            pieces.append(piece)
            remaining -= piece.key_len
            node = piece.parent
        if node is not s.parent:
            return None
        pieces.reverse()
        return pieces

    def _refresh(self) -> dict[int, Any]:
        """``_refresh_pending_backup_intents``: dead spans dropped, split ones replaced by
        their pieces in FIFO order; returns each survivor's parent state."""
        queued = {s.node.id for s in self.pending}
        survivors: dict[int, Snapshot] = {}
        states: dict[int, Any] = {}
        for s in self.pending:
            nid = s.node.id
            if nid in survivors:
                self._release_span(s)
                continue
            st = self._validate(s)
            if st is not None:
                survivors[nid] = s
                states[nid] = st
                continue
            self.inflight.discard(nid)
            self._release_span(s)
            pieces = self._split_pieces(s)
            if pieces is None:
                self.backups_dropped += len(s.keys) * self.page_size
                continue
            for piece in pieces:
                pid = piece.node.id
                if pid in survivors or (pid in self.inflight and pid not in queued):
                    continue
                if self.beliefs.covered(piece.keys):
                    continue
                survivors[pid] = piece
                states[pid] = piece
                self.inflight.add(pid)
                self._retain_span(piece)
        self.pending = deque(survivors.values())
        return states

    # ------------------------------------------------------------------ the launch --
    def write_window(self) -> int:
        """``live_cap``: the pool minus prefetch occupancy minus a tenth, floored at the
        write-staging fraction (pipeline.py:901-908)."""
        size = self.host.capacity_tokens
        occupied: int = self.storage.ctrl.prefetch_tokens_occupied
        return int(max(int(WRITE_STAGING_POOL_FRACTION * size), size - occupied - size // 10))

    def _drop_head(self, dropped: bool) -> None:
        s = self.pending.popleft()
        self.inflight.discard(s.node.id)
        self._release_span(s)
        if dropped:
            self.backups_dropped += len(s.keys) * self.page_size

    def flush_pending_writes(self) -> None:
        """``flush_pending_writes`` (pipeline.py:889-964): stage the FIFO head while the write
        window and the host pool allow, then submit the launched copies as one op."""
        if not self.pending:
            return
        states = self._refresh()
        cap = self.write_window()
        ps = self.page_size
        while self.pending:
            s = self.pending[0]
            if not self._parent_covered(states[s.node.id]):
                self._drop_head(True)  # the drop cascades down the chain
                continue
            if self.write_staged_tokens >= cap and s.keys:
                break
            value = s.node.value
            if not s.keys or not value or self.beliefs.covered(s.keys):
                self._drop_head(False)  # nothing left to write
                continue
            if len(value) * ps > self.host.capacity_tokens:
                self._drop_head(True)
                continue
            if not self._stage(s, value):
                break  # host full of in-flight staging: wait for acks, head of line
            self.pending.popleft()
        self.cache.controller.start_writing()

    def _stage(self, s: Snapshot, value: list[int]) -> bool:
        """``_stage_backup_intent``: staging pages, keys in flight, the node device-locked
        until its D2H ack."""
        self._ack_seq += 1
        ack_id = BACKUP_ACK_BASE - self._ack_seq
        host_pages = self.cache.controller.write(list(value), ack_id)
        if host_pages is None:
            self._ack_seq -= 1
            return False
        self.beliefs.track_inflight(s.keys)
        self.tree.inc_lock_ref(s.node)
        units = len(host_pages) * self.page_size
        self.ongoing_write_through[ack_id] = Launched(s, host_pages, units)
        self.write_staged_tokens += units
        self._release_span(s)
        return True

    # ------------------------------------------------------------------------ acks --
    def owns_write_ack(self, ack_id: int) -> bool:
        return ack_id in self.ongoing_write_through

    def finish_backup_ack(self, ack_id: int) -> None:
        """D2H done: unlock the node and write the staging pages to storage."""
        entry = self.ongoing_write_through.pop(ack_id)
        self.tree.dec_lock_ref(entry.intent.node)
        ctrl = self.storage.ctrl
        op_id = ctrl.write_storage(entry.host_pages, list(entry.intent.keys))
        self.ongoing_backup[op_id] = entry
        st = self.storage.stats
        st.backup_ops += 1
        st.backup_tokens += entry.units
        if ctrl.immediate:
            ctrl.run_all()

    def finish_storage_write_ack(self, op_id: int) -> None:
        """Storage ack: the keys are believed stored, the staging is freed at once."""
        entry = self.ongoing_backup.pop(op_id, None)
        if entry is None:
            return
        keys = entry.intent.keys
        self.beliefs.add(keys)
        self.beliefs.untrack_inflight(keys)
        self.cache.free_host(entry.host_pages)
        self.write_staged_tokens -= entry.units
        self.inflight.discard(entry.intent.node.id)


__all__ = [
    "EXISTENCE_MAX_ENTRIES",
    "LOAD_POOL_USAGE_FRACTION",
    "WRITE_STAGING_POOL_FRACTION",
    "BufferPipeline",
    "ExistenceBeliefs",
]
