"""``hicache-sim``: the command line.

User errors (bad arguments, unreadable or malformed traces) print one line and exit 2; a
traceback means a bug. Heavy modules are imported inside the commands, so ``--help`` stays fast
and works without torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EXIT_USER_ERROR = 2
REPO_DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def _int_list(text: str) -> list[int]:
    try:
        out = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one value")
    return out


def _str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _add_hitrate(sub: Any) -> None:
    from sim.hitrate import EVICTIONS, OUTPUT_MODES
    from sim.policy import WRITE_POLICIES

    p = sub.add_parser(
        "hitrate",
        help="cache-only replay: hit rate vs capacity for every policy",
        description="Replay a trace through the HiCache policy core one request at a time (no "
        "timing) and report hit rates per configuration. Lists are comma-separated; "
        "every combination runs.",
    )
    p.add_argument("trace", type=Path)
    p.add_argument("--device-tokens", type=_int_list, required=True, metavar="N[,N...]")
    host = p.add_mutually_exclusive_group()
    host.add_argument(
        "--host-tokens", type=_int_list, metavar="M[,M...]", help="host pool; 0 = no host tier"
    )
    host.add_argument(
        "--hicache-ratio",
        type=float,
        help="host pool = device × ratio, sized as SGLang does (one extra page); default 2",
    )
    p.add_argument("--page-size", type=int, default=64, help="tokens per page (default 64)")
    p.add_argument(
        "--eviction", type=_str_list, default=["lru"], help=f"one or more of {', '.join(EVICTIONS)}"
    )
    p.add_argument(
        "--write-policy",
        type=_str_list,
        default=["write_through"],
        help=f"one or more of {', '.join(WRITE_POLICIES)}",
    )
    p.add_argument("--outputs", choices=OUTPUT_MODES, default="cache")
    p.add_argument("--jobs", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("--csv", type=Path, help="write the table as CSV")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", type=Path, help="write hit rate vs capacity (PNG/SVG/PDF)")
    p.set_defaults(func=_cmd_hitrate)


def _hitrate_configs(args: argparse.Namespace) -> list[Any]:
    from sim.hitrate import HitRateConfig
    from sim.policy import host_pool_tokens

    configs = []
    for ev in args.eviction:
        for wp in args.write_policy:
            for dev in args.device_tokens:
                if args.host_tokens is not None:
                    hosts = args.host_tokens
                else:
                    ratio = 2.0 if args.hicache_ratio is None else args.hicache_ratio
                    try:
                        hosts = [host_pool_tokens(dev, args.page_size, hicache_ratio=ratio)]
                    except ValueError as e:
                        raise UserError(str(e)) from None
                for host in hosts:
                    configs.append(
                        HitRateConfig(
                            device_tokens=dev,
                            host_tokens=host,
                            page_size=args.page_size,
                            eviction=ev,
                            write_policy=wp,
                            outputs=args.outputs,
                        )
                    )
    for cfg in configs:
        try:
            cfg.validate()
        except ValueError as e:
            raise UserError(str(e)) from None
    return configs


def _load_trace(path: Path) -> Any:
    from traces.io import read_trace
    from traces.schema import TraceError

    try:
        return read_trace(path)
    except TraceError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read trace: {e.strerror or e}") from None


def _cmd_hitrate(args: argparse.Namespace) -> int:
    from sim.hitrate import run_grid
    from traces.stats import infinite_capacity_hit_rate

    configs = _hitrate_configs(args)
    trace = _load_trace(args.trace)
    try:
        inf = infinite_capacity_hit_rate(trace, args.page_size)
    except ValueError as e:
        raise UserError(f"{args.trace}: {e}") from None
    rows = run_grid(trace, configs, jobs=args.jobs)
    for r in rows:
        r["infinite_capacity_hit_rate"] = inf
    if args.csv:
        _write_csv(rows, args.csv)
    if args.plot:
        from sim.plots import plot_hitrate

        plot_hitrate(rows, args.plot, title=f"{args.trace.name} (page {args.page_size})")
    if args.json:
        print(json.dumps({"trace": str(args.trace), "rows": rows}, indent=1))
    else:
        print(format_hitrate_table(rows, inf, len(trace)))
    return 0


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import csv
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def format_hitrate_table(rows: list[dict[str, Any]], inf: float, n_requests: int) -> str:
    head = (
        f"{'eviction':>8} {'write_policy':>23} {'device':>11} {'host':>11} "
        f"{'hit':>6} {'device':>6} {'host':>6} {'written':>12} {'loaded':>12} {'dev_evict':>12} "
        f"{'host_evict':>12} {'h_fail':>6}"
    )
    lines = [
        f"{n_requests} requests; infinite-capacity hit rate {inf:.2%} (the best any policy can do)",
        head,
    ]
    for r in rows:
        lines.append(
            f"{r['eviction']:>8} {r['write_policy']:>23} {r['device_tokens']:>11,} "
            f"{r['host_tokens']:>11,} {r['hit_rate']:>6.2%} {r['device_hit_rate']:>6.2%} "
            f"{r['host_hit_rate']:>6.2%} {r['tokens_written']:>12,} {r['tokens_loaded']:>12,} "
            f"{r['device_evicted_tokens']:>12,} {r['host_evicted_tokens']:>12,} "
            f"{r['host_alloc_failures']:>6}"
        )
    return "\n".join(lines)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="the demo job: write-policy comparison on the bundled Mooncake trace",
        description="Cache-only comparison of write_through, write_through_selective, "
        "write_back and no host tier over the bundled Mooncake conversation trace at three "
        "device capacities; writes a CSV, a plot and a Markdown report.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"))
    p.add_argument("--trace", type=Path, default=REPO_DATA / "mooncake/conversation_trace.jsonl")
    p.add_argument("--jobs", type=int, default=0)
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from sim.hitrate import HitRateConfig, run_grid
    from sim.plots import plot_hitrate
    from sim.policy import host_pool_tokens
    from traces.stats import infinite_capacity_hit_rate

    page = 64
    trace = _load_trace(args.trace)
    configs = []
    for dev in (1_000_000, 4_000_000, 16_000_000):
        host = host_pool_tokens(dev, page, hicache_ratio=2.0)
        for wp in ("write_through", "write_through_selective", "write_back"):
            configs.append(HitRateConfig(dev, host, page, "lru", wp))
        configs.append(HitRateConfig(dev, 0, page, "lru", "write_through"))
    rows = run_grid(trace, configs, jobs=args.jobs)
    inf = infinite_capacity_hit_rate(trace, page)
    for r in rows:
        r["infinite_capacity_hit_rate"] = inf
        r["policy"] = r["write_policy"] if r["host_tokens"] else "no host tier"
    args.out.mkdir(parents=True, exist_ok=True)
    _write_csv(rows, args.out / "hitrate.csv")
    plot_hitrate(
        rows,
        args.out / "hitrate.png",
        title=f"{args.trace.name} (page {page}, LRU)",
        series="policy",
    )
    table = format_hitrate_table(rows, inf, len(trace))
    report = args.out / "report.md"
    report.write_text(
        "# hicache-sim demo: write policies on the Mooncake conversation trace\n\n"
        "Cache-only replay (no timing model): each request is matched, loaded back, "
        "inserted after prefill and at finish, one at a time. Host pool = 2 × device "
        "(SGLang's default hicache_ratio).\n\n![hit rate vs capacity](hitrate.png)\n\n"
        f"```\n{table}\n```\n"
    )
    print(table)
    print(
        f"\nreport: {report}  (plot {args.out / 'hitrate.png'}, table {args.out / 'hitrate.csv'})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sim import __version__

    parser = argparse.ArgumentParser(
        prog="hicache-sim",
        description="Simulate SGLang HiCache (HiRadixCache v0.5.14): hit rates, policies, traces.",
    )
    parser.add_argument("--version", action="version", version=f"hicache-sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_hitrate(sub)
    _add_demo(sub)
    from traces.cli import register

    register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as e:
        print(f"hicache-sim: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("hicache-sim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
