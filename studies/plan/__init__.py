"""Capacity planning: how many instances (GPUs) does a workload need to meet latency
targets, with and without HiCache's host tier, and so how many does HiCache save?

A plan is a grid of named configurations (a base config × variants × routers; by default
"no host tier", "host x2" and "host x4", :data:`~studies.plan.targets.DEFAULT_VARIANTS`) and
targets (upper bounds on summary keys, :func:`~studies.plan.targets.parse_target`). For each
configuration it finds the smallest ``cluster.instances`` in ``[1, max_instances]`` whose run
meets every target and is not overloaded (:mod:`~studies.plan.search`: doubling, then
bisection, assuming latency does not grow with N), and reports the instances, GPUs
(instances × ``model.tp``), GPU-hours and host DRAM that take.

GPU-hours = instances × ``model.tp`` × the trace's arrival span in hours: last arrival − first
arrival of the requests replayed (``workload.max_requests``), at ``workload.rate_scale``. It
is what a fleet sized for the trace's load costs while the trace lasts, not the (longer)
simulated duration, which includes the drain after the last arrival.

Parallelism: the search of one configuration is sequential, so evaluations run in waves: a
wave holds the next N of every configuration not yet done (all N = 1 first, then N = 2, ...,
then the bisection steps), and its jobs run on the local process pool or Ray
(:class:`~studies.plan.evaluate.Executor`). A wave is as wide as the grid (3 configurations ×
routers by default) and a plan takes about ``2 log2 N`` waves. Waves rather than one worker
per configuration's whole search: the jobs stay single simulations (what both executors run
well), the progress bar moves per evaluation, and a wave's widest (largest-N) runs overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from studies.errors import StudyError
from studies.plan.evaluate import Config, Executor
from studies.plan.search import Evaluation, Search, numeric_keys, run_searches
from studies.plan.targets import (
    DEFAULT_VARIANTS,
    ROUTER_KEY,
    Target,
    Variant,
    check_names,
    check_settable,
    format_seconds,
    parse_target,
    parse_variant,
)

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from traces.schema import Trace

#: ``max_instances`` when none is given.
DEFAULT_MAX_INSTANCES = 64


@dataclass(frozen=True)
class PlanConfig:
    """One configuration of the grid: a variant of the base with one router, resolved."""

    variant: str
    router: str
    overrides: tuple[str, ...]
    config: Config = field(repr=False)
    device_tokens: int
    host_tokens: int
    kv_bytes_per_token: int
    tp: int
    span_s: float

    @property
    def name(self) -> str:
        return f"{self.variant} / {self.router}"

    @property
    def host_dram_gb(self) -> float:
        """Host DRAM for the KV host pool of one instance, all its TP ranks (GB, 1e9 B)."""
        return self.host_tokens * self.kv_bytes_per_token * self.tp / 1e9


def arrival_span_s(trace: Trace, rate_scale: float = 1.0, max_requests: int = 0) -> float:
    """Last arrival − first arrival of the replayed requests (the first ``max_requests`` if
    > 0), in seconds at ``rate_scale``; 0 for fewer than two requests."""
    stamps = [r.timestamp for r in trace.requests[: max_requests or None]]
    return (max(stamps) - min(stamps)) / 1000.0 / rate_scale if len(stamps) > 1 else 0.0


def build_configs(
    base: SimConfig,
    trace: Trace,
    variants: Sequence[Variant] = DEFAULT_VARIANTS,
    routers: Sequence[str] = ("cache_aware",),
) -> list[PlanConfig]:
    """The grid: every variant of ``base`` with every router, validated. Raises
    ``ValueError`` (one line naming the variant or router) for an invalid one."""
    from hicache.config import ROUTER_POLICIES, config_to_dict, resolve_pools, with_overrides

    check_names(variants)
    bad = [r for r in routers if r not in ROUTER_POLICIES]
    if bad or not routers:
        raise StudyError(
            f"--router: unknown router {', '.join(map(repr, bad))}; choose from "
            f"{', '.join(ROUTER_POLICIES)}"
        )
    out = []
    for v in variants:
        for router in dict.fromkeys(routers):
            try:
                cfg = with_overrides(base, [*v.overrides, f"{ROUTER_KEY}={router}"])
            except ValueError as e:
                raise StudyError(f"--variant {v.name!r}: {e}") from None
            device, host, bpt = resolve_pools(cfg)
            span = arrival_span_s(trace, cfg.workload.rate_scale, cfg.workload.max_requests)
            out.append(
                PlanConfig(v.name, router, v.overrides, config_to_dict(cfg), device, host, bpt,
                           cfg.model.tp, span)
            )  # fmt: skip
    return out


def summary_keys(base: SimConfig, trace: Trace) -> list[str]:
    """The numeric summary keys a target may name: from a probe run of ``base`` on the
    trace's first request (milliseconds), so they are the simulator's own, whatever it
    reports. Raises what the simulation raises (e.g. a page size the trace cannot use)."""
    from hicache.config import with_overrides
    from sim.engine import run_simulation

    probe = with_overrides(base, ["workload.max_requests=1", "cluster.instances=1"])
    return numeric_keys(run_simulation(probe, trace, None, progress=False))


@dataclass
class ConfigPlan:
    """The outcome for one configuration: the smallest N that passes (None: more than
    ``max_instances``) and every evaluation, by N."""

    config: PlanConfig
    instances: int | None
    evaluations: list[Evaluation]
    monotone: bool

    @property
    def chosen(self) -> dict[str, Any] | None:
        """The summary of the run at the chosen N."""
        return next((e.summary for e in self.evaluations if e.instances == self.instances), None)

    @property
    def gpus(self) -> int | None:
        return None if self.instances is None else self.instances * self.config.tp

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpus is None else self.gpus * self.config.span_s / 3600.0


@dataclass
class Plan:
    """A finished plan: its targets, limits and one :class:`ConfigPlan` per configuration."""

    targets: list[Target]
    max_instances: int
    configs: list[ConfigPlan]

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per configuration (the CSV, the table)."""
        out = []
        for c in self.configs:
            chosen = c.chosen or {}
            row: dict[str, Any] = {
                "configuration": c.config.name,
                "variant": c.config.variant,
                "router": c.config.router,
                "instances": c.instances,
                "meets_targets": c.instances is not None,
                "max_instances": self.max_instances,
                "gpus": c.gpus,
                "gpu_hours": c.gpu_hours,
                "arrival_span_s": c.config.span_s,
                "host_dram_gb_per_instance": c.config.host_dram_gb,
                "device_tokens": c.config.device_tokens,
                "host_tokens": c.config.host_tokens,
                "hit_rate": chosen.get("hit_rate"),
                "device_hit_rate": chosen.get("device_hit_rate"),
                "host_hit_rate": chosen.get("host_hit_rate"),
            }
            for t in self.targets:
                row[t.key] = chosen.get(t.key)
            row["evaluations"] = len(c.evaluations)
            row["monotone"] = c.monotone
            row["overrides"] = ";".join(c.config.overrides)
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        """Everything: targets, configurations with their resolved configs, every evaluated
        N with its verdict and summary, and the savings lines."""
        return {
            "targets": [{"key": t.key, "limit": t.limit, "label": t.label} for t in self.targets],
            "max_instances": self.max_instances,
            "gpu_hours_basis": "instances x model.tp x arrival span (last - first arrival, "
            "at workload.rate_scale)",
            "configurations": [
                {
                    **row,
                    "config": c.config.config,
                    "evaluations": [e._asdict() for e in c.evaluations],
                }
                for row, c in zip(self.rows(), self.configs, strict=True)
            ],
            "savings": savings_lines(self),
        }


