"""``hicache-sim hitrate``: the cache-only hit-rate grid (policies x capacities x releases,
an L3 store behind the host pool), as a table, CSV, JSON or plot.

User errors are raised as :class:`cli.errors.UserError`; heavy modules are imported inside the
command, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cli.args import check_output_file, float_above, int_at_least, jobs_arg
from cli.errors import UserError
from cli.inputs import add_max_requests, check_names, int_list, load_trace, str_list, write_csv


def add_hitrate(sub: Any) -> None:
    from hicache.policy import WRITE_POLICIES
    from hicache.policy.storage import PREFETCH_POLICIES
    from sim.hitrate import EVICTIONS, OUTPUT_MODES, WRITE_BACK_NOTE

    p = sub.add_parser(
        "hitrate",
        help="cache-only replay: hit rate vs capacity for every policy",
        description="Replay a trace through the HiCache policy core one request at a time (no "
        "timing) and report hit rates per configuration. Lists are comma-separated; "
        "every combination runs.",
        epilog=f"Note: {WRITE_BACK_NOTE}.",
    )
    p.add_argument("trace", type=Path, help="trace file (.jsonl, .jsonl.gz, .parquet)")
    p.add_argument(
        "--device-tokens", type=int_list, required=True, metavar="N[,N...]",
        help="device (GPU) pool sizes in tokens, one run each, e.g. 1e6,4e6; a size that is "
        "not a multiple of --page-size is rounded down to one (with a note)",
    )  # fmt: skip
    host = p.add_mutually_exclusive_group()
    host.add_argument(
        "--host-tokens", type=int_list, metavar="M[,M...]", help="host pool; 0 = no host tier"
    )
    host.add_argument(
        "--hicache-ratio",
        type=float_above(0),
        help="host pool = device × ratio (> 1), sized as SGLang does (one extra page); default 2",
    )
    p.add_argument(
        "--page-size", type=int_at_least(1), default=64, help="tokens per page (default 64)"
    )
    p.add_argument(
        "--eviction", type=str_list, default=["lru"],
        help=f"one or more of {', '.join(EVICTIONS)} (lfu and slru order by hit counts, which "
        "write_back never increments: there they equal lru)",
    )  # fmt: skip
    p.add_argument(
        "--write-policy",
        type=str_list,
        default=["write_through"],
        help=f"one or more of {', '.join(WRITE_POLICIES)}",
    )
    p.add_argument(
        "--outputs", choices=OUTPUT_MODES, default="cache",
        help="cache: a finished request inserts prompt + outputs, as SGLang's "
        "cache_finished_req (default); skip: the prompt only",
    )  # fmt: skip
    p.add_argument(
        "--output-reuse", choices=("none", "next_turn"), default="none",
        help="none: output pages never hit (default); next_turn: a session turn's output "
        "pages are what its next prompt sends back there (workload.output_reuse)",
    )  # fmt: skip
    from hicache.versions import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS

    p.add_argument(
        "--sglang-version", type=str_list, default=[DEFAULT_SGLANG_VERSION],
        metavar="V[,V...]",
        help=f"the SGLang release whose cache decides, one or more of "
        f"{', '.join(SGLANG_VERSIONS)} (default {DEFAULT_SGLANG_VERSION}); 0.5.23 is "
        "UnifiedRadixCache (SGLang >= 0.5.19), 0.5.14 HiRadixCache (SGLang <= 0.5.18)",
    )  # fmt: skip
    l3 = p.add_argument_group("L3 storage tier (SGLang --hicache-storage-backend)")
    l3.add_argument(
        "--storage-tokens", type=_storage_list, metavar="S[,S...]",
        help="add an L3 store behind the host pool: its size in tokens, or 'unlimited' (a "
        "page LRU when bounded); 0 = no store (a baseline row); rows then split hits into "
        "device / host / storage",
    )  # fmt: skip
    l3.add_argument(
        "--prefetch-policy", choices=PREFETCH_POLICIES, default="timeout",
        help="timeout (SGLang's default) and wait_complete take storage I/O as instant here "
        "(use `run` to time it); best_effort ends each prefetch before any read, as SGLang does "
        "for a request that is admitted at once, so it gains nothing in this replay",
    )  # fmt: skip
    l3.add_argument(
        "--prefetch-threshold", type=int_at_least(1), default=256,
        help="tokens a prefetch must ask for and find (SGLang's default 256)",
    )  # fmt: skip
    l3.add_argument(
        "--host-memory-mode", choices=("cache", "buffer_only"), default="cache",
        help="SGLang 0.5.19+'s --hicache-host-memory-mode: cache (host RAM is the L2 tier, the "
        "default) or buffer_only (host RAM only stages copies to and from the L3 store: no "
        "host hits; needs --storage-tokens and --sglang-version 0.5.23)",
    )  # fmt: skip
    p.add_argument("--jobs", type=jobs_arg, default=0, help="worker processes (0 = all cores)")
    p.add_argument("--csv", type=Path, help="write the table as CSV (FILE.csv)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", type=Path, help="write hit rate vs capacity (.png, .svg or .pdf)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --csv or --plot")
    add_max_requests(p)
    p.add_argument(
        "--lenient", action="store_true", help="skip malformed trace lines (counted, one warning)"
    )
    p.set_defaults(func=_cmd_hitrate)


def _storage_list(text: str) -> list[int | None]:
    """``--storage-tokens``: sizes in tokens; ``unlimited`` (0 inside: HitRateConfig's
    unbounded store) and ``0`` (None: no store, the baseline row) allowed."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("unlimited", "inf"):
            out.append(0)
        else:
            out += [n or None for n in int_list(part)]
    return out


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _host_pools(args: argparse.Namespace, device_tokens: int) -> list[int]:
    from hicache.policy import host_pool_tokens

    if args.host_tokens is not None:
        return list(args.host_tokens)
    from hicache.config import MAX_POOL_PAGES
    from hicache.config.sections import BUFFER_ONLY_HICACHE_RATIO, DEFAULT_HICACHE_RATIO

    buffer = args.host_memory_mode == "buffer_only"
    default = BUFFER_ONLY_HICACHE_RATIO if buffer else DEFAULT_HICACHE_RATIO
    ratio = default if args.hicache_ratio is None else args.hicache_ratio
    try:
        host = host_pool_tokens(device_tokens, args.page_size, hicache_ratio=ratio)
    except ValueError as e:
        raise UserError(f"--hicache-ratio {ratio:g}: {e}") from None
    if host // args.page_size > MAX_POOL_PAGES:
        raise UserError(
            f"--hicache-ratio {ratio:g}: a host pool of {host // args.page_size:,} pages is more "
            f"than the simulator holds ({MAX_POOL_PAGES:,})"
        )
    return [host]


