"""What ``hicache-sim run`` prints for a PD run (``pd.enabled``), after the headline figures:
one block per role and the KV transfer (``summary.json``'s ``roles`` and transfer keys,
:mod:`sim.pd.summary`)."""

from __future__ import annotations

import math
from typing import Any


def _ms(seconds: float) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_pd_summary(s: dict[str, Any]) -> str:
    """The per-role lines of a PD run's summary; "" for a run without PD."""
    roles = s.get("roles")
    if not roles:
        return ""
    p, d = roles["prefill"], roles["decode"]
    lines = [
        f"prefill role: {p['instances']} instance(s), {p['requests']:,} requests "
        f"(per instance {_counts(p)}); hit rate {p['hit_rate']:.2%} (device "
        f"{p['device_hit_rate']:.2%}, host {p['host_hit_rate']:.2%}, L3 "
        f"{p['storage_hit_rate']:.2%}); bootstrap wait {_ms(p['bootstrap_wait_mean_s'])}, "
        f"queue {_ms(p['queue_after_bootstrap_mean_s'])}, prefill {_ms(p['prefill_mean_s'])} "
        "mean",
        f"KV transfer: mean {_ms(s['transfer_mean_s'])}, p90 {_ms(s['transfer_p90_s'])}, "
        f"link wait {_ms(s['transfer_wait_mean_s'])}; "
        f"{s['transfer_bytes_per_rank'] / 1e9:.1f} GB per rank",
        f"decode role: {d['instances']} instance(s), {d['requests']:,} requests "
        f"(per instance {_counts(d)}); pre-allocation wait {_ms(d['prealloc_wait_mean_s'])}, "
        f"merge wait {_ms(d['merge_wait_mean_s'])} mean; TPOT mean {_ms(d['tpot_mean_s'])}, "
        f"p90 {_ms(d['tpot_p90_s'])}; retractions {d['retractions']}",
    ]
    if d.get("radix_cache"):
        lines.append(
            f"decode radix cache: hit rate {d['hit_rate']:.2%} (device "
            f"{d['device_hit_rate']:.2%}, host {d['host_hit_rate']:.2%}, L3 "
            f"{d['storage_hit_rate']:.2%}); transfer saved "
            f"{s['transfer_bytes_saved_per_rank'] / 1e9:.1f} GB per rank "
            f"({s['transfer_bytes_saved_share']:.1%})"
        )
        if d.get("restore_failed_requests"):
            lines.append(
                f"decode restores of a promised L3 prefix that fell short: "
                f"{d['restore_failed_requests']:,} requests aborted (SGLang answers them with "
                f"status 500; storage.prefetch_policy decides how long a restore waits)"
            )
    return "\n".join(lines)


def _counts(role: dict[str, Any], most: int = 8) -> str:
    c = role.get("requests_per_instance", [])
    return ", ".join(map(str, c[:most])) + (", ..." if len(c) > most else "")


def print_pd_summary(s: dict[str, Any]) -> None:
    """Print :func:`format_pd_summary` when the run was a PD run."""
    text = format_pd_summary(s)
    if text:
        print(text)
