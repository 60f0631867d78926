"""``hicache-sim run``, ``hitrate`` and ``demo``: the timed simulation, the cache-only hit-rate
grid, and the demo job that shows both on the bundled Mooncake trace.

User errors are raised as :class:`cli.errors.UserError` (printed by :func:`cli.errors.
run_command`). Heavy modules are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.args import check_output_dir, check_output_file, float_above, int_at_least, jobs_arg
from cli.errors import UserError

REPO_DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def register(subparsers: Any) -> None:
    """Add ``run`` and ``hitrate`` to ``hicache-sim``'s sub-parsers (``demo``: :mod:`cli.demo`)."""
    _add_run(subparsers)
    _add_hitrate(subparsers)


# --- shared helpers --------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    """Comma-separated token counts >= 0; ``1e6`` is read as 1000000 (a fraction is dropped)."""
    try:
        out = [int(float(x)) for x in text.split(",") if x.strip()]
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one value")
    if min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return out


def _str_list(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected at least one name")
    return out


def _check_names(option: str, what: str, names: Sequence[str], choices: Sequence[str]) -> None:
    bad = [n for n in names if n not in choices]
    if bad:
        names = ", ".join(map(repr, bad))
        raise UserError(f"{option}: unknown {what} {names}; choose from {', '.join(choices)}")


def _load_trace(path: Path, lenient: bool = False) -> Any:
    """The trace at ``path``; ``lenient``: malformed lines are skipped, and one warning line
    says how many and why. Every read error is a ``UserError``."""
    import warnings

    from traces.io import read_trace
    from traces.schema import TraceError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one-line summary below instead
            trace = read_trace(path, lenient=lenient)
        if trace.skipped:
            print(f"warning: {path}: {trace.skip_summary()}", file=sys.stderr)
        return trace
    except TraceError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read trace: {e.strerror or e}") from None
    except ValueError as e:  # e.g. a Parquet file pyarrow cannot read
        raise UserError(f"{path}: cannot read trace: {' '.join(str(e).split())}") from None


def add_max_requests(p: argparse.ArgumentParser) -> None:
    """``--max-requests N``: replay only the trace's first N requests."""
    p.add_argument(
        "--max-requests", type=int_at_least(1), metavar="N",
        help="replay only the trace's first N requests (workload.max_requests; default: all)",
    )  # fmt: skip


def max_requests_override(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``--max-requests`` as a config override for :func:`cli.config.resolve_config`."""
    n = getattr(args, "max_requests", None)
    return [(f"workload.max_requests={n}", f"--max-requests {n}")] if n else []


def _write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import csv

    from traces.fsutil import write_atomic

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            # every row's keys, in first-seen order (rows of two grids may differ)
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)

    write_atomic(path, write)


# --- hitrate ---------------------------------------------------------------------------------


def _add_hitrate(sub: Any) -> None:
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
        "--device-tokens", type=_int_list, required=True, metavar="N[,N...]",
        help="device (GPU) pool sizes in tokens, one run each, e.g. 1e6,4e6; a size that is "
        "not a multiple of --page-size is rounded down to one (with a note)",
    )  # fmt: skip
    host = p.add_mutually_exclusive_group()
    host.add_argument(
        "--host-tokens", type=_int_list, metavar="M[,M...]", help="host pool; 0 = no host tier"
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
        "--eviction", type=_str_list, default=["lru"],
        help=f"one or more of {', '.join(EVICTIONS)} (lfu and slru order by hit counts, which "
        "write_back never increments: there they equal lru)",
    )  # fmt: skip
    p.add_argument(
        "--write-policy",
        type=_str_list,
        default=["write_through"],
        help=f"one or more of {', '.join(WRITE_POLICIES)}",
    )
    p.add_argument(
        "--outputs", choices=OUTPUT_MODES, default="cache",
        help="cache: a finished request inserts prompt + outputs, as SGLang's "
        "cache_finished_req (default); skip: the prompt only",
    )  # fmt: skip
    from hicache.versions import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS

    p.add_argument(
        "--sglang-version", type=_str_list, default=[DEFAULT_SGLANG_VERSION],
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
            out += [n or None for n in _int_list(part)]
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

    _check_names("--eviction", "eviction policy", args.eviction, EVICTIONS)
    _check_names("--write-policy", "write policy", args.write_policy, WRITE_POLICIES)
    from hicache.versions import SGLANG_VERSIONS

    _check_names("--sglang-version", "SGLang version", args.sglang_version, list(SGLANG_VERSIONS))
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
    trace = _load_trace(args.trace, args.lenient)
    if args.max_requests:
        from dataclasses import replace

        trace = replace(trace, requests=trace.requests[: args.max_requests])
    try:
        inf = infinite_capacity_hit_rate(trace, args.page_size)
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
        _write_output(args.csv, "CSV table", lambda: _write_csv(rows, args.csv))
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


# --- run -------------------------------------------------------------------------------------


def _add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="timed simulation (SimPy): HBM, DRAM and PCIe under an SGLang-like scheduler",
        description="Simulate a trace through the HiCache policy core with timing: prefill and "
        "decode compute, layer-wise loads, write-through copies, queueing. Writes a run "
        "directory (config.json, summary.json, requests/timeline/transfers.parquet).",
    )
    from cli.config import add_config_options

    p.add_argument("trace", type=Path, help="trace file (.jsonl, .jsonl.gz, .parquet)")
    add_config_options(p, profile_flag=True)
    p.add_argument(
        "--profile", type=Path,
        help="latency profile JSON (default: the shipped one for gpu.name + link.name); one "
        "measured on another machine needs --allow-profile-mismatch",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    p.add_argument(
        "--seed", type=int_at_least(0),
        help="run.seed (the simulator itself is deterministic)",
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=int_at_least(1), metavar="K",
        help="run K times, run.seed = seed, seed+1, ..., each on the trace with its sessions' "
        "start offsets permuted by that seed (seed 0: the trace as recorded; a Mooncake "
        "trace's conversations are found from its prefix hash ids) and router.seed + 0, 1, "
        "...; prints the median and the 5th-95th percentile of the main figures, written to "
        "summary.json (seeds); the run directory's tables are the first seed's",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="overwrite an existing run directory")
    add_max_requests(p)
    p.set_defaults(func=_cmd_run)


def _resolve_config(args: argparse.Namespace) -> Any:
    """The run's config (:func:`cli.config.resolve_config`) with ``--profile`` and ``--seed``;
    its latency profile is loaded here, so a bad one is reported before any work."""
    from cli.config import resolve_config
    from hicache.latency import load_profile

    extra = []
    if args.profile is not None:
        extra.append((f"run.profile={args.profile}", f"--profile {args.profile}"))
    if args.seed is not None:
        extra.append((f"run.seed={args.seed}", f"--seed {args.seed}"))
    if args.seeds:  # every replica replays resampled sessions (sim.seeds)
        extra.append(("workload.resample_sessions=true", f"--seeds {args.seeds}"))
    extra += max_requests_override(args)
    resolved = resolve_config(args, extra)
    cfg = resolved.cfg
    try:
        load_profile(cfg.run.profile or None, cfg.gpu.name, cfg.link.name)
    except ValueError as e:
        raise UserError(str(e)) from None
    return resolved


def _cmd_run(args: argparse.Namespace) -> int:
    import shutil

    from hicache.sglang_args import format_sglang_command
    from sim.engine import run_simulation

    resolved = _resolve_config(args)
    cfg = resolved.cfg
    check_output_dir(args.out, force=args.force, what="run directory")
    trace = _load_trace(args.trace, args.lenient)
    resolved.print_notes()
    print(format_setup(cfg, trace), flush=True)
    created = not args.out.exists()
    try:
        summary = run_simulation(cfg, trace, args.out)
    except BaseException as e:
        if created:  # no half-written run directory is left behind
            shutil.rmtree(args.out, ignore_errors=True)
        if isinstance(e, ValueError):  # e.g. page size not dividing the trace's block size
            raise UserError(f"{args.trace}: {e}") from None
        if isinstance(e, OSError):
            where = e.filename or args.out
            raise UserError(f"{where}: cannot write the run: {e.strerror or e}") from None
        raise
    print(format_summary(summary))
    note = cache_only_note(cfg, trace, summary)
    if note:
        print(note)
    if args.seeds:
        block = run_seeds(cfg, trace, args.seeds, summary)
        summary["seeds"] = block
        from sim.metrics import write_json_atomic

        write_json_atomic(summary, args.out / "summary.json")
        print(format_seeds(block))
    print(f"as SGLang flags: {format_sglang_command(cfg).splitlines()[0]}")
    print(f"run directory: {args.out}")
    return 0


def run_seeds(cfg: Any, trace: Any, k: int, first: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``'s ``seeds`` block (:func:`sim.seeds.seed_block`): ``first`` (the run
    of ``cfg`` as given, replica 0) and ``k - 1`` more runs, replica ``i`` of
    :func:`sim.seeds.replica_settings` (``run.seed + i``, ``router.seed + i``, sessions
    resampled)."""
    from hicache.config import with_overrides
    from sim.engine import run_simulation
    from sim.seeds import replica_overrides, seed_block

    base, router_seed = cfg.run.seed, cfg.router.seed
    summaries = [first]
    for i in range(1, k):
        one = with_overrides(cfg, replica_overrides(base, router_seed, i))
        print(f"seed {base + i} ({i + 1} of {k})", flush=True)
        summaries.append(run_simulation(one, trace))
    return seed_block(summaries, [base + i for i in range(k)])


def format_seeds(block: dict[str, Any]) -> str:
    """The ``seeds`` block as a table: per figure the median and the 90 % interval."""
    runs = block["runs"]
    seeds = [r["seed"] for r in runs]
    lo, hi = (round(q * 100) for q in block["interval"])
    names = {
        "hit_rate": "hit rate", "device_hit_rate": "device hit rate",
        "host_hit_rate": "host hit rate", "storage_hit_rate": "L3 hit rate",
        "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "ttft_p99_s": "TTFT p99",
        "tpot_mean_s": "TPOT mean", "throughput_output_tok_s": "output tok/s",
    }  # fmt: skip

    def show(key: str, v: float) -> str:
        if key.endswith("hit_rate"):
            return f"{v:.2%}"
        if key.endswith("_s") and not key.endswith("tok_s"):
            return _duration(v)
        return f"{v:,.0f}"

    lines = [
        f"seeds: {len(runs)} runs (run.seed {seeds[0]}-{seeds[-1]}; {block['method']}); "
        f"median and {hi - lo}% interval (p{lo} - p{hi})"
    ]
    for key, iv in block["intervals"].items():
        if key == "storage_hit_rate" and not any(r.get(key) for r in runs):
            continue  # no L3 tier
        lines.append(
            f"  {names.get(key, key):<16} {show(key, iv['median']):>10}   "
            f"{show(key, iv['lo'])} - {show(key, iv['hi'])}"
        )
    over = [r["seed"] for r in runs if r.get("overloaded")]
    if over:
        lines.append(f"  overloaded in {len(over)} of {len(runs)} runs (seeds {_seeds(over)})")
    return "\n".join(lines)


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds[:8])) + (", ..." if len(seeds) > 8 else "")


