"""Random operation sequences on two 0.5.23 caches at once, compared after every step.

``python -m conformance.v0523.run --self-test`` puts our core on both sides (no SGLang needed).
Inside ``.venv-conformance-0.5.23`` (``make conformance SGLANG_VERSION=0.5.23``) the other side is
the real ``UnifiedRadixCache`` (``sglang_side.RealUnifiedCache``), once per TreeCore
(``--cores python,rust``).

What a sequence does is what the 0.5.23 scheduler does around the cache, written once for both
sides (:func:`serve` is one request: match with the ``input_len-1`` limit, ``init_load_back``,
lock, allocate with ``evict_for_alloc`` of the shortfall, the batch's ``start_loading``, one or two
checkpoints -- an unfinished chunk, then the finish with its prompt-boundary split insert --
and unlock), plus the scheduler's polls (``check_hicache_events``, the controller finishing copies)
and direct ``evict`` / ``evict_host`` calls. Results and the whole state are compared after every
step; times are compared by rank (both sides use a logical counter, from different origins).

``--l3``: the L3 sequences of :mod:`conformance.v0523.run_l3` instead (the storage tier on both
sides, the real one built with the file backend: ``sglang_l3.RealUnifiedCacheL3``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.v0523.ours_side import OursUnifiedCache

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
EVICTION = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")


@dataclass
class Combo:
    write_policy: str
    eviction_policy: str
    page_size: int
    host_pages: int = 96
    device_pages: int = 48

    @property
    def eviction_config(self) -> dict[str, Any] | None:
        """``--radix-eviction-policy-config``: for tlru a budget that leaves some nodes
        TEL-safe (with SGLang's defaults, threshold 0 and no estimate, tlru is lru)."""
        if self.eviction_policy != "tlru":
            return None
        return {"threshold": 8 * self.page_size, "next_prompt_estimate": 2 * self.page_size}

    def label(self) -> str:
        return f"{self.write_policy}/{self.eviction_policy}/p{self.page_size}/h{self.host_pages}"


class Request:
    """A request as the scheduler holds it between its match and its finish."""

    def __init__(self, prompt: list[int], output: list[int], priority: int) -> None:
        self.prompt = prompt
        self.output = output
        self.priority = priority


def _ranked(values: list[float]) -> dict[float, int]:
    return {v: i for i, v in enumerate(sorted(set(values)))}


#: the node fields the Rust TreeCore's production binding exposes (no hit counts, priorities,
#: host lock counts or times): what a comparison against it can see
RUST_NODE_FIELDS = ("path", "tokens", "device", "host", "lock_ref")


def common_view(snap: dict[str, Any]) -> dict[str, Any]:
    out = dict(snap)
    out["nodes"] = [{k: n[k] for k in RUST_NODE_FIELDS} for n in snap["nodes"]]
    return out


def canonical(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with times replaced by their ranks."""
    nodes = snap["nodes"]
    if nodes and "last_access" not in nodes[0]:
        return snap
    la = _ranked([n["last_access"] for n in nodes])
    ct = _ranked([n["creation"] for n in nodes])
    out = dict(snap)
    out["nodes"] = [
        {**n, "last_access": la[n["last_access"]], "creation": ct[n["creation"]]} for n in nodes
    ]
    return out


class Sequence:
    """One random sequence of scheduler steps, replayed identically on every side."""

    def __init__(self, combo: Combo, seed: int, steps: int) -> None:
        self.combo = combo
        self.rng = random.Random(seed)
        self.steps = steps
        ps = combo.page_size
        # a few shared prefixes so requests overlap; lengths in whole pages plus a tail
        self.stems = [[self.rng.randrange(1, 4) for _ in range(ps * 6)] for _ in range(3)]

    def tokens(self, pages: int) -> list[int]:
        ps = self.combo.page_size
        stem = list(self.rng.choice(self.stems)) if self.rng.random() < 0.8 else []
        body = [self.rng.randrange(1, 4) for _ in range(pages * ps + self.rng.randrange(ps))]
        return (stem + body)[: max(ps, (len(stem) + len(body)))]

    def ops(self) -> list[tuple[Any, ...]]:
        r = self.rng
        out: list[tuple[Any, ...]] = []
        for _ in range(self.steps):
            x = r.random()
            if x < 0.40:
                prompt = self.tokens(r.randrange(1, 8))
                output = [
                    r.randrange(1, 4) for _ in range(r.randrange(0, 3 * self.combo.page_size))
                ]
                chunk = r.random() < 0.25
                out.append(("serve", prompt, output, r.randrange(0, 3), chunk))
            elif x < 0.50:
                out.append(("hold", self.tokens(r.randrange(1, 4))))
            elif x < 0.56:
                out.append(("release", r.randrange(8)))
            elif x < 0.70:
                out.append(("events",))
            elif x < 0.80:
                out.append(("finish_writes", r.choice([1, 2, None])))
            elif x < 0.86:
                out.append(("finish_loads", r.choice([1, None])))
            elif x < 0.92:
                out.append(("evict", r.randrange(1, 12) * self.combo.page_size))
            elif x < 0.96:
                out.append(("evict_host", r.randrange(1, 12) * self.combo.page_size))
            elif x < 0.98:
                out.append(("match", self.tokens(r.randrange(1, 4))))
            else:  # the waiting-queue refresh's touch (0.5.22+): the whole key, no limit
                out.append(("touch", self.tokens(r.randrange(1, 6))))
        return out


class Driver:
    """Turns each op into the same adapter calls on one side; keeps the side's held locks."""

    def __init__(self, side: Any, page_size: int) -> None:
        self.side = side
        self.ps = page_size
        self.held: list[int] = []

    def step(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        s = self.side
        if kind == "serve":
            return self.serve(op[1], op[2], op[3], op[4])
        if kind == "hold":
            m = s.match(op[1])
            self.held.append(s.lock(m["last_device"]))
            return m
        if kind == "release":
            if not self.held:
                return None
            s.unlock(self.held.pop(op[1] % len(self.held)))
            return None
        if kind == "events":
            s.check_hicache_events()
            return None
        if kind == "finish_writes":
            return s.finish_writes(op[1])
        if kind == "finish_loads":
            return s.finish_loads(op[1])
        if kind == "evict":
            return s.evict(op[1])
        if kind == "evict_host":
            return s.evict_host(op[1])
        if kind == "match":
            return s.match(op[1])
        if kind == "touch":
            s.touch(op[1])
            return None
        raise ValueError(kind)

    def serve(
        self,
        prompt: list[int],
        output: list[int],
        priority: int,
        chunk: bool,
        m: dict[str, Any] | None = None,
        load_back: tuple[list[int], Any] | None = None,
    ) -> Any:
        """One request from its match (``m``: the match the admission loop already made;
        ``load_back``: the (pages, node) its admission's ``init_load_back`` already gave)."""
        s, ps = self.side, self.ps
        limit = len(prompt) - 1
        if m is None:
            m = s.match(prompt, limit)
        if load_back is None:
            loaded, node = s.init_load_back(prompt, limit)
        else:
            loaded, node = load_back
        lk = s.lock(node)
        prefix = list(m["device_pages"]) + list(loaded)
        full = prompt + output
        aligned = len(full) - len(full) % ps
        need = aligned // ps - len(prefix)
        pages = s.alloc_device(need) if need > 0 else []
        if pages is None:
            shortfall = need * ps - len(s.snapshot()["device_free"]) * ps
            s.evict_for_alloc(shortfall)
            pages = s.alloc_device(need)
        s.ready_to_load()
        if pages is None:
            s.unlock(lk)
            return {"m": m, "loaded": loaded, "aborted": True}
        kv = prefix + pages
        protected = len(prefix) * ps
        inserted = 0
        results = []
        if chunk and aligned // ps - len(prefix) >= 2:
            cut = (len(prefix) + (aligned // ps - len(prefix)) // 2) * ps
            r = s.insert(
                full[:cut],
                kv[: cut // ps],
                prev_prefix_len=protected,
                inserted_len=inserted,
                priority=priority,
            )
            results.append(r)
            s.unlock(lk)
            lk = s.lock(r["last_device"])
            protected = inserted = cut
            # the request's row now points at the tree's pages (checkpoint_into_tree rewrites it)
            kv = list(s.match(full[:cut])["device_pages"]) + kv[cut // ps :]
        r = s.insert(
            full[:aligned], kv, prev_prefix_len=protected, inserted_len=inserted, priority=priority
        )
        results.append(r)
        pal = len(prompt) - len(prompt) % ps
        if 0 < pal < aligned:
            results.append(
                s.insert(
                    prompt[:pal],
                    kv[: pal // ps],
                    prev_prefix_len=pal,
                    inserted_len=pal,
                    priority=priority + 1,
                )
            )
        s.unlock(lk)
        s.flush_pending_backups()
        return {"m": m, "loaded": loaded, "ins": results}


def diff(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}.{k}: only on one side"
            d = diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}: {a!r} vs {b!r}"[:600]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


Factory = Callable[[Combo], Any]

#: what the sequences exercised, summed over a run (our side's counters)
COVERAGE: Counter[str] = Counter()


def run_sequence(
    combo: Combo,
    seed: int,
    steps: int,
    left: Factory,
    right: Factory,
    view: Callable[[dict[str, Any]], dict[str, Any]] = canonical,
) -> dict[str, Any] | None:
    ops = Sequence(combo, seed, steps).ops()
    a, b = Driver(left(combo), combo.page_size), Driver(right(combo), combo.page_size)
    res = compare_steps(combo, seed, ops, a, b, view)
    if res is None:
        COVERAGE.update(a.side.coverage())
    return res


def compare_steps(
    combo: Any,
    seed: int,
    ops: list[tuple[Any, ...]],
    a: Driver,
    b: Driver,
    view: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    """Each op on both drivers; the first step whose result or state differs (None: none)."""
    for i, op in enumerate(ops):
        ra, rb = _safe(a, op), _safe(b, op)
        d = diff(ra, rb, "result") or diff(
            view(a.side.snapshot()), view(b.side.snapshot()), "state"
        )
        if d:
            return {
                "combo": combo.label(),
                "seed": seed,
                "step": i,
                "op": repr(op)[:300],
                "diff": d,
                "ops": [repr(o)[:200] for o in ops[: i + 1]],
            }
    return None


def _safe(d: Driver, op: tuple[Any, ...]) -> Any:
    try:
        return d.step(op)
    except Exception as e:  # a raise is a result too: both sides must raise alike
        return {"raised": type(e).__name__}


#: host pools per combination (pages): roomy, and smaller than the device (0.5.23 allows it,
#: with a warning) so that backups fail, write_back drops subtrees and host eviction runs
HOST_PAGES = (96, 12)


def combos(page_sizes: list[int], policies: list[str], evictions: list[str]) -> list[Combo]:
    return [
        Combo(w, e, p, h)
        for w in policies
        for e in evictions
        for p in page_sizes
        for h in HOST_PAGES
    ]


def ours(combo: Combo) -> OursUnifiedCache:
    return OursUnifiedCache(
        page_size=combo.page_size,
        device_pages=combo.device_pages,
        host_pages=combo.host_pages,
        write_policy=combo.write_policy,
        eviction_policy=combo.eviction_policy,
        eviction_policy_config=combo.eviction_config,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=20, help="per combination")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--page-sizes", default="1,4")
    ap.add_argument("--policies", default=",".join(WRITE_POLICIES))
    ap.add_argument("--evictions", default=",".join(EVICTION))
    ap.add_argument("--cores", default="python,rust", help="real TreeCores to compare against")
    ap.add_argument("--self-test", action="store_true", help="our core on both sides")
    ap.add_argument("--out", default="runs/conformance-0.5.23")
    ap.add_argument("--l3", action="store_true", help="L3 sequences (run_l3)")
    ap.add_argument(
        "--buffer-only",
        action="store_true",
        help="L3 sequences with --hicache-host-memory-mode buffer_only (run_l3.BufferDriver)",
    )
    args = ap.parse_args(argv)
    if args.l3 or args.buffer_only:
        return _main_l3(args)
    cs = combos(
        [int(p) for p in args.page_sizes.split(",")],
        args.policies.split(","),
        args.evictions.split(","),
    )
    if args.self_test:
        rights: dict[str, Factory] = {"ours": ours}
    else:
        from conformance.v0523.sglang_side import RealUnifiedCache

        def real(core: str) -> Factory:
            return lambda c: RealUnifiedCache(
                page_size=c.page_size,
                device_pages=c.device_pages,
                host_pages=c.host_pages,
                write_policy=c.write_policy,
                eviction_policy=c.eviction_policy,
                eviction_policy_config=c.eviction_config,
                core=core,
            )

        rights = {core: real(core) for core in args.cores.split(",")}
    return _run_cores(args, cs, rights, _l12_sequence, "", "conformance.json")


def _l12_sequence(
    combo: Any, seed: int, steps: int, right: Factory, view: Any, cov: Counter[str]
) -> dict[str, Any] | None:
    res = run_sequence(combo, seed, steps, ours, right, view)
    cov.update(COVERAGE)
    COVERAGE.clear()
    return res


def _run_cores(
    args: argparse.Namespace,
    cs: list[Any],
    rights: dict[str, Any],
    one: Callable[..., dict[str, Any] | None],
    label: str,
    report_name: str,
    extra: dict[str, Any] | None = None,
) -> int:
    """``args.sequences`` sequences per combination against each side of ``rights``; prints
    each mismatch, the coverage and the totals, writes ``report_name`` under ``args.out``;
    1 if any sequence mismatched."""
    report: dict[str, Any] = {"totals": {}, "mismatches": [], **(extra or {})}
    for core, right in rights.items():
        n = 0
        t0 = time.process_time()
        cov: Counter[str] = Counter()
        view = (lambda x: canonical(common_view(x))) if core == "rust" else canonical
        for ci, combo in enumerate(cs):
            for k in range(args.sequences):
                seed = hash((args.seed, ci, k)) & 0xFFFFFFFF
                res = one(combo, seed, args.steps, right, view, cov)
                n += 1
                if res and res.get("explained"):
                    res["core"] = core
                    report.setdefault("explained", []).append(res)
                    print(f"explained ({res['explained']}) [{core}] {res['combo']} seed={seed}")
                elif res:
                    res["core"] = core
                    report["mismatches"].append(res)
                    print(
                        f"MISMATCH [{core}] {res['combo']} seed={seed} step={res['step']}: "
                        f"{res['op'][:120]}\n   {res['diff'][:400]}",
                        flush=True,
                    )
        mism = sum(1 for m in report["mismatches"] if m["core"] == core)
        expl = sum(1 for m in report.get("explained", []) if m["core"] == core)
        report["totals"][core] = {
            "sequences": n,
            "steps": n * args.steps,
            "mismatches": mism,
            "explained": expl,
            "cpu_s": round(time.process_time() - t0, 1),
            "coverage": dict(cov),
        }
        print(f"[{core}] {label}exercised: {dict(cov)}", flush=True)
        print(
            f"[{core}] {label}{n} sequences x {args.steps} steps over {len(cs)} combinations: "
            f"{mism} mismatching, {expl} explained",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / report_name).write_text(json.dumps(report, indent=1, default=str))
    return 1 if report["mismatches"] else 0


def _main_l3(args: argparse.Namespace) -> int:
    from conformance.v0523 import run_l3

    make = run_l3.buffer_combos if args.buffer_only else run_l3.l3_combos
    cs = make(
        [int(p) for p in args.page_sizes.split(",")],
        args.policies.split(","),
        args.evictions.split(","),
    )
    if args.self_test:
        rights: dict[str, Any] = {"ours": run_l3.ours_l3}
    else:
        rights = {core: run_l3.real_factory(core) for core in args.cores.split(",")}

    def one(
        combo: Any, seed: int, steps: int, right: Any, view: Any, cov: Counter[str]
    ) -> dict[str, Any] | None:
        return run_l3.run_l3_sequence(combo, seed, steps, run_l3.ours_l3, right, view, cov)

    if args.buffer_only:
        from conformance.v0523.known_differences import BUFFER_KNOWN_DIFFERENCES

        kds = {"known_differences": [k.as_dict() for k in BUFFER_KNOWN_DIFFERENCES]}
        return _run_cores(args, cs, rights, one, "buffer_only: ", "conformance-buffer.json", kds)
    return _run_cores(args, cs, rights, one, "L3: ", "conformance-l3.json")


if __name__ == "__main__":
    sys.exit(main())
