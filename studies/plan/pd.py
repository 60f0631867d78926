"""Capacity planning for prefill/decode disaggregation (``hicache-sim plan --pd``): the
cheapest prefill:decode split (GPUs = prefill servers x prefill ``model.tp`` + decode servers
x decode ``model.tp``) whose PD run (:mod:`sim.pd`) meets every target and is not overloaded,
per configuration, and what decode-side HiCache changes, like for like.

A configuration is the base config (``pd.enabled``) with a variant's overrides; by default the
variants differ on the decode side only (:data:`DEFAULT_PD_VARIANTS`): no decode radix cache,
the decode radix cache alone (device, L1), and with a host tier (L1 + L2, ``cache.hicache_ratio
= 2`` on the decode servers). A variant's ``pd.prefill_set`` / ``pd.decode_set`` items are
appended to the base's (a role keeps its TP or GPU when a variant adds a cache setting).

The search is :mod:`~studies.plan.pd_search` (monotone in each role's count); the evaluations
run in waves on the plan's executors (:class:`~studies.plan.evaluate.Executor`), one wave
holding every split that any configuration asks for next. GPU-hours = GPUs x the trace's
arrival span (as the single-role plan's); servers per role: instances placed whole on that
role's ``gpu.server`` (prefill and decode on servers of their own); host DRAM per instance:
the role's host pool over its TP ranks (a decode server has one only with the decode radix
cache and ``cache.enable_host``: :func:`sim.pd.run.decode_hicache`). The TTFT zero-load
floor is the prefill role's (:mod:`~studies.plan.floor`): TTFT includes the prefill, so no
split beats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from studies.errors import StudyError
from studies.plan.evaluate import Config, Executor
from studies.plan.pd_search import (
    PdEvaluation,
    PdSearch,
    Point,
    pd_trend_notes,
    run_pd_searches,
    split,
)
from studies.plan.targets import (
    Slo,
    Target,
    Variant,
    best_value,
    check_names,
    floor_misses,
    format_seconds,
)

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from traces.schema import Trace

#: The default PD grid: the decode side without a radix cache, with one (L1), and with one
#: backed by a host pool twice the device pool (L1 + L2). The prefill side is the base's.
DEFAULT_PD_VARIANTS = (
    Variant("decode cache off", ("pd.decode_radix_cache=false",)),
    Variant("decode radix cache (L1)",
            ("pd.decode_radix_cache=true", "pd.decode_set=cache.enable_host=false")),
    Variant("decode L1+L2 (host x2)", ("pd.decode_radix_cache=true",
            "pd.decode_set=cache.enable_host=true;cache.hicache_ratio=2")),
)  # fmt: skip
#: Keys a PD plan sets itself, or that mean nothing in a PD run.
PD_PLANNER_KEYS = {
    "pd.prefill_instances": "is what the plan searches; do not set it",
    "pd.decode_instances": "is what the plan searches; do not set it",
    "cluster.instances": "is not used by a PD run (the plan searches pd.prefill_instances and "
    "pd.decode_instances)",
    "pd.enabled": "is set by --pd",
    "router.policy": "is not used by a PD run: set pd.prefill_router / pd.decode_router",
}
#: The role settings a variant appends to the base's.
ROLE_SETS = ("pd.prefill_set", "pd.decode_set")


def check_pd_settable(key: str, where: str) -> None:
    """``StudyError`` when ``key`` is one a PD plan sets itself or a PD run ignores."""
    if key in PD_PLANNER_KEYS:
        raise StudyError(f"{where}: {key} {PD_PLANNER_KEYS[key]}")


def parse_pd_variant(text: str) -> Variant:
    """:func:`~studies.plan.targets.parse_variant` for a PD plan: also refuses the keys a PD
    plan sets itself or a PD run ignores (:data:`PD_PLANNER_KEYS`)."""
    from studies.plan.targets import _ITEM_SPLIT, parse_variant

    _, _, body = text.partition(":")
    for item in _ITEM_SPLIT.split(body):
        check_pd_settable(item.partition("=")[0].strip(), f"--variant {text!r}")
    return parse_variant(text)


@dataclass(frozen=True)
class RoleSetup:
    """One role of a PD configuration, resolved (sim.pd.run.role_configs)."""

    role: str
    config: Config = field(repr=False)
    tp: int
    device_tokens: int
    host_tokens: int
    kv_bytes_per_token: int
    instances_per_server: int
    setup: str

    @property
    def host_dram_gb(self) -> float:
        """Host DRAM for the KV host pool of one instance, all its TP ranks (GB, 1e9 B)."""
        return self.host_tokens * self.kv_bytes_per_token * self.tp / 1e9

    def servers(self, instances: int) -> int:
        return -(-instances // self.instances_per_server)


@dataclass(frozen=True)
class PdPlanConfig:
    """One configuration of a PD plan: a variant of the base, resolved per role."""

    variant: str
    overrides: tuple[str, ...]
    config: Config = field(repr=False)
    prefill: RoleSetup
    decode: RoleSetup
    span_s: float
    refused: str = ""
    """Why the plan does not evaluate it (a role's host pools overfill a full server)."""

    @property
    def name(self) -> str:
        return self.variant

    @property
    def decode_radix_cache(self) -> bool:
        return bool(self.config["pd"]["decode_radix_cache"])

    def gpus(self, point: Point) -> int:
        return point[0] * self.prefill.tp + point[1] * self.decode.tp


def _variant_overrides(base: SimConfig, v: Variant) -> list[str]:
    """``v``'s overrides with its role settings appended to the base's."""
    out = []
    for item in v.overrides:
        key, _, value = item.partition("=")
        key = key.strip()
        if key in ROLE_SETS:
            own = getattr(base.pd, key.removeprefix("pd."))
            value = ";".join(s for s in (own.strip(), value.strip()) if s)
            item = f"{key}={value}"
        out.append(item)
    return out


def build_pd_configs(
    base: SimConfig, trace: Trace, variants: Sequence[Variant] = DEFAULT_PD_VARIANTS
) -> list[PdPlanConfig]:
    """Every variant of ``base`` (``pd.enabled``), resolved per role. Raises ``StudyError``
    (one line naming the variant) for an invalid one."""
    from hicache.config import config_to_dict, with_overrides
    from sim.pd.run import decode_hicache, role_configs
    from studies.plan import arrival_span_s

    if not base.pd.enabled:
        raise StudyError("a PD plan needs pd.enabled")
    check_names(variants)
    out = []
    for v in variants:
        where = f"--variant {v.name!r}"
        for item in v.overrides:
            check_pd_settable(item.partition("=")[0].strip(), where)
        try:
            cfg = with_overrides(base, [*_variant_overrides(base, v),
                                        "gpu.allow_host_overcommit=true"])  # fmt: skip
            pre, dec = role_configs(cfg)
        except ValueError as e:
            raise StudyError(f"{where}: {e}") from None
        if cfg.pd.decode_radix_cache and dec.sglang.version != "0.5.23":
            raise StudyError(
                f"{where}: the decode radix cache (pd.decode_radix_cache) is modelled for "
                f"sglang.version 0.5.23 only, not {dec.sglang.version}: drop "
                "--sglang-version, or give variants without it"
            )
        roles = (_role(pre, "prefill", base, host=pre.cache.enable_host),
                 _role(dec, "decode", base, host=decode_hicache(dec)))  # fmt: skip
        refused = "; ".join(r for _, r in roles if r)
        span = arrival_span_s(trace, cfg.workload.rate_scale, cfg.workload.max_requests)
        data = config_to_dict(cfg)
        data["gpu"]["allow_host_overcommit"] = base.gpu.allow_host_overcommit
        out.append(PdPlanConfig(v.name, v.overrides, data, roles[0][0], roles[1][0], span,
                                refused))  # fmt: skip
    return out


def _role(rc: SimConfig, role: str, base: SimConfig, *, host: bool) -> tuple[RoleSetup, str]:
    """The role's setup and why it is refused ("" if it is not): with a host tier, its host
    pools must fit a full server of its instances (the plan may propose that many)."""
    from hicache.config import config_to_dict, host_memory, resolve_pools, server_for

    device, host_tokens, bpt = resolve_pools(rc)
    server = server_for(rc)
    per_server = max(1, server.gpus // rc.model.tp)
    setup = (f"{role}: {rc.model.spec.name} on {rc.gpu.name} x TP{rc.model.tp}, {server.name} "
             f"({server.gpus} GPUs per server)")  # fmt: skip
    refused = ""
    if host:
        need = host_memory(rc, per_server)
        if need is not None and need.over and not base.gpu.allow_host_overcommit:
            refused = (f"not evaluated: the {role} role's {need.describe()} "
                       "(--allow-host-overcommit: anyway)")  # fmt: skip
    data = config_to_dict(rc)
    setup_ = RoleSetup(role, data, rc.model.tp, device, host_tokens if host else 0, bpt,
                       per_server, setup)  # fmt: skip
    return setup_, refused


@dataclass
class PdConfigPlan:
    """The outcome for one configuration: the cheapest passing split (None: none within
    the box) and every evaluated split."""

    config: PdPlanConfig
    split: Point | None
    evaluations: list[PdEvaluation]
    monotone: bool = True
    trends: list[str] = field(default_factory=list)
    floors: dict[str, float] = field(default_factory=dict)
    bounds: Point | None = None
    """The search's step 1: the fewest prefill (decode) servers that pass with the most of
    the other role."""

    @property
    def chosen(self) -> dict[str, Any] | None:
        return next((e.summary for e in self.evaluations if e.point == self.split), None)

    @property
    def gpus(self) -> int | None:
        return None if self.split is None else self.config.gpus(self.split)

    @property
    def servers(self) -> tuple[int, int] | None:
        if self.split is None:
            return None
        return (self.config.prefill.servers(self.split[0]),
                self.config.decode.servers(self.split[1]))  # fmt: skip

    @property
    def gpu_hours(self) -> float | None:
        return None if self.gpus is None else self.gpus * self.config.span_s / 3600.0

    def best(self, target: Target) -> tuple[float, Point] | None:
        """The best value of ``target``'s key over the evaluated splits, and where."""
        return best_value(target, ((e.point, e.summary) for e in self.evaluations))

    def out_of_reach(self, target: Target) -> bool:
        """Whether the zero-load floor alone misses ``target``: no split can meet it."""
        return floor_misses(target, self.floors)


@dataclass
class PdPlan:
    """A finished PD plan: its targets, the box searched and one :class:`PdConfigPlan` per
    configuration."""

    targets: list[Target]
    max_instances: int
    """The most servers per role searched."""
    configs: list[PdConfigPlan]
    slo: Slo | None = None
    gpu_hour_usd: float = 0.0
    trace: str = ""
    seeds: int = 1

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per configuration (the CSV, the table)."""
        from studies.plan.pd_rows import pd_row

        return [pd_row(self, c) for c in self.configs]

    def to_json(self) -> dict[str, Any]:
        from studies.plan.pd_savings import pd_savings_lines

        return {
            "pd": True,
            "targets": [
                {"key": t.key, "limit": t.limit, "op": t.op, "label": t.label} for t in self.targets
            ],
            "slo": None if self.slo is None else self.slo._asdict(),
            "gpu_hour_usd": self.gpu_hour_usd,
            "trace": self.trace,
            "max_instances_per_role": self.max_instances,
            "seeds": self.seeds,
            "search": "cheapest prefill:decode split in GPUs, assuming the verdict is monotone "
            "in each role's count (studies.plan.pd_search)",
            "gpu_hours_basis": "(prefill servers x prefill model.tp + decode servers x decode "
            "model.tp) x arrival span (last - first arrival, at workload.rate_scale)",
            "configurations": [
                {
                    **row,
                    "config": c.config.config,
                    "bounds": None if c.bounds is None else list(c.bounds),
                    "evaluations": [e._asdict() for e in c.evaluations],
                }
                for row, c in zip(self.rows(), self.configs, strict=True)
            ],
            "savings": pd_savings_lines(self),
            "notes": self.notes(),
        }

    def notes(self) -> list[str]:
        """Targets out of reach at zero load, the best values where a target was missed,
        the assumption contradicted, and the seeds that missed a target."""
        from studies.plan import seed_lines

        out = []
        for c in self.configs:
            name = c.config.name
            if c.config.refused:
                out.append(f"{name}: {c.config.refused}")
                continue
            for t in self.targets:
                best = c.best(t)
                if c.out_of_reach(t):
                    out.append(f"{name}: {_floor_line(t, c)}")
                elif c.split is None and best is not None and not t.meets(best[0]):
                    out.append(f"{name}: {t.label} missed; best {_shown(t.key, best[0])} at "
                               f"{split(best[1])}")  # fmt: skip
            if not c.monotone:
                out.append(
                    f"{name}: the verdict is not monotone in the servers per role (a split "
                    "failed although one with no more servers of either role passed): the "
                    "answer passes but may not be the cheapest"
                )
            out.extend(f"{name}: {line}" for line in c.trends)
            if c.split is not None:
                at = f"at {split(c.split)}"
                out.extend(f"{name}: {line}" for line in seed_lines(self.targets, c.chosen, at))
        return out


def _shown(key: str, value: float) -> str:
    return format_seconds(value) if key.endswith("_s") else f"{value:.4g}"


def _floor_line(t: Target, c: PdConfigPlan) -> str:
    floor = c.floors[t.key]
    what = t.key.removeprefix("ttft_").removesuffix("_s")
    which = "the mean prompt" if what == "mean" else f"the {what} prompt"
    return (
        f"{t.label} is out of reach: on an idle prefill server, with every earlier prefix "
        f"cached, {which} alone needs {format_seconds(floor)} of prefill at "
        f"TP{c.config.prefill.tp}; no split meets it: raise the prefill role's model.tp "
        "(pd.prefill_set) or relax the target"
    )


def run_pd_plan(
    configs: Sequence[PdPlanConfig],
    trace: Trace,
    targets: Sequence[Target],
    max_instances: int = 64,
    *,
    executor: str = "local",
    jobs: int = 0,
    address: str | None = None,
    progress: bool | None = None,
    slo: Slo | None = None,
    gpu_hour_usd: float = 0.0,
    seeds: int = 1,
) -> PdPlan:
    """Search every configuration (up to ``max_instances`` servers per role) and return the
    :class:`PdPlan`; the arguments as :func:`studies.plan.run_plan`'s."""
    from tqdm import tqdm

    if not targets:
        raise StudyError("a plan needs at least one target")
    if slo is None and any(t.key == "goodput" for t in targets):
        raise StudyError("a goodput target needs an SLO: --slo ttft=2s,tpot=50ms")
    active = [c for c in configs if not c.refused]
    searches = [PdSearch(max_instances, max_instances, c.prefill.tp, c.decode.tp) for c in active]
    k = max(1, seeds)
    bar = tqdm(total=sum(s.remaining_bound() for s in searches) * k, desc="plan", unit="run",
               disable=None if progress is None else not progress, smoothing=0)  # fmt: skip

    def on_wave(done: Sequence[PdSearch]) -> None:
        bar.total = bar.n + sum(s.remaining_bound() for s in done) * k
        bar.refresh()

    dicts = [c.config for c in active]
    try:
        with Executor(trace, executor, jobs, address, lambda: bar.update(1), slo, seeds) as ex:
            run_pd_searches(searches, targets, lambda wave: ex.run(dicts, wave), on_wave)
    finally:
        bar.close()
    found = dict(zip(map(id, active), searches, strict=True))
    plans = []
    for c in configs:
        floors = _floors(c, trace, targets)
        s = found.get(id(c))
        if s is None:
            plans.append(PdConfigPlan(c, None, [], floors=floors))
            continue
        evals = sorted(s.evaluations.values(), key=lambda e: e.point)
        trends = pd_trend_notes(s.evaluations, targets)
        plans.append(PdConfigPlan(c, s.answer, evals, s.monotone, trends, floors, s.bounds))
    name = trace.path.name if trace.path else ""
    return PdPlan(list(targets), max_instances, plans, slo, gpu_hour_usd, name, k)


def _floors(c: PdPlanConfig, trace: Trace, targets: Sequence[Target]) -> dict[str, float]:
    """The zero-load floor of every TTFT target, on the prefill role's config."""
    from hicache.config import config_from_dict
    from studies.plan.floor import request_floors, target_floor

    if c.refused or not any(target_floor(t, [0.0]) is not None for t in targets):
        return {}
    per_request = request_floors(config_from_dict(c.prefill.config), trace)
    return {t.key: f for t in targets if (f := target_floor(t, per_request)) is not None}


def write_pd_plan(plan: PdPlan, out: Any) -> list[Any]:
    """``plan.json``, ``plan.csv``, ``plan.png`` and ``plan.html`` in folder ``out``
    (created), atomically; the paths written."""
    from pathlib import Path

    import pandas as pd

    from studies.plan.pd_report import pd_plan_html, plot_pd_plan
    from traces.fsutil import (
        write_bytes_atomic,
        write_csv_atomic,
        write_json_atomic,
        write_text_atomic,
    )

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / n for n in ("plan.json", "plan.csv", "plan.png", "plan.html")]
    write_json_atomic(plan.to_json(), paths[0], indent=1)
    write_csv_atomic(pd.DataFrame(plan.rows()), paths[1])
    write_bytes_atomic(plot_pd_plan(plan), paths[2])
    write_text_atomic(pd_plan_html(plan), paths[3])
    return paths


__all__ = [
    "DEFAULT_PD_VARIANTS",
    "PD_PLANNER_KEYS",
    "PdConfigPlan",
    "PdPlan",
    "PdPlanConfig",
    "RoleSetup",
    "build_pd_configs",
    "check_pd_settable",
    "parse_pd_variant",
    "run_pd_plan",
    "write_pd_plan",
]