#: A timed run's hit rate this far (points) from the cache-only replay's gets a note.
CACHE_ONLY_GAP = 0.05


def cache_only_note(cfg: Any, trace: Any, summary: dict[str, Any]) -> str | None:
    """A note when the timed run's hit rate differs from the cache-only replay of the same
    pools and policy (``hitrate``) by more than :data:`CACHE_ONLY_GAP`, with the likely why:
    the replay serves one request at a time with the whole pool, the timed run shares it
    among the requests in flight (whose pages are locked and cannot be evicted), and admits
    them in its own order. None for a fleet or an L3 run (no like replay), a run with a
    warm-up window (the replay would count the window's requests) or a context limit (it
    would see the prompts as recorded), or a small gap."""
    from dataclasses import replace

    from hicache.config import resolve_pools
    from sim.hitrate import HitRateConfig
    from studies.sweep.hitrate import run_hitrate_grid

    if cfg.cluster.instances > 1 or cfg.storage.enabled or cfg.cache.eviction == "oracle":
        return None
    if "warmup_requests" in summary:  # the replay counts every request: not like for like
        return None
    if cfg.workload.max_context:  # the replay sees the prompts as recorded, not as limited
        return None
    device, host, _ = resolve_pools(cfg)
    one = HitRateConfig(
        device, host if cfg.cache.enable_host else 0, cfg.cache.page_size, cfg.cache.eviction,
        cfg.cache.write_policy, outputs=cfg.workload.outputs, sglang_version=cfg.sglang.version,
    )  # fmt: skip
    limit = cfg.workload.max_requests or None
    sliced = replace(trace, requests=trace.requests[:limit])
    (row,) = run_hitrate_grid(sliced, [one], jobs=1, progress=False)
    timed, alone = float(summary["hit_rate"]), float(row["hit_rate"])
    if abs(timed - alone) <= CACHE_ONLY_GAP:
        return None
    duration = float(summary["sim_duration_s"])
    in_flight = (
        summary["e2e_mean_s"] * summary["finished_requests"] / duration if duration > 0 else 0.0
    )
    return (
        f"note: the cache-only replay of the same pools (hicache-sim hitrate) gives "
        f"{alone:.1%} against this run's {timed:.1%}: it serves one request at a time with the "
        f"whole pool, while here {in_flight:.1f} requests were in flight on average, holding "
        "their pages locked, and were admitted in the scheduler's order"
    )


