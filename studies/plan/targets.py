"""What a plan is asked: latency targets (``ttft_p90=2s``) and the configurations to size
(a base config × variants × routers).

A target bounds one numeric key of a run's summary (:func:`sim.engine.run_simulation`, plus
the plan's own ``goodput``): an upper bound ``NAME<=VALUE`` (``NAME=VALUE`` is the same, for
keys that are better when lower: latencies) or a lower bound ``NAME>=VALUE`` (hit rates,
throughput, goodput). ``NAME`` is the summary key, with or without its ``_s`` (seconds) suffix:
``ttft_p90`` and ``ttft_p90_s`` are the same key. A key in seconds takes a duration, ``2s``,
``50ms``, ``1.5min`` or a plain number of seconds; any other key takes a plain number. A key
that is better when higher must be written with ``>=`` (``hit_rate=0.5`` is refused: it would
read as "at most half").

``goodput`` is the share of the trace's requests that finish within an SLO (``--slo
ttft=2s,tpot=50ms``, :class:`Slo`): the requests that were rejected or missed either bound
count against it.

The search (:mod:`~studies.plan.search`) assumes a run passes from some N on and keeps passing:
true of latencies, throughput and goodput (more instances, less load on each); a hit rate may
go either way (more instances split the traffic, but add cache), so a lower bound on one is
judged at each N like any other and the plan says when the evaluated points contradict the
assumption.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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
    """A bound: a run meets it when ``summary[key] <= limit`` (``op`` ``"<="``) or ``>=``
    (``op`` ``">="``); NaN never does."""

    key: str
    limit: float
    op: str = "<="

    @property
    def label(self) -> str:
        """``ttft_p90 <= 2 s``: the key without ``_s`` and the limit in its unit."""
        if self.key.endswith("_s"):
            return f"{self.key[:-2]} {self.op} {format_seconds(self.limit)}"
        return f"{self.key} {self.op} {self.limit:g}"

    def meets(self, value: float) -> bool:
        """Whether ``value`` is within the bound (NaN: never)."""
        return value <= self.limit if self.op == "<=" else value >= self.limit

    def better(self, a: float, b: float) -> float:
        """The better of two values of this key (NaN loses)."""
        if a != a:
            return b
        if b != b:
            return a
        return min(a, b) if self.op == "<=" else max(a, b)


def best_value(
    target: Target, evaluations: Iterable[tuple[Any, Mapping[str, Any]]]
) -> tuple[float, Any] | None:
    """The best value of ``target``'s key over ``(where, summary)`` pairs (an evaluated N or
    split and its summary), and where it was reached; None when no summary has the key. Ties go
    to the first."""
    got: tuple[float, Any] | None = None
    for where, summary in evaluations:
        v = float(summary.get(target.key, math.nan))
        if v == v and (got is None or target.better(v, got[0]) != got[0]):
            got = (v, where)
    return got


def floor_misses(target: Target, floors: Mapping[str, float]) -> bool:
    """Whether the zero-load floor of ``target``'s key alone misses it: no size can meet it."""
    floor = floors.get(target.key)
    return floor is not None and not target.meets(floor)


def higher_is_better(key: str) -> bool:
    """Whether a summary key is better when higher (hit rates, throughput, goodput, rates of
    service); latencies, queues, stalls and byte counts are better when lower."""
    return (
        key.endswith("hit_rate") or key.startswith("throughput") or key == "goodput"
        or key.endswith("_rps") or key == "finished_requests"
    )  # fmt: skip


class Slo(NamedTuple):
    """A per-request SLO for ``goodput``: TTFT and TPOT at most these seconds (inf: none)."""

    ttft_s: float = math.inf
    tpot_s: float = math.inf

    @property
    def label(self) -> str:
        parts = [f"TTFT <= {format_seconds(self.ttft_s)}"] if math.isfinite(self.ttft_s) else []
        if math.isfinite(self.tpot_s):
            parts.append(f"TPOT <= {format_seconds(self.tpot_s)}")
        return " and ".join(parts)


def parse_slo(text: str) -> Slo:
    """``"ttft=2s,tpot=50ms"`` -> :class:`Slo` (either part may be left out)."""
    where = f"--slo {text!r}"
    values: dict[str, float] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, eq, value = item.partition("=")
        name = name.strip().lower()
        if not eq or name not in ("ttft", "tpot") or name in values:
            raise StudyError(f"{where}: expected ttft=DURATION and/or tpot=DURATION, e.g. "
                             "ttft=2s,tpot=50ms")  # fmt: skip
        values[name] = _duration(value.strip().lower(), where)
    if not values:
        raise StudyError(f"{where}: expected ttft=DURATION and/or tpot=DURATION")
    return Slo(values.get("ttft", math.inf), values.get("tpot", math.inf))


def _duration(value: str, where: str) -> float:
    unit = next(((u, f) for u, f in UNITS if value.endswith(u)), None)
    if unit is None:
        return _number(value, where)
    return _number(value[: -len(unit[0])].strip(), where) * unit[1]


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
    """``"ttft_p90=2s"`` -> ``Target("ttft_p90_s", 2.0)``, ``"hit_rate>=0.5"`` ->
    ``Target("hit_rate", 0.5, ">=")`` (module docstring for the syntax).

    ``keys``: the numeric summary keys a target may name (:func:`studies.plan.summary_keys`);
    without them, ``NAME`` gets ``_s`` appended when the value has a duration unit, and is
    otherwise kept as written. Raises ``StudyError`` (one line, naming ``text``) for bad
    syntax, an unknown key, a unit on a key that is not in seconds, a negative value, or ``=``
    on a key that is better when higher.
    """
    where = f"--target {text!r}"
    name, op, value = _split_bound(text, where)
    unit = next(((u, f) for u, f in UNITS if value.endswith(u)), None)
    if keys is None and unit is not None and not name.endswith("_s"):
        key = f"{name}_s"
    else:
        key = _resolve_key(name, keys, where)
    if op == "=":
        if higher_is_better(key):
            raise StudyError(
                f"{where}: {key} is better when higher: write {name}>={value} for at least "
                f"{value} (or {name}<={value} for at most)"
            )
        op = "<="
    if unit is None:
        return Target(key, _number(value, where), op)
    if not key.endswith("_s"):
        raise StudyError(f"{where}: {key} is not in seconds: give a plain number")
    return Target(key, _duration(value, where), op)


def _split_bound(text: str, where: str) -> tuple[str, str, str]:
    """``NAME``, the operator (``<=``, ``>=`` or ``=``) and the value, lower-cased."""
    for op in ("<=", ">=", "="):
        name, sep, value = text.partition(op)
        if sep:
            break
    name, value = name.strip(), value.strip().lower()
    if not sep or not _NAME.fullmatch(name) or not value or value[0] in "<>=":
        raise StudyError(
            f"{where}: expected NAME<=VALUE, NAME>=VALUE or NAME=VALUE (an upper bound), e.g. "
            "ttft_p90=2s, tpot_mean<=50ms or hit_rate>=0.5"
        )
    return name, op, value


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
    "Slo",
    "Target",
    "Variant",
    "check_names",
    "check_settable",
    "format_seconds",
    "higher_is_better",
    "parse_slo",
    "parse_target",
    "parse_variant",
]
