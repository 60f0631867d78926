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
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

#: (name, limit, comparison) of the issue's targets
TARGETS = {
    "bench_median_err": (0.05, "<="),
    "replay_median_err": (0.10, "<="),
    "large_op_fraction_of_peak": (0.90, ">="),
}
DEFAULT_TRACE = "shared-prefix"


def _met(value: float, limit: float, op: str) -> bool:
    return value <= limit if op == "<=" else value >= limit


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
    stages = _Stages()
    try:
        with stages.sigint_stops_stages():
            return _check(stages, out, rt, trace_kind, max_requests, model, gpu, flush_bytes, t_all)
    finally:
        rt.close()


@dataclass(frozen=True)
class CheckPlan:
    """What the check measures: the bench config, the replay's geometry overrides, the pool
    budgets (device, host bytes) and the requests replayed."""

    bench: Any
    geometry: dict[str, Any]
    budgets: tuple[int, int]
    max_requests: int


def check_plan(cuda: bool, model: str) -> CheckPlan:
    """The plan for a CUDA device (the model's real geometry; estimated at 1.5-2.5 minutes on
    an H100/H200 from the copies and bytes it moves, not yet timed on one) or for CPU tensors
    (a small geometry, seconds)."""
    from replay.bench import BenchConfig

    if cuda:
        # the full size range, fewer repeats; the pageable plain copies cost seconds and
        # answer "what does pinning buy". A 1 GiB device pool (8k tokens of Llama-3-8B) under
        # 8 GiB of host: with 400 requests of the shared-prefix trace, ~800 writes and ~70
        # loads (a 4 GiB pool gives only a handful of loads, too few for the h2d figures)
        return CheckPlan(
            bench=BenchConfig.for_model(model, page_size=64, repeats=5),
            geometry={"page_size": 64},
            budgets=(1 << 30, 8 << 30),
            max_requests=400,
        )
    cfg = BenchConfig.quick()
    return CheckPlan(
        bench=cfg,
        # the replay uses the bench's op geometry so the fit covers its ops
        geometry={
            "page_size": cfg.page_size,
            "num_layers": cfg.op_layers[-1],
            "token_layer_bytes": cfg.token_layer_bytes,
        },
        budgets=(16 << 20, 32 << 20),
        max_requests=120,
    )


