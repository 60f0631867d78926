"""``hicache-sim demo``: the write policies on the bundled Mooncake trace, timed and cache-only,
and L2 only against L2 + an L3 storage tier, ending with an HTML report."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cli.args import check_output_dir, int_at_least, jobs_arg
from cli.hitrate import format_hitrate_table
from cli.inputs import REPO_DATA, load_trace, write_csv
from hicache.versions import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS


def register(subparsers: Any) -> None:
    """Add ``demo`` to ``hicache-sim``'s sub-parsers."""
    _add_demo(subparsers)


#: The L3 storage backend of the demo's L2 + L3 run (a preset of hicache.storage_backends).
DEMO_L3_BACKEND = "mooncake"
DEMO_SETUPS = (
    ("write_through", ["cache.write_policy=write_through"]),
    ("write_through_selective", ["cache.write_policy=write_through_selective"]),
    ("write_back", ["cache.write_policy=write_back"]),
    ("no host tier", ["cache.enable_host=false"]),
    # the same write_through server with SGLang's --hicache-storage-backend (default prefetch
    # policy, threshold and timeouts): what an L3 store adds to L2 alone
    (
        f"write_through + L3 {DEMO_L3_BACKEND}",
        ["cache.write_policy=write_through", f"storage.backend={DEMO_L3_BACKEND}"],
    ),
)
# one H100 cannot keep up with the trace's full rate (Mooncake served it with a cluster): at a
# quarter of the rate the queue stays bounded, so policy effects are visible in TTFT
DEMO_RATE_SCALE = 0.25
DEMO_PAGE = 64


