"""Executors: where jobs run.

:func:`run_local` is the one local executor: any picklable job function over a list of tasks,
in this process (one worker) or on a process pool. It runs both kinds of job: the timed sweep
jobs (:func:`studies.sweep.jobs.run_job`) and the cache-only hit-rate configs
(:mod:`studies.sweep.hitrate`). :func:`run_ray` runs sweep jobs on a Ray cluster, calling the
same job function; nothing home-made distributes work.

On Linux the pool forks, so workers share what this process loaded before they started (the
simulator, traces, a trace's replay requests); elsewhere fork is unsafe or missing and workers
start fresh (spawn), except for jobs that need this process's state (then they run here).

Ctrl-C: pool workers ignore SIGINT (they start with it ignored, and :func:`_ignore_sigint`
keeps it so), so only this process sees the ``KeyboardInterrupt``; it stops the workers and
lets the interrupt propagate to the one place that reports it (``cli.errors.run_command``:
``hicache-sim: interrupted``, exit 130). No worker prints a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from studies.errors import StudyError
from studies.sweep.jobs import JobResult, JobSpec, one_line, run_job

#: Executors :func:`studies.sweep.run_sweep` knows.
EXECUTORS = ("local", "ray")

T = TypeVar("T")
R = TypeVar("R")


def local_workers(tasks: int, jobs: int) -> int:
    """Worker processes for ``tasks`` tasks: ``jobs`` (0 = all cores), at most one per task."""
    return min(tasks, jobs or os.cpu_count() or 1)


def _start_method(needs_parent_state: bool) -> str | None:
    """``"fork"``, ``"spawn"``, or None when the tasks must run in this process."""
    import multiprocessing as mp

    if sys.platform == "linux":
        return "fork"
    if needs_parent_state:
        return "fork" if "fork" in mp.get_all_start_methods() else None
    return "spawn"


def _ignore_sigint() -> None:
    """Pool worker initializer: Ctrl-C is the parent's to handle (module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while workers start, so they inherit "ignored" (a forked
    worker would otherwise raise ``KeyboardInterrupt`` before its initializer runs, and a
    spawned Python keeps an inherited SIG_IGN); restored after. Only the main thread may set
    handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_workers(ex: Any) -> None:
    """Terminate a process pool's workers (after Ctrl-C they would finish their task first)."""
    for proc in list(getattr(ex, "_processes", {}).values()):
        with contextlib.suppress(Exception):
            proc.terminate()


def run_local(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    jobs: int,
    on_result: Callable[[int, R], None],
    *,
    needs_parent_state: bool = False,
    before_fork: Callable[[], None] | None = None,
    on_worker_error: Callable[[int, Exception], R] | None = None,
) -> None:
    """Call ``fn`` on every task; ``on_result(index, result)`` in this process as each ends.

    ``jobs``: worker processes (0 = all cores); with one worker (or one task) the tasks run
    in this process, one after the other. ``needs_parent_state``: ``fn`` reads module state
    this process prepared, so workers must be forked after it (where fork does not exist,
    the tasks run here). ``before_fork`` runs just before a forking pool starts (e.g. to load
    what the workers will share). ``on_worker_error(index, exc)`` turns an exception from a
    pool worker (one that died, or ``fn`` raising there) into its result; without it, and
    always in this process, the exception propagates. On any exception queued tasks are
    dropped and the pool is shut down before it propagates; on Ctrl-C (which the workers
    ignore) the running ones are stopped too.
    """
    from concurrent.futures import Future, ProcessPoolExecutor, as_completed

    workers = local_workers(len(tasks), jobs)
    method = _start_method(needs_parent_state)
    if workers <= 1 or method is None:  # in-process: simplest to debug, no pool start-up
        for i, task in enumerate(tasks):
            on_result(i, fn(task))
        return
    import multiprocessing as mp

    if method == "fork" and before_fork is not None:
        before_fork()
    ex = ProcessPoolExecutor(workers, mp_context=mp.get_context(method), initializer=_ignore_sigint)
    try:
        with _sigint_ignored():  # every worker starts within the first submits
            futures: dict[Future[R], int] = {ex.submit(fn, t): i for i, t in enumerate(tasks)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                result = fut.result()
            except Exception as e:
                if on_worker_error is None:
                    raise
                result = on_worker_error(i, e)
            on_result(i, result)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            _stop_workers(ex)
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)


def map_local(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    jobs: int,
    on_done: Callable[[], None] | None = None,
    *,
    needs_parent_state: bool = False,
) -> list[R]:
    """:func:`run_local` returning the results in the order of ``tasks`` (an exception in a
    task propagates); ``on_done()`` is called as each task ends (a progress bar)."""
    results: dict[int, R] = {}

    def collect(i: int, result: R) -> None:
        results[i] = result
        if on_done is not None:
            on_done()

    run_local(fn, tasks, jobs, collect, needs_parent_state=needs_parent_state)
    return [results[i] for i in range(len(tasks))]


def run_ray(
    specs: Sequence[JobSpec],
    jobs: int,
    address: str | None,
    on_result: Callable[[int, JobResult], None],
) -> None:
    """Run sweep jobs as Ray tasks (:func:`run_job`, 1 CPU each); ``on_result(index, result)``
    in this process as each ends. ``address``: an existing cluster; otherwise a local runtime
    with ``jobs`` CPUs (0 = all) is started, and shut down after; an already initialised Ray
    is used as it is. Raises ``ValueError`` when Ray is missing or cannot start."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs or None, include_dashboard=False, log_to_driver=False)
        except Exception as e:
            where = f" at {address}" if address else ""
            raise StudyError(f"cannot start Ray{where}: {one_line(e)}") from None
        started = True
    try:
        _ray_jobs(ray, specs, on_result)
    finally:
        if started:
            ray.shutdown()


def _import_ray() -> Any:
    try:
        # by name: Ray is an optional extra, so neither mypy nor CI may have it
        return importlib.import_module("ray")
    except ImportError:
        raise StudyError("the ray executor needs Ray: pip install 'hicache-sim[cluster]'") from None


def _ray_jobs(
    ray: Any, specs: Sequence[JobSpec], on_result: Callable[[int, JobResult], None]
) -> None:
    task = ray.remote(num_cpus=1)(run_job)
    # each trace travels once through the object store, not once per job
    blobs = {p: ray.put(Path(p).read_bytes()) for p in dict.fromkeys(s.trace_path for s in specs)}
    refs = {task.remote(s, blobs[s.trace_path]): i for i, s in enumerate(specs)}
    left = list(refs)
    try:
        while left:
            done, left = ray.wait(left, num_returns=1)
            for ref in done:
                i = refs[ref]
                try:
                    result = ray.get(ref)
                except Exception as e:  # the task or its node died
                    error = f"ray task failed: {one_line(e)}"
                    result = JobResult(specs[i].name, False, error=error)
                on_result(i, result)
    except BaseException:
        for ref in left:
            ray.cancel(ref, force=True)
        raise


__all__ = ["EXECUTORS", "local_workers", "map_local", "run_local", "run_ray"]
