"""CLI: ``python -m conformance.run --sequences N --steps M --seed S --out DIR``.

Runs N random sequences of M steps for every write policy x page size x eviction strategy
(the L1/L2 tier), and ``--l3-sequences`` sequences of ``--l3-steps`` steps for every write
policy x L3 page size x prefetch stop policy (the L3 storage tier attached; the eviction
strategy and host ratio drawn per sequence), with the real SGLang ``HiRadixCache`` as side A
and our core as side B, prints a summary table per tier and writes ``DIR/conformance.json``
(figures, every known difference, what the L3 sequences exercised, and a report per
mismatching sequence: seed, config, step, op, diff, and the ops -- minimised for the first few).

``--self-test`` puts our core on both sides (no sglang needed). ``--replay FILE --report K``
replays report K of a previous ``conformance.json`` step by step. Exit status: 0 when no
mismatch is left unexplained, 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from conformance.driver import Driver, snapshot
from conformance.engine import SideFactory, minimise, run_sequence, sequence_rng
from conformance.known_differences import KNOWN_DIFFERENCES
from conformance.ops import (
    L3_PAGE_SIZES,
    PAGE_SIZES,
    PREFETCH_POLICIES,
    STRATEGIES,
    WRITE_POLICIES,
    Config,
    Op,
    generate,
    make_config,
    make_l3_config,
)

TIERS = ("l1l2", "l3")

#: sequences per task handed to a worker (load balancing across combos)
CHUNK = 8
#: full op lists are kept for at most this many mismatch reports per combo
REPORTS_PER_COMBO = 3
#: a sequence still running after this many seconds is stopped and reported (a hang in the
#: code under test must not hang the run; a normal sequence takes milliseconds)
SEQUENCE_TIMEOUT_S = 60


class SequenceTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise SequenceTimeout(f"sequence ran over {SEQUENCE_TIMEOUT_S} s")


def factories(mode: str) -> tuple[SideFactory, SideFactory, tuple[str, str]]:
    """Side A, side B and their names for ``mode`` (``sglang`` or ``self``)."""
    from conformance.ours_side import OursSide

    if mode == "self":
        return OursSide, OursSide, ("a", "b")
    from conformance.sglang_side import SglangSide

    return SglangSide, OursSide, ("sglang", "ours")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m conformance.run", description=__doc__)
    p.add_argument("--sequences", type=int, default=60, help="sequences per combination")
    p.add_argument("--steps", type=int, default=100, help="operations per sequence")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/conformance")
    p.add_argument("--policies", default=",".join(WRITE_POLICIES))
    p.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)))
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--tiers", default=",".join(TIERS), help="l1l2, l3 or both")
    p.add_argument("--l3-sequences", type=int, default=300, help="L3 sequences per L3 combination")
    p.add_argument("--l3-steps", type=int, default=100, help="operations per L3 sequence")
    p.add_argument("--l3-page-sizes", default=",".join(map(str, L3_PAGE_SIZES)))
    p.add_argument("--prefetch-policies", default=",".join(PREFETCH_POLICIES))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--minimise", type=int, default=2, help="mismatches to minimise (0: none)")
    p.add_argument("--minimise-budget", type=float, default=30.0, help="seconds per minimisation")
    p.add_argument("--self-test", action="store_true", help="our core on both sides")
    p.add_argument("--replay", help="a conformance.json to replay a report from")
    p.add_argument("--report", type=int, default=0, help="which report --replay replays")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------- workers --
def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Sequences ``task['indices']`` of one combination (runs in a worker process)."""
    make_a, make_b, names = factories(task["mode"])
    tier = task["tier"]
    policy, ps, variant = task["combo"]  # variant: the eviction strategy, or the L3 policy
    combo = f"{policy}/p{ps}/{variant}" if tier == "l1l2" else f"L3/{policy}/p{ps}/{variant}"
    res: dict[str, Any] = {"combo": combo, "tier": tier, "sequences": 0, "steps": 0}
    res.update(mismatches=0, explained=0, explained_by={}, agreed_errors=0, ours_flags=0)
    res.update(reports=[], coverage={})
    t0 = time.perf_counter()
    for index in task["indices"]:
        rng = sequence_rng(task["seed"], combo, index)
        if tier == "l1l2":
            cfg = make_config(rng, policy, ps, variant)
        else:
            cfg = make_l3_config(rng, policy, ps, variant)
        ops = generate(rng, cfg, task["steps"])
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(SEQUENCE_TIMEOUT_S)
        try:
            outcome = run_sequence(cfg, ops, make_a, make_b, names)
        finally:
            signal.alarm(0)
        res["sequences"] += 1
        res["steps"] += outcome.steps
        res["agreed_errors"] += len(outcome.agreed_errors)
        res["ours_flags"] += len(outcome.b_flags)
        for k, v in outcome.coverage.items():
            res["coverage"][k] = res["coverage"].get(k, 0) + v
        m = outcome.mismatch
        if m is None:
            continue
        if m.explained_by:
            res["explained"] += 1
            res["explained_by"][m.explained_by] = res["explained_by"].get(m.explained_by, 0) + 1
        else:
            res["mismatches"] += 1
        report = {"combo": combo, "seed": task["seed"], "sequence": index}
        report.update(config=cfg.as_dict(), **m.as_dict())
        report["ops"] = [op.as_dict() for op in ops[: m.step + 1]]
        res["reports"].append(report)
    res["time_s"] = time.perf_counter() - t0
    return res