def _baseline(c: ConfigPlan) -> bool:
    return not c.config.config["cache"]["enable_host"]


def savings_lines(plan: Plan) -> list[str]:
    """Per router: the best configuration with a host tier against the one without
    ("HiCache saves X instances (Y %) against no host tier"); none without a baseline."""
    lines = []
    cap = plan.max_instances
    for router in dict.fromkeys(c.config.router for c in plan.configs):
        mine = [c for c in plan.configs if c.config.router == router]
        base = next((c for c in mine if _baseline(c)), None)
        tiered = [c for c in mine if not _baseline(c)]
        if base is None or not tiered:
            continue
        best = min(tiered, key=lambda c: math.inf if c.instances is None else c.instances)
        lines.append(f"{router}: {_saving(base, best, cap)}")
    return lines


def _saving(base: ConfigPlan, best: ConfigPlan, cap: int) -> str:
    name = f"HiCache ({best.config.variant})"
    against = f"against {base.config.variant}"
    if best.instances is None:
        if base.instances is None:
            return f"neither {name} nor {base.config.variant} meets the targets within {cap}"
        return f"{name} needs more than {cap} instances, {base.config.variant} {base.instances}"
    if base.instances is None:
        at_least = cap + 1 - best.instances
        return (
            f"HiCache saves at least {_count(at_least)} (>= {at_least / (cap + 1):.1%}) "
            f"{against}: {best.instances} with {best.config.variant}, more than {cap} without"
        )
    saved = base.instances - best.instances
    share = saved / base.instances
    counts = f"{best.instances} with {best.config.variant}, {base.instances} without"
    if saved >= 0:
        return f"HiCache saves {_count(saved)} ({share:.1%}) {against}: {counts}"
    return f"HiCache needs {_count(-saved, 'more ')}({-share:.1%}) {against}: {counts}"


