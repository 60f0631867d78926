"""L3 sequences for the 0.5.23 check: the L1/L2 steps of :mod:`conformance.v0523.run` plus the
storage tier, on our cache and the real one (``sglang_l3.RealUnifiedCacheL3``) at once.

What the scheduler does around the storage tier is written once here for both sides
(:class:`L3Driver`), after ``managers/scheduler.py`` 0.5.23:

* ``arrive`` -- a request joins the waiting queue and ``_prefetch_kvcache`` runs (its match with
  the ``input_len - 1`` limit, then ``prefetch_from_storage`` if the best match is backed up or
  the root); the matched length is kept (``storage_prefetch_last_match_len``);
* ``events`` -- ``_process_hicache_events``: ``check_hicache_events`` (its storage drain
  included), then the retry pass over the waiting queue (``pop_ready``, interval and attempts
  of the sequence's config), each due request re-issuing ``_prefetch_kvcache`` with its known
  hit end and one more attempt;
* ``admit`` -- one waiting request at the admission loop: ``check_prefetch_progress`` (not done:
  it stays), ``pop_prefetch_loaded_span``, the match, the device-hit-loss re-query
  (``_prefetch_after_device_hit_loss``: a shorter match than at its last query re-issues and
  the request stays, up to the attempt cap), then the L1/L2 ``serve`` with that match,
  ``finish_storage_prefetch_admission`` and the retry's ``cancel``; one admission in five is
  refused after the checks (``add_one_req`` with a full batch), and the request stays queued;
* ``abort`` -- ``release_aborted_request`` of a waiting request;
* ``query`` / ``read`` / ``backup`` -- one step of the storage threads; ``put`` -- pages another
  server stored; ``tick`` -- the clock moves on (dyadic steps, so the timeout comparisons are
  exact on both sides).

Every result and the whole state (tree, pools, L1/L2 queues, and every L3 queue, in-flight
operation, wait timer, pending retry, loaded-span credit and the store's page count) are
compared after each step.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from conformance.v0523.ours_side import OursUnifiedCache
from conformance.v0523.run import Combo, Driver, Sequence, canonical, compare_steps

PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
#: pages per backend call (SGLang's STORAGE_BATCH_SIZE is 128; small here so that transfers and
#: backups take several calls)
BATCH_PAGES = 2
#: timeout policy: 0.5 s + 1/4 s per 1,024 tokens x 1,024 (i.e. 1/4 s per token at page 1)
TIMEOUT_BASE = 0.5
TIMEOUT_PER_KI_TOKEN = 256.0
TICKS = (0.125, 0.25, 0.5, 1.0, 2.0)
#: retry pass (the defaults are 8 and 8; small so that retries happen within a sequence)
RETRY_INTERVAL = 1
RETRY_MAX_ATTEMPTS = 3


@dataclass
class L3Combo(Combo):
    prefetch_policy: str = "best_effort"
    threshold_pages: int = 2
    host_pages: int = 96
    #: ``--hicache-host-memory-mode``: ``cache`` or ``buffer_only``
    host_memory_mode: str = "cache"

    @property
    def l3(self) -> dict[str, Any]:
        return {
            "prefetch_policy": self.prefetch_policy,
            "threshold": self.threshold_pages * self.page_size,
            "batch_pages": BATCH_PAGES,
            "timeout_base": TIMEOUT_BASE,
            "timeout_per_ki_token": TIMEOUT_PER_KI_TOKEN,
        }

    def label(self) -> str:
        mode = "BUF" if self.host_memory_mode == "buffer_only" else "L3"
        return f"{mode}/{super().label()}/{self.prefetch_policy}/t{self.threshold_pages}"


@dataclass
class Waiting:
    """A queued request as the retry pass reads it."""

    rid: str
    prompt: list[int]
    output: list[int]
    priority: int
    chunk: bool
    storage_prefetch_retry_attempts: int = 0
    last_match_len: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class L3Sequence(Sequence):
    def ops(self) -> list[tuple[Any, ...]]:
        r = self.rng
        out: list[tuple[Any, ...]] = []
        ps = self.combo.page_size
        for _ in range(self.steps):
            x = r.random()
            if x < 0.16:
                prompt = self.tokens(r.randrange(1, 8))
                output = [r.randrange(1, 4) for _ in range(r.randrange(0, 3 * ps))]
                out.append(("arrive", prompt, output, r.randrange(0, 3), r.random() < 0.25))
            elif x < 0.30:
                # one in five admissions is refused after the checks (a full batch, no tokens)
                out.append(("admit", r.randrange(8), r.random() < 0.2))
            elif x < 0.33:
                out.append(("abort", r.randrange(8)))
            elif x < 0.43:
                out.append(("events",))
            elif x < 0.50:
                out.append(("query",))
            elif x < 0.58:
                out.append(("read",))
            elif x < 0.64:
                out.append(("backup",))
            elif x < 0.68:
                out.append(("put", self.tokens(r.randrange(1, 6))))
            elif x < 0.74:
                out.append(("tick", r.choice(TICKS)))
            elif x < 0.82:
                out.append(("finish_writes", r.choice([1, 2, None])))
            elif x < 0.86:
                out.append(("finish_loads", r.choice([1, None])))
            elif x < 0.90:
                out.append(("hold", self.tokens(r.randrange(1, 4))))
            elif x < 0.93:
                out.append(("release", r.randrange(8)))
            elif x < 0.96:
                out.append(("evict", r.randrange(1, 12) * ps))
            else:
                out.append(("evict_host", r.randrange(1, 12) * ps))
        return out


class BufferSequence(L3Sequence):
    """The L3 steps re-weighted for buffer_only: prompts recur (a storage hit needs a prefix
    that was backed up, then evicted from the device), the storage threads and the event
    polls run more often (a staged load needs its query, its hit allocation, its reads and
    its completion ack before the admission), so that staged loads are frequent."""

    def __init__(self, combo: Combo, seed: int, steps: int) -> None:
        super().__init__(combo, seed, steps)
        self.seen: list[list[int]] = []

    def prompt(self) -> list[int]:
        r = self.rng
        if self.seen and r.random() < 0.5:
            base = r.choice(self.seen)
            if r.random() < 0.5:
                return list(base)
            return list(base[: r.randrange(1, len(base) + 1)]) + self.tokens(r.randrange(1, 3))
        p = self.tokens(r.randrange(1, 8))
        self.seen.append(p)
        return p

    def ops(self) -> list[tuple[Any, ...]]:
        r = self.rng
        out: list[tuple[Any, ...]] = []
        ps = self.combo.page_size
        for _ in range(self.steps):
            x = r.random()
            if x < 0.15:
                prompt = self.prompt()
                output = [r.randrange(1, 4) for _ in range(r.randrange(0, 3 * ps))]
                out.append(("arrive", prompt, output, r.randrange(0, 3), r.random() < 0.25))
            elif x < 0.31:
                out.append(("admit", r.randrange(8), r.random() < 0.1))
            elif x < 0.32:
                out.append(("abort", r.randrange(8)))
            elif x < 0.40:
                out.append(("events",))
            elif x < 0.48:
                out.append(("pump", r.randrange(1, 5)))
            elif x < 0.54:
                out.append(("query",))
            elif x < 0.63:
                out.append(("read",))
            elif x < 0.70:
                out.append(("backup",))
            elif x < 0.72:
                out.append(("put", self.prompt()))
            elif x < 0.76:
                out.append(("tick", r.choice(TICKS)))
            elif x < 0.85:
                out.append(("finish_writes", r.choice([1, 2, None])))
            elif x < 0.89:
                out.append(("finish_loads", r.choice([1, None])))
            elif x < 0.92:
                out.append(("hold", self.tokens(r.randrange(1, 4))))
            elif x < 0.94:
                out.append(("release", r.randrange(8)))
            elif x < 0.99:
                out.append(("evict", r.randrange(4, 24) * ps))
            else:
                out.append(("evict_host", r.randrange(1, 12) * ps))
        return out


class L3Driver(Driver):
    """:class:`~conformance.v0523.run.Driver` plus the scheduler's storage-tier steps."""

    def __init__(self, side: Any, page_size: int) -> None:
        super().__init__(side, page_size)
        self.waiting: list[Waiting] = []
        self.now = 0.0
        self.next_rid = 0
        self.counts: Counter[str] = Counter()

    def _prefetch(self, w: Waiting, end: int | None = None) -> Any:
        r = self.side.prefetch(w.rid, w.prompt, len(w.prompt) - 1, self.now, end)
        w.last_match_len = r["matched"]
        return r

    def step(self, op: tuple[Any, ...]) -> Any:
        kind, s = op[0], self.side
        if kind == "arrive":
            self.next_rid += 1
            w = Waiting(f"r{self.next_rid}", op[1], op[2], op[3], op[4])
            self.waiting.append(w)
            return self._prefetch(w)
        if kind == "admit":
            return self.admit(op[1], op[2])
        if kind == "abort":
            if not self.waiting:
                return None
            w = self.waiting.pop(op[1] % len(self.waiting))
            s.abort(w.rid)
            return w.rid
        if kind == "events":
            s.check_hicache_events()
            out = []
            for rid, end in s.retry_pass(self.waiting, RETRY_INTERVAL, RETRY_MAX_ATTEMPTS):
                self.counts["retries_issued"] += 1
                self.counts["retries_with_hit_end"] += end is not None
                w = next(x for x in self.waiting if x.rid == rid)
                w.storage_prefetch_retry_attempts += 1
                out.append((rid, end, self._prefetch(w, end)))
            return out
        if kind == "query":
            return s.query_step()
        if kind == "read":
            return s.read_step()
        if kind == "backup":
            return s.backup_step()
        if kind == "put":
            s.l3_put(op[1])
            return None
        if kind == "pump":
            # the storage threads and the scheduler's polls in a burst: a query, the drain
            # (the hit's allocation), ``op[1]`` reads, the drain (the completion ack)
            out = [s.query_step()]
            s.check_hicache_events()
            out += [s.read_step() for _ in range(op[1])]
            s.check_hicache_events()
            return out
        if kind == "tick":
            self.now += op[1]
            return self.now
        return super().step(op)

    def admit(self, index: int, refused: bool = False) -> Any:
        """The admission loop on one request; ``refused``: ``add_one_req`` turns it away after
        the storage checks (it stays queued, its L3 credit kept as ``storage_hit_length``)."""
        if not self.waiting:
            return None
        s, ps = self.side, self.ps
        w = self.waiting[index % len(self.waiting)]
        if not s.check_prefetch(w.rid, self.now):
            self.counts["admit_pending"] += 1
            return "pending"
        span = s.pop_span(w.rid)
        if span[0] > 0:
            w.extra["storage_hit"] = span
        self.counts["admitted_with_l3_tokens"] += span[0]
        m = s.match(w.prompt, len(w.prompt) - 1)
        current = len(m["device_pages"]) * ps + m["host_hit"]
        if w.last_match_len and current < w.last_match_len:
            if w.storage_prefetch_retry_attempts >= RETRY_MAX_ATTEMPTS:
                w.last_match_len = current
            else:
                w.storage_prefetch_retry_attempts += 1
                self.counts["device_hit_loss_requery"] += 1
                return {"span": span, "requery": self._prefetch(w)}
        if refused:
            self.counts["admission_refused"] += 1
            return {"span": span, "refused": True}
        res = self.serve(w.prompt, w.output, w.priority, w.chunk, m)
        s.finish_admission(w.rid)
        s.cancel_retry(w.rid)
        self.waiting.remove(w)
        return {"span": span, "served": res}