def _add_demo(sub: Any) -> None:

    p = sub.add_parser(
        "demo",
        help="the demo job: write policies and an L3 tier on the bundled Mooncake trace",
        description="Timed simulation of write_through, write_through_selective, write_back, "
        f"no host tier, and write_through with an L3 storage tier ({DEMO_L3_BACKEND}) "
        "(defaults: llama-3-8b, h100-sxm, pcie5-x16, page 64, LRU) over the bundled Mooncake "
        f"conversation trace at {DEMO_RATE_SCALE}x its rate, plus a cache-only "
        "hit-rate-vs-capacity study (with an unlimited L3 store as one more series); writes "
        "run directories, CSVs, a plot, a Markdown and an HTML report.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="folder to write runs/, comparison.csv, upgrade.csv, hitrate.csv, hitrate.png, "
        "report.md and report.html into (created if missing; default runs/demo)",
    )
    p.add_argument(
        "--trace",
        type=Path,
        default=REPO_DATA / "mooncake/conversation_trace.jsonl",
        help="trace to simulate (default: the bundled Mooncake conversation trace)",
    )
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default=0,
        help="worker processes for the timed runs and the hit-rate grid (default 0: all cores)",
    )
    p.add_argument(
        "--max-requests",
        type=int_at_least(1),
        help="replay only the trace's first N requests (default: all; a quicker look)",
    )
    p.add_argument(
        "--sglang-version", default=DEFAULT_SGLANG_VERSION, choices=list(SGLANG_VERSIONS),
        help="the SGLang release of the main runs (sglang.version; default "
        f"{DEFAULT_SGLANG_VERSION}); the write policies also run under the other release, "
        "side by side: what upgrading changes",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(func=_cmd_demo)


def _run_dir_name(setup: str) -> str:
    """A setup's run directory: ``write_through + L3 mooncake`` -> ``write_through_L3_mooncake``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", setup).strip("_")


#: The setups that also run under the other SGLang release (the upgrade comparison).
UPGRADE_SETUPS = ("write_through", "write_through_selective", "write_back")
#: The two releases the upgrade comparison sets side by side (old, new).
UPGRADE_PAIR = ("0.5.14", "0.5.23")


def _overrides(max_requests: int | None, version: str = DEFAULT_SGLANG_VERSION) -> list[str]:
    """The settings every timed demo run shares."""
    out = [f"workload.rate_scale={DEMO_RATE_SCALE}", f"sglang.version={version}"]
    if max_requests:
        out.append(f"workload.max_requests={max_requests}")
    return out


def _demo_run(job: tuple[str, list[str], str, str]) -> dict[str, Any]:
    from hicache.config import load_config
    from sim.engine import run_simulation

    name, overrides, trace_path, out = job
    cfg = load_config(None, overrides)
    summary = run_simulation(cfg, load_trace(Path(trace_path)), Path(out), progress=False)
    return {"setup": name, **summary}


def format_comparison(rows: list[dict[str, Any]]) -> str:
    """The timed runs side by side: hit rates (device / host / L3 storage), TTFT, TPOT and
    PCIe traffic; then a line per run with an L3 tier (its store traffic and prefetches) and
    the SGLang 0.5.14 defects a run would hit."""
    from cli.run_output import defects_line, l3_line

    head = (
        f"{'setup':>28} {'hit':>7} {'device':>7} {'host':>7} {'L3':>7} {'TTFT mean':>10} "
        f"{'p50':>8} {'p90':>8} {'p99':>8} {'TPOT':>7} {'D2H GB':>9} {'H2D GB':>8}"
    )
    lines = [head]
    notes = []
    for r in rows:
        l3 = f"{r['storage_hit_rate']:>7.2%}" if r.get("storage") else f"{'-':>7}"
        lines.append(
            f"{r['setup']:>28} {r['hit_rate']:>7.2%} {r['device_hit_rate']:>7.2%} "
            f"{r['host_hit_rate']:>7.2%} {l3} {r['ttft_mean_s']:>9.2f}s {r['ttft_p50_s']:>7.2f}s "
            f"{r['ttft_p90_s']:>7.2f}s {r['ttft_p99_s']:>7.2f}s {r['tpot_mean_s'] * 1e3:>5.1f}ms "
            f"{r['bytes_d2h'] / 1e9:>9.0f} {r['bytes_h2d'] / 1e9:>8.0f}"
        )
        if r.get("storage"):
            line = l3_line(r["storage"]).removeprefix(f"L3 {r['storage'].get('backend')}: ")
            notes.append(f"{r['setup']}: L3 {line}")
        defects = defects_line(r)
        if defects:
            notes.append(f"{r['setup']}: {defects}")
    return "\n".join(lines + notes)


def _csv_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The timed runs' summaries as CSV rows with one set of columns: the L3 block and the
    defect counters flattened (:func:`studies.sweep.results.flatten_summary`), a column a
    run lacks (the L3 ones without an L3 tier) left empty."""
    from studies.sweep.results import flatten_summary

    flat = [flatten_summary(r) for r in rows]
    keys = list(dict.fromkeys(k for r in flat for k in r))
    return [{k: r.get(k, "") for k in keys} for r in flat]


def _demo_timed(args: argparse.Namespace, trace: Any) -> tuple[list[Path], str, Upgrade]:
    """The timed runs (on the local executor): the main runs' directories and comparison, and
    the upgrade comparison (the write policies under both releases)."""
    from studies.sweep.executors import local_workers, map_local
    from studies.upgrade import format_upgrade, upgrade_html

    main, other = args.sglang_version, _other_version(args.sglang_version)
    shared = _overrides(args.max_requests, main)
    jobs = [
        (name, [*ov, *shared], str(args.trace), str(args.out / "runs" / _run_dir_name(name)))
        for name, ov in DEMO_SETUPS
    ]
    n_main = len(jobs)
    for name, ov in DEMO_SETUPS:
        if name in UPGRADE_SETUPS:
            run_dir = args.out / "runs" / f"{_run_dir_name(name)}_sglang-{other}"
            jobs.append((name, [*ov, *_overrides(args.max_requests, other)], str(args.trace),
                         str(run_dir)))  # fmt: skip
    # the L3 run takes longest: start it first, so that it does not run alone at the end
    order = sorted(range(len(jobs)), key=lambda i: "storage.backend" not in " ".join(jobs[i][1]))
    workers = local_workers(len(jobs), args.jobs)
    n = min(len(trace), args.max_requests or len(trace))
    print(
        f"timed runs: {n_main} setups (SGLang {main}) and {len(jobs) - n_main} under SGLang "
        f"{other}, over {n:,} requests ({workers} processes)"
    )
    ran = map_local(_demo_run, [jobs[i] for i in order], args.jobs)
    timed = [ran[order.index(i)] for i in range(len(jobs))]
    comparison = format_comparison(timed[:n_main])
    write_csv(_csv_rows(timed[:n_main]), args.out / "comparison.csv")
    print(comparison)
    versions = {main: timed[:n_main], other: timed[n_main:]}
    old, new = (versions[v] for v in UPGRADE_PAIR)
    old = [r for r in old if r["setup"] in UPGRADE_SETUPS]
    new = [r for r in new if r["setup"] in UPGRADE_SETUPS]
    write_csv(_csv_rows([*old, *new]), args.out / "upgrade.csv")
    upgrade = Upgrade(f"What upgrading SGLang {UPGRADE_PAIR[0]} -> {UPGRADE_PAIR[1]} changes",
                      format_upgrade(old, new), upgrade_html(old, new))  # fmt: skip
    print(f"\n{upgrade.title} (timed, the same trace and server)\n{upgrade.text}")
    return [Path(j[3]) for j in jobs[:n_main]], comparison, upgrade


@dataclass(frozen=True)
class Upgrade:
    """The upgrade comparison: its title, as text and as an HTML fragment."""

    title: str
    text: str
    html: str


def _other_version(version: str) -> str:
    """The release the upgrade comparison sets beside ``version``."""
    return UPGRADE_PAIR[1] if version == UPGRADE_PAIR[0] else UPGRADE_PAIR[0]


def _demo_hitrate(
    args: argparse.Namespace, trace: Any
) -> tuple[list[dict[str, Any]], str, tuple[str, str]]:
    """The cache-only grid: hit rate vs device capacity per write policy; its rows and table,
    and the write policies' rows under both releases (text, HTML)."""
    from hicache.policy import host_pool_tokens
    from sim.hitrate import HitRateConfig
    from studies.report import plot_hitrate
    from studies.sweep.hitrate import run_hitrate_grid
    from studies.upgrade import format_upgrade, upgrade_html
    from traces.stats import infinite_capacity_hit_rate

    page = DEMO_PAGE
    main, other = args.sglang_version, _other_version(args.sglang_version)
    configs = []
    for dev in (1_000_000, 4_000_000, 16_000_000):
        host = host_pool_tokens(dev, page, hicache_ratio=2.0)
        for wp in ("write_through", "write_through_selective", "write_back"):
            configs.append(HitRateConfig(dev, host, page, "lru", wp, sglang_version=main))
        configs.append(HitRateConfig(dev, 0, page, "lru", "write_through", sglang_version=main))
        # an unlimited L3 store behind write_through (hitrate --storage-tokens unlimited):
        # storage I/O is instant here, so this is what L3 can add at best
        configs.append(
            HitRateConfig(dev, host, page, "lru", "write_through", storage=True,
                          sglang_version=main)
        )  # fmt: skip
    # the write policies under the other release too: the upgrade comparison's cache-only part
    twins = [replace(c, sglang_version=other) for c in configs if c.host_tokens and not c.storage]
    both = run_hitrate_grid(trace, configs + twins, jobs=args.jobs)
    rows, twin_rows = both[: len(configs)], both[len(configs) :]
    inf = infinite_capacity_hit_rate(trace, page)
    for r in rows:
        r["infinite_capacity_hit_rate"] = inf
        r["policy"] = r["write_policy"] if r["host_tokens"] else "no host tier"
        if r["storage"]:
            r["policy"] += " + L3 (unlimited)"
    write_csv(rows, args.out / "hitrate.csv")
    plot_hitrate(rows, args.out / "hitrate.png", title=f"{args.trace.name} (page {page}, LRU)",
                 series="policy")  # fmt: skip
    for r in [*rows, *twin_rows]:
        r["setup"] = f"{r['write_policy']} @ {r['device_tokens'] / 1e6:g} M device"
    main_rows = [r for r in rows if r["host_tokens"] and not r["storage"]]
    old, new = (main_rows, twin_rows) if main == UPGRADE_PAIR[0] else (twin_rows, main_rows)
    write_csv([*old, *new], args.out / "upgrade_cache_only.csv")
    upgrade = format_upgrade(old, new), upgrade_html(old, new)
    return rows, format_hitrate_table(rows, inf, len(trace)), upgrade


def _demo_markdown(comparison: str, table: str, upgrade: Upgrade) -> str:
    return (
        "# hicache-sim demo: write policies and an L3 tier on the Mooncake conversation trace\n\n"
        "## Timed simulation\n\n"
        f"llama-3-8b on one h100-sxm over pcie5-x16, page 64, LRU, host pool 2 x device "
        f"(SGLang defaults); the trace at {DEMO_RATE_SCALE} x its recorded rate. Latencies come "
        "from the shipped, unmeasured default profile. The last run adds an L3 storage tier "
        f"(`storage.backend={DEMO_L3_BACKEND}`, SGLang's `--hicache-storage-backend "
        f"{DEMO_L3_BACKEND}` with its default prefetch policy `timeout`, threshold 256 "
        "tokens); the backend's figures are published ones, not measured by us. Hit rates "
        "split into device / host / L3 storage. Run directories are under `runs/`.\n\n"
        f"```\n{comparison}\n```\n\n"
        f"## {upgrade.title}\n\n"
        "The write policies again under the other SGLang release (`sglang.version`): timed, "
        "the same trace, server and rate; and cache-only, the grid below. The lines under each "
        "table name each big difference and its cause in SGLang's code.\n\n"
        f"```\n{upgrade.text}\n```\n\n"
        "## Hit rate vs device capacity (cache-only replay)\n\n"
        "Each request matched, loaded back and inserted one at a time (no timing). The "
        "`+ L3 (unlimited)` rows put an unbounded L3 store behind write_through, its I/O "
        "taken as instant: what L3 can add at best.\n\n"
        f"![hit rate vs capacity](hitrate.png)\n\n```\n{table}\n```\n"
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    from sim.hitrate import write_back_ignores_hit_counts
    from studies.report import build_report
    from traces.fsutil import write_text_atomic

    check_output_dir(args.out, force=args.force, what="demo folder")
    args.out.mkdir(parents=True, exist_ok=True)
    trace = load_trace(args.trace)
    if args.max_requests:
        trace = replace(trace, requests=trace.requests[: args.max_requests])
    run_dirs, comparison, upgrade = _demo_timed(args, trace)
    print(f"\ncache-only replay: hit rate vs device capacity (page {DEMO_PAGE}, LRU)")
    rows, table, (only_text, only_html) = _demo_hitrate(args, trace)
    print(table)
    note = write_back_ignores_hit_counts(rows)
    if note:
        print(f"note: {note}")
    head = f"{upgrade.title}, cache-only (the grid's write policies)"
    print(f"\n{head}\n{only_text}")
    upgrade = Upgrade(
        upgrade.title,
        f"timed (the same trace and server):\n{upgrade.text}\n\ncache-only:\n{only_text}",
        f"<h3>Timed (the same trace and server)</h3>{upgrade.html}"
        f"<h3>Cache-only (the grid's write policies, host pool 2 x device)</h3>{only_html}",
    )
    write_text_atomic(_demo_markdown(comparison, table, upgrade), args.out / "report.md")
    html = build_report(
        run_dirs,
        args.out / "report.html",
        hitrate_rows=rows,
        hitrate_title=f"{args.trace.name} (page {DEMO_PAGE}, LRU, host pool 2 × device)",
        sections=[("sglang-upgrade", upgrade.title, upgrade.html)],
    )
    print(
        f"\nreport: {html}  (also report.md, comparison.csv, upgrade.csv, "
        "upgrade_cache_only.csv, hitrate.csv, hitrate.png, runs/)"
    )
    return 0


__all__ = ["format_comparison", "register"]
