"""``hicache-sim plan``: how many instances (GPUs, servers) a trace needs to meet its targets,
with and without the host tier, and so how many HiCache saves, like for like (the planning is
:mod:`studies.plan`).

Every input is checked before the first evaluation: targets, variants, routers, the config of
every configuration, the output folder, and the target keys (against a one-request probe
run's summary); each error is one line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.args import check_output_dir, int_at_least, jobs_arg
from cli.errors import UserError, input_and_os_errors

if TYPE_CHECKING:
    from studies.plan import Plan

DEFAULT_VARIANTS_TEXT = "'no host tier', 'host x2' (cache.hicache_ratio=2), 'host x4' (ratio 4)"


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` command to an argparse sub-parsers object."""
    from cli.config import add_config_options
    from cli.inputs import add_max_requests
    from studies.sweep import EXECUTORS

    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="capacity planning: the instances (GPUs) needed to meet latency targets, and "
        "what HiCache saves",
        description="For each configuration (the base config x variants x routers), find the "
        "smallest cluster.instances whose run meets every --target and is not overloaded "
        "(doubling, then bisection; assumes latency does not grow with instances). Prints "
        "instances, GPUs, servers (gpu.server), GPU-hours (instances x model.tp x the trace's "
        "arrival span), host DRAM per instance, hit rates per tier, the best value reached "
        "and the zero-load floor where a target is missed, and what the host tier saves "
        "against a baseline that differs in the host tier alone.",
    )
    p.add_argument("trace", type=Path, help="trace file (.jsonl, .jsonl.gz, .parquet)")
    p.add_argument(
        "--target", action="append", required=True, metavar="KEY<=VALUE|KEY>=VALUE",
        help="a bound on a summary key, repeatable: ttft_p90=2s (= is <=), tpot_mean<=50ms, "
        "e2e_mean=1.5min, hit_rate>=0.5, throughput_output_tok_s>=2000, goodput>=0.95 (with "
        "--slo); units ms, s, min; a plain number for keys not in seconds",
    )  # fmt: skip
    p.add_argument(
        "--slo", metavar="ttft=D[,tpot=D]",
        help="the per-request SLO that goodput counts (share of requests within it), e.g. "
        "ttft=2s,tpot=50ms",
    )  # fmt: skip
    p.add_argument(
        "--gpu-hour-usd", type=float, default=0.0, metavar="USD",
        help="price of one GPU-hour: adds a cost column and the saving in dollars",
    )  # fmt: skip
    p.add_argument(
        "--router", default="cache_aware", metavar="POLICY[,POLICY...]",
        help="router policies, comma-separated (one row each; default cache_aware)",
    )  # fmt: skip
    p.add_argument(
        "--variant", action="append", default=[], metavar="'NAME:KEY=VALUE[,KEY=VALUE...]'",
        help=f"a named configuration (repeatable; replaces the defaults: {DEFAULT_VARIANTS_TEXT}"
        "); e.g. 'host 64GB:cache.hicache_size_gb=64'",
    )  # fmt: skip
    p.add_argument(
        "--max-instances", type=int_at_least(1), default=64,
        help="the largest instance count tried (default 64); beyond it: '> max'",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, help="folder for plan.json, plan.csv, plan.png and plan.html"
    )
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    add_max_requests(p)
    p.add_argument(
        "--seeds", type=int_at_least(1), default=1, metavar="K",
        help="run every evaluation K times (run.seed and router.seed + 0, 1, ..., each on the "
        "trace with its sessions' start offsets permuted, seed 0 as recorded) and judge the "
        "targets on the medians; the table shows the 5th-95th percentile, the notes in how "
        "many seeds each target was met",
    )  # fmt: skip
    add_config_options(p)
    p.add_argument(
        "--jobs", type=jobs_arg, default=0,
        help="worker processes (local) or CPUs of a local Ray (0 = all cores, the default)",
    )  # fmt: skip
    p.add_argument(
        "--executor", choices=EXECUTORS, default="local",
        help="local process pool (default) or Ray (needs the 'cluster' extra)",
    )  # fmt: skip
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="a progress bar over evaluations (default: only on a terminal)",
    )  # fmt: skip
    p.set_defaults(func=_cmd_plan, user_errors=input_and_os_errors)
    return p


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, list[Any], list[Any], Any]:
    """(config, trace, configurations, targets, SLO or None), every one checked;
    ``UserError`` else."""
    from cli.config import resolve_config
    from cli.inputs import load_trace, max_requests_override
    from studies.plan import (
        DEFAULT_VARIANTS,
        build_configs,
        check_settable,
        parse_slo,
        parse_target,
        parse_variant,
        summary_keys,
    )

    if args.address and args.executor != "ray":
        raise UserError("--address needs --executor ray")
    if not (math.isfinite(args.gpu_hour_usd) and args.gpu_hour_usd >= 0):
        raise UserError(f"--gpu-hour-usd: expected a price >= 0, got {args.gpu_hour_usd}")
    try:
        for item in args.overrides:
            check_settable(item.partition("=")[0].strip(), f"--set {item}")
        for text in args.target:
            parse_target(text)  # the syntax, before anything is loaded
        variants = [parse_variant(v) for v in args.variant] or list(DEFAULT_VARIANTS)
    except ValueError as e:
        raise UserError(str(e)) from None
    routers = [r.strip() for r in args.router.split(",") if r.strip()]
    resolved = resolve_config(args, max_requests_override(args))
    if args.out is not None:
        check_output_dir(args.out, force=args.force, what="plan folder")
    trace = load_trace(args.trace, args.lenient)
    try:
        configs = build_configs(resolved.cfg, trace, variants, routers)
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        keys = summary_keys(resolved.cfg, trace)
    except ValueError as e:  # e.g. a page size that does not divide the trace's block size
        raise UserError(f"{args.trace}: {e}") from None
    try:
        slo = parse_slo(args.slo) if args.slo else None
        targets = [parse_target(text, [*keys, "goodput"]) for text in args.target]
    except ValueError as e:
        raise UserError(str(e)) from None
    if slo is None and any(t.key == "goodput" for t in targets):
        raise UserError("--target goodput: needs --slo (e.g. --slo ttft=2s,tpot=50ms)")
    resolved.print_notes()
    return resolved.cfg, trace, configs, targets, slo


