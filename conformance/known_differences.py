"""Every deliberate difference between our policy core and SGLang 0.5.14, in one place.

Each entry says what differs, why, and how the comparison treats it. Two kinds of treatment:

* *normalised*: the harness makes both sides comparable (a stub, a conversion, a section kept
  apart) and the entry has no triggers; a mismatch there is a real mismatch.
* *explained*: the sides really diverge. The SGLang side raises a *flag* when the situation
  occurs (see ``Side.flag``); a mismatch at or after a step where one of the entry's
  ``triggers`` was raised is counted as **explained** by that entry -- separately, never
  silently -- and its report still lists the diff.

Sources: the docstrings of ``hicache/policy/hiradix.py`` and POLICY_CORE.md (shared design).
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
            "are [] like ours."
        ),
        why="Either is below every real priority; the root is never evicted (lock_ref 1).",
        treatment="normalised: of the root only last_access is compared.",
    ),
    KnownDifference(
        id="KD-DEC-LOCK-BELOW-ZERO",
        what="dec_lock_ref below zero: ours raises, SGLang lets lock_ref go negative.",
        why="A caller bug either way; ours fails loudly.",
        treatment="not exercised: the driver only releases locks it holds.",
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
