"""Decode-side L3 at pre-allocation: a PD decode server with HiCache and a storage backend asks
the store for the prompt's pages past what its own tree holds, promises them to the prefill
side, prefetches them into its host pool and loads them back before the request may decode.

What SGLang 0.5.23 does (file:line of the installed 0.5.23 wheel):

- **The query** (``_build_decode_prefix_match``, disaggregation/decode_hicache_mixin.py:70-114),
  right after the pre-allocation match and lock (decode.py:860-877), only with decode-side
  HiCache and a storage backend (:84): anchored at the match's ``last_host_node``, when that is
  backed up or the root (:86-88), ``query_storage_hit_length`` (mem_cache/
  unified_radix_cache.py:2039-2079) asks one synchronous ``batch_exists`` on the scheduler
  thread for the page-aligned prompt past ``l1 + l2`` (no length limit for a dense model);
  nothing when the prefetch rate limit is reached or the span is below ``prefetch_threshold``;
  a hit is cut to whole pages. ``l3`` is that hit; ``decode_prefix_len = l1 + l2 + l3``.
- **The prefetch** (``_start_hicache_prefetch``, decode_hicache_mixin.py:116-164), once the
  request fits the budget (decode.py:1606-1610): ``prefetch_from_storage`` with
  ``storage_hit_end = l1 + l2 + l3``, so the span is taken as stored and no second query runs
  (unified_radix_cache.py:2111-2126, ``assume_stored``). If it is not registered (declined:
  below the threshold, rate limited, a wait already expired, one under way), ``l3`` is zeroed:
  the prefill side is never promised tokens nothing will load (:151-156).
- **The budget**: the pages past ``l1`` are charged (the gap is loaded into pages the restore
  allocates), and the promised restores not yet loaded are held back from later requests'
  budget (``_hicache_pending_restore_tokens``, :166-174; decode.py:1381, 1620-1626).
- **The restore** (``_process_hicache_local_restores`` / ``_try_hicache_queue_load_back``,
  :208-326, each transfer-queue poll, decode.py:2837-2844): while ``check_prefetch_progress``
  says the prefetch goes on, the request waits (the prefetch stop policy decides:
  ``best_effort`` ends it at the first poll, ``timeout`` after ``base + per page`` from that
  poll, ``wait_complete`` never); then what arrived is popped, the promised prefix re-matched
  (``decode_prefix_len`` tokens) and loaded back; if the device prefix plus the load fall
  short of ``decode_prefix_len`` the restore fails (:253-267), and the request is aborted when
  its KV poll succeeds (``HiCacheRestoreGatedKVReceiver``, :177-191; decode.py:2861-2900:
  ``prepare_abort``, status 500, the prefetch finished as aborted).
- **The commit** (``_commit_hicache_local_restore_to_req``, :328-349, when the transfer is
  taken): the pre-allocation lock is dropped for the restore's lock, the restored pages fill
  ``[l1, decode_prefix_len)`` of the request's row.

Here the policy steps are the decode instance's own 0.5.23 ``UnifiedRadixCache`` and
``StorageAttachment`` (``hicache.policy.v0523``), the same ones the prefill scheduler's L3 tier
runs and conformance holds against SGLang's class. The query's time is one backend
``batch_exists`` call (:meth:`~hicache.storage_backends.StorageBackendSpec.stage_seconds`)
charged to the decode scheduler, as the synchronous call on its thread is, and at tp > 1 one
all-reduce of the hit count across the TP ranks (``Costs.tp_sync_s``), as is each timeout vote
of a restore's progress check. The restores respect SGLang's limit of three load-backs in
flight (``has_free_load_back_slot``: while three are unacknowledged, no restore is queued and
no prefetch polled). Not modelled: decode-side L3 under ``--hicache-host-memory-mode
buffer_only`` (no decode L3 then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache.policy.v0523.l3 import StorageAttachment

if TYPE_CHECKING:
    from hicache.policy.v0523.node import UNode
    from hicache.policy.v0523.tree import Match
    from sim.storage import SimStorage


@dataclass(eq=False, slots=True)
class PendingRestore:
    """A request whose promised prefix past its device prefix (host, L3) waits for its
    restore: its L3 prefetch, if any, then its load-back.

    ``l1`` / ``promised``: the device prefix and ``decode_prefix_len`` in pages; ``registered``:
    an L3 prefetch is in flight (polled first; aborted with the request); ``started``: the load-back
    was issued (``node``: the restore lock's node, ``prefix``: the row's pages up to
    ``promised``); ``failed``: the restore fell short (the request is aborted at its KV poll).
    """

    l1: int
    promised: int
    registered: bool = True
    started: bool = False
    failed: bool = False
    node: UNode | None = None
    prefix: list[int] | None = None


class DecodeL3:
    """The decode server's L3 steps at pre-allocation and restore (see the module docstring):
    ``attachment``: the decode cache's storage tier; ``storage``: its timed stages (the query's
    cost and the store's page bytes)."""

    def __init__(
        self, attachment: StorageAttachment, storage: SimStorage, tp_sync_s: float = 0.0
    ) -> None:
        self.attachment = attachment
        self.storage = storage
        self.page_size = attachment.page_size
        self.queries = 0
        #: one scheduler-thread all-reduce over the TP group (``sim.costs.Costs.tp_sync_s``)
        self.tp_sync_s = tp_sync_s

    def query(self, m: Match, prompt: tuple[object, ...]) -> tuple[int, float]:
        """``query_storage_hit_length`` past ``m`` for the paged ``prompt``: (hit tokens, the
        seconds of the synchronous backend call, 0 when none is made)."""
        att, ps = self.attachment, self.page_size
        anchor = m.last_host
        if anchor.host_value is None and anchor is not att.tree.root:
            return 0, 0.0  # not backed up: nothing past it can be in L3
        if att.ctrl.prefetch_rate_limited():
            return 0, 0.0
        matched = len(m.device_pages) + m.host_hit_length // ps
        symbols = prompt[matched:]
        if len(symbols) * ps < att.prefetch_threshold:
            return 0, 0.0
        hits = att.ctrl.store.match_chain(att.last_hash(anchor), symbols)
        self.queries += 1
        spec = self.storage.spec
        charged = spec.query_pages_charged(len(symbols), len(hits))
        seconds = spec.stage_seconds("query", charged, self.storage.page_bytes)
        # the hit count's MIN all-reduce over the TP group (unified_radix_cache.py:2072-2076)
        return len(hits) * ps, seconds + self.tp_sync_s

    def start(
        self, rid: int, m: Match, prompt: tuple[object, ...], input_length: int, l3: int,
        now: float,
    ) -> bool:  # fmt: skip
        """``_start_hicache_prefetch``: the span up to the queried hit end, taken as stored;
        True when the prefetch was registered (else the promise is zeroed)."""
        att, ps = self.attachment, self.page_size
        matched = len(m.device_pages) * ps + m.host_hit_length
        att.prefetch_from_storage(
            rid, m.last_host, prompt[matched // ps :], input_length - matched, matched, now,
            storage_hit_end=matched + l3,
        )  # fmt: skip
        return rid in att.ongoing_prefetch

    def progress(self, rid: int, now: float) -> tuple[bool, float]:
        """``check_prefetch_progress`` then ``pop_prefetch_loaded_tokens``: (True once the
        request may be restored (its prefetch ended here or earlier), the seconds its TP votes
        block the scheduler)."""
        att = self.attachment
        votes = att.stats.prefetch_tp_votes
        done = att.check_prefetch_progress(rid, now)
        seconds = (att.stats.prefetch_tp_votes - votes) * self.tp_sync_s
        if done:
            att.pop_prefetch_loaded_span(rid)
        return done, seconds

    def deadline(self, rid: int) -> float | None:
        """When a waiting timeout-policy prefetch stops holding ``rid`` (None: not by time)."""
        return self.attachment.deadline_of(rid)

    def abort(self, rid: int) -> None:
        """``tree_cache.finish(handle, ABORT)`` of an aborted request's prefetch."""
        self.attachment.release_aborted_request(rid)


def decode_l3_for(
    cache: object, storage: SimStorage | None, tp_sync_s: float = 0.0
) -> DecodeL3 | None:
    """The decode server's L3 steps when its cache runs HiCache with a storage tier (SGLang:
    ``enable_decode_hicache and tree_cache.enable_storage``), else None."""
    attachment = getattr(cache, "storage", None)
    if storage is None or not isinstance(attachment, StorageAttachment):
        return None
    if attachment.buffer_only:
        return None  # buffer_only hosts keep no tree state for a restore to match
    return DecodeL3(attachment, storage, tp_sync_s)