class BufferDriver(L3Driver):
    """:class:`L3Driver` with the buffer_only admission (``managers/scheduler.py:4239-4270``,
    ``schedule_policy.add_one_req``): after the storage checks and the match,
    ``prepare_staged_prefetch`` (False: the staged span's device prefix shrank, the request
    stays for a re-fetch); a refused admission (a full, idle budget) defers the staged hold
    (``defer_staged_admission``); a planned request's ``init_load_back`` loads the staged span
    onto its device prefix (None: deferred, the request stays), then the L1/L2 ``serve``
    with that prefix and the loaded pages."""

    def admit(self, index: int, refused: bool = False) -> Any:
        if not self.waiting:
            return None
        s, c = self.side, self.counts
        w = self.waiting[index % len(self.waiting)]
        if not s.check_prefetch(w.rid, self.now):
            c["admit_pending"] += 1
            return "pending"
        span = s.pop_span(w.rid)
        c["admitted_with_l3_tokens"] += span[0]
        m = s.match(w.prompt, len(w.prompt) - 1)
        current = len(m["device_pages"]) * self.ps + m["host_hit"]
        if w.last_match_len and current < w.last_match_len:
            if w.storage_prefetch_retry_attempts >= RETRY_MAX_ATTEMPTS:
                w.last_match_len = current
            else:
                w.storage_prefetch_retry_attempts += 1
                c["device_hit_loss_requery"] += 1
                return {"span": span, "requery": self._prefetch(w)}
        prep = s.prepare_staged(w.rid, m)
        if not prep["ready"]:
            c["staged_shrunk"] += 1
            return {"span": span, "prep": prep}
        if refused:
            c["admission_refused"] += 1
            c["staged_refused"] += prep["host_hit"] > 0
            s.defer_staged(w.rid)
            return {"span": span, "prep": prep, "refused": True}
        if prep["host_hit"] > 0:
            lb = s.staged_load_back(w.rid)
            if lb is None:
                c["staged_deferred"] += 1
                return {"span": span, "prep": prep, "deferred": True}
            c["staged_loaded"] += 1
            c["staged_loaded_tokens"] += len(lb[0]) * self.ps
        else:
            lb = ([], prep["last_device"])
        m2 = {**m, "device_pages": prep["device_pages"], "last_device": prep["last_device"]}
        res = self.serve(w.prompt, w.output, w.priority, w.chunk, m2, lb)
        s.finish_admission(w.rid)
        s.cancel_retry(w.rid)
        self.waiting.remove(w)
        return {"span": span, "prep": prep, "served": res}


