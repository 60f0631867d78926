"""Grid files: parsing and checking a sweep's grid (TOML; the format is documented in
``examples/README.md``) into a :class:`Grid` of named :class:`Axis` values.

Every error is a :class:`hicache.config.ConfigError`: one line naming the file and the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from hicache.config import SECTIONS, ConfigError

#: A value an axis or a ``set`` table may hold (TOML scalars).
Scalar = str | int | float | bool
#: Result columns that are not axes (an axis may not take one of these names).
FIXED_COLUMNS = ("job", "status", "error", "device_tokens", "host_tokens", "run_dir")
#: Keys a grid file may have at the top level, and in ``[base]``.
GRID_KEYS = ("name", "description", "base", "axes", "include")
BASE_KEYS = ("trace", "config", "set")

Settings = tuple[tuple[str, Scalar], ...]


@dataclass(frozen=True)
class AxisValue:
    """One value of an axis: ``label`` is what the results table shows, ``settings`` the
    ``("section.key" | "trace", value)`` pairs it applies."""

    label: Scalar
    settings: Settings


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
    include: tuple[Settings, ...] = ()
    text: str = ""

    def with_set(self, items: Sequence[str]) -> Grid:
        """The grid with ``section.key=value`` items appended to ``[base] set`` (they win)."""
        for item in items:
            key, sep, _ = item.partition("=")
            if not sep or key.strip() == "trace":
                raise ConfigError(item, "expected section.key=value", f"{self.source}: set")
            _check_key(key.strip(), self.source, "set")
        return replace(self, overrides=(*self.overrides, *items))

    def with_axis(self, key: str, values: Sequence[Scalar]) -> Grid:
        """The grid with one more axis over config ``key`` (its values as a grid file's list
        gives them). Raises :class:`ConfigError` when the grid already varies ``key``."""
        if any(a.name == key for a in self.axes):
            raise ConfigError(key, "the grid already has this axis", self.source)
        axis = _parse_axis(key, list(values), self.source)
        return replace(self, axes=(*self.axes, axis))

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


def setting_text(value: Scalar) -> str:
    """A typed value as ``--set`` text that :func:`hicache.config.load_config` parses back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def resolve_path(root: Path, path: str) -> Path:
    """``path`` (``~`` expanded) relative to ``root`` unless absolute."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (root / p).resolve()


# --- parsing ---------------------------------------------------------------------------------


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


def _settings(table: Any, src: str, where: str) -> Settings:
    """A table of ``"section.key" = value`` (and ``trace = path``) as checked pairs."""
    if not isinstance(table, Mapping):
        raise ConfigError(where, "expected a table of section.key = value", src)
    out = []
    for key, value in _flatten_keys(table).items():
        _check_key(key, src, where)
        out.append((key, _scalar(value, key, f"{src}: {where}")))
    return tuple(out)


def _include(table: Any, named: Mapping[str, Axis], src: str, where: str) -> Settings:
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


def _parse_base(base: Any, source: str) -> list[str]:
    """Check ``[base]``; its ``set`` as ``section.key=value`` override strings."""
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
            overrides.append(f"{key}={setting_text(value)}")
    elif isinstance(raw_set, list) and all(isinstance(s, str) for s in raw_set):
        overrides.extend(raw_set)
    else:
        raise ConfigError("base.set", "expected a list of 'section.key=value' strings", source)
    return overrides


def _parse_axes(table: Any, source: str) -> list[Axis]:
    """The ``[axes]`` table; a config key may belong to one axis only."""
    if not isinstance(table, Mapping):
        raise ConfigError("axes", "expected a table", source)
    axes = [_parse_axis(k, v, source) for k, v in _flatten_axes(table).items()]
    owner: dict[str, str] = {}
    for a in axes:
        for key in {k for v in a.values for k, _ in v.settings}:
            if key in owner:
                raise ConfigError(key, f"set by two axes ({owner[key]!r} and {a.name!r})", source)
            owner[key] = a.name
    return axes


def parse_grid(data: Mapping[str, Any], root: Path, source: str = "<grid>", text: str = "") -> Grid:
    """A :class:`Grid` from parsed TOML. Raises :class:`ConfigError` (one line, naming the key)
    for an unknown key, a malformed axis, or an axis key that is not a config key."""
    for key in data:
        if key not in GRID_KEYS:
            raise ConfigError(key, f"unknown key; a grid has: {', '.join(GRID_KEYS)}", source)
    base = data.get("base", {})
    overrides = _parse_base(base, source)
    for what, given in (
        ("base.trace", base.get("trace")),
        ("base.config", base.get("config")),
        ("name", data.get("name")),
        ("description", data.get("description")),
    ):
        if given is not None and not isinstance(given, str):
            raise ConfigError(what, f"expected a string, got {given!r}", source)
    axes = _parse_axes(data.get("axes", {}), source)
    include = data.get("include", [])
    if not isinstance(include, list):
        raise ConfigError("include", "expected an array of tables ([[include]])", source)
    named = {a.name: a for a in axes if not a.is_key}
    grid = Grid(
        root=root,
        source=source,
        name=str(data.get("name", "")),
        description=str(data.get("description", "")),
        trace=base.get("trace"),
        config=base.get("config"),
        axes=tuple(axes),
        include=tuple(_include(t, named, source, f"include[{i}]") for i, t in enumerate(include)),
        text=text,
    )
    return grid.with_set(overrides)


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


__all__ = [
    "BASE_KEYS",
    "FIXED_COLUMNS",
    "GRID_KEYS",
    "Axis",
    "AxisValue",
    "Grid",
    "Scalar",
    "load_grid",
    "parse_grid",
    "resolve_path",
    "setting_text",
]