def format_setup(cfg: Any, trace: Any) -> str:
    """What a run is about to simulate, resolved: model, GPU, TP and server; the pools in
    tokens and GB per rank (the unit of ``--hicache-size``); and how arrivals are replayed."""
    from hicache.config import resolve_pools, server_for
    from sim.engine import resolve_closed_loop

    device, host, bpt = resolve_pools(cfg)
    tp, server = cfg.model.tp, server_for(cfg)
    policy = cfg.cache.write_policy if cfg.cache.enable_host else "no host tier"
    lines = [
        f"setup: {cfg.model.spec.name} on {cfg.gpu.name} x TP{tp} (server {server.name}), "
        f"SGLang {cfg.sglang.version}, {policy}"
    ]
    pools = f"pools: device {device:,} tokens ({device * bpt / 1e9:,.1f} GB per rank)"
    if cfg.cache.enable_host:
        pools += (
            f", host {host:,} tokens ({host * bpt / 1e9:,.1f} GB per rank, "
            f"{host * bpt * tp / 1e9:,.1f} GB per instance)"
        )
    lines.append(pools)
    n = cfg.workload.max_requests or len(trace.requests)
    if resolve_closed_loop(cfg.workload.closed_loop, trace, n):
        lines.append(
            "arrivals: closed loop (the trace records think times: each turn arrives its think "
            "time after the previous turn finished; workload.closed_loop=off replays the "
            "timestamps)"
        )
    elif cfg.workload.rate_scale != 1:
        lines.append(
            f"arrivals: open loop (the trace's timestamps, {cfg.workload.rate_scale:g}x as fast)"
        )
    else:
        lines.append("arrivals: open loop (the trace's timestamps)")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """A latency in the unit a reader takes in: ms below 1 s, s below 10 min, then min or h."""
    if seconds != seconds:  # NaN: no request had one
        return "n/a"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 600.0:
        return f"{seconds:.2f} s"
    if seconds < 7200.0:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _context_lines(s: dict[str, Any]) -> list[str]:
    """What the context limit (``workload.max_context``) did, when one is set."""
    if "context_aborted" not in s:
        return []
    return [
        f"context limit: {s['context_aborted']:,} prompts too long aborted (of the rejected), "
        f"{s['context_truncated']:,} cut (auto-truncate), {s['context_capped_outputs']:,} "
        "outputs capped to fit"
    ]


