"""Sweeps: the cross product of a grid of configurations, run as independent, resumable jobs.

A grid file (TOML; the format is documented in ``examples/README.md``) names a base config and
axes; every combination of axis values (plus any ``[[include]]`` extra jobs) is one job: one
timed simulation (:func:`sim.engine.run_simulation`) writing one run directory. The output
directory of a sweep::

    OUT/grid.toml        the grid file as it was run
    OUT/sweep.json       name, description, axes, job names in grid order
    OUT/results.parquet  one row per job: job, status, error, the axes, device/host pool
    OUT/results.csv      tokens, every summary.json field (the L3 storage block as
                         storage_* columns, sglang_defects as sglang_defect_* columns),
                         run_dir (relative to OUT)
    OUT/runs/<job>/      a run directory (config.json, summary.json, *.parquet) + job.json;
                         a failed job's directory holds job.json and error.json instead

Jobs run on a local process pool (``executor="local"``) or on a Ray cluster
(``executor="ray"``); both call the same job function, :func:`run_job`, which returns the run
directory's files as bytes, and the driver (this process) writes them. So a Ray cluster needs
no shared file system, and a run directory appears atomically (written to a hidden temporary
directory, then renamed), whatever the executor: a job directory that exists with a
``summary.json`` is complete.

Resuming: a job whose directory already holds a finished run with the same resolved config
(:func:`hicache.config.config_to_dict`) and the same trace checksum is not run again. Directory
names are readable axis values plus a short hash of exactly that (config + trace checksum), so
a finished run is found again even if the grid's axes were renamed or reordered. A job that
fails (an exception in the simulation, or a combination of axis values the config rejects) is
recorded with its error and the other jobs go on; rerunning the sweep retries it.

Only one sweep may write to an output directory at a time (a lock file enforces it where the
platform has ``fcntl``).

The package, by job: :mod:`~studies.sweep.grid` (grid files), :mod:`~studies.sweep.jobs`
(expansion, the job function, job directories), :mod:`~studies.sweep.executors` (the local
pool, Ray), :mod:`~studies.sweep.results` (the results table) and
:mod:`~studies.sweep.hitrate` (the cache-only hit-rate grid, a second kind of job on the same
local executor).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from studies.errors import StudyError
from studies.sweep.executors import EXECUTORS, run_local, run_ray
from studies.sweep.grid import Axis, AxisValue, Grid, Scalar, load_grid, parse_grid
from studies.sweep.hitrate import run_hitrate_grid
from studies.sweep.jobs import (
    JobResult,
    JobSpec,
    adopt,
    commit,
    config_hash,
    expand,
    forget_traces,
    one_line,
    preload_traces,
    result_files,
    run_job,
)
from studies.sweep.results import collect_results, flatten_summary, write_results
from traces.fsutil import write_bytes_atomic, write_json_atomic

if TYPE_CHECKING:
    import pandas as pd

OnResult = Callable[[int, JobResult], None]


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``out/.sweep.lock`` (advisory, fcntl) so two sweeps never write one directory."""
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): run unlocked
        yield
        return
    with open(out / ".sweep.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            raise StudyError(f"{out}: another sweep is writing to this directory") from None
        except OSError:  # a file system without locks (some network mounts): run unlocked
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)


def _check_args(executor: str, jobs: int, address: str | None) -> None:
    if executor not in EXECUTORS:
        raise StudyError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if jobs < 0:
        raise StudyError(f"jobs must be >= 0 (0 = all cores), got {jobs}")
    if address and executor != "ray":
        raise StudyError("an address needs the ray executor")


