"""What HiCache saves in a plan, like for like.

A saving is claimed only between two configurations of the same router that differ in the
host tier alone (:data:`HOST_TIER_KEYS`: whether there is one, its size, the write policy, the
copy path, L3): a baseline without a host tier and a variant with one. Two variants that also
differ in ``model.tp``, the GPU, the server, the scheduler or anything else are not compared:
what they differ by would be counted as HiCache's. Each saving is stated in instances, GPUs,
servers and GPU-hours (and cost, given a price per GPU-hour).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.plan import ConfigPlan, Plan

__all__ = ["HOST_TIER_KEYS", "differences", "like_for_like", "savings_lines"]

#: The keys that make up the host tier (and L3 behind it); the rest must match.
HOST_TIER_KEYS = frozenset({
    "cache.enable_host", "cache.hicache_ratio", "cache.hicache_size_gb",
    "cache.hicache_host_memory_fraction", "cache.write_policy", "cache.load_back_threshold",
    "link.io_backend", "link.mem_layout", "gpu.host_memory_gb", "gpu.allow_host_overcommit",
})  # fmt: skip
#: Whole sections that belong to the host tier.
HOST_TIER_SECTIONS = frozenset({"storage"})


def differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    """The ``section.key`` names outside the host tier where configs ``a`` and ``b`` differ."""
    out = []
    for section in sorted(set(a) | set(b)):
        if section in HOST_TIER_SECTIONS:
            continue
        sa, sb = a.get(section, {}), b.get(section, {})
        for key in sorted(set(sa) | set(sb)):
            name = f"{section}.{key}"
            if name not in HOST_TIER_KEYS and sa.get(key) != sb.get(key):
                out.append(name)
    return out


def _baseline(c: ConfigPlan) -> bool:
    return not c.config.config["cache"]["enable_host"]


def like_for_like(plan: Plan) -> tuple[list[tuple[ConfigPlan, list[ConfigPlan]]], list[str]]:
    """``([(baseline, [its like tiered configurations]), ...], [why a tiered one has none])``."""
    pairs, unmatched = [], []
    configs = plan.configs
    matched: set[int] = set()
    for base in (c for c in configs if _baseline(c)):
        likes = [
            c for c in configs
            if not _baseline(c) and c.config.router == base.config.router
            and not differences(base.config.config, c.config.config)
        ]  # fmt: skip
        matched.update(id(c) for c in likes)
        if likes:
            pairs.append((base, likes))
    bases = [c for c in configs if _baseline(c)]
    for c in configs:
        if _baseline(c) or id(c) in matched or not bases or c.config.refused:
            continue
        same_router = [b for b in bases if b.config.router == c.config.router] or bases
        diff = min((differences(b.config.config, c.config.config) for b in same_router), key=len)
        shown = ", ".join(diff[:4]) + (", ..." if len(diff) > 4 else "")
        unmatched.append(
            f"{c.config.name}: no baseline without a host tier that differs from it in the "
            f"host tier alone (the closest also differs in {shown}): no saving claimed"
        )
    return pairs, unmatched


def savings_lines(plan: Plan, gpu_hour_usd: float = 0.0) -> list[str]:
    """One line per like-for-like baseline (the best of its tiered variants against it), then
    one per tiered configuration without a like baseline; none without any baseline."""
    pairs, unmatched = like_for_like(plan)
    lines = []
    for base, likes in pairs:
        best = min(likes, key=lambda c: math.inf if c.instances is None else c.instances)
        lines.append(f"{base.config.router}: {_saving(base, best, plan, gpu_hour_usd)}")
    return lines + unmatched


def _saving(base: ConfigPlan, best: ConfigPlan, plan: Plan, usd: float) -> str:
    cap = plan.max_instances
    name = f"HiCache ({best.config.variant})"
    against = f"against {base.config.variant}"
    if best.instances is None:
        if base.instances is None:
            return f"neither {name} nor {base.config.variant} meets the targets within {cap}"
        return f"{name} needs more than {cap} instances, {base.config.variant} {base.instances}"
    if base.instances is None:
        at_least = cap + 1 - best.instances
        return (
            f"HiCache saves at least {_count(at_least, 'instance')} (>= "
            f"{at_least / (cap + 1):.1%}) {against}: {best.instances} with "
            f"{best.config.variant}, more than {cap} without"
        )
    saved = base.instances - best.instances
    share = saved / base.instances
    counts = f"{_fleet(best)} with {best.config.variant}, {_fleet(base)} without"
    if saved < 0:
        return f"HiCache needs {_count(-saved, 'more instance')} ({-share:.1%}) {against}: {counts}"
    gpus = (base.gpus or 0) - (best.gpus or 0)
    servers = (base.servers or 0) - (best.servers or 0)
    hours = (base.gpu_hours or 0.0) - (best.gpu_hours or 0.0)
    cost = f", ${hours * usd:,.0f}" if usd > 0 else ""
    return (
        f"HiCache saves {_count(saved, 'instance')}, {_count(gpus, 'GPU')}, "
        f"{_count(servers, 'server')} ({share:.1%}; {hours:.3g} GPU-hours{cost}) {against}: "
        f"{counts}"
    )


def _fleet(c: ConfigPlan) -> str:
    return (
        f"{_count(c.instances or 0, 'instance')} ({_count(c.gpus or 0, 'GPU')}, "
        f"{_count(c.servers or 0, 'server')})"
    )


def _count(n: int, noun: str) -> str:
    """``1 instance``, ``2 GPUs``, ``0 servers``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
