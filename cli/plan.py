"""``hicache-sim plan``: how many instances (GPUs, servers) a trace needs to meet its targets,
with and without the host tier, and so how many HiCache saves, like for like (the planning is
:mod:`studies.plan`). With ``--pd`` (or ``pd.enabled`` in the config): the cheapest
prefill:decode split, and what decode-side HiCache changes (:mod:`studies.plan.pd`).

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
    from studies.plan.pd import PdPlan

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
        "--router", default=None, metavar="POLICY[,POLICY...]",
        help="router policies, comma-separated (one row each; default cache_aware; not with "
        "--pd: PD runs route with pd.prefill_router / pd.decode_router)",
    )  # fmt: skip
    p.add_argument(
        "--pd", action="store_true",
        help="plan a prefill/decode-disaggregated fleet (sets pd.enabled; also on when the "
        "config has it): the split of prefill:decode servers with the fewest GPUs that meets "
        "every target, per variant (default: decode cache off, decode radix cache (L1), "
        "decode L1+L2 (host x2)), and what decode-side HiCache changes",
    )  # fmt: skip
    p.add_argument(
        "--variant", action="append", default=[], metavar="'NAME:KEY=VALUE[,KEY=VALUE...]'",
        help=f"a named configuration (repeatable; replaces the defaults: {DEFAULT_VARIANTS_TEXT}"
        "); e.g. 'host 64GB:cache.hicache_size_gb=64'",
    )  # fmt: skip
    p.add_argument(
        "--max-instances", type=int_at_least(1), default=64,
        help="the largest instance count tried (default 64; with --pd, per role); beyond it: "
        "'> max'",
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


def _inputs(args: argparse.Namespace) -> tuple[bool, Any, list[Any], list[Any], Any]:
    """(a PD plan?, trace, configurations, targets, SLO or None), every one checked;
    ``UserError`` else."""
    from cli.config import resolve_config
    from cli.inputs import load_trace, max_requests_override
    from studies.plan import parse_slo, parse_target, summary_keys

    if args.address and args.executor != "ray":
        raise UserError("--address needs --executor ray")
    if not (math.isfinite(args.gpu_hour_usd) and args.gpu_hour_usd >= 0):
        raise UserError(f"--gpu-hour-usd: expected a price >= 0, got {args.gpu_hour_usd}")
    try:
        for text in args.target:
            parse_target(text)  # the syntax, before anything is loaded
    except ValueError as e:
        raise UserError(str(e)) from None
    extra = [*max_requests_override(args), *([("pd.enabled=true", "--pd")] if args.pd else [])]
    resolved = resolve_config(args, extra)
    pd = resolved.cfg.pd.enabled
    try:
        variants = _variants(args, pd)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.out is not None:
        check_output_dir(args.out, force=args.force, what="plan folder")
    trace = load_trace(args.trace, args.lenient)
    try:
        configs = _configs(args, resolved.cfg, trace, variants, pd)
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
    return pd, trace, configs, targets, slo


def _variants(args: argparse.Namespace, pd: bool) -> list[Any]:
    """The variants of ``--variant`` (or the defaults), the ``--set`` items and ``--router``
    checked against what the plan sets itself."""
    from studies.plan import DEFAULT_VARIANTS, check_settable, parse_variant
    from studies.plan.pd import DEFAULT_PD_VARIANTS, check_pd_settable, parse_pd_variant

    for item in args.overrides:
        key = item.partition("=")[0].strip()
        if pd and key != "pd.enabled":  # pd.enabled=true is what made it a PD plan
            check_pd_settable(key, f"--set {item}")
        check_settable(key, f"--set {item}")
    if not pd:
        return [parse_variant(v) for v in args.variant] or list(DEFAULT_VARIANTS)
    if args.router is not None:
        raise UserError(
            "--router: a PD plan routes with pd.prefill_router and pd.decode_router (--set "
            "pd.decode_router=...); --router is for plans without --pd"
        )
    return [parse_pd_variant(v) for v in args.variant] or list(DEFAULT_PD_VARIANTS)


def _configs(
    args: argparse.Namespace, cfg: Any, trace: Any, variants: list[Any], pd: bool
) -> list[Any]:
    from studies.plan import build_configs
    from studies.plan.pd import build_pd_configs

    if pd:
        return build_pd_configs(cfg, trace, variants)
    routers = [r.strip() for r in (args.router or "cache_aware").split(",") if r.strip()]
    return build_configs(cfg, trace, variants, routers)


def _cmd_plan(args: argparse.Namespace) -> int:
    from studies.plan import run_plan, write_plan
    from studies.plan.pd import run_pd_plan, write_pd_plan

    t0 = time.perf_counter()
    pd, trace, configs, targets, slo = _inputs(args)
    run = run_pd_plan if pd else run_plan
    plan = run(
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
    print(format_pd_plan(plan) if pd else format_plan(plan))  # type: ignore[arg-type]
    print(f"{evaluations} runs in {time.perf_counter() - t0:.1f} s")
    if args.out is not None:
        write = write_pd_plan if pd else write_plan
        try:
            paths = write(plan, args.out)  # type: ignore[arg-type]
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


def _table(cells: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                  for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in cells
    ]  # fmt: skip


def format_pd_plan(plan: PdPlan) -> str:
    """A PD plan: each role's setup, the targets, the table (one row per configuration: the
    split, GPUs and servers as total (prefill + decode), GPU-hours, host DRAM per instance
    of each role, the hit rates of both sides, the KV bytes the decode cache saved, the
    target metrics; a missed target shows its best value in brackets), the notes and what
    decode-side HiCache changes."""
    from studies.plan.pd_savings import pd_savings_lines

    cost = plan.gpu_hour_usd > 0
    cap = plan.max_instances
    cells = [["configuration", "prefill:decode", "GPUs (P+D)", "servers (P+D)", "GPU-h",
              *(["cost $"] * cost), "host GB/inst P", "host GB/inst D", "hit P", "hit D",
              "KV saved", *(t.key.removesuffix("_s") for t in plan.targets)]]  # fmt: skip
    for r in plan.rows():
        missed = r["split"] is None
        cells.append([
            r["configuration"],
            f"> {cap}:{cap}" if missed else r["split"],
            "n/a" if missed else f"{r['gpus']} ({r['prefill_gpus']}+{r['decode_gpus']})",
            "n/a" if missed else
            f"{r['servers']} ({r['prefill_servers']}+{r['decode_servers']})",
            "n/a" if r["gpu_hours"] is None else f"{r['gpu_hours']:.3g}",
            *(["n/a" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}"] * cost),
            f"{r['prefill_host_dram_gb_per_instance']:.1f}",
            f"{r['decode_host_dram_gb_per_instance']:.1f}",
            _pct(r["prefill_hit_rate"]), _pct(r["decode_hit_rate"]),
            _pct(r["transfer_bytes_saved_share"]),
            *(_target_cell(t.key, r) if not missed
              else f"({_metric(t.key, r[f'{t.key}_best'])})" for t in plan.targets),
        ])  # fmt: skip
    setups = dict.fromkeys(s for c in plan.configs
                           for s in (c.config.prefill.setup, c.config.decode.setup))  # fmt: skip
    lines = [
        f"trace {plan.trace}" if plan.trace else "",
        *(f"setup: {s}" for s in setups),
        "targets: " + ", ".join(t.label for t in plan.targets) + " (and not overloaded)"
        + (f"; goodput: share of requests with {plan.slo.label}" if plan.slo else "")
        + (f"; judged on the median of {plan.seeds} seeds, in brackets p5 - p95"
           if plan.seeds > 1 else ""),
        f"the split with the fewest GPUs, up to {cap} servers per role (GPUs = prefill "
        "servers x prefill TP + decode servers x decode TP)",
        *_table(cells),
    ]  # fmt: skip
    if any(r["split"] is None for r in plan.rows()):
        lines.append(f"(> {cap}:{cap}: no split within --max-instances per role; in brackets "
                     "the best value any evaluated split reached)")  # fmt: skip
    lines.extend(f"note: {line}" for line in plan.notes())
    lines.extend(pd_savings_lines(plan) or ["(no configuration without the decode radix cache "
                                            "to compare against)"])  # fmt: skip
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
