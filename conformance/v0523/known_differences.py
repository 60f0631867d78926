"""The deliberate differences of the 0.5.23 buffer_only check (``run --buffer-only``), in the
form of :mod:`conformance.known_differences`. All but KD-BUF-STALE-OP are *normalised* (the
harness makes the two sides comparable; a mismatch there is a real one); KD-BUF-STALE-OP
*explains* the mismatches of a sequence in which its SGLang-side flag was raised. The L3 entries of
that module that concern the storage threads and keys (KD-L3-THREADS, KD-L3-KEYS, KD-L3-QUEUES,
KD-L3-HIT-LIST, KD-CLOCK, KD-PAGE-IDS) hold for these sequences as for the cache-mode L3 ones.
"""

from __future__ import annotations

from conformance.known_differences import KnownDifference

BUFFER_KNOWN_DIFFERENCES: tuple[KnownDifference, ...] = (
    KnownDifference(
        id="KD-BUF-WRITE-BACK",
        what="write_back is resolved to write_through by SGLang's launch hook, by our core's "
        "constructor",
        why="buffer_only has no host tier to write back to "
        "(arg_groups/hicache_hook.py:279-289); the harness builds ServerArgs directly, which "
        "runs no launch hook",
        treatment="normalised: the SGLang side is built with the resolved policy, ours with "
        "write_back, so our resolution is what the write_back combinations check",
    ),
    KnownDifference(
        id="KD-BUF-STALE-ANCHOR",
        what="a buffer prefetch's anchor holds no lock and may be evicted: SGLang keeps the "
        "dead node id, ours the detached node object",
        why="representation only: both only read the anchor's hash context at issue",
        treatment="normalised: an anchor (or any buffer-state node) no longer in the tree is "
        "compared as None on both sides",
    ),
    KnownDifference(
        id="KD-BUF-KEYS",
        what="existence beliefs, staged hash lists and backup keys are SHA-256 hex strings in "
        "SGLang, 64-bit chained hashes in ours; storage operation ids come from a per-process "
        "counter",
        why="hash functions differ by design (KD-L3-KEYS); op ids are not policy",
        treatment="normalised: every key is compared as the token prefix it names (both sides "
        "register the chains of every key the driver makes; an unknown key reads '?'), in LRU "
        "order for the beliefs; storage writes are compared by (node, staging pages, units, "
        "keys), sorted; D2H ack ids (-(1<<40) - seq) are compared as they are",
    ),
    KnownDifference(
        id="KD-BUF-REQ",
        what="the admission runs on a stand-in Req (the fields prepare_staged_prefetch and "
        "init_load_back read); the prefill budget is not modelled",
        why="the budget is the scheduler's, not the cache's; a refused admission is modelled "
        "as an idle budget's NO_TOKEN (_defer_staged_for_capacity_if_idle -> "
        "defer_staged_admission)",
        treatment="normalised: both sides get the same refusals; metrics-only state "
        "(_storage_prefetch_hit_remaining_by_reqid, outcome stats, dropped-token counters, "
        "anchor-cap skip counts) is not compared",
    ),
    KnownDifference(
        id="KD-BUF-STALE-OP",
        what="a prefetch revoked while its operation still waits for its query (a stale op "
        "in the hit queue revokes the request's newer prefetch; the request re-issues) is "
        "queried later and its hit is allocated onto the request's newer prefetch "
        "(_try_alloc_storage_hit reads ongoing_prefetch[request] without checking that it is "
        "this operation's); the next revoke of that prefetch trips SGLang's assertion "
        "(unified_radix_cache.py:3005, 'buffer mode holds no occupancy here'), which would "
        "stop the scheduler; ours goes on",
        why="an SGLang 0.5.23 defect: the states are equal up to the assertion (ours "
        "reproduces the misattached bounce); a crash is not a decision to copy",
        treatment="explained: the SGLang side flags 'stale_op_bounce_revoked' when the "
        "assertion fires; a mismatch in such a sequence is counted as explained, with its "
        "diff kept in the report",
        triggers=("stale_op_bounce_revoked",),
    ),
    KnownDifference(
        id="KD-BUF-NOT-EXERCISED",
        what="SWA/Mamba/sidecar pools, shared host arenas, TP > 1, the 'unservable' anchor, "
        "the 512 Ki existence-LRU bound, the write-backlog cap (2 x device pool), 32 staged "
        "deferrals, reset",
        why="the dense one-rank path is what hicache-sim models; the bounds are not reached "
        "by 80-step sequences",
        treatment="not exercised",
    ),
)
