"""Sweep jobs: a grid expanded into self-contained :class:`JobSpec` s, the job function
:func:`run_job` (it runs in a pool worker or a Ray task and returns files, never writes them),
and the driver's side of a job directory: commit a finished job, or adopt one already there.

A job directory appears atomically: its files are written into a hidden temporary directory
that is then renamed to ``runs/<job>``, so a job directory with a ``summary.json`` is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache.config import ConfigError, config_to_dict, load_config, with_overrides
from studies.errors import StudyError
from studies.sweep.grid import Grid, Scalar, resolve_path, setting_text
from traces.fsutil import write_bytes_atomic

if TYPE_CHECKING:
    from traces.schema import Trace

_HASH_CHARS = 10  # 40 bits: collisions are irrelevant at grid sizes, and names stay short
_SLUG_MAX = 80  # readable part of a job name; the hash keeps truncated names unique
_SAFE = re.compile(r"[^A-Za-z0-9._=+-]+")

Config = dict[str, dict[str, Any]]
Row = tuple[tuple[str, Scalar | None], ...]


@dataclass(frozen=True)
class JobSpec:
    """One job, self-contained and picklable (it travels to pool workers and Ray tasks).

    ``config`` is the resolved :func:`hicache.config.config_to_dict` (None when the combination
    is invalid; ``error`` says why); ``axes`` the result-table values of the axis columns;
    ``config_hash`` hashes config + trace checksum and ends ``name``.
    """

    name: str
    axes: Row
    config: Config | None
    trace_path: str
    trace_sha256: str
    config_hash: str
    error: str | None = None


@dataclass(frozen=True)
class JobResult:
    """What :func:`run_job` returns: the run directory's files (name -> bytes) or the error."""

    name: str
    ok: bool
    files: dict[str, bytes] = field(default_factory=dict)
    error: str | None = None
    traceback: str | None = None


