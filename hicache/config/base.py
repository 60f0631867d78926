"""What every config section shares: :class:`ConfigError`, the validation helpers (each raises
it naming ``section.key``) and the router choices that the cluster and the PD sections both
offer. Split from :mod:`.sections` so that a section may live in a module of its own
(:mod:`.pd`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Routers of a cluster (``sim.routers``): the SGLang gateway's policies, session affinity, and
#: a tier-aware router that scores each instance's real device/host prefix.
ROUTER_POLICIES = (
    "round_robin",
    "random",
    "least_load",
    "power_of_two",
    "session_affinity",
    "cache_aware",
    "tier_aware",
)


class ConfigError(ValueError):
    """A configuration a user wrote is invalid. ``str()`` is one line:
    ``SOURCE: section.key: problem`` (``SOURCE`` is a file or a ``--set`` item, when known)."""

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field, self.problem) if p]
        return ": ".join(parts)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str | None]]:
        # rebuild from the parts, so the error survives pickling (process-pool sweeps)
        return (ConfigError, (self.field, self.problem, self.source))

    def with_source(self, source: str | None) -> ConfigError:
        """The same error attributed to ``source`` (kept if already attributed)."""
        return type(self)(self.field, self.problem, self.source or source)  # keeps the kind


# --- validation helpers (each raises ConfigError naming section.key) -------------------------


def _choice(where: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(where, f"{value!r} is not one of: {', '.join(choices)}")


def _at_least(where: str, value: float, lo: float) -> None:
    if not value >= lo:
        raise ConfigError(where, f"must be >= {lo:g}, got {value:g}")


def _positive(where: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(where, f"must be > 0, got {value:g}")


def _between(where: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ConfigError(where, f"must be in [{lo:g}, {hi:g}], got {value:g}")


def _in_unit(where: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ConfigError(where, f"must be in (0, 1], got {value:g}")


def _preset(where: str, getter: Any, name: str) -> None:
    try:
        getter(name)
    except ValueError as e:
        raise ConfigError(where, str(e)) from None