def _tasks(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    tiers = args.tiers.split(",")
    policies = args.policies.split(",")
    plan: list[tuple[str, Any, int, int]] = []
    if "l1l2" in tiers:
        combos = itertools.product(
            policies, [int(x) for x in args.page_sizes.split(",")], args.strategies.split(",")
        )
        plan += [("l1l2", c, args.sequences, args.steps) for c in combos]
    if "l3" in tiers:
        combos = itertools.product(
            policies,
            [int(x) for x in args.l3_page_sizes.split(",")],
            args.prefetch_policies.split(","),
        )
        plan += [("l3", c, args.l3_sequences, args.l3_steps) for c in combos]
    tasks = []
    for tier, combo, sequences, steps in plan:
        for start in range(0, sequences, CHUNK):
            indices = list(range(start, min(start + CHUNK, sequences)))
            tasks.append(
                {"mode": mode, "tier": tier, "combo": combo, "indices": indices}
                | {"steps": steps, "seed": args.seed}
            )
    return tasks


def _merge(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_combo: dict[str, dict[str, Any]] = {}
    for part in parts:
        agg = by_combo.setdefault(
            part["combo"],
            {"combo": part["combo"], "tier": part["tier"], "explained_by": {}, "coverage": {}},
        )
        for k in ("sequences", "steps", "mismatches", "explained", "agreed_errors", "time_s"):
            agg[k] = agg.get(k, 0) + part[k]
        agg["ours_flags"] = agg.get("ours_flags", 0) + part["ours_flags"]
        for kd, n in part["explained_by"].items():
            agg["explained_by"][kd] = agg["explained_by"].get(kd, 0) + n
        for k, n in part["coverage"].items():
            agg["coverage"][k] = agg["coverage"].get(k, 0) + n
        agg.setdefault("reports", []).extend(part["reports"])
    for agg in by_combo.values():
        agg["reports"].sort(key=lambda r: r["sequence"])
    return list(by_combo.values())


# ----------------------------------------------------------------------------------- output --
def _table(rows: list[dict[str, Any]], subtotals: list[dict[str, Any]]) -> str:
    """One line per combination (worker CPU seconds), then a total line per tier."""
    head = (
        f"{'combination':<46}{'seqs':>7}{'steps':>9}{'mismatch':>10}{'explained':>11}{'cpu s':>9}"
    )
    lines = [head, "-" * len(head)]

    def line(r: dict[str, Any]) -> str:
        return (
            f"{r['combo']:<46}{r['sequences']:>7}{r['steps']:>9}{r['mismatches']:>10}"
            f"{r['explained']:>11}{r.get('cpu_s', r['time_s']):>9.1f}"
        )

    lines += [line(r) for r in rows]
    lines.append("-" * len(head))
    lines += [line(t) for t in subtotals]
    return "\n".join(lines)


def _totals(rows: list[dict[str, Any]], wall: float, label: str = "TOTAL") -> dict[str, Any]:
    tot: dict[str, Any] = {"combo": label, "explained_by": {}, "coverage": {}}
    for k in ("sequences", "steps", "mismatches", "explained", "agreed_errors", "ours_flags"):
        tot[k] = sum(r[k] for r in rows)
    for r in rows:
        for kd, n in r["explained_by"].items():
            tot["explained_by"][kd] = tot["explained_by"].get(kd, 0) + n
        for k, n in r.get("coverage", {}).items():
            tot["coverage"][k] = tot["coverage"].get(k, 0) + n
    tot["time_s"] = wall
    tot["cpu_s"] = sum(r["time_s"] for r in rows)
    return tot


def _minimise_reports(reports: list[dict[str, Any]], mode: str, count: int, budget: float) -> None:
    """Minimise the first ``count`` reports, unexplained ones first."""
    make_a, make_b, names = factories(mode)
    ordered = sorted(reports, key=lambda r: (r["explained_by"] is not None, r["combo"]))
    seen: set[str | None] = set()
    done = 0
    for rep in ordered:
        if done >= count:
            break
        if rep["explained_by"] in seen and rep["explained_by"] is not None:
            continue  # one minimal example per known difference is enough
        seen.add(rep["explained_by"])
        cfg = Config(**rep["config"])
        ops = [Op.from_dict(o) for o in rep["ops"]]
        small = minimise(cfg, ops, make_a, make_b, names, budget_s=budget)
        rep["minimal_ops"] = [op.as_dict() for op in small]
        rep["minimal_ops_text"] = [op.describe() for op in small]
        final = run_sequence(cfg, small, make_a, make_b, names).mismatch
        if final is not None:
            rep["minimal_diffs"] = final.diffs
        done += 1


def replay(path: str, index: int, mode: str) -> int:
    """Print a report's (minimal) sequence step by step: both results, then the state diff."""
    from conformance.compare import compare_results, compare_states

    data = json.loads(Path(path).read_text())
    rep = data["reports"][index]
    cfg = Config(**rep["config"])
    ops = [Op.from_dict(o) for o in rep.get("minimal_ops") or rep["ops"]]
    make_a, make_b, names = factories(mode)
    a, b = make_a(cfg), make_b(cfg)
    da, db = Driver(a), Driver(b)
    print(f"{rep['combo']} {cfg}")
    for i, op in enumerate(ops):
        ra, rb = da.step(op), db.step(op)
        print(f"[{i}] {op.describe()}\n    {names[0]}: {ra}\n    {names[1]}: {rb}")
        for line in compare_results(ra, rb, names) + compare_states(
            snapshot(a), snapshot(b), names
        ):
            print(f"    DIFF {line}")
        for side in (a, b):
            for f in side.take_flags():
                print(f"    FLAG {side.name}: {f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    mode = "self" if args.self_test else "sglang"
    if args.replay:
        return replay(args.replay, args.report, mode)
    if mode == "sglang":
        from conformance import import_stubs, sglang_side

        version = sglang_side.sglang_version()
        stubbed = import_stubs.stubbed_modules()
    else:
        version, stubbed = "n/a (self-test)", []
    tasks = _tasks(args, mode)
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            parts = list(pool.map(run_task, tasks))
    else:
        parts = [run_task(t) for t in tasks]
    rows = _merge(parts)
    wall = time.perf_counter() - t0
    totals = _totals(rows, wall)
    by_tier = {
        tier: _totals([r for r in rows if r["tier"] == tier], wall, f"TOTAL {tier}")
        for tier in TIERS
        if any(r["tier"] == tier for r in rows)
    }
    reports = [r for row in rows for r in row["reports"]]
    if args.minimise and reports:
        _minimise_reports(reports, mode, args.minimise, args.minimise_budget)
    for row in rows:
        minimised_first = sorted(row["reports"], key=lambda r: "minimal_ops" not in r)
        row["reports"] = minimised_first[:REPORTS_PER_COMBO]
    print(_table(rows, [*by_tier.values(), totals] if len(by_tier) > 1 else [totals]))
    for tier, t in by_tier.items():
        print(
            f"{tier}: {t['sequences']} sequences, {t['steps']} steps, {t['mismatches']} "
            f"mismatches, {t['explained']} explained {t['explained_by'] or ''}; "
            f"{t['cpu_s']:.1f} cpu s"
        )
    if "l3" in by_tier:
        cov = by_tier["l3"]["coverage"]
        keys = (
            "prefetch_issued",
            "prefetch_rate_limited",
            "prefetch_truncated",
            "ctrl_revoked",
            "ctrl_read_calls",
            "check_pending",
            "check_stopped_early",
            "check_complete",
            "abort_in_flight",
            "credit_positive",
            "backup_ops",
        )
        print("l3 exercised: " + ", ".join(f"{k} {cov.get(k, 0)}" for k in keys))
    print(
        f"sglang {version}; {totals['sequences']} sequences, {totals['steps']} steps, "
        f"{totals['mismatches']} mismatches, {totals['explained']} explained; "
        f"wall {totals['time_s']:.1f} s, jobs {args.jobs}"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "sglang_version": version,
        "mode": mode,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "args": vars(args),
        "totals": totals,
        "totals_by_tier": by_tier,
        "combos": [{k: v for k, v in r.items() if k != "reports"} for r in rows],
        "known_differences": [kd.as_dict() for kd in KNOWN_DIFFERENCES],
        "stubbed_modules": stubbed,
        "reports": [r for row in rows for r in row["reports"]],
    }
    (out / "conformance.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'conformance.json'}")
    return 1 if totals["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
