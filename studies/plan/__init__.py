"""Capacity planning: how many instances (GPUs) does a workload need to meet latency
targets, with and without HiCache's host tier, and so how many does HiCache save?

A plan is a grid of named configurations (a base config × variants × routers; by default
"no host tier", "host x2" and "host x4", :data:`~studies.plan.targets.DEFAULT_VARIANTS`) and
targets (bounds on summary keys and goodput, :func:`~studies.plan.targets.parse_target`). For
each configuration it finds the smallest ``cluster.instances`` in ``[1, max_instances]`` whose
run meets every target and is not overloaded (:mod:`~studies.plan.search`: doubling, then
bisection, assuming latency does not grow with N), and reports the instances, GPUs
(instances × ``model.tp``), servers (instances packed whole onto ``gpu.server``'s GPUs),
GPU-hours and host DRAM that take. Where a target is missed it reports the best value reached
and, for TTFT, the zero-load floor (:mod:`~studies.plan.floor`); savings are claimed only like
for like (:mod:`~studies.plan.savings`).

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from studies.errors import StudyError
from studies.plan.evaluate import Config, Executor
from studies.plan.savings import savings_lines
from studies.plan.search import Evaluation, Search, numeric_keys, run_searches, trend_notes
from studies.plan.targets import (
    DEFAULT_VARIANTS,
    ROUTER_KEY,
    Slo,
    Target,
    Variant,
    best_value,
    check_names,
    check_settable,
    floor_misses,
    format_seconds,
    parse_slo,
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
    instances_per_server: int = 1
    """How many instances of ``tp`` GPUs one ``gpu.server`` holds."""
    setup: str = ""
    """Model, GPU, TP and server, for the reader (``qwen3-32b on h200 x TP2, dgx-h200``)."""
    refused: str = ""
    """Why the plan does not evaluate it (its host pools do not fit a full server's DRAM)."""

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
    from hicache.config import (
        ROUTER_POLICIES,
        config_to_dict,
        host_memory,
        resolve_pools,
        server_for,
        with_overrides,
    )

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
            try:  # the host-memory check below, for a whole server, instead of for one
                cfg = with_overrides(base, [*v.overrides, f"{ROUTER_KEY}={router}",
                                            "gpu.allow_host_overcommit=true"])  # fmt: skip
            except ValueError as e:
                raise StudyError(f"--variant {v.name!r}: {e}") from None
            device, host, bpt = resolve_pools(cfg)
            span = arrival_span_s(trace, cfg.workload.rate_scale, cfg.workload.max_requests)
            server = server_for(cfg)
            setup = (f"{cfg.model.spec.name} on {cfg.gpu.name} x TP{cfg.model.tp}, "
                     f"{server.name} ({server.gpus} GPUs per server)")  # fmt: skip
            per_server = max(1, server.gpus // cfg.model.tp)
            # the plan may propose a full server of instances: their host pools must fit it
            need = host_memory(cfg, per_server)
            refused = ""
            if need is not None and need.over and not base.gpu.allow_host_overcommit:
                refused = f"not evaluated: {need.describe()} (--allow-host-overcommit: anyway)"
            data = config_to_dict(cfg)
            data["gpu"]["allow_host_overcommit"] = base.gpu.allow_host_overcommit
            out.append(
                PlanConfig(v.name, router, v.overrides, data, device, host, bpt, cfg.model.tp,
                           span, per_server, setup, refused)
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
    trends: list[str] = field(default_factory=list)
    """Where a target's value got worse as N grew (:func:`~studies.plan.search.trend_notes`)."""
    floors: dict[str, float] = field(default_factory=dict)
    """The zero-load floor of each TTFT target's key (:mod:`~studies.plan.floor`)."""

    @property
    def chosen(self) -> dict[str, Any] | None:
        """The summary of the run at the chosen N."""
        return next((e.summary for e in self.evaluations if e.instances == self.instances), None)

    @property
    def gpus(self) -> int | None:
        return None if self.instances is None else self.instances * self.config.tp

    @property
    def servers(self) -> int | None:
        """Servers the instances take, each instance whole on one server."""
        if self.instances is None:
            return None
        return -(-self.instances // self.config.instances_per_server)

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpus is None else self.gpus * self.config.span_s / 3600.0

    def best(self, target: Target) -> tuple[float, int] | None:
        """The best value of ``target``'s key over the evaluated N, and that N (None: none)."""
        return best_value(target, ((e.instances, e.summary) for e in self.evaluations))

    def out_of_reach(self, target: Target) -> bool:
        """Whether the zero-load floor alone misses ``target``: no N can meet it."""
        return floor_misses(target, self.floors)


@dataclass
class Plan:
    """A finished plan: its targets, limits and one :class:`ConfigPlan` per configuration."""

    targets: list[Target]
    max_instances: int
    configs: list[ConfigPlan]
    slo: Slo | None = None
    gpu_hour_usd: float = 0.0
    trace: str = ""
    """The trace's file name (for the report's reader)."""
    seeds: int = 1
    """Replicas per evaluation (``--seeds``; :mod:`sim.seeds`): targets are judged on their
    medians."""

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
                "servers": c.servers,
                "instances_per_server": c.config.instances_per_server,
                "gpu_hours": c.gpu_hours,
                "cost_usd": None
                if c.gpu_hours is None or not self.gpu_hour_usd
                else c.gpu_hours * self.gpu_hour_usd,
                "setup": c.config.setup,
                "arrival_span_s": c.config.span_s,
                "host_dram_gb_per_instance": c.config.host_dram_gb,
                "host_gb_per_rank": c.config.host_tokens * c.config.kv_bytes_per_token / 1e9,
                "device_gb_per_rank": c.config.device_tokens * c.config.kv_bytes_per_token / 1e9,
                "device_tokens": c.config.device_tokens,
                "host_tokens": c.config.host_tokens,
                "hit_rate": chosen.get("hit_rate"),
                "device_hit_rate": chosen.get("device_hit_rate"),
                "host_hit_rate": chosen.get("host_hit_rate"),
                "storage_hit_rate": chosen.get("storage_hit_rate"),
                "idle_instances": len(chosen.get("idle_instances", [])),
            }
            for t in self.targets:
                row[t.key] = chosen.get(t.key)
                best = c.best(t)
                row[f"{t.key}_best"] = None if best is None else best[0]
                row[f"{t.key}_best_at"] = None if best is None else best[1]
                row[f"{t.key}_floor"] = c.floors.get(t.key)
                if self.seeds > 1:
                    iv = chosen.get("seeds", {}).get("intervals", {}).get(t.key, {})
                    row[f"{t.key}_lo"], row[f"{t.key}_hi"] = iv.get("lo"), iv.get("hi")
            if self.seeds > 1:
                row["seeds"] = self.seeds
            row["evaluations"] = len(c.evaluations)
            row["monotone"] = c.monotone
            row["overrides"] = ";".join(c.config.overrides)
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        """Everything: targets, configurations with their resolved configs, every evaluated
        N with its verdict and summary, and the savings lines."""
        return {
            "targets": [
                {"key": t.key, "limit": t.limit, "op": t.op, "label": t.label} for t in self.targets
            ],
            "slo": None if self.slo is None else self.slo._asdict(),
            "gpu_hour_usd": self.gpu_hour_usd,
            "trace": self.trace,
            "max_instances": self.max_instances,
            "seeds": self.seeds,
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
            "savings": savings_lines(self, self.gpu_hour_usd),
            "notes": self.notes(),
        }

    def notes(self) -> list[str]:
        """What a reader must know besides the table: targets out of reach at zero load, the
        best value reached where a target was missed, routers that left instances idle, and
        latency that rose with N (the search's assumption broken)."""
        out = []
        for c in self.configs:
            if c.config.refused:
                out.append(f"{c.config.name}: {c.config.refused}")
                continue
            for t in self.targets:
                if c.out_of_reach(t):
                    out.append(f"{c.config.name}: {_floor_line(t, c)}")
                elif (
                    c.instances is None and (best := c.best(t)) is not None and not t.meets(best[0])
                ):
                    floor = c.floors.get(t.key)
                    extra = "" if floor is None else f"; zero-load floor {_shown(t.key, floor)}"
                    out.append(
                        f"{c.config.name}: {t.label} missed; best {_shown(t.key, best[0])} at "
                        f"N = {best[1]}{extra}"
                    )
            idle = (c.chosen or {}).get("idle_instances", [])
            if idle and c.instances:
                out.append(
                    f"{c.config.name}: the {c.config.router} router used "
                    f"{c.instances - len(idle)} of {c.instances} instances; more instances "
                    "change nothing for it"
                )
            if not c.monotone:
                out.append(
                    f"{c.config.name}: latency is not monotone in N (a smaller N passed while "
                    "a larger failed): the answer passes but may not be the minimum"
                )
            out.extend(f"{c.config.name}: {line}" for line in c.trends)
            at = f"at N = {c.instances}"
            out.extend(
                f"{c.config.name}: {line}" for line in seed_lines(self.targets, c.chosen, at)
            )
        return out


def seed_lines(targets: Sequence[Target], chosen: dict[str, Any] | None, at: str) -> list[str]:
    """Under ``--seeds``, per target that some seeds missed in the summary ``chosen`` (the
    chosen size, ``at``: "at N = 4"): the median it was judged on, the interval over the
    seeds and in how many seeds it was met."""
    block = (chosen or {}).get("seeds")
    if not block:
        return []
    runs, (lo_q, hi_q) = block["runs"], block["interval"]
    lines = []
    for t in targets:
        iv = block["intervals"].get(t.key)
        if iv is None:
            continue
        met = sum(t.meets(float(r[t.key])) for r in runs if t.key in r)
        if met == len(runs):  # the table's interval says enough
            continue
        lines.append(
            f"{at}, {t.key} median {_shown(t.key, iv['median'])} "
            f"(p{round(lo_q * 100)} - p{round(hi_q * 100)} over {len(runs)} seeds: "
            f"{_shown(t.key, iv['lo'])} - {_shown(t.key, iv['hi'])}); {t.label} met in "
            f"{met} of {len(runs)} seeds"
        )
    return lines


def _shown(key: str, value: float) -> str:
    return format_seconds(value) if key.endswith("_s") else f"{value:.4g}"


def _floor_line(t: Target, c: ConfigPlan) -> str:
    floor = c.floors[t.key]
    what = t.key.removeprefix("ttft_").removesuffix("_s")
    which = "the mean prompt" if what == "mean" else f"the {what} prompt"
    return (
        f"{t.label} is out of reach: on an idle server, with every earlier prefix cached, "
        f"{which} alone needs {format_seconds(floor)} of prefill at TP{c.config.tp}; no "
        "instance count meets it: raise model.tp or relax the target"
    )


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
    slo: Slo | None = None,
    gpu_hour_usd: float = 0.0,
    seeds: int = 1,
) -> Plan:
    """Search every configuration (module docstring) and return the :class:`Plan`.

    ``executor``/``jobs``/``address`` as :func:`studies.sweep.run_sweep`; ``progress``: a bar
    over evaluations (None = only on a terminal). ``slo``: what ``goodput`` counts (needed by
    a goodput target). ``gpu_hour_usd``: a price per GPU-hour for the cost column (0: none).
    ``seeds`` > 1: every evaluation is that many replicas over resampled traces
    (:mod:`sim.seeds`), judged on their medians. A failing simulation raises.
    """
    from tqdm import tqdm

    if not targets:
        raise StudyError("a plan needs at least one target")
    if slo is None and any(t.key == "goodput" for t in targets):
        raise StudyError("a goodput target needs an SLO: --slo ttft=2s,tpot=50ms")
    floors = [_floors(c, trace, targets) for c in configs]
    bar = tqdm(
        total=sum(not c.refused for c in configs)
        * Search(max_instances).remaining_bound()
        * max(1, seeds),
        desc="plan",
        unit="run",
        disable=None if progress is None else not progress,
        smoothing=0,
    )

    def on_wave(searches: Sequence[Search]) -> None:
        bar.total = bar.n + sum(s.remaining_bound() for s in searches) * max(1, seeds)
        bar.refresh()

    active = [c for c in configs if not c.refused]  # a refused one is never evaluated
    dicts = [c.config for c in active]
    try:
        with Executor(trace, executor, jobs, address, lambda: bar.update(1), slo, seeds) as ex:
            found = run_searches(
                len(active), targets, max_instances, lambda wave: ex.run(dicts, wave), on_wave
            )
    finally:
        bar.close()
    searches = dict(zip(map(id, active), found, strict=True))
    plans = []
    for c, f in zip(configs, floors, strict=True):
        s = searches.get(id(c))
        if s is None:
            plans.append(ConfigPlan(c, None, [], True, [], f))
            continue
        plans.append(ConfigPlan(c, s.answer, sorted(s.evaluations.values(), key=_n), s.monotone,
                                trend_notes(s.evaluations, targets), f))  # fmt: skip
    name = trace.path.name if trace.path else ""
    return Plan(list(targets), max_instances, plans, slo, gpu_hour_usd, name, max(1, seeds))


def _floors(c: PlanConfig, trace: Trace, targets: Sequence[Target]) -> dict[str, float]:
    """The zero-load floor of every TTFT target of ``c`` (none: no TTFT target)."""
    from hicache.config import config_from_dict
    from studies.plan.floor import request_floors, target_floor

    if c.refused or not any(target_floor(t, [0.0]) is not None for t in targets):
        return {}
    per_request = request_floors(config_from_dict(c.config), trace)
    out = {}
    for t in targets:
        floor = target_floor(t, per_request)
        if floor is not None:
            out[t.key] = floor
    return out


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
    "Slo",
    "Target",
    "Variant",
    "arrival_span_s",
    "build_configs",
    "check_settable",
    "format_seconds",
    "parse_slo",
    "parse_target",
    "parse_variant",
    "run_plan",
    "savings_lines",
    "seed_lines",
    "summary_keys",
    "write_plan",
]
