"""Bench + calibrate + a short trace replay in one go: ``python -m replay.device_check --out DIR``.

Meant for a CUDA machine (``make device-check``), where it should take a few minutes on an
H100/H200 (not yet run on one); ``--device cpu`` runs the same pipeline on CPU tensors with a
smaller geometry (seconds), which is how the tests and CI prove it end to end. Everything
goes under ``DIR``:

* ``bench/``: the microbenchmark table (``bench.parquet``/``.csv``, ``meta.json``);
* ``profile.json``: the calibrated profile (``"measured": true`` only on CUDA); on CUDA also a
  copy named ``<gpu>-measured.json``, ready to commit as ``hicache/profiles/<gpu>-measured.json``;
* ``replay-direct/``, ``replay-kernel/``: the bundled synthetic trace replayed with each IO
  backend, predicted with the calibrated profile (``ops.parquet``, ``summary.json``);
* ``summary.json``, ``summary.md``: the figures against the targets of the replay issue:
  microbenchmark ops predicted with median error <= 5 %, replay ops <= 10 %, large copies of
  the direct backend at >= 90 % of the plain-copy peak. On CPU the targets are reported but do
  not apply (they are GPU targets).

Each stage (bench, calibrate, each replay) is isolated: a failing one is recorded under
``errors`` in the summary (traceback on stderr) and the others still run and write their
files. ``--export DIR`` copies the summary, any measured profile and a ``.tar.gz`` of the whole
folder into ``DIR`` (4 flat files, even after a failure): the shape a lent GPU machine's result
folder can hand back (``bench/device_check.sh`` is that one prepared run).

Exit code 0 when every stage ran (whatever the figures), 1 when a stage failed (or, with
``--strict``, when a target is missed on CUDA), 2 for a user error (e.g. ``--device cuda``
without CUDA, a missing package).

This module is the entry point and the order of the stages; their parts are in
:mod:`replay.check` (the plan, the stages, the summary, the export), whose public names are
re-exported here. It imports only the standard library until the check runs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay.check.export import ARCHIVE, export
from replay.check.plan import (
    CPU_MAX_REQUESTS,
    CUDA_MAX_REQUESTS,
    DEFAULT_TRACE,
    CheckPlan,
    check_plan,
    load_trace,
    profile_gpu,
)
from replay.check.stages import (
    Stages,
    bench_stage,
    calibrate_stage,
    replay_settings,
    replay_stage,
    sim_config,
)
from replay.check.summary import TARGETS, build_summary, format_check, write_summary

if TYPE_CHECKING:
    from replay.runtime import Runtime


def run_check(
    out: Path,
    device: str = "auto",
    trace_kind: str = DEFAULT_TRACE,
    max_requests: int = 0,
    model: str = "llama-3-8b",
    gpu: str | None = None,
    flush_bytes: int | None = None,
) -> dict[str, Any]:
    """Run the whole check into ``out`` (see the module docstring); returns the summary.

    ``gpu``: the ``hicache.hardware`` preset the profile is for (default: detected from the CUDA
    device name; ``h100-sxm`` on CPU, where the profile is unmeasured anyway). ``ValueError``
    for a CUDA device that matches no preset and no ``gpu`` given. ``flush_bytes``: the cache
    flush of bench and replays (default ``BenchConfig.flush_bytes``; 0 = off)."""
    import torch

    from replay.runtime import make_runtime

    t_all = time.perf_counter()
    rt = make_runtime(device)
    # One intra-op thread, on CUDA too: the CPU side of the ops (the kernel backend's host
    # gathers and scatters) is then one issuing thread, as in a serving process, and stable.
    # Several threads make it erratic: torch's CPU index_select copies each large row with a
    # parallel copy, measured 10-20x slower with 2 threads than with 1 on 4 MiB rows.
    torch.set_num_threads(1)
    stages = Stages()
    try:
        with stages.sigint_stops_stages():
            return _check(stages, out, rt, trace_kind, max_requests, model, gpu, flush_bytes, t_all)
    finally:
        rt.close()


def _check(
    stages: Stages,
    out: Path,
    rt: Runtime,
    trace_kind: str,
    max_requests: int,
    model: str,
    gpu: str | None,
    flush_bytes: int | None,
    t_all: float,
) -> dict[str, Any]:
    """The stages in order, then the summary. Each stage is isolated: on a GPU lent for a few
    minutes, a failure in one (say, the kernel backend's replay) must not cost the
    measurements of the others; its figures stay NaN."""
    from hicache.hardware import get_gpu

    trace = load_trace(trace_kind)
    cuda = rt.kind == "cuda"
    info = rt.describe()
    if gpu is None:
        gpu = profile_gpu(info["gpu_name"], cuda)
    link = get_gpu(gpu).default_link
    print(f"device check on {rt.kind} ({info['gpu_name']}); profile for {gpu} + {link}")
    plan = check_plan(cuda, model)
    cfg = plan.bench if flush_bytes is None else replace(plan.bench, flush_bytes=flush_bytes)
    max_requests = max_requests or plan.max_requests

    benched = stages.run("bench", lambda: bench_stage(cfg, rt, out, model))
    calibrated = None
    if benched is not None:
        bench, meta = benched
        calibrated = stages.run(
            "calibrate",
            lambda: calibrate_stage(bench, meta, gpu=gpu, link=link, out=out, cuda=cuda),
        )
    replays: dict[str, Any] = {}
    if calibrated is not None:
        profile = calibrated[0].profile
        cfg_sim = sim_config(model, gpu, link, plan.geometry["page_size"])
        for backend in ("direct", "kernel"):
            settings = replay_settings(cfg_sim, backend, plan, max_requests, cfg.flush_bytes, cuda)
            do_replay = partial(replay_stage, trace, backend, settings, rt, profile, out)
            r = stages.run(f"replay-{backend}", do_replay)
            if r is not None:
                replays[backend] = r

    summary = build_summary(
        rt=rt,
        info=info,
        gpu=gpu,
        link=link,
        out=out,
        benched=benched,
        calibrated=calibrated,
        replays=replays,
        flush_bytes=cfg.flush_bytes,
        stages=stages,
        t_all=t_all,
    )
    write_summary(summary, out)
    return summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m replay.device_check",
        description="Bench + calibrate + short replay, all under --out; prints a summary.",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder (a previous device check there is replaced)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument(
        "--trace", default=DEFAULT_TRACE, help="a trace file, or a bundled synthetic trace kind"
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=0,
        help=f"default {CUDA_MAX_REQUESTS} (CUDA), {CPU_MAX_REQUESTS} (CPU)",
    )
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--gpu", help="hicache.hardware GPU preset of the profile (default: detected)")
    p.add_argument(
        "--flush-mib",
        type=float,
        help="scratch MiB written before each bench op and where a forward pass would run in "
        "the replays (default 64; 0 = off, to see what cold caches change)",
    )
    p.add_argument("--force", action="store_true", help="replace any non-empty --out")
    p.add_argument("--strict", action="store_true", help="exit 1 when a CUDA target is missed")
    p.add_argument(
        "--export",
        type=Path,
        help=f"also copy summary.md, summary.json, any measured profile and {ARCHIVE} (all of "
        "--out) into this folder, even when a stage fails",
    )
    return p


def _missing_packages() -> list[str]:
    import importlib.util

    # torch is checked on its own (it has its own message); parquet needs pyarrow
    return [m for m in ("numpy", "pandas", "pyarrow") if importlib.util.find_spec(m) is None]


def _usage_error(args: argparse.Namespace) -> str | None:
    """Why the check cannot run as asked (a missing package, no such device, a bad
    ``--flush-mib``, ``--out`` or ``--export``), or None."""
    missing = _missing_packages()
    if missing:
        return f"missing Python packages: {', '.join(missing)} (pip install -e '.[replay]')"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is not installed (pip install 'hicache-sim[replay]')"
    from replay.runtime import resolve_device

    try:
        resolve_device(args.device)
    except ValueError as e:
        return str(e)
    if args.flush_mib is not None and args.flush_mib < 0:
        return f"--flush-mib must be >= 0, got {args.flush_mib:g}"
    out: Path = args.out
    if args.export is not None:
        ex = args.export.resolve()
        if ex == out.resolve() or out.resolve() in ex.parents:
            return f"--export {ex} must lie outside --out {out}"
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a directory"
    # a previous device check's folder is replaced; anything else needs --force
    if _nonempty(out) and not (args.force or (out / "bench" / "meta.json").is_file()):
        return f"{out} is not empty and not a device check (use --force)"
    return None


def _nonempty(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    error = _usage_error(args)
    if error is not None:
        print(f"device_check: {error}", file=sys.stderr)
        return 2
    flush = None if args.flush_mib is None else int(args.flush_mib * (1 << 20)) // 8 * 8
    out: Path = args.out
    if _nonempty(out):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        s = run_check(out, args.device, args.trace, args.max_requests, args.model, args.gpu, flush)
    except ValueError as e:
        print(f"device_check: {e}", file=sys.stderr)
        return 2
    finally:
        if args.export is not None:
            for f in export(out, args.export):
                print(f"exported {f}")
    if s["errors"]:
        return 1
    if args.strict and s["targets_apply"] and not all(c["met"] for c in s["targets"].values()):
        return 1
    return 0


__all__ = [
    "ARCHIVE",
    "DEFAULT_TRACE",
    "TARGETS",
    "CheckPlan",
    "check_plan",
    "export",
    "format_check",
    "main",
    "run_check",
]

if __name__ == "__main__":
    sys.exit(main())
