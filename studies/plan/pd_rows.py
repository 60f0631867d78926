"""One flat row per configuration of a PD plan (``plan.csv``, the table, ``plan.json``): the
split, GPUs, servers and host DRAM per role and in all, GPU-hours, the hit rates of both
roles and the target metrics at the chosen split."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from studies.plan.pd_search import split

if TYPE_CHECKING:
    from studies.plan.pd import PdConfigPlan, PdPlan

#: The decode server's own hit rates (with the decode radix cache; sim.pd.summary).
DECODE_HIT_KEYS = ("hit_rate", "device_hit_rate", "host_hit_rate")


def pd_row(plan: PdPlan, c: PdConfigPlan) -> dict[str, Any]:
    """The row of ``c``."""
    cfg, chosen = c.config, c.chosen or {}
    p, d = c.split if c.split is not None else (None, None)
    servers = c.servers
    decode = chosen.get("roles", {}).get("decode", {})
    row: dict[str, Any] = {
        "configuration": cfg.name,
        "variant": cfg.variant,
        "split": None if c.split is None else split(c.split),
        "prefill_instances": p,
        "decode_instances": d,
        "meets_targets": c.split is not None,
        "max_instances_per_role": plan.max_instances,
        "prefill_gpus": None if p is None else p * cfg.prefill.tp,
        "decode_gpus": None if d is None else d * cfg.decode.tp,
        "gpus": c.gpus,
        "prefill_servers": None if servers is None else servers[0],
        "decode_servers": None if servers is None else servers[1],
        "servers": None if servers is None else sum(servers),
        "gpu_hours": c.gpu_hours,
        "cost_usd": None
        if c.gpu_hours is None or not plan.gpu_hour_usd
        else c.gpu_hours * plan.gpu_hour_usd,
        "prefill_setup": cfg.prefill.setup,
        "decode_setup": cfg.decode.setup,
        "prefill_tp": cfg.prefill.tp,
        "decode_tp": cfg.decode.tp,
        "arrival_span_s": cfg.span_s,
        "decode_radix_cache": cfg.decode_radix_cache,
    }
    for role in (cfg.prefill, cfg.decode):
        n = p if role.role == "prefill" else d
        per_rank = role.kv_bytes_per_token / 1e9
        row[f"{role.role}_host_dram_gb_per_instance"] = role.host_dram_gb
        row[f"{role.role}_host_dram_gb"] = None if n is None else n * role.host_dram_gb
        row[f"{role.role}_device_gb_per_rank"] = role.device_tokens * per_rank
        row[f"{role.role}_host_gb_per_rank"] = role.host_tokens * per_rank
        row[f"{role.role}_device_tokens"] = role.device_tokens
        row[f"{role.role}_host_tokens"] = role.host_tokens
    row["host_dram_gb"] = (
        None if p is None else row["prefill_host_dram_gb"] + row["decode_host_dram_gb"]
    )
    for key in ("hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate"):
        row[f"prefill_{key}"] = chosen.get(key)
    for key in DECODE_HIT_KEYS:
        row[f"decode_{key}"] = decode.get(key) if decode.get("radix_cache") else None
    row["transfer_bytes_saved_share"] = chosen.get("transfer_bytes_saved_share")
    for t in plan.targets:
        row[t.key] = chosen.get(t.key)
        best = c.best(t)
        row[f"{t.key}_best"] = None if best is None else best[0]
        row[f"{t.key}_best_at"] = None if best is None else split(best[1])
        row[f"{t.key}_floor"] = c.floors.get(t.key)
        if plan.seeds > 1:
            iv = chosen.get("seeds", {}).get("intervals", {}).get(t.key, {})
            row[f"{t.key}_lo"], row[f"{t.key}_hi"] = iv.get("lo"), iv.get("hi")
    if plan.seeds > 1:
        row["seeds"] = plan.seeds
    row["evaluations"] = len(c.evaluations)
    row["monotone"] = c.monotone
    row["overrides"] = ";".join(cfg.overrides)
    return row


__all__ = ["DECODE_HIT_KEYS", "pd_row"]