class _Stages:
    """Runs the check's stages, each isolated: a failure is recorded in ``errors`` (traceback
    on stderr) and the next stage runs. While :meth:`sigint_stops_stages` is active, SIGINT
    (``timeout -s INT`` running out) interrupts only the stage running then; later stages are
    skipped, and a SIGINT between stages or while the summary is written only marks the
    interruption, so the summary of the finished stages is always written and exported."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.interrupted = False
        self._in_stage = False

    def _on_sigint(self, _signum: int, _frame: Any) -> None:
        first = not self.interrupted
        self.interrupted = True
        if first and self._in_stage:
            raise KeyboardInterrupt

    @contextmanager
    def sigint_stops_stages(self) -> Iterator[None]:
        try:
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        except ValueError:  # not the main thread: leave SIGINT as it is
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def run(self, name: str, fn: Callable[[], _T]) -> _T | None:
        if self.interrupted:
            self.errors[name] = "skipped: an earlier stage was interrupted"
            return None
        t0 = time.perf_counter()
        try:
            self._in_stage = True
            return fn()
        except KeyboardInterrupt:
            self._in_stage = False
            self.interrupted = True
            self.errors[name] = "interrupted (SIGINT / time limit)"
            print(f"device check: stage {name} INTERRUPTED", flush=True)
            return None
        except Exception as e:  # recorded and reported; the next stage runs
            self._in_stage = False
            traceback.print_exc()
            self.errors[name] = f"{type(e).__name__}: {e}"
            print(f"device check: stage {name} FAILED: {self.errors[name]}", flush=True)
            return None
        finally:
            self._in_stage = False
            self.seconds[name] = round(time.perf_counter() - t0, 3)
            print(f"[{name}: {self.seconds[name]:.1f} s]", flush=True)


def _check(
    stages: _Stages,
    out: Path,
    rt: Any,
    trace_kind: str,
    max_requests: int,
    model: str,
    gpu: str | None,
    flush_bytes: int | None,
    t_all: float,
) -> dict[str, Any]:
    import numpy as np

    from hicache.config import load_config
    from hicache.hardware import get_gpu
    from hicache.latency import save_profile
    from replay.bench import bench_table, run_bench, write_bench
    from replay.calibrate import calibrate, error_stats, op_rows_for_fit, predict_ops, rel_errors
    from replay.outputs import write_json, write_text
    from replay.presets import gpu_preset_for
    from replay.run import format_summary, run_replay, settings_from_config
    from traces.bundled import synthetic_path
    from traces.io import read_trace

    if Path(trace_kind).is_file():
        trace = read_trace(Path(trace_kind))
    else:
        try:
            trace = read_trace(synthetic_path(trace_kind))
        except KeyError as e:
            raise ValueError(str(e).strip("'\"")) from None
    cuda = rt.kind == "cuda"
    info = rt.describe()
    if gpu is None:
        gpu = gpu_preset_for(info["gpu_name"]) if cuda else "h100-sxm"
        if gpu is None:
            raise ValueError(
                f"GPU {info['gpu_name']!r} matches no hicache.hardware preset; pass --gpu NAME"
            )
    link = get_gpu(gpu).default_link
    print(f"device check on {rt.kind} ({info['gpu_name']}); profile for {gpu} + {link}")
    plan = check_plan(cuda, model)
    cfg, geometry, budgets = plan.bench, plan.geometry, plan.budgets
    if flush_bytes is not None:
        cfg = replace(cfg, flush_bytes=flush_bytes)
    max_requests = max_requests or plan.max_requests

    # Each stage is isolated: on a GPU lent for a few minutes, a failure in one stage (say, the
    # kernel backend's replay) must not cost the measurements of the others. A failed stage is
    # recorded under "errors" (the traceback goes to stderr) and its figures stay NaN.
    errors, stage_s, stage = stages.errors, stages.seconds, stages.run

    # -- 1. bench ---------------------------------------------------------------------------
    def do_bench() -> tuple[Any, dict[str, Any]]:
        t0 = time.perf_counter()
        df = run_bench(cfg, rt, lambda m: print(f"  {m}", flush=True))
        meta = write_bench(df, cfg, rt, out / "bench", time.perf_counter() - t0, model=model)
        print(bench_table(df))
        print(f"bench: {len(df)} rows")
        return df, meta

    benched = stage("bench", do_bench)

    # -- 2. calibrate -----------------------------------------------------------------------
    def do_calibrate() -> tuple[Any, dict[str, Any]]:
        assert benched is not None
        bench, meta = benched
        cal = calibrate(bench, meta, gpu=gpu, link=link, source=f"replay.device_check {out}")
        save_profile(cal.profile, out / "profile.json")
        if cuda:
            save_profile(cal.profile, out / f"{gpu}-measured.json")
        err: dict[str, Any] = {}
        all_err = []
        for b, by_dir in cal.fits.items():
            for d, fit in by_dir.items():
                print(f"  fit {b:>6} {d}: {fit.describe()}")
                rows = op_rows_for_fit(bench, b, d, None if b == "direct" else "page_first")
                if rows.empty and b == "kernel":
                    rows = op_rows_for_fit(bench, b, d, None)
                e = rel_errors(predict_ops(cal.profile, rows), rows.duration_s.to_numpy())
                err[f"{b}_{d}"] = error_stats(e)
                all_err.append(e)
        err["all"] = error_stats(np.concatenate(all_err))
        return cal, err

    calibrated = stage("calibrate", do_calibrate) if benched is not None else None

    # -- 3. replay --------------------------------------------------------------------------
    replays: dict[str, Any] = {}
    if calibrated is not None:
        cal = calibrated[0]
        cfg_sim = load_config(
            None,
            [
                f"model.name={model}",
                f"gpu.name={gpu}",
                f"link.name={link}",
                f"cache.page_size={geometry['page_size']}",
            ],
        )
        for backend in ("direct", "kernel"):
            settings = settings_from_config(
                cfg_sim,
                backend=backend,
                layout="layer_first" if backend == "direct" else "page_first",
                max_requests=max_requests,
                device_budget_bytes=budgets[0],
                host_budget_bytes=budgets[1],
                num_layers=geometry.get("num_layers"),
                token_layer_bytes=geometry.get("token_layer_bytes"),
                peak_bytes=min(256 << 20, budgets[0] // 4),
                flush_bytes=cfg.flush_bytes,
            )
            if not cuda:
                settings = replace(settings, verify=True, large_op_bytes=1 << 20)

            def do_replay(backend: str = backend, settings: Any = settings) -> dict[str, Any]:
                print(f"replay ({backend}):")
                s = run_replay(
                    trace,
                    settings,
                    rt,
                    cal.profile,
                    profile_path=str(out / "profile.json"),
                    out=out / f"replay-{backend}",
                    log=lambda m: print(f"  {m}", flush=True),
                )
                print(format_summary(s))
                return s

            r = stage(f"replay-{backend}", do_replay)
            if r is not None:
                replays[backend] = r

    # -- 4. targets -------------------------------------------------------------------------
    nan = float("nan")
    bench_err: dict[str, Any] = calibrated[1] if calibrated is not None else {}
    figures = {
        "bench_median_err": bench_err.get("all", {}).get("median", nan),
        # the worse backend; a backend whose replay failed counts as missed
        "replay_median_err": max(
            (
                replays[b].get("error", {}).get("all", {}).get("median", nan)
                if b in replays
                else nan
                for b in ("direct", "kernel")
            ),
            key=lambda v: math.inf if math.isnan(v) else v,
        ),
        # contiguous large ops of the direct backend: plain copies, the ones that can
        # reach the peak (fragmented ones pay per-run costs by design)
        "large_op_fraction_of_peak": min(
            (
                v["fraction_of_peak"]
                for v in replays.get("direct", {}).get("large_contiguous_ops", {}).values()
            ),
            default=nan,
        ),
    }
    checks = {
        k: {
            "value": v,
            "limit": TARGETS[k][0],
            "op": TARGETS[k][1],
            "met": bool(_met(v, *TARGETS[k])),
        }
        for k, v in figures.items()
    }
    summary = {
        "device": rt.kind,
        "machine": info,
        "gpu_preset": gpu,
        "link": link,
        "profile": str(out / "profile.json"),
        "profile_measured": bool(calibrated is not None and calibrated[0].profile.measured),
        "bench_rows": len(benched[0]) if benched is not None else 0,
        "bench_s": stage_s.get("bench", nan),
        "bench_error": bench_err,
        "fits": (
            {b: {d: f.describe() for d, f in by.items()} for b, by in calibrated[0].fits.items()}
            if calibrated is not None
            else {}
        ),
        "eta": {d: e[0] for d, e in calibrated[0].eta.items()} if calibrated is not None else {},
        "replay": {
            b: {
                "error": r.get("error"),
                "large_ops": r.get("large_ops"),
                "large_contiguous_ops": r.get("large_contiguous_ops"),
                "issue_share": r.get("issue_share"),
                "count": r.get("count"),
                "cache": r["cache"],
                "notes": r["notes"],
            }
            for b, r in replays.items()
        },
        "targets": checks,
        "targets_apply": cuda,
        "runtime_notes": list(rt.notes),
        "flush_bytes": cfg.flush_bytes,
        "stage_s": stage_s,
        "errors": errors,
        "wall_s": time.perf_counter() - t_all,
    }
    write_json(summary, out / "summary.json")
    text = format_check(summary)
    write_text(text + "\n", out / "summary.md")
    print(text)
    return summary


def format_check(s: dict[str, Any]) -> str:
    """The summary as Markdown-ish text (what ``summary.md`` holds)."""
    lines = [
        f"# device check: {s['machine'].get('gpu_name')} ({s['device']}), {s['wall_s']:.0f} s",
        "",
        f"profile: {s['profile']} (gpu {s['gpu_preset']}, link {s['link']}, "
        f"measured={s['profile_measured']})",
        "",
        "| target | value | limit | met |",
        "| --- | ---: | ---: | --- |",
    ]
    for k, c in s["targets"].items():
        pct = f"{c['value']:.1%}"
        lines.append(
            f"| {k} | {pct} | {c['op']} {c['limit']:.0%} | {'yes' if c['met'] else 'NO'} |"
        )
    if not s["targets_apply"]:
        lines += ["", "CPU run: these are GPU targets; the figures only show the pipeline works."]
    if s.get("errors"):
        lines += ["", "FAILED stages (their figures are NaN; tracebacks on stderr):"]
        lines += [f"- {k}: {v}" for k, v in s["errors"].items()]
    if s.get("stage_s"):
        lines += ["", "stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in s["stage_s"].items())]
    lines += ["", "bench op prediction |rel err| (median / p90):"]
    for k, e in s["bench_error"].items():
        lines.append(f"- {k}: {e['median']:.1%} / {e['p90']:.1%} (n={e['n']})")
    lines += ["", "replay:"]
    for b, r in s["replay"].items():
        e = (r.get("error") or {}).get("all", {})
        if e.get("n"):
            lines.append(
                f"- {b}: op |rel err| median {e['median']:.1%}, p90 {e['p90']:.1%} "
                f"(n={e['n']}), hit rate {r['cache']['hit_rate']:.1%}"
            )
        if r.get("count"):
            lines.append(
                f"  - ops: {r['count'].get('write', 0)} writes, {r['count'].get('load', 0)} loads"
            )
        if r.get("issue_share"):
            i = r["issue_share"]
            lines.append(
                f"  - issuing thread busy a median {i['median']:.0%} of an op's time; "
                f"{i['issue_bound_fraction']:.0%} of ops issue-bound"
            )
        for key in ("large_ops", "large_contiguous_ops"):
            for d, v in (r.get(key) or {}).items():
                lines.append(
                    f"  - {d} {v['selection']} (n={v['n']}): {v['median_Bps'] / 1e9:.2f} GB/s"
                    f" = {v['fraction_of_peak']:.0%} of peak {v['peak_Bps'] / 1e9:.2f} GB/s"
                )
    lines += ["", "fits:"]
    for b, by in s["fits"].items():
        for d, text in by.items():
            lines.append(f"- {b} {d}: {text}")
    if s["device"] == "cuda" and "calibrate" not in s.get("errors", {}):
        gpu = s["gpu_preset"]
        lines += [
            "",
            f"commit: cp {Path(s['profile']).parent / (gpu + '-measured.json')} "
            f"hicache/profiles/{gpu}-measured.json",
        ]
    return "\n".join(lines)


#: the archive of the whole check that ``--export`` writes
ARCHIVE = "device-check.tar.gz"


def export(out: Path, dest: Path) -> list[Path]:
    """Copy what a reader needs at once (``summary.md``, ``summary.json``, a measured profile)
    and a gzipped tar of all of ``out`` into ``dest``; returns the files written.

    At most 4 flat files named in letters, digits, ``.``, ``_`` and ``-``: what a lent GPU
    machine's result folder hands back (8 files, 2 folders deep), whatever the check wrote."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    names = ["summary.md", "summary.json", *sorted(p.name for p in out.glob("*-measured.json"))]
    for name in names:
        if (out / name).is_file():
            shutil.copyfile(out / name, dest / name)
            written.append(dest / name)
    archive = dest / ARCHIVE
    tmp = dest / f".{ARCHIVE}.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.resolve().name or "device-check")
    tmp.replace(archive)
    written.append(archive)
    return written