def format_summary(s: dict[str, Any]) -> str:
    ttft = "  ".join(
        f"{name} {_duration(s[key])}"
        for name, key in (("mean", "ttft_mean_s"), ("p50", "ttft_p50_s"), ("p90", "ttft_p90_s"),
                          ("p99", "ttft_p99_s"))
    )  # fmt: skip
    storage = s.get("storage")
    l3 = f", L3 storage {s.get('storage_hit_rate', 0.0):.2%}" if storage else ""
    lines = [
        f"requests {s['requests']:,} ({s['rejected_requests']} rejected)  "
        f"simulated {s['sim_duration_s']:.1f} s in {s['wall_time_s']:.1f} s",
        *_warmup_lines(s),
        *_context_lines(s),
        f"hit rate {s['hit_rate']:.2%} (device {s['device_hit_rate']:.2%}, host "
        f"{s['host_hit_rate']:.2%}{l3})",
        f"TTFT {ttft}",
        f"TPOT mean {_duration(s['tpot_mean_s'])}  E2E mean {_duration(s['e2e_mean_s'])}  "
        f"output {s['throughput_output_tok_s']:.0f} tok/s",
        f"PCIe per rank: D2H {s['bytes_d2h'] / 1e9:.1f} GB  H2D {s['bytes_h2d'] / 1e9:.1f} GB  "
        f"retractions {s['retractions']}",
    ]
    if storage:
        lines.append(_l3_line(storage))
    defects = _defects_line(s)
    if defects:
        lines.append(defects)
    if "per_instance" in s:
        lines.append(_fleet_line(s))
    if s.get("overloaded"):
        lines.append(f"WARNING: {s['overload_message']}")
    return "\n".join(lines)