Factory = Callable[[L3Combo], Any]


def buffer_combos(
    page_sizes: list[int], policies: list[str], evictions: list[str]
) -> list[L3Combo]:
    """The L3 combinations in buffer_only mode: host pools are staging only (96 roomy,
    16 and 8 pages under pressure, so staging and loads contend and writes wait)."""
    return [
        L3Combo(
            w,
            e,
            p,
            host_pages=h,
            prefetch_policy=pp,
            threshold_pages=t,
            host_memory_mode="buffer_only",
        )
        for w in policies
        for e in evictions
        for p in page_sizes
        for pp in PREFETCH_POLICIES
        for h, t in ((96, 2), (16, 2), (8, 3))
    ]


def l3_combos(page_sizes: list[int], policies: list[str], evictions: list[str]) -> list[L3Combo]:
    return [
        L3Combo(w, e, p, host_pages=h, prefetch_policy=pp, threshold_pages=t)
        for w in policies
        for e in evictions
        for p in page_sizes
        for pp in PREFETCH_POLICIES
        for h, t in ((96, 2), (16, 3))
    ]


def ours_l3(combo: L3Combo) -> OursUnifiedCache:
    return OursUnifiedCache(
        page_size=combo.page_size,
        device_pages=combo.device_pages,
        host_pages=combo.host_pages,
        write_policy=combo.write_policy,
        eviction_policy=combo.eviction_policy,
        eviction_policy_config=combo.eviction_config,
        l3=combo.l3,
        host_memory_mode=combo.host_memory_mode,
    )