def _device_sizes(args: argparse.Namespace, notes: list[str]) -> list[int]:
    """``--device-tokens`` rounded down to page multiples (a line in ``notes`` for each)."""
    from hicache.config import MAX_POOL_PAGES

    page = args.page_size
    sizes = []
    for n in args.device_tokens:
        rounded = n // page * page
        if rounded <= 0:
            raise UserError(f"--device-tokens: {n} is less than one page (--page-size {page})")
        if rounded != n:
            notes.append(
                f"note: --device-tokens {n} rounded down to {rounded:,} (a multiple of the "
                f"page size {page})"
            )
        sizes.append(rounded)
    for option, values in (("--device-tokens", sizes), ("--host-tokens", args.host_tokens or [])):
        for n in values:
            if n // page > MAX_POOL_PAGES:
                raise UserError(
                    f"{option}: {n:,} tokens is {n // page:,} pages, more than the simulator "
                    f"holds ({MAX_POOL_PAGES:,}); use a larger --page-size"
                )
    return sizes


def _hitrate_configs(args: argparse.Namespace, notes: list[str]) -> list[Any]:
    from hicache.policy import WRITE_POLICIES
    from sim.hitrate import EVICTIONS, HitRateConfig

    check_names("--eviction", "eviction policy", args.eviction, EVICTIONS)
    check_names("--write-policy", "write policy", args.write_policy, WRITE_POLICIES)
    from hicache.versions import SGLANG_VERSIONS

    check_names("--sglang-version", "SGLang version", args.sglang_version, list(SGLANG_VERSIONS))
    args.device_tokens = _device_sizes(args, notes)
    for n in args.storage_tokens or []:
        if n and n % args.page_size:
            raise UserError(
                f"--storage-tokens: {n:,} is not a multiple of the page size {args.page_size} "
                "(0 = no store, 'unlimited' = an unbounded one)"
            )
    configs = [
        HitRateConfig(
            device_tokens=dev,
            host_tokens=host,
            page_size=args.page_size,
            eviction=ev,
            write_policy=wp,
            outputs=args.outputs,
            output_reuse=args.output_reuse,
            storage=l3 is not None,
            storage_tokens=l3 or 0,
            prefetch_policy=args.prefetch_policy,
            prefetch_threshold=args.prefetch_threshold,
            sglang_version=ver,
            host_memory_mode=args.host_memory_mode,
        )
        for ver in args.sglang_version
        for ev in args.eviction
        for wp in args.write_policy
        for dev in args.device_tokens
        for host in _host_pools(args, dev)
        for l3 in (args.storage_tokens or [None])
    ]
    if args.host_memory_mode == "buffer_only" and "write_back" in args.write_policy:
        notes.append(
            "--host-memory-mode buffer_only: write_back resolves to write_through (host RAM only "
            "stages copies: there is no host tier to write back to), as SGLang resolves it"
        )
    for cfg in configs:
        try:
            cfg.validate()
        except ValueError as e:
            msg = str(e)
            option = (
                "--host-memory-mode"
                if "host memory mode" in msg
                else "--sglang-version"
                if "SGLang" in msg
                else "--storage-tokens"
                if "storage" in msg
                else "--host-tokens"
                if "host" in msg
                else "--device-tokens"
            )
            raise UserError(f"{option}: {e}") from None
    return configs


