"""Every deliberate difference between our policy core and SGLang 0.5.14, in one place.

Each entry says what differs, why, and how the comparison treats it. Two kinds of treatment:

* *normalised*: the harness makes both sides comparable (a stub, a conversion, a section kept
  apart) and the entry has no triggers; a mismatch there is a real mismatch.
* *explained*: the sides really diverge. The SGLang side raises a *flag* when the situation
  occurs (see ``Side.flag``); a mismatch at or after a step where one of the entry's
  ``triggers`` was raised is counted as **explained** by that entry -- separately, never
  silently -- and its report still lists the diff.

Sources: the docstrings of ``hicache/policy/hiradix.py`` and POLICY_CORE.md (shared design);
for the L3 entries (``KD-L3-*``) ``hicache/policy/storage_tier.py`` (``DEFECTS``) and
STORAGE_TIER.md §8.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class KnownDifference:
    id: str
    what: str
    why: str
    treatment: str
    triggers: tuple[str, ...] = ()
    """SGLang-side flags whose presence explains a mismatch (empty: normalised, never explains)."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


KNOWN_DIFFERENCES: tuple[KnownDifference, ...] = (
    KnownDifference(
        id="KD-LOADBACK-PIN",
        what=(
            "load_back: when the device pool is short, ours pins the host copies of the chain "
            "being loaded (protect_host) for the duration of the nested evict; SGLang locks "
            "only the device ancestor."
        ),
        why=(
            "0.5.14 defect: under write_back the nested evict can fail a write, call evict_host "
            "and delete host-only nodes of the very chain being loaded; the load then fills "
            "detached nodes and their device pages end up owned twice and freed twice. With the "
            "pin, ours fails that load cleanly instead (the request recomputes)."
        ),
        treatment=(
            "explained: the driver flags load_back_chain_detached when a node of the chain left "
            "the tree during init_load_back on the SGLang side; mismatches from that step on "
            "count as explained."
        ),
        triggers=("load_back_chain_detached",),
    ),
    KnownDifference(
        id="KD-WB-DEMOTE-DETACHED",
        what=(
            "write_back evict: at its end, ours demotes only the written nodes still in the "
            "tree; SGLang demotes every written node."
        ),
        why=(
            "A written node that left the tree would have its device pages freed a second "
            "time. Not reachable from a consistent 0.5.14 state (belt and braces in our core), "
            "but reachable after KD-LOADBACK-PIN's double ownership."
        ),
        treatment=(
            "explained: the SGLang stub device pool flags device_double_free; mismatches from "
            "that step on count as explained."
        ),
        triggers=("device_double_free",),
    ),
    KnownDifference(
        id="KD-RESET-STALE",
        what=(
            "reset: SGLang keeps ongoing_write_through / ongoing_load_back entries (and the "
            "controller drops their acks); ours starts both empty."
        ),
        why=(
            "POLICY_CORE.md 2.19: the stale entries are never acked and, with node ids "
            "restarting at 0, are only ever overwritten; no decision reads them."
        ),
        treatment=(
            "normalised: records whose lock node is not in the current tree are kept in the "
            "state's 'stale' section, which is not compared."
        ),
    ),
    KnownDifference(
        id="KD-CLOCK",
        what=(
            "Time: ours is a logical clock (one tick per node touch, one per new node); SGLang "
            "reads time.monotonic() per touch and twice in TreeNode.__init__."
        ),
        why="LRU order must not depend on wall time (POLICY_CORE.md 2, 3).",
        treatment=(
            "normalised: the SGLang side's radix_cache/hiradix_cache see a logical clock; the "
            "two reads of one TreeNode.__init__ share a tick. last_access/creation ticks are "
            "compared exactly, and so are both eviction orders."
        ),
    ),
    KnownDifference(
        id="KD-PAGE-IDS",
        what=(
            "Values: SGLang stores token-slot tensors (page_size slots per page), ours stores "
            "page-id lists."
        ),
        why="Our core works in pages; page_size consecutive slots are one page in SGLang.",
        treatment=(
            "normalised: SGLang slots are converted to page ids (a slot run that is not a "
            "whole page is an error); the stub pools hand pages out in PageAllocator order, so "
            "ids compare exactly, as do both free lists in order."
        ),
    ),
    KnownDifference(
        id="KD-PUBLISH-ORDER",
        what=(
            "A pending write split by a match/insert: SGLang puts the new upper node before the "
            "lower one in the record's publish list, ours appends it."
        ),
        why=(
            "The list is only walked when the ack is processed (clearing pending ids; with KV "
            "events on, SGLang would emit the upper half's event first). Ours does not emit "
            "events."
        ),
        treatment="normalised: publish node ids are compared as a sorted list.",
    ),
    KnownDifference(
        id="KD-EVICT-HOST-RETURN",
        what="evict_host: SGLang returns None, ours the tokens freed.",
        why="Our figure is for reports only.",
        treatment="normalised: both sides' results are the host pool's free-size delta.",
    ),
    KnownDifference(
        id="KD-LOAD-HANDLE",
        what=(
            "ready_to_load_host_cache: SGLang returns a 3-slot producer index, ours an op "
            "handle; both -1 when nothing is queued."
        ),
        why="The index only matters to the model worker's per-layer wait.",
        treatment="normalised: compared as started (!= -1) or not.",
    ),
    KnownDifference(
        id="KD-PERSISTENT-HEAP",
        what=(
            "evict / evict_host: ours keeps lazily invalidated heaps across calls; SGLang "
            "heapifies a snapshot of the leaf set at each call."
        ),
        why="Speed; claimed to pop in exactly SGLang's order (hiradix.py HiRadixCache.evict).",
        treatment="none: compared as is; any difference is a real mismatch.",
    ),
    KnownDifference(
        id="KD-ROOT",
        what=(
            "Root: SGLang's priority is -sys.maxsize, ours -(2**63); SGLang's value/host_value "
            "are [] like ours. A node a prefetch attaches directly under the root inherits "
            "the root's priority (both sides)."
        ),
        why="Either is below every real priority; the root is never evicted (lock_ref 1).",
        treatment=(
            "normalised: of the root only last_access is compared; a node priority equal to "
            "the side's root priority is compared as 'root'."
        ),
    ),
    KnownDifference(
        id="KD-DEC-LOCK-BELOW-ZERO",
        what="dec_lock_ref below zero: ours raises, SGLang lets lock_ref go negative.",
        why="A caller bug either way; ours fails loudly.",
        treatment="not exercised: the driver only releases locks it holds.",
    ),
    # ------------------------------------------------------------------ L3 storage tier --
    KnownDifference(
        id="KD-L3-D1",
        what=(
            "Prefetch termination (_insert_helper_host): when the walk from the anchor ends on "
            "a device-only node below the anchor, SGLang attaches the fetched remainder under "
            "it as a host-only node; ours frees those host pages instead (no credit for them)."
        ),
        why=(
            "STORAGE_TIER.md §8 D1: the device-only node becomes a device leaf with a child "
            "and no host copy, and SGLang's next evict of it raises an AssertionError "
            "(non-leaf) under write_through / write_through_selective."
        ),
        treatment=(
            "explained: the SGLang side flags fetched_under_device_only when a check creates "
            "a host-only node whose parent is a device-only node other than the root."
        ),
        triggers=("fetched_under_device_only",),
    ),
    KnownDifference(
        id="KD-L3-EXTRA-KEY",
        what=(
            "Page keys and extra keys: SGLang's page keys ignore the extra key (a LoRA/salt "
            "request finds pages written under another namespace), and a prefetch anchored at "
            "the root drops the request's extra key (fetched nodes land in the no-extra-key "
            "namespace); ours keeps namespaces apart (a per-namespace chain seed) and inserts "
            "fetched nodes under the request's extra key."
        ),
        why="STORAGE_TIER.md §8 D2: cross-tenant KV reuse in SGLang.",
        treatment=(
            "explained: the SGLang side flags l3_cross_namespace_hit when a query batch hits a "
            "page that no backup wrote under the request's extra key, and "
            "l3_extra_key_dropped when a prefetch whose key lost the request's extra key "
            "inserted something. L3 content is compared as token prefixes without namespace."
        ),
        triggers=("l3_cross_namespace_hit", "l3_extra_key_dropped"),
    ),
    KnownDifference(
        id="KD-L3-RESET-BACKUP",
        what=(
            "reset (flush) while an L2->L3 backup is part-way through its batches: SGLang's "
            "reset joins the backup thread, which finishes the operation it is on (its "
            "remaining pages reach L3); ours drops it with the queued ones."
        ),
        why=(
            "Ours treats the stage's current operation like the queued ones (StorageController"
            ".reset); the pages are simply absent from L3 later. A flush needs an idle engine, "
            "so this only matters for a backup still running at that moment."
        ),
        treatment=(
            "explained: the SGLang stub controller flags reset_backup_in_progress when its "
            "backup stage is inside an operation at reset (and then finishes it, as the join)."
        ),
        triggers=("reset_backup_in_progress",),
    ),
    KnownDifference(
        id="KD-L3-RESET-IO",
        what=(
            "reset with prefetch reads pending (D3/D4): SGLang does not join the prefetch IO "
            "thread; it may exit, or survive and release its operations' host slots after "
            "the host pool was cleared (duplicate free-list entries) and run next to the new "
            "one. Ours drops those operations."
        ),
        why="STORAGE_TIER.md §8 D3/D4: a race in 0.5.14, not a decision to reproduce.",
        treatment=(
            "normalised: the stub's IO stage stops at reset and drops its operations (the "
            "race's clean outcome); a double free would still be flagged by the stub pool."
        ),
    ),
    KnownDifference(
        id="KD-L3-RESET-STALE",
        what=(
            "reset: SGLang keeps ongoing_prefetch and ongoing_backup entries (anchors and "
            "nodes of the old tree); ours clears them (DEFECTS D10)."
        ),
        why=(
            "STORAGE_TIER.md §8 D10: their revokes/acks were cleared with the queues, so "
            "nothing ever reads them again (request ids are not reused)."
        ),
        treatment=(
            "normalised: entries whose anchor/node is not in the current tree go to the "
            "state's 'stale' section (not compared; ours having any is a mismatch)."
        ),
    ),
    KnownDifference(
        id="KD-L3-KEYS",
        what=(
            "L3 keys and operation ids: SGLang chains SHA-256 hex strings over the tokens "
            "(and has one StorageOperation id counter per process); ours chains 64-bit "
            "hashes of (previous key, page symbol) and numbers its own operations."
        ),
        why="Speed; any injective prefix-chained key will do (STORAGE_TIER.md §9).",
        treatment=(
            "normalised: both sides record the token prefix of every key they compute; L3 "
            "content (SGLang: the HiCacheFile directory's files) is compared as the set of "
            "token prefixes, operations as the prefix of their last page, ongoing backups by "
            "node path, revokes by request id."
        ),
    ),
    KnownDifference(
        id="KD-L3-QUEUES",
        what=(
            "Control queues: SGLang's host-release queue holds one item per page and its "
            "revoke queue request ids; ours holds one page list per release and (request id, "
            "op id) pairs. Drains snapshot the queue length first on both sides."
        ),
        why="Ours releases a run of pages as one item; the op id guards against D9.",
        treatment="normalised: release pages compared flattened in order, revokes by id.",
    ),
    KnownDifference(
        id="KD-L3-HIT-LIST",
        what=(
            "A prefetch's hit list: ours grows it batch by batch during the query and keeps "
            "the hit length of a revoked operation (hit_pages); SGLang sets hash_value once, "
            "at the end of the query, and only when it is not revoked."
        ),
        why="Bookkeeping for a timed driver (charging calls as they happen).",
        treatment=(
            "normalised: compared as the hit pages visible to the tree (0 before the query "
            "ends and for a revoked operation); the decisions that read it are compared as is."
        ),
    ),
    KnownDifference(
        id="KD-L3-THREADS",
        what=(
            "Threads: SGLang's prefetch, prefetch IO and backup threads run freely; here the "
            "driver steps each stage one backend call at a time (STORAGE_BATCH_SIZE patched to "
            "the configuration's batch of 2 pages on both sides), and prefetch start times and "
            "timeouts read a logical clock in seconds."
        ),
        why="Determinism: every interleaving a step order produces is one the threads allow.",
        treatment=(
            "normalised: the thread functions' bodies and batch loops are reproduced line by "
            "line around the real per-batch methods; the TP/CP collectives are the identity in "
            "one process, on both sides."
        ),
    ),
    KnownDifference(
        id="KD-L3-NOT-EXERCISED",
        what=(
            "D8 (prefix keys omit the anchor), D9 (stale revoke with a reused request id), "
            "D5/D6 (scheduler-side credit and breakdown reporting), backup failures, MLA "
            "backup skip, a capped file backend, TP > 1."
        ),
        why=(
            "Prefix keys are off by default and no built-in backend reads them; request ids "
            "are unique here; D5/D6 are the scheduler's (the core pops credits exactly like "
            "SGLang, compared as is); the unbounded file backend never fails a write."
        ),
        treatment="not exercised.",
    ),
)


def by_id(kd_id: str) -> KnownDifference:
    for kd in KNOWN_DIFFERENCES:
        if kd.id == kd_id:
            return kd
    raise KeyError(kd_id)


def explain(flags_in_order: Iterable[str]) -> KnownDifference | None:
    """The entry explaining a mismatch, given the SGLang-side flags raised so far in the
    sequence (oldest first): the one triggered by the earliest flag, or None."""
    for flag in flags_in_order:
        for kd in KNOWN_DIFFERENCES:
            if flag in kd.triggers:
                return kd
    return None
