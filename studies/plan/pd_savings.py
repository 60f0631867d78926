"""What decode-side HiCache changes in a PD plan, like for like.

A baseline is a configuration without the decode radix cache (``pd.decode_radix_cache =
false``). A configuration with it is compared against a baseline only when the two differ in
the decode side's cache alone (:data:`DECODE_TIER_KEYS`: the radix cache, and the decode
role's host tier, :data:`~studies.plan.savings.HOST_TIER_KEYS`): the prefill role's resolved
config must be the same, key for key, and so must the decode role's outside those keys and
the PD settings (transfer, routers, reservations). Anything else they differ in would be
counted as decode-side HiCache's. A saving is stated in GPUs, servers per role and
GPU-hours; at the baseline's split the like configuration's own figures there (KV bytes the
decode cache saved, the target metrics) say what it changes when it saves nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from studies.plan.pd_search import split
from studies.plan.savings import HOST_TIER_KEYS, differences
from studies.plan.targets import format_seconds

if TYPE_CHECKING:
    from studies.plan.pd import PdConfigPlan, PdPlan, PdPlanConfig

#: The decode side's cache: its radix cache and its host tier (the decode role's keys).
DECODE_TIER_KEYS = HOST_TIER_KEYS | {"pd.decode_radix_cache"}
#: PD keys that are the decode cache, the searched counts, or the role settings (compared
#: through the roles' resolved configs instead).
_PD_OWN = frozenset({"decode_radix_cache", "prefill_instances", "decode_instances",
                     "prefill_set", "decode_set"})  # fmt: skip


def pd_differences(a: PdPlanConfig, b: PdPlanConfig) -> list[str]:
    """Where ``a`` and ``b`` differ outside the decode side's cache: ``prefill: KEY`` (any
    key of the prefill role), ``decode: KEY`` (outside :data:`DECODE_TIER_KEYS`) and
    ``pd.KEY``."""

    def roleless(c: dict[str, Any]) -> dict[str, Any]:
        return {s: body for s, body in c.items() if s != "pd"}

    pre_a, pre_b = roleless(a.prefill.config), roleless(b.prefill.config)
    out = [
        f"prefill: {s}.{k}"
        for s in sorted(set(pre_a) | set(pre_b))
        for k in sorted(set(pre_a.get(s, {})) | set(pre_b.get(s, {})))
        if pre_a.get(s, {}).get(k) != pre_b.get(s, {}).get(k)
    ]
    out += [f"decode: {k}" for k in differences(roleless(a.decode.config),
                                                roleless(b.decode.config))]  # fmt: skip
    pa, pb = a.config["pd"], b.config["pd"]
    out += [f"pd.{k}" for k in sorted((set(pa) | set(pb)) - _PD_OWN) if pa.get(k) != pb.get(k)]
    return out


def _baseline(c: PdConfigPlan) -> bool:
    return not c.config.decode_radix_cache


def like_for_like_pd(
    plan: PdPlan,
) -> tuple[list[tuple[PdConfigPlan, list[PdConfigPlan]]], list[str]]:
    """``([(baseline, [its like configurations with the decode cache]), ...], [why one has
    no like baseline])``."""
    configs = [c for c in plan.configs if not c.config.refused]
    bases = [c for c in configs if _baseline(c)]
    pairs: list[tuple[PdConfigPlan, list[PdConfigPlan]]] = []
    matched: set[int] = set()
    for base in bases:
        likes = [c for c in configs
                 if not _baseline(c) and not pd_differences(base.config, c.config)]  # fmt: skip
        matched.update(id(c) for c in likes)
        if likes:
            pairs.append((base, likes))
    unmatched = []
    for c in configs:
        if _baseline(c) or id(c) in matched or not bases:
            continue
        diff = min((pd_differences(b.config, c.config) for b in bases), key=len)
        shown = ", ".join(diff[:4]) + (", ..." if len(diff) > 4 else "")
        unmatched.append(
            f"{c.config.name}: no baseline without the decode radix cache that differs from it "
            f"in the decode cache alone (the closest also differs in {shown}): no saving claimed"
        )
    return pairs, unmatched


def pd_savings_lines(plan: PdPlan) -> list[str]:
    """Per like-for-like baseline: what its best like configuration saves (or "none at these
    targets"), then per like configuration what it changes at the baseline's split; then
    the configurations without a like baseline."""
    pairs, unmatched = like_for_like_pd(plan)
    lines = []
    for base, likes in pairs:
        best = min(likes, key=lambda c: math.inf if c.gpus is None else c.gpus)
        same = base.split is not None and all(c.split == base.split for c in likes)
        lines.append(_unchanged(base, likes) if same else _saving(base, best, plan))
        lines.extend(line for c in likes if (line := _at_split(base, c, plan)))
    return lines + unmatched


def _fleet(c: PdConfigPlan) -> str:
    servers = c.servers or (0, 0)
    return (f"{split(c.split or (0, 0))} ({_count(c.gpus or 0, 'GPU')}; "
            f"{servers[0]} + {servers[1]} servers)")  # fmt: skip


def _unchanged(base: PdConfigPlan, likes: list[PdConfigPlan]) -> str:
    names = [base.config.variant, *(c.config.variant for c in likes)]
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return (f"decode-side HiCache saves no GPUs at these targets (none): {listed} all need "
            f"{_fleet(base)}")  # fmt: skip


def _saving(base: PdConfigPlan, best: PdConfigPlan, plan: PdPlan) -> str:
    cap = plan.max_instances
    name, without = best.config.variant, base.config.variant
    head = "decode-side HiCache"
    if best.gpus is None or base.gpus is None:
        if best.gpus is None and base.gpus is None:
            return (f"{head}: neither {name} nor {without} meets the targets within {cap} "
                    "servers per role")  # fmt: skip
        if best.gpus is None:
            return (f"{head} ({name}) meets the targets with no split up to {cap}:{cap}, "
                    f"{without} with {_fleet(base)}")  # fmt: skip
        return (f"{head} ({name}) meets the targets with {_fleet(best)}, {without} with no "
                f"split up to {cap}:{cap}")  # fmt: skip
    saved = base.gpus - best.gpus
    counts = f"{_fleet(best)} with {name}, {_fleet(base)} with {without}"
    if saved == 0:
        return f"{head} saves no GPUs at these targets: {counts}"
    if saved < 0:
        return f"{head} ({name}) needs {_count(-saved, 'more GPU')}: {counts}"
    servers = sum(base.servers or (0, 0)) - sum(best.servers or (0, 0))
    hours = (base.gpu_hours or 0.0) - (best.gpu_hours or 0.0)
    usd = f", ${hours * plan.gpu_hour_usd:,.0f}" if plan.gpu_hour_usd > 0 else ""
    return (f"{head} ({name}) saves {_count(saved, 'GPU')}, {_count(servers, 'server')} "
            f"({saved / base.gpus:.1%}; {hours:.3g} GPU-hours{usd}) against {without}: "
            f"{counts}")  # fmt: skip


def _at_split(base: PdConfigPlan, c: PdConfigPlan, plan: PdPlan) -> str:
    """What ``c`` shows at ``base``'s split, where both evaluated it ("" where not)."""
    if base.split is None:
        return ""
    mine = next((e.summary for e in c.evaluations if e.point == base.split), None)
    theirs = base.chosen
    if mine is None or theirs is None:
        return ""
    parts = []
    share = mine.get("transfer_bytes_saved_share")
    if share is not None:
        parts.append(f"sends {share:.1%} fewer KV bytes")
    hit = mine.get("roles", {}).get("decode", {}).get("hit_rate")
    if hit is not None and hit == hit:
        parts.append(f"decode hit rate {hit:.1%}")
    for t in plan.targets:
        a, b = mine.get(t.key), theirs.get(t.key)
        if a is not None and b is not None:
            parts.append(
                f"{t.key.removesuffix('_s')} {_shown(t.key, a)} against {_shown(t.key, b)}"
            )
    return f"at {split(base.split)}, {c.config.variant}: " + ", ".join(parts)


def _shown(key: str, v: float) -> str:
    return format_seconds(float(v)) if key.endswith("_s") else f"{float(v):.4g}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


__all__ = ["DECODE_TIER_KEYS", "like_for_like_pd", "pd_differences", "pd_savings_lines"]