def _cmd_hitrate(args: argparse.Namespace) -> int:
    from sim.hitrate import write_back_ignores_hit_counts
    from studies.sweep.hitrate import run_hitrate_grid
    from traces.stats import infinite_capacity_hit_rate

    notes: list[str] = []
    configs = _hitrate_configs(args, notes)
    if args.csv:
        check_output_file(args.csv, (".csv",), what="CSV table", option="--csv", force=args.force)
    if args.plot:
        check_output_file(args.plot, PLOT_SUFFIXES, what="plot", option="--plot", force=args.force)
    trace = load_trace(args.trace, args.lenient)
    if args.max_requests:
        from dataclasses import replace

        trace = replace(trace, requests=trace.requests[: args.max_requests])
    try:
        inf = infinite_capacity_hit_rate(trace, args.page_size)
        if args.output_reuse != "none":  # the answers a later prompt re-sends count as cached
            from hicache.output_keys import infinite_capacity_hit_rate_reusing_outputs

            inf = infinite_capacity_hit_rate_reusing_outputs(trace, args.page_size)
    except ValueError as e:
        raise UserError(f"{args.trace}: {e}") from None
    for line in notes:  # every input checked: no note precedes an error line
        print(line, file=sys.stderr)
    rows = run_hitrate_grid(trace, configs, jobs=args.jobs)
    for r in rows:
        r["infinite_capacity_hit_rate"] = inf
    note = write_back_ignores_hit_counts(rows)
    # the results first: a file that still cannot be written does not lose them
    if args.json:
        print(json.dumps({"trace": str(args.trace), "rows": rows, "note": note}, indent=1))
    else:
        print(format_hitrate_table(rows, inf, len(trace)))
        if note:
            print(f"note: {note}")
    if args.csv:
        _write_output(args.csv, "CSV table", lambda: write_csv(rows, args.csv))
    if args.plot:
        from studies.report import plot_hitrate

        title = f"{args.trace.name} (page {args.page_size})"
        _write_output(args.plot, "plot", lambda: plot_hitrate(rows, args.plot, title=title))
    return 0


