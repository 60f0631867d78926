"""Scripted scenarios through :class:`RealUnifiedCache` on both TreeCores, plus a random
Python-core vs Rust-core differential of the adapter's observable state.

    .venv-conformance-0.5.23/bin/python -m conformance.v0523.probe [--sequences 200] [--steps 40]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import time
from typing import Any

from conformance.v0523.sglang_side import RealUnifiedCache, common_view, sglang_version

PS = 2  # page size of the scenarios


def fmt_nodes(snap: dict[str, Any]) -> str:
    lines = []
    for n in snap["nodes"]:
        depth = len(n["path"]) - len(n["tokens"])
        extra = ""
        if n["hit_count"] is not None:
            extra = (
                f" hits={n['hit_count']} prio={n['priority']} hlock={n['host_lock_ref']}"
                f" la={n['last_access']:g} cr={n['creation']:g}"
            )
        lines.append(
            f"    {' ' * depth}{n['tokens']} dev={n['device']} host={n['host']}"
            f" lock={n['lock_ref']}{extra}"
        )
    lines.append(
        f"    evictable={snap['evictable_size']} protected={snap['protected_size']}"
        f" dev_free={snap['device_free']} host_free={snap['host_free']}"
    )
    pend = {
        k: snap[k]
        for k in (
            "write_queue",
            "writes_in_flight",
            "load_queue",
            "loads_in_flight",
            "ongoing_write_through",
            "ongoing_load_back",
        )
        if snap[k]
    }
    if pend:
        lines.append(f"    pending={pend}")
    return "\n".join(lines)


def serve(
    c: RealUnifiedCache, tokens: list[int], priority: int = 0, inserted_len: int = 0
) -> dict[str, Any]:
    """Match (limit len-1), allocate the rest (evicting the shortfall), insert, like a request
    that prefills ``tokens`` and is cached at once (no load-back of a host hit)."""
    m = c.match(tokens, limit=len(tokens) - 1)
    have = len(m["device_pages"])
    need = len(tokens) // PS - have
    h = c.lock(m["last_device"])
    try:
        pages = c.alloc_device(need)
        if pages is None:
            c.evict_for_alloc(need * PS - c.allocator.available_size())
            pages = c.alloc_device(need)
        if pages is None:
            return {"match": m, "insert": None}
        r = c.insert(
            tokens,
            m["device_pages"] + pages,
            prev_prefix_len=have * PS,
            inserted_len=inserted_len,
            priority=priority,
        )
    finally:
        c.unlock(h)
    return {"match": m, "insert": r}


def scenarios(core: str) -> None:
    print(f"===== core={core}")
    A = [1, 2, 3, 4, 5, 6, 7, 8]
    B = [1, 2, 3, 4, 9, 9, 9, 9]

    print("(1) insert A, insert B sharing a prefix, match A")
    c = RealUnifiedCache(
        page_size=PS,
        device_pages=12,
        host_pages=12,
        write_policy="write_through",
        eviction_policy="lru",
        core=core,
    )
    print("  serve A ->", serve(c, A)["insert"])
    print("  serve B ->", serve(c, B)["insert"])
    print("  match A ->", c.match(A))
    print(fmt_nodes(c.snapshot()))

    print("(2) write_through: insert, flush_pending_backups, finish_writes, writing_check")
    c = RealUnifiedCache(
        page_size=PS,
        device_pages=12,
        host_pages=12,
        write_policy="write_through",
        eviction_policy="lru",
        core=core,
    )
    L = list(range(1, 17))  # 16 tokens: a load-back needs >= 10 (load_back_threshold)
    serve(c, L)
    print(fmt_nodes(c.snapshot()))
    c.flush_pending_backups()
    print("  after flush:", {k: c.snapshot()[k] for k in ("write_queue", "writes_in_flight")})
    print("  finish_writes(None) ->", c.finish_writes(None))
    c.writing_check()
    print(fmt_nodes(c.snapshot()))

    print("(3) evict_for_alloc to host, match (host hit), init_load_back, finish_loads")
    print("  evict_for_alloc(16) ->", c.evict_for_alloc(16))
    print(fmt_nodes(c.snapshot()))
    print("  match L ->", c.match(L, limit=len(L) - 1))
    loaded = c.init_load_back(L, limit=len(L) - 1)
    print("  init_load_back ->", loaded)
    print(fmt_nodes(c.snapshot()))
    print("  ready_to_load ->", c.ready_to_load(), " finish_loads ->", c.finish_loads(None))
    c.loading_check()
    print(fmt_nodes(c.snapshot()))
    print("  match L ->", c.match(L, limit=len(L) - 1))
    print(fmt_nodes(c.snapshot()))
    c.state_ok()

    print("(4) write_back eviction with the host full (subtree drop)")
    c = RealUnifiedCache(
        page_size=PS,
        device_pages=8,
        host_pages=2,
        write_policy="write_back",
        eviction_policy="lru",
        core=core,
    )
    serve(c, [1, 1, 1, 1, 1, 1])  # 3 pages: can never fit the 2-page host
    serve(c, [1, 1, 1, 1, 1, 1, 0, 0])  # its child
    serve(c, [2, 2])
    print(fmt_nodes(c.snapshot()))
    print("  evict_for_alloc(10) ->", c.evict_for_alloc(10))
    print(fmt_nodes(c.snapshot()))
    c.state_ok()

    print("(5) insert of an evicted node (re-valued, counts a hit)")
    c = RealUnifiedCache(
        page_size=PS,
        device_pages=8,
        host_pages=8,
        write_policy="write_through_selective",
        eviction_policy="lru",
        core=core,
    )
    serve(c, A)
    c.flush_pending_backups()
    c.finish_writes(None)
    c.writing_check()
    print(fmt_nodes(c.snapshot()))
    serve(c, A)  # second hit: selective threshold 2 -> backup
    c.check_hicache_events()
    c.finish_writes(None)
    c.check_hicache_events()
    print(fmt_nodes(c.snapshot()))
    print("  evict_for_alloc(16) ->", c.evict_for_alloc(16))
    print(fmt_nodes(c.snapshot()))
    m = c.match(A, limit=len(A) - 1)
    pages = c.alloc_device(4)
    r = c.insert(A, pages, prev_prefix_len=0, inserted_len=0, priority=0)
    print("  match", m, "\n  insert A on fresh pages", pages, "->", r)
    print(fmt_nodes(c.snapshot()))

    print(
        "(6) prompt-boundary split (checkpoint_into_tree: 2nd insert of the page-aligned "
        "prompt, prev_prefix_len = inserted_len = prompt length, priority + 1)"
    )
    c = RealUnifiedCache(
        page_size=PS,
        device_pages=12,
        host_pages=12,
        write_policy="write_through",
        eviction_policy="priority",
        core=core,
    )
    prompt, full = [5, 5, 6, 6], [5, 5, 6, 6, 7, 7, 8]
    key = full[: len(full) // PS * PS]
    pages = c.alloc_device(len(key) // PS)
    r1 = c.insert(key, pages, prev_prefix_len=0, inserted_len=0, priority=3)
    r2 = c.insert(
        prompt,
        pages[: len(prompt) // PS],
        prev_prefix_len=len(prompt),
        inserted_len=len(prompt),
        priority=4,
    )
    print("  insert full ->", r1, " insert prompt ->", r2)
    print(fmt_nodes(c.snapshot()))


# ----------------------------------------------------------------------- differential --
class Driver:
    """One random op stream, played on one adapter; returns each op's result."""

    def __init__(self, c: RealUnifiedCache) -> None:
        self.c = c
        self.locks: list[int] = []

    def step(self, op: tuple[Any, ...]) -> Any:
        c = self.c
        kind = op[0]
        if kind == "serve":
            return serve(c, op[1], priority=op[2])
        if kind == "match":
            return c.match(op[1], limit=op[2])
        if kind == "lock":
            m = c.match(op[1], limit=len(op[1]) - 1)
            self.locks.append(c.lock(m["last_device"]))
            return m
        if kind == "unlock":
            if not self.locks:
                return None
            c.unlock(self.locks.pop(op[1] % len(self.locks)))
            return None
        if kind == "evict_for_alloc":
            return c.evict_for_alloc(op[1])
        if kind == "evict":
            return c.evict(op[1])
        if kind == "evict_host":
            return c.evict_host(op[1])
        if kind == "load_back":
            pages, path = c.init_load_back(op[1], limit=len(op[1]) - 1)
            if pages:
                self.locks.append(c.lock(path))
            return pages, path
        if kind == "flush":
            return c.flush_pending_backups()
        if kind == "finish_writes":
            return c.finish_writes(op[1])
        if kind == "finish_loads":
            return c.finish_loads(op[1])
        if kind == "writing_check":
            return c.writing_check(write_back=op[1])
        if kind == "loading_check":
            return c.loading_check()
        if kind == "events":
            return c.check_hicache_events()
        if kind == "ready_to_load":
            return c.ready_to_load()
        if kind == "settle":  # every pending D->H done and acked
            c.flush_pending_backups()
            n = c.finish_writes(None)
            c.check_hicache_events()
            return n
        raise ValueError(kind)