def _missing_packages() -> list[str]:
    import importlib.util

    # torch is checked on its own (it has its own message); parquet needs pyarrow
    return [m for m in ("numpy", "pandas", "pyarrow") if importlib.util.find_spec(m) is None]


def main(argv: Sequence[str] | None = None) -> int:
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
    p.add_argument("--max-requests", type=int, default=0, help="default 200 (CUDA), 120 (CPU)")
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
    args = p.parse_args(argv)
    missing = _missing_packages()
    if missing:
        print(
            f"device_check: missing Python packages: {', '.join(missing)} "
            "(pip install -e '.[replay]')",
            file=sys.stderr,
        )
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "device_check: torch is not installed (pip install 'hicache-sim[replay]')",
            file=sys.stderr,
        )
        return 2
    from replay.runtime import resolve_device

    try:
        resolve_device(args.device)
    except ValueError as e:
        print(f"device_check: {e}", file=sys.stderr)
        return 2
    flush = None
    if args.flush_mib is not None:
        if args.flush_mib < 0:
            print(
                f"device_check: --flush-mib must be >= 0, got {args.flush_mib:g}", file=sys.stderr
            )
            return 2
        flush = int(args.flush_mib * (1 << 20)) // 8 * 8
    out: Path = args.out
    if args.export is not None:
        ex = args.export.resolve()
        if ex == out.resolve() or out.resolve() in ex.parents:
            print(f"device_check: --export {ex} must lie outside --out {out}", file=sys.stderr)
            return 2
    if out.exists() and not out.is_dir():
        print(f"device_check: {out} exists and is not a directory", file=sys.stderr)
        return 2
    if out.is_dir() and any(out.iterdir()):
        # a previous device check's folder is replaced; anything else needs --force
        if not (args.force or (out / "bench" / "meta.json").is_file()):
            print(
                f"device_check: {out} is not empty and not a device check (use --force)",
                file=sys.stderr,
            )
            return 2
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


if __name__ == "__main__":
    sys.exit(main())