def run_l3_sequence(
    combo: L3Combo,
    seed: int,
    steps: int,
    left: Factory,
    right: Factory,
    view: Callable[[dict[str, Any]], dict[str, Any]] = canonical,
    coverage: Any = None,
) -> dict[str, Any] | None:
    buffer = combo.host_memory_mode == "buffer_only"
    ops = (BufferSequence if buffer else L3Sequence)(combo, seed, steps).ops()
    cls: type[L3Driver] = BufferDriver if buffer else L3Driver
    a, b = cls(left(combo), combo.page_size), cls(right(combo), combo.page_size)
    try:
        res = compare_steps(combo, seed, ops, a, b, view)
        flags = getattr(a.side, "flags", set()) | getattr(b.side, "flags", set())
        if res is not None and "stale_op_bounce_revoked" in flags:
            res["explained"] = "KD-BUF-STALE-OP"
        if res is None and coverage is not None:
            coverage.update(a.side.coverage())
            coverage.update(a.counts)
        return res
    finally:
        for drv in (a, b):
            close = getattr(drv.side, "close", None)
            if close is not None:
                close()


def real_factory(core: str) -> Factory:
    from conformance.v0523.sglang_l3 import RealUnifiedCacheL3

    def make(c: L3Combo) -> Any:
        write_policy = c.write_policy
        if c.host_memory_mode == "buffer_only" and write_policy == "write_back":
            # the launch resolves it (arg_groups/hicache_hook.py:279-289); ours resolves it
            # in the core
            write_policy = "write_through"
        return RealUnifiedCacheL3(
            page_size=c.page_size,
            device_pages=c.device_pages,
            host_pages=c.host_pages,
            write_policy=write_policy,
            eviction_policy=c.eviction_policy,
            eviction_policy_config=c.eviction_config,
            core=core,
            l3=c.l3,
            host_memory_mode=c.host_memory_mode,
        )

    return make


def random_seed(base: int, ci: int, k: int) -> int:
    return random.Random(hash((base, ci, k))).getrandbits(32)