def one_line(e: BaseException) -> str:
    """``Type: message`` on one line (a job's error in the results table)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def json_bytes(obj: Any) -> bytes:
    """JSON as the engine writes it (indent 1, sorted keys, newline-ended), so rewritten files
    look like the engine's."""
    return (json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n").encode()


def config_hash(config: Mapping[str, Any], trace_sha256: str) -> str:
    """The short hash that identifies a job: its resolved config and its trace's content."""
    blob = json.dumps(
        {"config": config, "trace_sha256": trace_sha256}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:_HASH_CHARS]


def _slug(axes: Sequence[tuple[str, Scalar | None]]) -> str:
    parts = []
    for name, value in axes:
        if value is None:
            continue
        if name == "trace":
            parts.append(Path(str(value)).name.split(".")[0])
            continue
        short = name.rpartition(".")[2]
        shown = f"{value:g}" if isinstance(value, float) else setting_text(value)
        parts.append(f"{short}={shown}")
    slug = _SAFE.sub("_", "__".join(parts)).strip("._-")[:_SLUG_MAX].rstrip("._-")
    return slug or "run"


def _flat(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, body in config.items() for k, v in body.items()}


# --- expansion -------------------------------------------------------------------------------


class _Resolver:
    """Resolves settings against a grid's base: configs, and traces with their checksums."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.config_path = None if grid.config is None else resolve_path(grid.root, grid.config)
        self.checksums: dict[str, str] = {}

    def trace_of(self, settings: Sequence[tuple[str, Scalar]]) -> str:
        from sim.engine import trace_checksum

        grid = self.grid
        value = dict(settings).get("trace", grid.trace)
        if value is None:
            raise ConfigError("base.trace", "no trace: set base.trace or a trace axis", grid.source)
        path = str(resolve_path(grid.root, str(value)))
        if path not in self.checksums:
            if not Path(path).is_file():
                raise ConfigError("trace", f"{value}: no such file", grid.source)
            self.checksums[path] = trace_checksum(Path(path))
        return path

    def config(self, settings: Sequence[tuple[str, Scalar]]) -> Config:
        grid = self.grid
        sets = [f"{k}={setting_text(v)}" for k, v in settings if k != "trace"]
        cfg = load_config(self.config_path, [*grid.overrides, *sets])
        profile = cfg.run.profile
        if profile and not Path(profile).is_absolute():
            cfg = with_overrides(cfg, [f"run.profile={resolve_path(grid.root, profile)}"])
        return config_to_dict(cfg)

    def check_alone(self, settings: Sequence[tuple[str, Scalar]], where: str) -> None:
        try:
            self.config(settings)
        except ConfigError as e:
            raise ConfigError(e.field, e.problem, f"{self.grid.source}: {where}") from None


Combo = tuple[dict[str, Scalar | None], list[tuple[str, Scalar]]]


def _combos(grid: Grid, res: _Resolver) -> list[Combo]:
    """(shown axis values, settings) of every job: the cross product, then the includes."""
    axis_by_name = {a.name: a for a in grid.axes}
    combos: list[Combo] = []
    for values in itertools.product(*(a.values for a in grid.axes)):
        shown: dict[str, Scalar | None] = {
            a.name: v.label for a, v in zip(grid.axes, values, strict=True)
        }
        combos.append((shown, [s for v in values for s in v.settings]))
    for i, inc in enumerate(grid.include):
        shown = {}
        settings: list[tuple[str, Scalar]] = []
        for key, value in inc:
            axis = axis_by_name.get(key)
            if axis is not None and not axis.is_key:  # a named axis: pick one of its values
                match = [v for v in axis.values if v.label == value]
                if not match:
                    labels = [v.label for v in axis.values]
                    raise ConfigError(
                        key, f"no value {value!r}; values: {labels}", f"{grid.source}: include[{i}]"
                    )
                settings.extend(match[0].settings)
            else:
                settings.append((key, value))
            shown[key] = value
        res.check_alone(settings, f"include[{i}]")
        combos.append((shown, settings))
    return combos


def _spec(grid: Grid, res: _Resolver, columns: Sequence[str], combo: Combo) -> JobSpec:
    shown, settings = combo
    trace = res.trace_of(settings)
    sha = res.checksums[trace]
    try:
        config: Config | None = res.config(settings)
        error = None
    except ConfigError as e:
        config, error = None, f"ConfigError: {e.field}: {e.problem}"
    flat = _flat(config) if config is not None else {}
    trace_label = dict(settings).get("trace", grid.trace)
    row: list[tuple[str, Scalar | None]] = []
    for col in columns:
        if col in shown:
            row.append((col, shown[col]))
        elif col == "trace":
            row.append((col, trace_label))
        else:
            row.append((col, flat.get(col)))
    h = (
        config_hash(config, sha)
        if config is not None
        else hashlib.sha256(repr(settings).encode()).hexdigest()[:_HASH_CHARS]
    )
    # the readable part names only what the job sets (not values filled in from the base),
    # so adding an [[include]] does not rename the cross product's jobs
    slug = _slug(list(shown.items()))
    name = f"{slug}-{h}" if config is not None else f"{slug}-invalid-{h}"
    return JobSpec(name, tuple(row), config, trace, sha, h, error)


def expand(grid: Grid) -> list[JobSpec]:
    """Every job of ``grid`` in grid order: the cross product of the axes (first axis slowest),
    then the ``[[include]]`` jobs.

    Raises :class:`ConfigError` when the base config is invalid, a trace is missing, or one
    axis value is invalid on its own (a typo should stop the sweep before it starts). A
    combination that only fails together (e.g. a page size that does not divide a device
    pool size from another axis) becomes a job with ``config=None`` and its ``error``.
    """
    res = _Resolver(grid)
    res.check_alone((), "base")
    if grid.trace is not None:
        res.trace_of(())  # a missing base trace fails before any job runs
    for a in grid.axes:
        for v in a.values:
            res.check_alone(v.settings, f"axes.{a.name} = {v.label!r}")
            if any(k == "trace" for k, _ in v.settings):
                res.trace_of(v.settings)
    axis_names = {a.name for a in grid.axes}
    include_keys = [k for inc in grid.include for k, _ in inc if k not in axis_names]
    columns = [a.name for a in grid.axes] + list(dict.fromkeys(include_keys))
    return [_spec(grid, res, columns, combo) for combo in _combos(grid, res)]


# --- the job function (runs in a pool worker or a Ray task) -----------------------------------

# per-process cache: (path, sha) -> trace; filled by the driver before a fork pool starts, so
# workers inherit it, and by each worker on first use otherwise
_TRACES: dict[tuple[str, str], Trace] = {}


def preload_traces(specs: Sequence[JobSpec]) -> None:
    """Read the specs' traces into this process's cache (forked workers inherit it). A trace
    that cannot be read is skipped: it fails its jobs, not the sweep."""
    from traces.io import read_trace

    for key in dict.fromkeys((s.trace_path, s.trace_sha256) for s in specs):
        if key not in _TRACES:
            with contextlib.suppress(Exception):
                _TRACES[key] = read_trace(key[0])


def forget_traces() -> None:
    """Empty this process's trace cache."""
    _TRACES.clear()


def _trace_for(spec: JobSpec, data: bytes | None) -> Trace:
    from traces.io import read_trace

    key = (spec.trace_path, spec.trace_sha256)
    trace = _TRACES.get(key)
    if trace is not None:
        return trace
    if data is None:
        trace = read_trace(spec.trace_path)
    else:
        # shipped bytes (a Ray node may not see the driver's files): parse from a temporary
        # copy with the same name (the reader picks the format by suffix); path=None, so the
        # engine does not re-read a file that is gone (run_job fills in path and checksum)
        if hashlib.sha256(data).hexdigest() != spec.trace_sha256:
            raise StudyError(f"{spec.trace_path}: shipped trace does not match its checksum")
        with tempfile.TemporaryDirectory(prefix="hicache-trace-") as tmp:
            copy = write_bytes_atomic(data, Path(tmp) / Path(spec.trace_path).name)
            trace = replace(read_trace(copy), path=None)
    _TRACES[key] = trace
    return trace


def run_job(spec: JobSpec, trace_data: bytes | None = None) -> JobResult:
    """Run one job and return its run directory's files, or its error. Never raises for a
    failing simulation (``KeyboardInterrupt`` still propagates).

    The trace comes from ``trace_data`` (its bytes, as a Ray task gets them) or is read from
    ``spec.trace_path``; either way its checksum must equal ``spec.trace_sha256`` (a trace
    edited during a sweep fails the job rather than mixing two traces in one results table).
    ``config.json`` records ``spec.trace_path`` and that checksum, so the files are identical
    whichever executor ran the job.
    """
    from hicache.config import config_from_dict
    from sim.engine import run_simulation

    try:
        if spec.config is None:
            raise StudyError(spec.error or "invalid configuration")
        cfg = config_from_dict(spec.config)
        trace = _trace_for(spec, trace_data)
        with tempfile.TemporaryDirectory(prefix="hicache-job-") as tmp:
            run_dir = Path(tmp) / "run"
            run_simulation(cfg, trace, run_dir, progress=False)
            files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}
        conf = json.loads(files["config.json"])
        sha = conf.get("trace_sha256") or spec.trace_sha256  # None when parsed from bytes
        if sha != spec.trace_sha256:
            raise StudyError(f"{spec.trace_path}: trace changed since the sweep started")
        conf["trace"], conf["trace_sha256"] = spec.trace_path, sha
        files["config.json"] = json_bytes(conf)
        return JobResult(spec.name, True, files)
    except Exception as e:
        return JobResult(spec.name, False, error=one_line(e), traceback=traceback.format_exc())