def _count(n: int, more: str = "") -> str:
    """``1 instance``, ``2 instances`` (``more`` goes before the noun)."""
    return f"{n} {more}instance{'' if n == 1 else 's'}" + (" " if more else "")


def run_plan(
    configs: Sequence[PlanConfig],
    trace: Trace,
    targets: Sequence[Target],
    max_instances: int = DEFAULT_MAX_INSTANCES,
    *,
    executor: str = "local",
    jobs: int = 0,
    address: str | None = None,
    progress: bool | None = None,
) -> Plan:
    """Search every configuration (module docstring) and return the :class:`Plan`.

    ``executor``/``jobs``/``address`` as :func:`studies.sweep.run_sweep`; ``progress``: a bar
    over evaluations (None = only on a terminal). A failing simulation raises.
    """
    from tqdm import tqdm

    if not targets:
        raise StudyError("a plan needs at least one target")
    bar = tqdm(
        total=len(configs) * Search(max_instances).remaining_bound(),
        desc="plan",
        unit="run",
        disable=None if progress is None else not progress,
        smoothing=0,
    )

    def on_wave(searches: Sequence[Search]) -> None:
        bar.total = bar.n + sum(s.remaining_bound() for s in searches)
        bar.refresh()

    dicts = [c.config for c in configs]
    try:
        with Executor(trace, executor, jobs, address, on_done=lambda: bar.update(1)) as ex:
            searches = run_searches(
                len(configs), targets, max_instances, lambda wave: ex.run(dicts, wave), on_wave
            )
    finally:
        bar.close()
    return Plan(
        list(targets),
        max_instances,
        [
            ConfigPlan(c, s.answer, sorted(s.evaluations.values(), key=_n), s.monotone)
            for c, s in zip(configs, searches, strict=True)
        ],
    )


def _n(e: Evaluation) -> int:
    return e.instances


def write_plan(plan: Plan, out: Any) -> list[Any]:
    """``plan.json``, ``plan.csv``, ``plan.png`` and ``plan.html`` (the report: targets,
    savings, table and figure) in folder ``out`` (created), atomically; the paths written."""
    from pathlib import Path

    import pandas as pd

    from studies.plan.figure import plot_plan
    from studies.plan.html import plan_html
    from traces.fsutil import (
        write_bytes_atomic,
        write_csv_atomic,
        write_json_atomic,
        write_text_atomic,
    )

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    names = ("plan.json", "plan.csv", "plan.png", "plan.html")
    paths = [folder / n for n in names]
    write_json_atomic(plan.to_json(), paths[0], indent=1)
    write_csv_atomic(pd.DataFrame(plan.rows()), paths[1])
    write_bytes_atomic(plot_plan(plan), paths[2])
    write_text_atomic(plan_html(plan), paths[3])
    return paths


__all__ = [
    "DEFAULT_MAX_INSTANCES",
    "DEFAULT_VARIANTS",
    "ConfigPlan",
    "Evaluation",
    "Plan",
    "PlanConfig",
    "Search",
    "Target",
    "Variant",
    "arrival_span_s",
    "build_configs",
    "check_settable",
    "format_seconds",
    "parse_target",
    "parse_variant",
    "run_plan",
    "savings_lines",
    "summary_keys",
    "write_plan",
]
