"""What a plan is asked: latency targets (``ttft_p90=2s``) and the configurations to size
(a base config × variants × routers).

A target is an upper bound on one numeric key of a run's summary (:func:`sim.engine.
run_simulation`): ``NAME=VALUE`` or ``NAME<=VALUE``. ``NAME`` is the summary key, with or
without its ``_s`` (seconds) suffix: ``ttft_p90`` and ``ttft_p90_s`` are the same key. A key in
seconds takes a duration, ``2s``, ``50ms``, ``1.5min`` or a plain number of seconds; any other
key takes a plain number. Only upper bounds exist (``hit_rate>=0.5`` is an error): the search
assumes the metric does not grow as instances are added, which holds for latencies, not for
hit rates (more instances split the cache).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import NamedTuple

from studies.errors import StudyError

#: Duration suffixes -> seconds (longest first, so ``ms`` is not read as ``s``).
UNITS = (("ms", 1e-3), ("min", 60.0), ("s", 1.0))
#: Keys the planner sets itself; a variant or ``--set`` may not set them.
PLANNER_KEYS = ("cluster.instances",)
#: The router key: set by ``--router``, never by a variant.
ROUTER_KEY = "router.policy"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a comma that starts the next ``section.key=`` item (so a value may itself hold commas)
_ITEM_SPLIT = re.compile(r",(?=\s*[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\s*=)")


class Target(NamedTuple):
    """An upper bound: a run meets it when ``summary[key] <= limit`` (NaN never does)."""

    key: str
    limit: float

    @property
    def label(self) -> str:
        """``ttft_p90 <= 2 s``: the key without ``_s`` and the limit in its unit."""
        if self.key.endswith("_s"):
            return f"{self.key[:-2]} <= {format_seconds(self.limit)}"
        return f"{self.key} <= {self.limit:g}"


class Variant(NamedTuple):
    """A named set of ``section.key=value`` overrides applied on top of the base config."""

    name: str
    overrides: tuple[str, ...]


#: The default grid: the same server without a host tier, and with 2x and 4x host pools.
DEFAULT_VARIANTS = (
    Variant("no host tier", ("cache.enable_host=false",)),
    Variant("host x2", ("cache.enable_host=true", "cache.hicache_ratio=2")),
    Variant("host x4", ("cache.enable_host=true", "cache.hicache_ratio=4")),
)


def format_seconds(seconds: float) -> str:
    """A duration as a reader takes it in: ``50 ms``, ``2 s``, ``1.5 min``."""
    if not math.isfinite(seconds):
        return "n/a"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 600.0:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise StudyError(f"{where}: expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise StudyError(f"{where}: expected a finite number >= 0, got {text!r}")
    return value


def _resolve_key(name: str, keys: Collection[str] | None, where: str) -> str:
    """``name`` or ``name_s``, whichever ``keys`` holds (without ``keys``: ``name`` as
    given); a ``ValueError`` listing ``keys`` when neither is there."""
    if keys is None:
        return name
    for key in (name, f"{name}_s"):
        if key in keys:
            return key
    raise StudyError(f"{where}: unknown summary key {name!r}; choose from {', '.join(keys)}")


def parse_target(text: str, keys: Collection[str] | None = None) -> Target:
    """``"ttft_p90=2s"`` -> ``Target("ttft_p90_s", 2.0)`` (module docstring for the syntax).

    ``keys``: the numeric summary keys a target may name (:func:`studies.plan.summary_keys`);
    without them, ``NAME`` gets ``_s`` appended when the value has a duration unit, and is
    otherwise kept as written. Raises ``ValueError`` (one line, naming ``text``) for bad syntax,
    an unknown key, a unit on a key that is not in seconds, or a negative value.
    """
    where = f"--target {text!r}"
    if ">" in text:
        raise StudyError(f"{where}: targets are upper bounds (NAME=VALUE or NAME<=VALUE)")
    name, sep, value = text.partition("<=")
    if not sep:
        name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip().lower()
    if not sep or not _NAME.fullmatch(name) or not value:
        raise StudyError(f"{where}: expected NAME=VALUE, e.g. ttft_p90=2s or tpot_mean=50ms")
    unit = next(((u, f) for u, f in UNITS if value.endswith(u)), None)
    if keys is None and unit is not None and not name.endswith("_s"):
        key = f"{name}_s"
    else:
        key = _resolve_key(name, keys, where)
    if unit is None:
        return Target(key, _number(value, where))
    if not key.endswith("_s"):
        raise StudyError(f"{where}: {key} is not in seconds: give a plain number")
    suffix, factor = unit
    return Target(key, _number(value[: -len(suffix)].strip(), where) * factor)


def parse_variant(text: str) -> Variant:
    """``"name:key=value,key=value"`` -> :class:`Variant` (``"name:"`` = the base config).

    Raises ``ValueError`` for a missing name or colon, an item without ``=``, or a key the
    planner owns (``cluster.instances``, and ``router.policy``: use ``--router``). Whether the
    keys and values exist is checked when the configs are built (:func:`hicache.config.
    with_overrides`).
    """
    where = f"--variant {text!r}"
    name, sep, body = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise StudyError(f"{where}: expected NAME:SECTION.KEY=VALUE[,SECTION.KEY=VALUE...]")
    items = [item.strip() for item in _ITEM_SPLIT.split(body) if item.strip()]
    for item in items:
        key, eq, _ = item.partition("=")
        if not eq or "." not in key:
            raise StudyError(f"{where}: {item!r}: expected SECTION.KEY=VALUE")
        check_settable(key.strip(), where)
    return Variant(name, tuple(items))


def check_settable(key: str, where: str) -> None:
    """``ValueError`` when ``key`` is one the planner sets itself."""
    if key in PLANNER_KEYS:
        raise StudyError(f"{where}: {key} is what the plan searches; do not set it")
    if key == ROUTER_KEY:
        raise StudyError(f"{where}: {key} is set by --router (comma-separated for several)")


def check_names(variants: Sequence[Variant]) -> None:
    """``ValueError`` when two variants share a name."""
    seen: set[str] = set()
    for v in variants:
        if v.name in seen:
            raise StudyError(f"--variant: two variants are named {v.name!r}")
        seen.add(v.name)


__all__ = [
    "DEFAULT_VARIANTS",
    "PLANNER_KEYS",
    "ROUTER_KEY",
    "UNITS",
    "Target",
    "Variant",
    "check_names",
    "check_settable",
    "format_seconds",
    "parse_target",
    "parse_variant",
]