def _cmd_plan(args: argparse.Namespace) -> int:
    from studies.plan import run_plan, write_plan

    t0 = time.perf_counter()
    _, trace, configs, targets, slo = _inputs(args)
    plan = run_plan(
        configs,
        trace,
        targets,
        args.max_instances,
        executor=args.executor,
        jobs=args.jobs,
        address=args.address,
        progress=args.progress,
        slo=slo,
        gpu_hour_usd=args.gpu_hour_usd,
        seeds=args.seeds,
    )
    evaluations = sum(len(c.evaluations) for c in plan.configs) * plan.seeds
    print(format_plan(plan))
    print(f"{evaluations} runs in {time.perf_counter() - t0:.1f} s")
    if args.out is not None:
        try:
            paths = write_plan(plan, args.out)
        except OSError as e:
            raise UserError(f"{args.out}: cannot write the plan: {e.strerror or e}") from None
        print(f"plan: {', '.join(str(p) for p in paths)}")
    return 0


def _metric(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    from studies.plan import format_seconds

    return format_seconds(float(value)) if key.endswith("_s") else f"{float(value):.4g}"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _target_cell(key: str, row: dict[str, Any]) -> str:
    """A target's value at the chosen N; under ``--seeds`` with the interval over seeds."""
    cell = _metric(key, row[key])
    if row.get(f"{key}_lo") is None:
        return cell
    return f"{cell} [{_metric(key, row[f'{key}_lo'])} - {_metric(key, row[f'{key}_hi'])}]"


def format_plan(plan: Plan) -> str:
    """The setups, the table (one row per configuration; a missed target shows its best value
    in brackets), the notes and the savings lines."""
    rows = plan.rows()
    cost = plan.gpu_hour_usd > 0
    head = ["configuration", "instances", "GPUs", "servers", "GPU-h", *(["cost $"] * cost),
            "host GB/rank", "host GB/inst", "hit", "device", "host", "L3",
            *(t.key.removesuffix("_s") for t in plan.targets)]  # fmt: skip
    cells = [head]
    for r in rows:
        missed = r["instances"] is None
        cells.append([
            r["configuration"],
            f"> {plan.max_instances}" if missed else str(r["instances"]),
            "n/a" if missed else str(r["gpus"]),
            "n/a" if missed else str(r["servers"]),
            "n/a" if r["gpu_hours"] is None else f"{r['gpu_hours']:.3g}",
            *(["n/a" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}"] * cost),
            f"{r['host_gb_per_rank']:.1f}",
            f"{r['host_dram_gb_per_instance']:.1f}",
            *(_pct(r[k]) for k in ("hit_rate", "device_hit_rate", "host_hit_rate",
                                   "storage_hit_rate")),
            *(_target_cell(t.key, r) if not missed
              else f"({_metric(t.key, r[f'{t.key}_best'])})" for t in plan.targets),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    setups = dict.fromkeys(c.config.setup for c in plan.configs)
    lines = [
        f"trace {plan.trace}" if plan.trace else "",
        *(f"setup: {s}" for s in setups),
        "targets: " + ", ".join(t.label for t in plan.targets) + " (and not overloaded)"
        + (f"; goodput: share of requests with {plan.slo.label}" if plan.slo else "")
        + (f"; judged on the median of {plan.seeds} seeds, in brackets p5 - p95"
           if plan.seeds > 1 else ""),
        *(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            for row in cells
        ),
    ]  # fmt: skip
    if any(r["instances"] is None for r in rows):
        lines.append(f"(> {plan.max_instances}: not met within --max-instances; in brackets "
                     "the best value any evaluated N reached)")  # fmt: skip
    lines.extend(f"note: {line}" for line in plan.notes())
    lines.extend(_savings(plan))
    return "\n".join(line for line in lines if line)


def _savings(plan: Plan) -> list[str]:
    from studies.plan import savings_lines

    lines = savings_lines(plan, plan.gpu_hour_usd)
    return lines or ["(no configuration without a host tier to compare against)"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.plan TRACE --target ...``: the ``plan`` command on its own."""
    from cli.errors import run_one_command

    return run_one_command("plan", register, argv)


if __name__ == "__main__":
    # through the importable module, so pickled job functions refer to studies.plan
    from cli.plan import main as _main

    sys.exit(_main())