def _warmup_lines(s: dict[str, Any]) -> list[str]:
    """What a warm-up window left out (``workload.warmup_s``); none without a window."""
    if "warmup_requests" not in s:
        return []
    lines = [
        f"warm-up: {s['warmup_requests']:,} requests arriving before {s['warmup_end_s']:.1f} s "
        f"ran but count in no figure below (PCIe: copies from {s['warmup_end_s']:.1f} s on)"
    ]
    if not s["requests"]:
        lines.append(
            f"WARNING: workload.warmup_s={s['warmup_s']:g} covers every arrival: nothing was "
            "measured; shorten the window"
        )
    return lines


def _l3_line(st: dict[str, Any]) -> str:
    """One line of a run's L3 traffic and prefetches (its summary's ``storage`` block)."""
    wait = st.get("prefetch_wait_mean_s", 0.0)
    p90 = st.get("prefetch_wait_p90_s", 0.0)
    return (
        f"L3 {st.get('backend', '?')}: per instance read "
        f"{st.get('bytes_read', 0) / 1e9:,.1f} GB  written "
        f"{st.get('bytes_written', 0) / 1e9:,.1f} GB  prefetches {st.get('prefetches_issued', 0):,}"
        f" ({st.get('prefetches_terminated', 0):,} terminated, "
        f"{st.get('prefetches_revoked', 0):,} revoked)  wait mean {_duration(wait)} p90 "
        f"{_duration(p90)}  {st.get('requests_with_l3_hit', 0):,} requests hit L3"
    )


def _defects_line(s: dict[str, Any]) -> str:
    """``"SGLang 0.5.14 defects this run would hit: D5 x51 (614,400 tokens); ..."`` for the
    nonzero counters of the summary's ``sglang_defects`` (0.5.23: the one it reproduces); ""
    when none (or no counters)."""
    hit = [(code, d) for code, d in (s.get("sglang_defects") or {}).items() if d.get("count", 0)]
    if not hit:
        return ""
    parts = [
        f"{code} x{d['count']:,}" + (f" ({d['tokens']:,} tokens)" if d.get("tokens") else "")
        for code, d in hit
    ]
    version = s.get("sglang_version", "0.5.14")
    if version != "0.5.14":
        return (
            f"SGLang {version} defects this run meets (reproduced, as SGLang behaves; "
            f"sglang_defects in summary.json): {'; '.join(parts)}"
        )
    return (
        f"SGLang 0.5.14 defects this run would hit (what the simulator does instead: "
        f"sglang_defects in summary.json): {'; '.join(parts)}"
    )


def _fleet_line(s: dict[str, Any]) -> str:
    """One line for a cluster: the router, how evenly it loaded the instances (idle ones
    named), and the spread of their hit rates and TTFT p90 over the instances that served."""
    per = [p for p in s["per_instance"] if p["requests"]]
    hits = [p["hit_rate"] for p in per]
    p90 = [p["ttft_p90_s"] for p in per if p["ttft_p90_s"] == p["ttft_p90_s"]]
    spread = f"TTFT p90 {_duration(min(p90))} - {_duration(max(p90))}" if p90 else "no TTFT"
    n, idle = s["instances"], s.get("idle_instances", [])
    line = (
        f"instances {n} ({s['router']}): load imbalance {s['imbalance_requests']:.2f}x "
        f"requests, {s['imbalance_prompt_tokens']:.2f}x prompt tokens (1 = even, {n} = one "
        f"instance took all)"
    )
    if hits:
        line += f"; hit rate {min(hits):.1%} - {max(hits):.1%}; {spread}"
    if idle:
        shown = ", ".join(map(str, idle[:8])) + (", ..." if len(idle) > 8 else "")
        line += (
            f"\nwarning: {len(idle)} of {n} instances got no request ({shown}): the "
            f"{s['router']} router used {n - len(idle)}; adding instances changes nothing for it"
        )
    return line


__all__ = [
    "REPO_DATA",
    "format_hitrate_table",
    "format_seeds",
    "format_summary",
    "register",
    "run_seeds",
]
