"""``hicache-sim run``: the timed simulation (one run, or ``--seeds K`` replicas), and the
registration of ``hitrate`` (:mod:`cli.hitrate`) beside it; what ``run`` prints is
:mod:`cli.run_output`.

User errors are raised as :class:`cli.errors.UserError` (printed by :func:`cli.errors.
run_command`). Heavy modules are imported inside the commands, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cli.args import check_output_dir, int_at_least
from cli.errors import UserError
from cli.hitrate import add_hitrate
from cli.inputs import add_max_requests, load_trace, max_requests_override
from cli.pd_summary import print_pd_summary
from cli.run_output import format_seeds, format_setup, format_summary


def register(subparsers: Any) -> None:
    """Add ``run`` and ``hitrate`` to ``hicache-sim``'s sub-parsers (``demo``: :mod:`cli.demo`)."""
    _add_run(subparsers)
    add_hitrate(subparsers)


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
    trace = load_trace(args.trace, args.lenient)
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
    print_pd_summary(summary)  # the per-role lines of a PD run (nothing otherwise)
    note = cache_only_note(cfg, trace, summary)
    if note:
        print(note)
    if args.seeds:
        block = run_seeds(cfg, trace, args.seeds, summary)
        summary["seeds"] = block
        from sim.metrics import write_json_atomic

        write_json_atomic(summary, args.out / "summary.json")
        print(format_seeds(block))
    flags = format_sglang_command(cfg).splitlines()[0]
    if cfg.pd.enabled:  # one command per role, each with its own overrides (pd.*_set)
        print(f"as SGLang flags, per role (plus --disaggregation-mode prefill|decode and that "
              f"role's pd.prefill_set / pd.decode_set): {flags}")  # fmt: skip
    else:
        print(f"as SGLang flags: {flags}")
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

    if cfg.pd.enabled:  # the replay would see one server, not the two roles
        return None
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
        output_reuse=cfg.workload.output_reuse,
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


__all__ = ["cache_only_note", "register", "run_seeds"]