def _write_output(path: Path, what: str, write: Any) -> None:
    """``write()``; an ``OSError`` (disk full, folder removed meanwhile) as a ``UserError``."""
    try:
        write()
    except OSError as e:
        raise UserError(f"{path}: cannot write {what}: {e.strerror or e}") from None


def format_hitrate_table(rows: list[dict[str, Any]], inf: float, n_requests: int) -> str:
    if any(r.get("storage") for r in rows):
        return _format_l3_table(rows, inf, n_requests)
    head = (
        f"{'eviction':>8} {'write_policy':>23} {'device':>11} {'host':>11} "
        f"{'hit':>6} {'device':>6} {'host':>6} {'written':>12} {'loaded':>12} {'dev_evict':>12} "
        f"{'host_evict':>12} {'h_fail':>6}"
    )
    versions = any(r.get("sglang_version", "0.5.14") != "0.5.14" for r in rows)
    if versions:
        head = f"{'sglang':>7} {head}"
    lines = [
        f"{n_requests} requests; infinite-capacity hit rate {inf:.2%} (the best any policy can do)",
        head,
    ]
    for r in rows:
        lines.append(
            (f"{r.get('sglang_version', ''):>7} " if versions else "")
            + f"{r['eviction']:>8} {r['write_policy']:>23} {r['device_tokens']:>11,} "
            f"{r['host_tokens']:>11,} {r['hit_rate']:>6.2%} {r['device_hit_rate']:>6.2%} "
            f"{r['host_hit_rate']:>6.2%} {r['tokens_written']:>12,} {r['tokens_loaded']:>12,} "
            f"{r['device_evicted_tokens']:>12,} {r['host_evicted_tokens']:>12,} "
            f"{r['host_alloc_failures']:>6}"
        )
    return "\n".join(lines)


def _format_l3_table(rows: list[dict[str, Any]], inf: float, n_requests: int) -> str:
    """The hit-rate table with an L3 column set (device / host / storage hit rates)."""
    head = (
        f"{'eviction':>8} {'write_policy':>23} {'device':>11} {'host':>11} {'storage':>11} "
        f"{'prefetch':>13} {'hit':>6} {'device':>6} {'host':>6} {'L3':>6} {'L3 read':>12} "
        f"{'L3 written':>12}"
    )
    versions = any(r.get("sglang_version", "0.5.14") != "0.5.14" for r in rows)
    if versions:
        head = f"{'sglang':>7} {head}"
    lines = [
        f"{n_requests} requests; infinite-capacity hit rate {inf:.2%} (the best any policy can do)",
        head,
    ]
    for r in rows:
        size = f"{r['storage_tokens']:,}" if r.get("storage_tokens") else "unlimited"
        policy = r["prefetch_policy"]
        if not r.get("storage"):
            size = policy = "-"
        lines.append(
            (f"{r.get('sglang_version', ''):>7} " if versions else "")
            + f"{r['eviction']:>8} {r['write_policy']:>23} {r['device_tokens']:>11,} "
            f"{r['host_tokens']:>11,} {size:>11} {policy:>13} "
            f"{r['hit_rate']:>6.2%} {r['device_hit_rate']:>6.2%} {r['host_hit_rate']:>6.2%} "
            f"{r['storage_hit_rate']:>6.2%} {r['storage_read_tokens']:>12,} "
            f"{r['storage_written_tokens']:>12,}"
        )
    return "\n".join(lines)


__all__ = ["add_hitrate", "format_hitrate_table"]