# --- job directories (the driver's side) ------------------------------------------------------


def is_finished(run_dir: Path, spec: JobSpec) -> bool:
    """A complete run of exactly this job's resolved config and trace."""
    if spec.config is None or not (run_dir / "summary.json").is_file():
        return False
    try:
        conf = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(conf.get("config") == spec.config and conf.get("trace_sha256") == spec.trace_sha256)


def job_json(spec: JobSpec, grid: Grid) -> bytes:
    """The ``job.json`` of a job directory: which job of which sweep it is."""
    return json_bytes(
        {
            "job": spec.name,
            "sweep": grid.name,
            "axes": dict(spec.axes),
            "config_hash": spec.config_hash,
        }
    )


def result_files(spec: JobSpec, grid: Grid, result: JobResult) -> dict[str, bytes]:
    """What a job directory holds: the run's files, or ``error.json``; and ``job.json``."""
    files = dict(result.files)
    if not result.ok:
        files = {"error.json": json_bytes({"error": result.error, "traceback": result.traceback})}
    files["job.json"] = job_json(spec, grid)
    return files


def commit(runs: Path, spec: JobSpec, files: Mapping[str, bytes]) -> None:
    """Write ``files`` as ``runs/<job>`` atomically: into a hidden directory, then renamed
    (replacing what was there, e.g. an earlier failure of the same job). On any failure the
    hidden directory is removed and what was there before stays."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.name[:40]}-", dir=runs))
    if "config.json" in files:  # the trace relative to the job folder (no machine paths)
        conf = json.loads(files["config.json"])
        conf["trace"] = os.path.relpath(spec.trace_path, runs / spec.name)
        files = {**files, "config.json": json_bytes(conf)}
    try:
        tmp.chmod(0o755)  # mkdtemp's 0o700 would make run directories private to this user
        for name, data in files.items():
            write_bytes_atomic(data, tmp / name)
        _replace_dir(tmp, runs / spec.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded


def _replace_dir(src: Path, final: Path) -> None:
    """Rename directory ``src`` to ``final``; an existing ``final`` is moved aside first and
    removed after, or put back if the rename fails."""
    if not final.exists():
        os.replace(src, final)
        return
    old = Path(tempfile.mkdtemp(prefix=f".old-{final.name[:40]}-", dir=final.parent))
    try:
        os.replace(final, old / "x")
        try:
            os.replace(src, final)
        except BaseException:
            os.replace(old / "x", final)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def adopt(runs: Path, spec: JobSpec, grid: Grid, by_hash: Mapping[str, list[Path]]) -> bool:
    """True if a finished run of ``spec`` exists; one found under another name (the grid's
    axes changed) is renamed to ``spec.name`` and its job.json rewritten."""
    final = runs / spec.name
    job = job_json(spec, grid)
    if is_finished(final, spec):
        if not (final / "job.json").is_file() or (final / "job.json").read_bytes() != job:
            write_bytes_atomic(job, final / "job.json")  # same run, relabelled (grid renamed)
        return True
    for other in by_hash.get(spec.config_hash, []):
        if other != final and is_finished(other, spec):
            if final.exists():
                shutil.rmtree(final)
            os.replace(other, final)
            write_bytes_atomic(job, final / "job.json")
            return True
    return False


__all__ = [
    "JobResult",
    "JobSpec",
    "adopt",
    "commit",
    "config_hash",
    "expand",
    "is_finished",
    "job_json",
    "json_bytes",
    "one_line",
    "result_files",
    "run_job",
]
