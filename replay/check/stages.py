"""The device check's stages, each isolated by :class:`Stages`: the bench, the calibration (and
its bench-op prediction errors), and a trace replay per IO backend.

Each stage imports what it runs when it runs (``replay.bench.run_bench``,
``replay.run.run_replay``, ...), so a stage replaced by a test's monkeypatch is the one used.
"""

from __future__ import annotations

import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pandas as pd

    from hicache.config import SimConfig
    from hicache.latency import Profile
    from replay.bench import BenchConfig
    from replay.calibrate import Calibration
    from replay.check.plan import CheckPlan
    from replay.run import ReplaySettings
    from replay.runtime import Runtime
    from traces.schema import Trace

_T = TypeVar("_T")


def _log(msg: str) -> None:
    print(f"  {msg}", flush=True)


class Stages:
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
        """``fn()``, or None when it failed, was interrupted or was skipped (see the class
        docstring); its seconds go to ``seconds[name]``."""
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


def bench_stage(
    cfg: BenchConfig, rt: Runtime, out: Path, model: str
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run the bench, write it to ``out/bench`` and print its table; the table and its meta."""
    from replay.bench import bench_table, run_bench, write_bench

    t0 = time.perf_counter()
    df = run_bench(cfg, rt, _log)
    meta = write_bench(df, cfg, rt, out / "bench", time.perf_counter() - t0, model=model)
    print(bench_table(df))
    print(f"bench: {len(df)} rows")
    return df, meta


def calibrate_stage(
    bench: pd.DataFrame, meta: dict[str, Any], *, gpu: str, link: str, out: Path, cuda: bool
) -> tuple[Calibration, dict[str, Any]]:
    """Calibrate a profile from the bench into ``out/profile.json`` (on CUDA also
    ``out/<gpu>-measured.json``); the calibration and its bench-op errors (:func:`bench_errors`)."""
    from hicache.latency import save_profile
    from replay.calibrate import calibrate

    cal = calibrate(bench, meta, gpu=gpu, link=link, source=f"replay.device_check {out}")
    save_profile(cal.profile, out / "profile.json")
    if cuda:
        save_profile(cal.profile, out / f"{gpu}-measured.json")
    return cal, bench_errors(cal, bench)


def bench_errors(cal: Calibration, bench: pd.DataFrame) -> dict[str, Any]:
    """How well the calibrated profile predicts the bench's own op rows: ``error_stats`` per
    ``<backend>_<direction>`` fit (kernel: its ``page_first`` rows when there are any) and over
    ``all``; prints each fit."""
    import numpy as np

    from replay.fit import error_stats, op_rows_for_fit, predict_ops, rel_errors

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
    return err


def sim_config(model: str, gpu: str, link: str, page_size: int) -> SimConfig:
    """The simulator config the replays take their cache and scheduler settings from."""
    from hicache.config import load_config

    return load_config(
        None,
        [
            f"model.name={model}",
            f"gpu.name={gpu}",
            f"link.name={link}",
            f"cache.page_size={page_size}",
        ],
    )


def replay_settings(
    cfg_sim: SimConfig,
    backend: str,
    plan: CheckPlan,
    max_requests: int,
    flush_bytes: int,
    cuda: bool,
) -> ReplaySettings:
    """The replay of ``backend`` (direct IO on the layer_first layout, kernel IO on page_first)
    with the plan's geometry and pool budgets; on CPU tensors it also verifies the bytes moved
    and counts ops of 1 MiB as large."""
    from replay.run import settings_from_config

    device_budget, host_budget = plan.budgets
    settings = settings_from_config(
        cfg_sim,
        backend=backend,
        layout="layer_first" if backend == "direct" else "page_first",
        max_requests=max_requests,
        device_budget_bytes=device_budget,
        host_budget_bytes=host_budget,
        num_layers=plan.geometry.get("num_layers"),
        token_layer_bytes=plan.geometry.get("token_layer_bytes"),
        peak_bytes=min(256 << 20, device_budget // 4),
        flush_bytes=flush_bytes,
    )
    if not cuda:
        settings = replace(settings, verify=True, large_op_bytes=1 << 20)
    return settings


def replay_stage(
    trace: Trace,
    backend: str,
    settings: ReplaySettings,
    rt: Runtime,
    profile: Profile,
    out: Path,
) -> dict[str, Any]:
    """Replay ``trace`` into ``out/replay-<backend>`` with the calibrated ``profile`` (saved as
    ``out/profile.json``) and print its summary; the replay's summary."""
    from replay.run import format_summary, run_replay

    print(f"replay ({backend}):")
    s = run_replay(
        trace,
        settings,
        rt,
        profile,
        profile_path=str(out / "profile.json"),
        out=out / f"replay-{backend}",
        log=_log,
    )
    print(format_summary(s))
    return s


__all__ = [
    "Stages",
    "bench_errors",
    "bench_stage",
    "calibrate_stage",
    "replay_settings",
    "replay_stage",
    "sim_config",
]