def _start(out: Path, grid: Grid, specs: Sequence[JobSpec]) -> list[JobSpec]:
    """Clear what an interrupted sweep left, write ``grid.toml`` and ``sweep.json``, adopt
    finished runs; the specs still to run."""
    runs = out / "runs"
    for pattern in (".tmp-*", ".old-*"):  # left by an interrupted sweep
        for stale in runs.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)
    write_bytes_atomic(grid.text.encode(), out / "grid.toml")
    sweep = {
        "name": grid.name,
        "description": grid.description,
        "grid": grid.source,
        "axes": [a.name for a in grid.axes],
        "columns": [c for c, _ in specs[0].axes],
        "jobs": [s.name for s in specs],
    }
    write_json_atomic(sweep, out / "sweep.json", indent=1, sort_keys=True)
    by_hash: dict[str, list[Path]] = {}
    for d in sorted(runs.iterdir()):
        if d.is_dir() and not d.name.startswith("."):
            by_hash.setdefault(d.name.rpartition("-")[2], []).append(d)
    return [s for s in specs if s.config is not None and not adopt(runs, s, grid, by_hash)]


def _execute(
    pending: Sequence[JobSpec], jobs: int, executor: str, address: str | None, on: OnResult
) -> None:
    if not pending:
        return
    if executor == "ray":
        run_ray(pending, jobs, address, on)
        return

    def worker_failed(i: int, e: Exception) -> JobResult:  # e.g. killed for memory
        return JobResult(pending[i].name, False, error=f"worker failed: {one_line(e)}")

    try:
        run_local(
            run_job,
            pending,
            jobs,
            on,
            before_fork=lambda: preload_traces(pending),
            on_worker_error=worker_failed,
        )
    finally:
        forget_traces()


def run_sweep(
    grid_path: str | Path | Grid,
    out_dir: str | Path,
    jobs: int = 0,
    executor: str = "local",
    address: str | None = None,
    progress: bool | None = None,
) -> pd.DataFrame:
    """Run every job of a grid (a file, or a :class:`Grid`) into ``out_dir``; return the
    results table (also written as ``results.parquet`` and ``results.csv``).

    ``jobs``: worker processes (local) or CPUs of a local Ray runtime; 0 = all cores.
    ``executor``: ``"local"`` or ``"ray"`` (``address`` = an existing cluster, e.g.
    ``"auto"`` or ``"ray://head:10001"``; otherwise a local runtime is started; an already
    initialised Ray is used as it is). ``progress``: one bar over jobs (None = only on a
    terminal). Finished jobs with the same resolved config are skipped; failed jobs are
    recorded (``status="failed"``, ``error``) and retried on the next call. Raises
    :class:`ConfigError` for a bad grid and ``ValueError`` for a bad argument, a locked
    output directory or a Ray that cannot start. ``KeyboardInterrupt`` stops the sweep with
    every finished job committed.
    """
    from tqdm import tqdm

    _check_args(executor, jobs, address)
    grid = grid_path if isinstance(grid_path, Grid) else load_grid(grid_path)
    specs = expand(grid)
    out = Path(out_dir)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        pending = _start(out, grid, specs)
        bar = tqdm(
            total=len(specs),
            initial=len(specs) - len(pending),
            desc="jobs",
            unit="job",
            disable=None if progress is None else not progress,
            smoothing=0,
        )
        failed = 0

        def on_result(i: int, result: JobResult) -> None:
            nonlocal failed
            if not result.ok:
                failed += 1
                bar.set_postfix(failed=failed)
            commit(runs, pending[i], result_files(pending[i], grid, result))
            bar.update(1)

        try:
            _execute(pending, jobs, executor, address, on_result)
        finally:
            bar.close()
        df = collect_results(out, specs)
        write_results(df, out)
    # after writing: pandas stores attrs in Parquet metadata, and these differ between reruns
    df.attrs.update(
        ran=len(pending),
        reused=len(specs) - len(pending) - sum(s.config is None for s in specs),
        failed=int((df["status"] != "ok").sum()),
    )
    return df


__all__ = [
    "EXECUTORS",
    "Axis",
    "AxisValue",
    "Grid",
    "JobResult",
    "JobSpec",
    "Scalar",
    "collect_results",
    "config_hash",
    "expand",
    "flatten_summary",
    "load_grid",
    "parse_grid",
    "run_hitrate_grid",
    "run_job",
    "run_sweep",
]
