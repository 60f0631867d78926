"""Sweeps: the cross product of a grid of configurations, run as independent, resumable jobs.

A grid file (TOML; the format is documented in ``examples/README.md``) names a base config and
axes; every combination of axis values (plus any ``[[include]]`` extra jobs) is one job: one
timed simulation (:func:`sim.engine.run_simulation`) writing one run directory. The output
directory of a sweep::

    OUT/grid.toml        the grid file as it was run
    OUT/sweep.json       name, description, axes, job names in grid order
    OUT/results.parquet  one row per job: job, status, error, the axes, device/host pool
    OUT/results.csv      tokens, every summary.json field, run_dir (relative to OUT)
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
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import tomllib
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hicache.config import SECTIONS, ConfigError, config_to_dict, load_config, with_overrides

if TYPE_CHECKING:
    import pandas as pd

    from traces.schema import Trace

#: A value an axis or a ``set`` table may hold (TOML scalars).
Scalar = str | int | float | bool
#: Executors :func:`run_sweep` knows.
EXECUTORS = ("local", "ray")
#: Result columns that are not axes (an axis may not take one of these names).
FIXED_COLUMNS = ("job", "status", "error", "device_tokens", "host_tokens", "run_dir")
#: Keys a grid file may have at the top level, and in ``[base]``.
GRID_KEYS = ("name", "description", "base", "axes", "include")
BASE_KEYS = ("trace", "config", "set")

_HASH_CHARS = 10  # 40 bits: collisions are irrelevant at grid sizes, and names stay short
_SLUG_MAX = 80  # readable part of a job name; the hash keeps truncated names unique
_SAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


# --- the grid --------------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisValue:
    """One value of an axis: ``label`` is what the results table shows, ``settings`` the
    ``("section.key" | "trace", value)`` pairs it applies."""

    label: Scalar
    settings: tuple[tuple[str, Scalar], ...]


@dataclass(frozen=True)
class Axis:
    """A named list of values. ``name`` is a config key (``"cache.write_policy"``),
    ``"trace"``, or a free name for an axis whose values each set several keys."""

    name: str
    values: tuple[AxisValue, ...]

    @property
    def is_key(self) -> bool:
        """True when the axis is a single config key or ``trace`` (its label is the value)."""
        return self.name == "trace" or "." in self.name


@dataclass(frozen=True)
class Grid:
    """A parsed grid file. Relative paths (traces, base config, ``run.profile`` values) are
    relative to ``root``, the grid file's folder. Build with :func:`load_grid`; adjust with
    :meth:`with_set` / :meth:`select` (e.g. to shrink a study for a quick look)."""

    root: Path
    source: str = "<grid>"
    name: str = ""
    description: str = ""
    trace: str | None = None
    config: str | None = None
    overrides: tuple[str, ...] = ()
    axes: tuple[Axis, ...] = ()
    include: tuple[tuple[tuple[str, Scalar], ...], ...] = ()
    text: str = ""

    def with_set(self, items: Sequence[str]) -> Grid:
        """The grid with ``section.key=value`` items appended to ``[base] set`` (they win)."""
        for item in items:
            key, sep, _ = item.partition("=")
            if not sep or key.strip() == "trace":
                raise ConfigError(item, "expected section.key=value", f"{self.source}: set")
            _check_key(key.strip(), self.source, "set")
        return replace(self, overrides=(*self.overrides, *items))

    def select(self, axis: str, labels: Sequence[Scalar]) -> Grid:
        """The grid keeping only the values of ``axis`` whose label is in ``labels`` (in the
        grid's order). Raises :class:`ConfigError` for an unknown axis or label."""
        names = [a.name for a in self.axes]
        if axis not in names:
            raise ConfigError(axis, f"no such axis; axes: {', '.join(names)}", self.source)
        new = []
        for a in self.axes:
            if a.name == axis:
                known = [v.label for v in a.values]
                for lab in labels:
                    if lab not in known:
                        raise ConfigError(axis, f"no value {lab!r}; values: {known}", self.source)
                a = Axis(a.name, tuple(v for v in a.values if v.label in labels))
            new.append(a)
        return replace(self, axes=tuple(new))

    @property
    def size(self) -> int:
        """Number of jobs: the cross product of the axes plus the included jobs."""
        n = 1
        for a in self.axes:
            n *= len(a.values)
        return n + len(self.include)


def _check_key(key: str, source: str, where: str) -> None:
    """ConfigError naming ``key`` unless it is ``trace`` or an existing ``section.key``."""
    if key == "trace":
        return
    section, dot, name = key.partition(".")
    src = f"{source}: {where}"
    if not dot or not section or not name:
        raise ConfigError(key, "expected section.key (or trace)", src)
    if section not in SECTIONS:
        raise ConfigError(key, f"unknown section {section!r}; choices: {', '.join(SECTIONS)}", src)
    keys = [f.name for f in fields(SECTIONS[section])]
    if name not in keys:
        raise ConfigError(key, f"unknown key; {section} has: {', '.join(keys)}", src)


def _scalar(value: Any, key: str, src: str) -> Scalar:
    if isinstance(value, str | int | float | bool):
        return value
    raise ConfigError(key, f"expected a string, number or boolean, got {value!r}", src)


def _flatten_keys(table: Mapping[str, Any]) -> dict[str, Any]:
    """``{"cache": {"page_size": 64}}`` (what TOML makes of an unquoted ``cache.page_size``)
    -> ``{"cache.page_size": 64}``; quoted dotted keys pass through."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        if k in SECTIONS and isinstance(v, Mapping):
            for kk, vv in v.items():
                out[f"{k}.{kk}"] = vv
        else:
            out[k] = v
    return out


def _settings(table: Any, src: str, where: str) -> tuple[tuple[str, Scalar], ...]:
    """A table of ``"section.key" = value`` (and ``trace = path``) as checked pairs."""
    if not isinstance(table, Mapping):
        raise ConfigError(where, "expected a table of section.key = value", src)
    out = []
    for key, value in _flatten_keys(table).items():
        _check_key(key, src, where)
        out.append((key, _scalar(value, key, f"{src}: {where}")))
    return tuple(out)


def _include(
    table: Any, named: Mapping[str, Axis], src: str, where: str
) -> tuple[tuple[str, Scalar], ...]:
    """An ``[[include]]`` table: ``"section.key" = value`` pairs, ``trace``, or the name of a
    named axis with one of its values' names."""
    if not isinstance(table, Mapping):
        raise ConfigError(where, "expected a table of section.key = value", src)
    out = []
    for key, value in _flatten_keys(table).items():
        if key in named:
            labels = [v.label for v in named[key].values]
            if value not in labels:
                raise ConfigError(key, f"no value {value!r}; values: {labels}", f"{src}: {where}")
        else:
            _check_key(key, src, where)
        out.append((key, _scalar(value, key, f"{src}: {where}")))
    return tuple(out)


def _parse_axis(name: str, body: Any, src: str) -> Axis:
    where = f"axes.{name}"
    if isinstance(body, list):
        _check_key(name, src, "axes")
        if not body:
            raise ConfigError(name, "an axis needs at least one value", f"{src}: axes")
        values = [_scalar(v, name, f"{src}: axes") for v in body]
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(name, f"duplicate values in {values}", f"{src}: axes")
        return Axis(name, tuple(AxisValue(v, ((name, v),)) for v in values))
    if isinstance(body, Mapping):
        if name in FIXED_COLUMNS or name in SECTIONS:
            raise ConfigError(
                name,
                f"a named axis may not be called {name!r} (reserved: "
                f"{', '.join((*FIXED_COLUMNS, *SECTIONS))})",
                f"{src}: axes",
            )
        if not body:
            raise ConfigError(where, "an axis needs at least one value", src)
        return Axis(
            name,
            tuple(
                AxisValue(str(label), _settings(t, src, f"{where}.{label}"))
                for label, t in body.items()
            ),
        )
    raise ConfigError(name, "expected a list of values, or a table of named values", f"{src}: axes")


def parse_grid(data: Mapping[str, Any], root: Path, source: str = "<grid>", text: str = "") -> Grid:
    """A :class:`Grid` from parsed TOML. Raises :class:`ConfigError` (one line, naming the key)
    for an unknown key, a malformed axis, or an axis key that is not a config key."""
    for key in data:
        if key not in GRID_KEYS:
            raise ConfigError(key, f"unknown key; a grid has: {', '.join(GRID_KEYS)}", source)
    base = data.get("base", {})
    if not isinstance(base, Mapping):
        raise ConfigError("base", "expected a table", source)
    for key in base:
        if key not in BASE_KEYS:
            raise ConfigError(
                f"base.{key}", f"unknown key; [base] has: {', '.join(BASE_KEYS)}", source
            )
    overrides: list[str] = []
    raw_set = base.get("set", [])
    if isinstance(raw_set, Mapping):  # typed form: "section.key" = value
        for key, value in _settings(raw_set, source, "base.set"):
            if key == "trace":
                raise ConfigError("base.set", "set the trace with base.trace", source)
            overrides.append(f"{key}={_text(value)}")
    elif isinstance(raw_set, list) and all(isinstance(s, str) for s in raw_set):
        overrides.extend(raw_set)
    else:
        raise ConfigError("base.set", "expected a list of 'section.key=value' strings", source)
    for what, given in (
        ("base.trace", base.get("trace")),
        ("base.config", base.get("config")),
        ("name", data.get("name")),
        ("description", data.get("description")),
    ):
        if given is not None and not isinstance(given, str):
            raise ConfigError(what, f"expected a string, got {given!r}", source)
    axes_table = data.get("axes", {})
    if not isinstance(axes_table, Mapping):
        raise ConfigError("axes", "expected a table", source)
    axes = [_parse_axis(k, v, source) for k, v in _flatten_axes(axes_table).items()]
    owner: dict[str, str] = {}
    for a in axes:
        for key in {k for v in a.values for k, _ in v.settings}:
            if key in owner:
                raise ConfigError(key, f"set by two axes ({owner[key]!r} and {a.name!r})", source)
            owner[key] = a.name
    include = data.get("include", [])
    if not isinstance(include, list):
        raise ConfigError("include", "expected an array of tables ([[include]])", source)
    named = {a.name: a for a in axes if not a.is_key}
    inc = tuple(_include(t, named, source, f"include[{i}]") for i, t in enumerate(include))
    grid = Grid(
        root=root,
        source=source,
        name=str(data.get("name", "")),
        description=str(data.get("description", "")),
        trace=base.get("trace"),
        config=base.get("config"),
        axes=tuple(axes),
        include=inc,
        text=text,
    )
    return grid.with_set(overrides)


def _flatten_axes(table: Mapping[str, Any]) -> dict[str, Any]:
    """Axes keyed by name; an unquoted ``cache.page_size = [...]`` (a nested TOML table of
    lists) counts as the quoted key."""
    out: dict[str, Any] = {}
    for k, v in table.items():
        if (
            k in SECTIONS
            and isinstance(v, Mapping)
            and all(isinstance(x, list) for x in v.values())
        ):
            for kk, vv in v.items():
                out[f"{k}.{kk}"] = vv
        else:
            out[k] = v
    return out


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file. Raises :class:`ConfigError` for an unreadable file, invalid
    TOML, or an unknown or malformed key (the message names the file and the key)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError("", f"cannot read grid: {e.strerror or e}", str(p)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"invalid TOML: {e}", str(p)) from None
    return parse_grid(data, p.resolve().parent, str(p), text)


def _text(value: Scalar) -> str:
    """A typed value as ``--set`` text that :func:`hicache.config.load_config` parses back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# --- jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """One job, self-contained and picklable (it travels to pool workers and Ray tasks).

    ``config`` is the resolved :func:`hicache.config.config_to_dict` (None when the combination
    is invalid; ``error`` says why); ``axes`` the result-table values of the axis columns;
    ``config_hash`` hashes config + trace checksum and ends ``name``.
    """

    name: str
    axes: tuple[tuple[str, Scalar | None], ...]
    config: dict[str, dict[str, Any]] | None
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


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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
        shown = f"{value:g}" if isinstance(value, float) else _text(value)
        parts.append(f"{short}={shown}")
    slug = _SAFE.sub("_", "__".join(parts)).strip("._-")[:_SLUG_MAX].rstrip("._-")
    return slug or "run"


def _flat(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, body in config.items() for k, v in body.items()}


def expand(grid: Grid) -> list[JobSpec]:
    """Every job of ``grid`` in grid order: the cross product of the axes (first axis slowest),
    then the ``[[include]]`` jobs.

    Raises :class:`ConfigError` when the base config is invalid, a trace is missing, or one
    axis value is invalid on its own (a typo should stop the sweep before it starts). A
    combination that only fails together (e.g. a page size that does not divide a device
    pool size from another axis) becomes a job with ``config=None`` and its ``error``.
    """
    from sim.engine import trace_checksum

    config_path = None if grid.config is None else _resolve(grid.root, grid.config)
    checksums: dict[str, str] = {}

    def trace_of(settings: Sequence[tuple[str, Scalar]]) -> str:
        value = dict(settings).get("trace", grid.trace)
        if value is None:
            raise ConfigError("base.trace", "no trace: set base.trace or a trace axis", grid.source)
        path = str(_resolve(grid.root, str(value)))
        if path not in checksums:
            if not Path(path).is_file():
                raise ConfigError("trace", f"{value}: no such file", grid.source)
            checksums[path] = trace_checksum(Path(path))
        return path

    def resolve(settings: Sequence[tuple[str, Scalar]]) -> dict[str, dict[str, Any]]:
        sets = [f"{k}={_text(v)}" for k, v in settings if k != "trace"]
        cfg = load_config(config_path, [*grid.overrides, *sets])
        profile = cfg.run.profile
        if profile and not Path(profile).is_absolute():
            cfg = with_overrides(cfg, [f"run.profile={_resolve(grid.root, profile)}"])
        return config_to_dict(cfg)

    def check_alone(settings: Sequence[tuple[str, Scalar]], where: str) -> None:
        try:
            resolve(settings)
        except ConfigError as e:
            raise ConfigError(e.field, e.problem, f"{grid.source}: {where}") from None

    check_alone((), "base")
    if grid.trace is not None:
        trace_of(())  # a missing base trace fails before any job runs
    for a in grid.axes:
        for v in a.values:
            check_alone(v.settings, f"axes.{a.name} = {v.label!r}")
            if any(k == "trace" for k, _ in v.settings):
                trace_of(v.settings)
    axis_by_name = {a.name: a for a in grid.axes}
    include_keys = [k for inc in grid.include for k, _ in inc if k not in axis_by_name]
    columns = [a.name for a in grid.axes] + list(dict.fromkeys(include_keys))

    combos: list[tuple[dict[str, Scalar | None], list[tuple[str, Scalar]]]] = []
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
        check_alone(settings, f"include[{i}]")
        combos.append((shown, settings))

    specs = []
    for shown, settings in combos:
        trace = trace_of(settings)
        sha = checksums[trace]
        try:
            config: dict[str, dict[str, Any]] | None = resolve(settings)
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
        specs.append(JobSpec(name, tuple(row), config, trace, sha, h, error))
    return specs


def _resolve(root: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (root / p).resolve()


# --- the job function (runs in a pool worker or a Ray task) -----------------------------------

# per-process cache: (path, sha) -> trace; filled by the driver before a fork pool starts, so
# workers inherit it, and by each worker on first use otherwise
_TRACES: dict[tuple[str, str], Trace] = {}


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
            raise ValueError(f"{spec.trace_path}: shipped trace does not match its checksum")
        with tempfile.TemporaryDirectory(prefix="hicache-trace-") as tmp:
            copy = Path(tmp) / Path(spec.trace_path).name
            copy.write_bytes(data)
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
            raise ValueError(spec.error or "invalid configuration")
        cfg = config_from_dict(spec.config)
        trace = _trace_for(spec, trace_data)
        with tempfile.TemporaryDirectory(prefix="hicache-job-") as tmp:
            run_dir = Path(tmp) / "run"
            run_simulation(cfg, trace, run_dir, progress=False)
            files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}
        conf = json.loads(files["config.json"])
        sha = conf.get("trace_sha256") or spec.trace_sha256  # None when parsed from bytes
        if sha != spec.trace_sha256:
            raise ValueError(f"{spec.trace_path}: trace changed since the sweep started")
        conf["trace"], conf["trace_sha256"] = spec.trace_path, sha
        files["config.json"] = _json_bytes(conf)
        return JobResult(spec.name, True, files)
    except Exception as e:
        return JobResult(spec.name, False, error=_one_line(e), traceback=traceback.format_exc())


def _json_bytes(obj: Any) -> bytes:
    # the layout of sim.metrics.write_json_atomic, so rewritten files look like the engine's
    return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n").encode()


# --- the driver ------------------------------------------------------------------------------


def _is_finished(run_dir: Path, spec: JobSpec) -> bool:
    """A complete run of exactly this job's resolved config and trace."""
    if spec.config is None or not (run_dir / "summary.json").is_file():
        return False
    try:
        conf = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(conf.get("config") == spec.config and conf.get("trace_sha256") == spec.trace_sha256)


def _job_json(spec: JobSpec, grid: Grid) -> bytes:
    return _json_bytes(
        {
            "job": spec.name,
            "sweep": grid.name,
            "axes": dict(spec.axes),
            "config_hash": spec.config_hash,
        }
    )


def _commit(runs: Path, spec: JobSpec, files: Mapping[str, bytes]) -> None:
    """Write ``files`` as ``runs/<job>`` atomically: into a hidden directory, then renamed
    (replacing what was there, e.g. an earlier failure of the same job)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{spec.name[:40]}-", dir=runs))
    tmp.chmod(0o755)  # mkdtemp's 0o700 would make run directories private to this user
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    final = runs / spec.name
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".old-{spec.name[:40]}-", dir=runs))
        os.replace(final, old / "x")
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _adopt(runs: Path, spec: JobSpec, grid: Grid, by_hash: Mapping[str, list[Path]]) -> bool:
    """True if a finished run of ``spec`` exists; one found under another name (the grid's
    axes changed) is renamed to ``spec.name`` and its job.json rewritten."""
    final = runs / spec.name
    if _is_finished(final, spec):
        job = _job_json(spec, grid)
        if not (final / "job.json").is_file() or (final / "job.json").read_bytes() != job:
            _write_atomic(final / "job.json", job)  # same run, relabelled (e.g. grid renamed)
        return True
    for other in by_hash.get(spec.config_hash, []):
        if other != final and _is_finished(other, spec):
            if final.exists():
                shutil.rmtree(final)
            os.replace(other, final)
            _write_atomic(final / "job.json", _job_json(spec, grid))
            return True
    return False


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0o600 would hide the file from other users
    os.replace(tmp, path)


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
            raise ValueError(f"{out}: another sweep is writing to this directory") from None
        except OSError:  # a file system without locks (some network mounts): run unlocked
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(f, fcntl.LOCK_UN)


OnResult = Callable[[JobSpec, JobResult], None]


def _run_local(specs: Sequence[JobSpec], jobs: int, on_result: OnResult) -> None:
    import multiprocessing as mp
    from concurrent.futures import Future, ProcessPoolExecutor, as_completed

    from traces.io import read_trace

    workers = min(len(specs), jobs or os.cpu_count() or 1)
    # fork shares the already-imported simulator and the traces loaded here with the workers;
    # elsewhere (macOS, Windows) fork is unsafe or missing and workers start fresh
    use_fork = sys.platform == "linux"
    if workers > 1 and use_fork:
        for key in dict.fromkeys((s.trace_path, s.trace_sha256) for s in specs):
            if key not in _TRACES:
                with contextlib.suppress(Exception):  # a bad trace fails its jobs, not the sweep
                    _TRACES[key] = read_trace(key[0])
    try:
        if workers == 1:  # in-process: simplest to debug, no pool start-up
            for s in specs:
                on_result(s, run_job(s))
            return
        ctx = mp.get_context("fork" if use_fork else "spawn")
        ex = ProcessPoolExecutor(workers, mp_context=ctx)
        try:
            futures: dict[Future[JobResult], JobSpec] = {ex.submit(run_job, s): s for s in specs}
            for fut in as_completed(futures):
                spec = futures[fut]
                try:
                    result = fut.result()
                except Exception as e:  # the worker died (e.g. killed for memory)
                    result = JobResult(spec.name, False, error=f"worker failed: {_one_line(e)}")
                on_result(spec, result)
        except BaseException:
            # Ctrl-C reaches the workers too (same process group): their jobs stop at once;
            # queued jobs are dropped. Nothing unfinished was committed.
            ex.shutdown(wait=True, cancel_futures=True)
            raise
        ex.shutdown(wait=True)
    finally:
        _TRACES.clear()


def _run_ray(specs: Sequence[JobSpec], jobs: int, address: str | None, on_result: OnResult) -> None:
    import importlib

    try:
        # by name: Ray is an optional extra, so neither mypy nor CI may have it
        ray: Any = importlib.import_module("ray")
    except ImportError:
        raise ValueError("the ray executor needs Ray: pip install 'hicache-sim[cluster]'") from None
    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=jobs or None, include_dashboard=False, log_to_driver=False)
        except Exception as e:
            where = f" at {address}" if address else ""
            raise ValueError(f"cannot start Ray{where}: {_one_line(e)}") from None
        started = True
    try:
        task = ray.remote(num_cpus=1)(run_job)
        # each trace travels once through the object store, not once per job
        blobs = {
            p: ray.put(Path(p).read_bytes()) for p in dict.fromkeys(s.trace_path for s in specs)
        }
        refs = {task.remote(s, blobs[s.trace_path]): s for s in specs}
        left = list(refs)
        try:
            while left:
                done, left = ray.wait(left, num_returns=1)
                for ref in done:
                    spec = refs[ref]
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # the task or its node died
                        result = JobResult(
                            spec.name, False, error=f"ray task failed: {_one_line(e)}"
                        )
                    on_result(spec, result)
        except BaseException:
            for ref in left:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


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

    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if jobs < 0:
        raise ValueError(f"jobs must be >= 0 (0 = all cores), got {jobs}")
    if address and executor != "ray":
        raise ValueError("an address needs the ray executor")
    grid = grid_path if isinstance(grid_path, Grid) else load_grid(grid_path)
    specs = expand(grid)
    out = Path(out_dir)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        for stale in runs.glob(".tmp-*"):  # left by an interrupted sweep
            shutil.rmtree(stale, ignore_errors=True)
        for stale in runs.glob(".old-*"):
            shutil.rmtree(stale, ignore_errors=True)
        _write_atomic(out / "grid.toml", grid.text.encode())
        _write_atomic(
            out / "sweep.json",
            _json_bytes(
                {
                    "name": grid.name,
                    "description": grid.description,
                    "grid": grid.source,
                    "axes": [a.name for a in grid.axes],
                    "columns": [c for c, _ in specs[0].axes],
                    "jobs": [s.name for s in specs],
                }
            ),
        )
        by_hash: dict[str, list[Path]] = {}
        for d in sorted(runs.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                by_hash.setdefault(d.name.rpartition("-")[2], []).append(d)
        pending = [s for s in specs if s.config is not None and not _adopt(runs, s, grid, by_hash)]
        failed = 0
        bar = tqdm(
            total=len(specs),
            initial=len(specs) - len(pending),
            desc="jobs",
            unit="job",
            disable=None if progress is None else not progress,
            smoothing=0,
        )

        def on_result(spec: JobSpec, result: JobResult) -> None:
            nonlocal failed
            files = dict(result.files)
            if not result.ok:
                failed += 1
                files = {
                    "error.json": _json_bytes(
                        {"error": result.error, "traceback": result.traceback}
                    )
                }
                bar.set_postfix(failed=failed)
            files["job.json"] = _job_json(spec, grid)
            _commit(runs, spec, files)
            bar.update(1)

        try:
            if pending and executor == "ray":
                _run_ray(pending, jobs, address, on_result)
            elif pending:
                _run_local(pending, jobs, on_result)
        finally:
            bar.close()
        df = collect_results(out, specs)
        _write_results(df, out)
    # after writing: pandas stores attrs in Parquet metadata, and these differ between reruns
    df.attrs.update(
        ran=len(pending),
        reused=len(specs) - len(pending) - sum(s.config is None for s in specs),
        failed=int((df["status"] != "ok").sum()),
    )
    return df


def collect_results(out: Path, specs: Sequence[JobSpec]) -> pd.DataFrame:
    """The results table from what the job directories hold, one row per spec in order:
    ``job, status ("ok" | "failed" | "missing"), error``, the axis columns,
    ``device_tokens, host_tokens`` (resolved pools), every ``summary.json`` field, and
    ``run_dir`` (relative to ``out``; empty for a job without a run)."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    summary_keys: dict[str, None] = {}
    for spec in specs:
        row: dict[str, Any] = {"job": spec.name, "status": "missing", "error": None}
        row.update(dict(spec.axes))
        d = out / "runs" / spec.name
        if spec.config is None:
            row.update(status="failed", error=spec.error)
        elif _is_finished(d, spec):
            conf = json.loads((d / "config.json").read_text())
            summary = json.loads((d / "summary.json").read_text())
            row.update(
                status="ok",
                device_tokens=conf["device_tokens"],
                host_tokens=conf["host_tokens"],
                run_dir=f"runs/{spec.name}",
            )
            row.update(summary)
            summary_keys.update(dict.fromkeys(summary))
        elif (d / "error.json").is_file():
            row.update(status="failed", error=json.loads((d / "error.json").read_text())["error"])
        rows.append(row)
    axes = [c for c, _ in specs[0].axes] if specs else []
    columns = [
        "job",
        "status",
        "error",
        *axes,
        "device_tokens",
        "host_tokens",
        *summary_keys,
        "run_dir",
    ]
    return pd.DataFrame(rows, columns=columns)


def _write_results(df: pd.DataFrame, out: Path) -> None:
    for name in ("results.parquet", "results.csv"):
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        if name.endswith(".parquet"):
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out / name)
