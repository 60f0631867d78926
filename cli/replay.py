"""``hicache-sim replay``: ``bench``, ``calibrate`` and ``run``.

:func:`register` adds the ``replay`` command to ``hicache-sim``'s sub-parsers; :func:`main` runs
the same steps standalone (``python -m cli.replay bench ...``). Nothing heavy is imported until
a step runs, and torch only by the steps that copy (``calibrate`` needs numpy and pandas only).
User errors (torch missing, ``--device cuda`` without CUDA, bad files or values) are
:class:`cli.errors.UserError` or, for config, trace, profile and size errors, ``ValueError`` /
``OSError``: :func:`cli.errors.run_command` prints them as one line
``hicache-sim replay: <message>`` and returns 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.args import (
    check_output_dir,
    check_output_file,
    float_above,
    float_in_unit,
    int_at_least,
)
from cli.errors import Parser, UserError, parse_args, run_command, value_and_os_errors

GiB = 1 << 30
#: How this command's user errors start (``run_command`` adds ": <message>").
ERROR_PREFIX = "hicache-sim replay"


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UserError(
            "torch is not installed; the replay needs it: pip install 'hicache-sim[replay]' "
            "(or torch==2.13.0 for the CPU build)"
        ) from None


def _runtime(device: str, threads: int = 1) -> Any:
    _need_torch()
    import torch

    from replay.runtime import make_runtime

    if threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)

    try:
        return make_runtime(device)
    except ValueError as e:
        raise UserError(str(e)) from None


def _check_out(out: Path, force: bool) -> None:
    check_output_dir(out, force=force)


def _flush_bytes(mib: float) -> int:
    if mib < 0:
        raise UserError(f"--flush-mib must be >= 0, got {mib:g}")
    return int(mib * (1 << 20)) // 8 * 8


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------ bench --
def _cmd_bench(args: argparse.Namespace) -> int:
    rt = _runtime(args.device, args.threads)
    from dataclasses import replace

    from replay.bench import BenchConfig, bench_table, run_bench, write_bench

    _check_out(args.out, args.force)
    cfg = BenchConfig.for_model(args.model, args.tp, args.page_size)
    if args.quick:
        cfg = BenchConfig.quick()
    kw: dict[str, Any] = {}
    if args.repeats is not None:
        kw["repeats"] = args.repeats
    if args.no_pageable:
        kw["pageable"] = False
    if args.backends:
        bad = set(args.backends) - {"direct", "kernel"}
        if bad:
            raise UserError(f"--backends: unknown {', '.join(sorted(bad))} (direct, kernel)")
        kw["backends"] = tuple(args.backends)
    if args.flush_mib is not None:
        kw["flush_bytes"] = _flush_bytes(args.flush_mib)
    if args.max_size_mib is not None:
        cap = int(args.max_size_mib * (1 << 20))
        kw["plain_sizes"] = tuple(s for s in cfg.plain_sizes if s <= cap)
        kw["bidir_sizes"] = tuple(s for s in cfg.bidir_sizes if s <= cap)
        kw["max_op_bytes"] = min(cfg.max_op_bytes, cap)
    cfg = replace(cfg, **kw)
    _say(f"bench on {rt.kind} ({rt.describe().get('gpu_name')}) -> {args.out}")
    t0 = time.perf_counter()
    try:
        df = run_bench(cfg, rt, _say)
        write_bench(df, cfg, rt, args.out, time.perf_counter() - t0, model=args.model, tp=args.tp)
    finally:
        rt.close()
    _say(bench_table(df))
    _say(f"{len(df)} rows in {time.perf_counter() - t0:.1f} s -> {args.out}/bench.parquet")
    return 0


# -------------------------------------------------------------------------------- calibrate --
def _cmd_calibrate(args: argparse.Namespace) -> int:
    from hicache.hardware import get_gpu, get_link
    from hicache.latency import save_profile
    from hicache.profile import machine_mismatch
    from replay.calibrate import calibrate, load_bench, replay_rows
    from replay.presets import gpu_preset_for

    check_output_file(args.out, (".json",), what="profile", force=args.force)
    bench, meta = load_bench(args.bench_dir)
    machine = meta.get("machine", {})
    gpu = args.gpu
    if gpu is None:
        gpu = (
            gpu_preset_for(str(machine.get("gpu_name", "")))
            if machine.get("device") == "cuda"
            else "h100-sxm"
        )
        if gpu is None:
            raise UserError(
                f"{args.bench_dir}: GPU {machine.get('gpu_name')!r} has no hardware preset; "
                "pass --gpu NAME (and --link)"
            )
    try:
        link = args.link or get_gpu(gpu).default_link
        get_link(link)
    except ValueError as e:
        raise UserError(f"--gpu/--link: {e}") from None
    replay = replay_rows(args.replay_dirs) if args.replay_dirs else None
    try:
        cal = calibrate(
            bench,
            meta,
            gpu=gpu,
            link=link,
            replay=replay,
            kernel_layout=args.kernel_layout,
            source="hicache-sim replay calibrate "
            + " ".join(str(p) for p in [args.bench_dir, *args.replay_dirs]),
        )
    except ValueError as e:  # the fit: too few or unusable measurements
        raise UserError(f"{args.bench_dir}: cannot fit: {e}") from None
    save_profile(cal.profile, args.out)
    _say(f"profile for {gpu} + {link} (measured={cal.profile.measured}) -> {args.out}")
    problem = machine_mismatch(cal.profile.provenance, gpu)
    if problem:
        print(
            f"warning: {args.out}: labelled {gpu} + {link}, but {problem}; `hicache-sim run "
            "--profile` refuses it without --allow-profile-mismatch",
            file=sys.stderr,
        )
    for b, by_dir in cal.fits.items():
        for d, fit in by_dir.items():
            _say(f"  {b:>6} {d}: {fit.describe()}")
    for d, (eta, how) in cal.eta.items():
        _say(f"  eta {d}: {how}" if eta != 1.0 or "not" in how else f"  eta {d}: {eta}")
    if not cal.profile.measured:
        _say("  (CPU measurements: the profile is marked unmeasured; see its provenance)")
    return 0


# -------------------------------------------------------------------------------------- run --
def _avail_host_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 32 * GiB


def _budget_caps(device: str) -> tuple[int, int]:
    """The most a default budget may take: a share of what the machine has free."""
    if device == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return min(8 * GiB, int(free * 0.4)), min(16 * GiB, int(_avail_host_bytes() * 0.25))
    # CPU tensors: both pools live in RAM, and the warm-up and every op copy through the CPU:
    # a GiB-sized pool makes a replay minutes long
    avail = _avail_host_bytes()
    return min(512 << 20, int(avail * 0.1)), min(1 * GiB, int(avail * 0.2))


def _budgets(device: str, dev_gb: float | None, host_gb: float | None) -> tuple[int, int]:
    """Memory budgets for the pools: what was asked, else a starting point that
    :func:`replay.run.fit_budgets` sizes from the trace."""
    if device == "cuda":
        dev, host = _budget_caps(device)
    else:
        # small, so a CPU replay (CI, laptops) takes seconds when the trace allows it
        dev, host = 256 << 20, 512 << 20
    if dev_gb is not None:
        dev = int(dev_gb * GiB)
    if host_gb is not None:
        host = int(host_gb * GiB)
    return dev, host


def _read_profile(path: Path) -> Any:
    """The profile JSON at ``path``; ``UserError`` naming the file when it cannot be used."""
    import json

    from hicache.latency import profile_from_dict
    from hicache.profile import json_error_text

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"{path}: cannot read profile: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: cannot read profile: not a UTF-8 text (JSON) file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {json_error_text(e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level: expected an object")
    try:
        return profile_from_dict(data, source=str(path))
    except ValueError as e:
        raise UserError(str(e)) from None


def _check_profile_machine(profile: Any, path: Path, rt: Any, allow: bool) -> None:
    """Refuse (or, with ``allow``, warn about) a profile measured on another machine than the
    one replaying: its predictions would be compared with copies of a different machine."""
    from hicache.profile import machine_mismatch
    from replay.presets import gpu_preset_for

    here = "cpu" if rt.kind == "cpu" else gpu_preset_for(rt.describe().get("gpu_name", ""))
    problem = machine_mismatch(profile.provenance, here or "this GPU")
    if problem is None:
        return
    if not allow:
        raise UserError(
            f"{path}: {problem} (this replay runs on {here or rt.kind}); use a profile "
            "calibrated here, or --allow-profile-mismatch"
        )
    print(f"warning: {path}: {problem}; used anyway (--allow-profile-mismatch)", file=sys.stderr)


def _cmd_run(args: argparse.Namespace) -> int:
    rt = _runtime(args.device, args.threads)
    try:
        return _run_on(rt, args)
    finally:
        rt.close()


def _run_on(rt: Any, args: argparse.Namespace) -> int:
    from dataclasses import replace

    from cli.config import resolve_config
    from hicache.latency import load_profile
    from replay.presets import gpu_preset_for
    from replay.run import (
        BudgetError,
        fit_budgets,
        format_summary,
        run_replay,
        settings_from_config,
    )
    from traces.io import read_trace
    from traces.schema import TraceError

    _check_out(args.out, args.force)
    extra = []
    named = any("gpu.name=" in o for o in args.overrides)
    if rt.kind == "cuda" and args.config is None and not named:
        detected = gpu_preset_for(rt.describe()["gpu_name"])
        if detected:
            extra.append((f"gpu.name={detected}", f"the detected GPU ({detected})"))
    resolved = resolve_config(args, extra)
    cfg = resolved.cfg
    if cfg.storage.enabled:
        raise UserError(
            f"storage.backend={cfg.storage.backend}: replay copies between GPU and host memory "
            "only; the L3 tier is simulated by `hicache-sim run` (drop the storage setting)"
        )
    try:
        trace = read_trace(args.trace)
    except TraceError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{args.trace}: cannot read trace: {e.strerror or e}") from None
    dev_budget, host_budget = _budgets(rt.kind, args.device_mem_gb, args.host_mem_gb)
    settings = settings_from_config(
        cfg,
        backend=args.backend,
        layout=args.layout,
        max_requests=args.max_requests,
        batch_tokens=args.batch_tokens,
        batch_requests=args.batch_requests,
        device_budget_bytes=dev_budget,
        host_budget_bytes=host_budget,
        scale=args.scale,
        num_layers=args.layers,
        token_layer_bytes=args.token_layer_bytes,
        verify=args.verify or None,
        flush_bytes=None if args.flush_mib is None else _flush_bytes(args.flush_mib),
    )
    if args.device_mem_gb is None:
        # the default budget is sized from the trace: most requests must fit the device pool
        cap_dev, cap_host = _budget_caps(rt.kind)
        try:
            dev_budget, host_budget, note = fit_budgets(
                trace, settings, cap_dev, cap_host, host_budget_fixed=args.host_mem_gb is not None
            )
        except BudgetError as e:
            raise UserError(f"{args.trace}: {e}") from None
        settings = replace(settings, device_budget_bytes=dev_budget, host_budget_bytes=host_budget)
        if note:
            _say(note)
    if args.profile is not None:
        profile = _read_profile(args.profile)
        _check_profile_machine(profile, args.profile, rt, args.allow_profile_mismatch)
    else:
        profile = load_profile(None, settings.gpu, settings.link)
    resolved.print_notes()
    summary = run_replay(
        trace,
        settings,
        rt,
        profile,
        profile_path=str(args.profile or ""),
        out=args.out,
        log=_say,
        progress=None,
    )
    _say(format_summary(summary))
    _say(f"-> {args.out}/ops.parquet, summary.json")
    return 0


# ------------------------------------------------------------------------------- argparse ----
def add_steps(p: argparse.ArgumentParser) -> None:
    """Add the ``bench`` / ``calibrate`` / ``run`` sub-commands to ``p``; config, trace,
    profile and size errors (``ValueError``, ``OSError``) are user errors of every step."""
    p.set_defaults(user_errors=value_and_os_errors, error_prefix=ERROR_PREFIX)
    sub = p.add_subparsers(dest="replay_step", metavar="STEP")
    sub.required = True
    _add_bench(sub)
    _add_calibrate(sub)
    _add_run(sub)


_DEV_HELP = "where to copy: cuda, cpu, or auto (cuda when available; default)"
# the CPU side of an op (the kernel backend's host gathers/scatters) is one issuing thread
# in a server; torch's parallel CPU index ops were measured 10-20x slower on large rows
# with 2 threads than with 1, and OpenMP workers make timings erratic on a shared box
_THREADS_HELP = "torch intra-op threads for the CPU side of the ops (default 1)"
_FLUSH_HELP = (
    "scratch MiB overwritten before each timed op (bench) or where a forward pass would "
    "run (replay), so ops meet cold caches as in serving (default 64; 0 = off)"
)


def _add_bench(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="copy microbenchmarks (sizes, directions, both at once, fragmentation, backends)",
        description="Time plain copies (4 KiB-256 MiB, each direction, pinned and pageable), "
        "both directions at once, and HiCache writes/loads through both IO backends, "
        "contiguous and fragmented. Writes bench.parquet, bench.csv and meta.json.",
    )
    b.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help=_DEV_HELP)
    b.add_argument("--out", type=Path, required=True, help="output folder")
    b.add_argument("--model", default="llama-3-8b", help="page geometry of this model preset")
    b.add_argument("--tp", type=int_at_least(1), default=1, help="tensor parallel ranks")
    b.add_argument(
        "--page-size", type=int_at_least(1), default=64, help="tokens per page (default 64)"
    )
    b.add_argument("--quick", action="store_true", help="a small sweep (seconds; CI, CPU)")
    b.add_argument("--repeats", type=int_at_least(1), help="timed repeats per point (default 5)")
    b.add_argument("--no-pageable", action="store_true", help="skip the pageable-memory sweep")
    b.add_argument("--backends", type=_csv, help="direct,kernel (default both)")
    b.add_argument("--max-size-mib", type=float_above(0), help="cap copy and op sizes (MiB)")
    b.add_argument("--threads", type=int, default=1, help=_THREADS_HELP)
    b.add_argument("--flush-mib", type=float, help=_FLUSH_HELP)
    b.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    b.set_defaults(func=_cmd_bench)


def _add_calibrate(sub: Any) -> None:
    c = sub.add_parser(
        "calibrate",
        help="fit the latency model to a bench (and replay runs) -> profile JSON",
        description="Least-squares fit of alpha, beta, gamma per IO backend and direction, eta "
        "from the both-directions runs, compute constants from GEMMs when measured on CUDA. "
        "The profile is marked measured only for CUDA measurements.",
    )
    c.add_argument("bench_dir", type=Path, help="output folder of hicache-sim replay bench")
    c.add_argument("replay_dirs", type=Path, nargs="*", help="replay run folders (ops.parquet)")
    c.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    c.add_argument("--force", action="store_true", help="overwrite an existing --out")
    c.add_argument("--gpu", help="GPU preset the profile is for (default: detected; CPU: h100-sxm)")
    c.add_argument("--link", help="link preset (default: the GPU's usual link)")
    c.add_argument(
        "--kernel-layout",
        choices=("page_first", "layer_first"),
        help="host layout whose kernel ops to fit (default page_first if measured)",
    )
    c.set_defaults(func=_cmd_calibrate)


def _add_run(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="replay a trace with real copies; measured vs predicted per op",
        description="Replay a trace through the HiCache policy core with every write and load "
        "done as a real copy (compute is not executed); compare each op's time with the "
        "latency model. Pools are scaled to fit the memory budgets (the notes say how).",
    )
    r.add_argument("trace", type=Path, help="trace file (.jsonl, .jsonl.gz, .parquet)")
    r.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help=_DEV_HELP)
    r.add_argument(
        "--profile", type=Path,
        help="latency profile JSON (default: shipped one); one measured on another machine "
        "needs --allow-profile-mismatch",
    )  # fmt: skip
    r.add_argument("--out", type=Path, required=True, help="run folder to write")
    from cli.config import add_config_options

    add_config_options(r, profile_flag=True)
    r.add_argument("--backend", choices=("kernel", "direct"), help="IO backend (default: config)")
    r.add_argument("--layout", choices=("layer_first", "page_first"), help="host layout")
    r.add_argument(
        "--max-requests", type=int_at_least(0), help="replay only the first N requests (0 = all)"
    )
    r.add_argument(
        "--batch-tokens",
        type=int_at_least(0),
        help="prompt tokens per batch (default: config's "
        "max_prefill_tokens; 0 = one request per batch)",
    )
    r.add_argument(
        "--batch-requests", type=int_at_least(1), help="requests per batch at most (default 8)"
    )
    r.add_argument(
        "--device-mem-gb", type=float_above(0),
        help="device pool budget, GiB (default: sized from the trace so that most requests fit, "
        "within a share of the free memory)",
    )  # fmt: skip
    r.add_argument("--host-mem-gb", type=float_above(0), help="host pool budget, GiB")
    r.add_argument("--scale", type=float_in_unit, help="shrink both pools by this factor (0, 1]")
    r.add_argument(
        "--layers", type=int_at_least(1), help="override the model's layer count (shrinks ops)"
    )
    r.add_argument(
        "--token-layer-bytes", type=int_at_least(1), help="override KV bytes per token per layer"
    )
    r.add_argument("--verify", action="store_true", help="check every loaded page's bytes")
    r.add_argument("--threads", type=int, default=1, help=_THREADS_HELP)
    r.add_argument("--flush-mib", type=float, help=_FLUSH_HELP)
    r.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    r.set_defaults(func=_cmd_run)


def register(subparsers: Any) -> None:
    """Add ``replay`` (with ``bench``, ``calibrate``, ``run``) to ``hicache-sim``'s
    sub-parsers (the object ``ArgumentParser.add_subparsers`` returned)."""
    p = subparsers.add_parser(
        "replay",
        help="real copies (torch): microbenchmarks, calibration, trace replay",
        description="Replay HiCache's host<->device copies for real (CUDA, or CPU tensors) to "
        "calibrate and check the simulator's latency model.",
    )
    add_steps(p)


def main(argv: Sequence[str] | None = None) -> int:
    """``hicache-sim replay`` on its own: ``main(["bench", "--device", "cpu", ...])``."""
    parser = Parser(prog="hicache-sim replay")
    add_steps(parser)
    args = parse_args(parser, argv)
    return args if isinstance(args, int) else run_command(args)


if __name__ == "__main__":
    sys.exit(main())