def random_ops(rng: random.Random, steps: int, write_policy: str) -> list[tuple[Any, ...]]:
    keys: list[list[int]] = []
    ops: list[tuple[Any, ...]] = []

    def key() -> list[int]:
        if keys and rng.random() < 0.7:
            base = rng.choice(keys)
            cut = rng.randrange(0, len(base) // PS + 1) * PS
            tail = [rng.randrange(3) for _ in range(rng.randrange(1, 5) * PS)]
            k = base[:cut] + tail
        else:
            k = [rng.randrange(3) for _ in range(rng.randrange(3, 9) * PS)]
        keys.append(k)
        return k

    weights = {
        "serve": 30,
        "match": 6,
        "lock": 3,
        "unlock": 9,
        "evict_for_alloc": 5,
        "evict": 3,
        "evict_host": 3,
        "load_back": 12,
        "flush": 5,
        "finish_writes": 7,
        "finish_loads": 5,
        "writing_check": 5,
        "loading_check": 4,
        "events": 6,
        "ready_to_load": 5,
        "settle": 6,
    }
    names, w = zip(*weights.items(), strict=True)
    for _ in range(steps):
        kind = rng.choices(names, w)[0]
        if kind == "serve":
            ops.append((kind, key(), rng.randrange(3)))
        elif kind in ("match",):
            k = key()
            ops.append((kind, k, rng.choice([None, len(k) - 1])))
        elif kind in ("lock", "load_back"):
            ops.append((kind, rng.choice(keys) if keys else key()))
        elif kind == "unlock":
            ops.append((kind, rng.randrange(100)))
        elif kind in ("evict_for_alloc", "evict", "evict_host"):
            ops.append((kind, rng.randrange(1, 13) * PS))
        elif kind in ("finish_writes", "finish_loads"):
            ops.append((kind, rng.choice([None, 1, 2])))
        elif kind == "writing_check":
            ops.append((kind, write_policy == "write_back" and rng.random() < 0.3))
        else:
            ops.append((kind,))
    return ops


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


def differential(sequences: int, steps: int, seed: int) -> int:
    policies = ["write_through", "write_through_selective", "write_back"]
    evictions = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"]
    diverged = 0
    errors = 0
    sanity: list[tuple[Any, ...]] = []
    cov = {
        k: 0
        for k in (
            "load_backs",
            "host_hits",
            "serve_no_room",
            "finish_writes",
            "finish_loads",
            "evicted_tokens",
        )
    }
    t0 = time.time()
    for i in range(sequences):
        rng = random.Random(seed * 1_000_003 + i)
        wp = policies[i % 3]
        ev = evictions[(i // 3) % len(evictions)]
        dev = rng.randrange(12, 28)
        host = rng.randrange(6, 40)
        ops = random_ops(rng, steps, wp)
        sides = [
            Driver(
                RealUnifiedCache(
                    page_size=PS,
                    device_pages=dev,
                    host_pages=host,
                    write_policy=wp,
                    eviction_policy=ev,
                    core=core,
                )
            )
            for core in ("python", "rust")
        ]
        for s, op in enumerate(ops):
            outs = []
            for d in sides:
                try:
                    outs.append(("ok", d.step(op), common_view(d.c.snapshot())))
                except Exception as e:
                    outs.append(("raise", _err(e), None))
            if outs[0] != outs[1]:
                diverged += 1
                print(f"  DIVERGED seq {i} ({wp}, {ev}, dev {dev}, host {host}) step {s} op {op}")
                for core, out in zip(("python", "rust"), outs, strict=True):
                    print(f"    {core}: {out[0]} {out[1]}")
                    if out[2] is not None:
                        print("     ", out[2])
                break
            res = outs[0][1]
            if op[0] == "load_back" and outs[0][0] == "ok" and res[0]:
                cov["load_backs"] += 1
            if op[0] in ("match", "lock") and outs[0][0] == "ok" and res["host_hit"]:
                cov["host_hits"] += 1
            if op[0] == "serve" and outs[0][0] == "ok" and res["insert"] is None:
                cov["serve_no_room"] += 1
            if op[0] in ("finish_writes", "finish_loads") and outs[0][0] == "ok":
                cov[op[0]] += res
            if op[0].startswith("evict") and outs[0][0] == "ok":
                cov["evicted_tokens"] += res
            if outs[0][0] == "raise":
                errors += 1
                print(f"  both raised at seq {i} step {s} op {op}: {outs[0][1]}")
                break
        else:
            # settle (every copy done and acked, every lock released), compare, sanity-check
            # (sanity_check assumes no transfer in flight: mid-load-back under write_through a
            # node reads as an unregistered host duplicate, in both cores)
            finals = []
            for d in sides:
                d.c.ready_to_load()
                d.c.flush_pending_backups()
                d.c.finish_loads(None)
                d.c.finish_writes(None)
                d.c.check_hicache_events()
                while d.locks:
                    d.c.unlock(d.locks.pop())
                finals.append(common_view(d.c.snapshot()))
            if finals[0] != finals[1]:
                diverged += 1
                print(f"  DIVERGED after settling seq {i}:\n    {finals[0]}\n    {finals[1]}")
            for core, d in zip(("python", "rust"), sides, strict=True):
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        d.c.state_ok()
                except AssertionError as e:
                    sanity.append((i, wp, ev, core, str(e).splitlines()[-1].strip()))
    print(
        f"differential: {sequences} sequences x {steps} steps, {diverged} diverged, "
        f"{errors} ended in a common exception, {time.time() - t0:.1f}s"
    )
    print(f"  exercised (python side): {cov}")
    print(f"  sanity_check failures at the end of a sequence: {len(sanity)}")
    for f in sanity[:10]:
        print("    seq {} {} {} core={}: {}".format(*f))
    return diverged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sequences", type=int, default=200)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-scenarios", action="store_true")
    args = ap.parse_args(argv)
    print(f"sglang {sglang_version()}")
    if not args.no_scenarios:
        for core in ("python", "rust"):
            scenarios(core)
    return 1 if differential(args.sequences, args.steps, args.seed) else 0


if __name__ == "__main__":
    sys.exit(main())
