"""Derived figures of PD runs (``pd.enabled``, :mod:`sim.pd`): TTFT step by step through both
roles, where the requests are over time, each role's pools over time, the KV links' load, and
the per-role tables.

A PD run's ``requests.parquet`` has one row per request with the time of every step
(arrival, pre-allocation on the decode server, bootstrap, prefill admission and end, the KV
transfer's start and end, the first token, the finish); ``timeline.parquet`` and
``transfers.parquet`` (PCIe copies) have a ``role`` and an ``instance`` column. Each prefill
server has one KV link (its NICs, one FIFO: :class:`sim.pd.transfer.KvLinks`): a request's
transfer occupies its prefill server's link from ``transfer_start_s`` to ``transfer_end_s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from studies.report.derive import TIME_POINTS, instances_occupancy, served_by, step_means
from studies.report.derive import time_edges as _edges
from studies.report.fmt import integer, ms, num, pct, sig
from studies.report.load import ReportData, Run

if TYPE_CHECKING:
    import pandas as pd

#: TTFT of a PD request, step by step: (part, from column, to column); the parts add up to
#: the TTFT (arrival to the first token) exactly.
PD_PARTS: tuple[tuple[str, str, str], ...] = (
    ("pre-allocation wait", "arrival_s", "prealloc_s"),
    ("bootstrap", "prealloc_s", "bootstrap_s"),
    ("prefill queue", "bootstrap_s", "prefill_admitted_s"),
    ("prefill", "prefill_admitted_s", "prefill_end_s"),
    ("link wait", "prefill_end_s", "transfer_start_s"),
    ("KV transfer", "transfer_start_s", "transfer_end_s"),
    ("merge wait", "transfer_end_s", "first_token_s"),
)
#: Where a request is on each role, as SGLang's queues name it: (stage, from, to). The first
#: stage of each is the one the timeline counts too (:data:`TIMELINE_COUNTS`), drawn at the
#: bottom of the stack; the others follow in the order a request passes them.
STAGES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "prefill": (
        ("waiting queue", "bootstrap_s", "prefill_admitted_s"),
        ("bootstrap queue", "arrival_s", "bootstrap_s"),
        ("prefilling", "prefill_admitted_s", "prefill_end_s"),
        ("inflight (sending KV)", "prefill_end_s", "transfer_end_s"),
    ),
    "decode": (
        ("decoding", "first_token_s", "finish_s"),
        ("prealloc queue", "arrival_s", "prealloc_s"),
        ("transfer queue (awaiting KV)", "prealloc_s", "transfer_end_s"),
        ("waiting to merge", "transfer_end_s", "first_token_s"),
    ),
}
#: The timeline's own request counts drawn over the stages, per role: (column, label).
TIMELINE_COUNTS = {
    "prefill": ("waiting", "waiting queue (timeline)"),
    "decode": ("running", "running batch (timeline)"),
}
LINK_BINS = 120
#: Requests drawn in the transfer-time scatter (evenly picked beyond it).
MAX_POINTS = 3000


def pd_runs(data: ReportData) -> list[Run]:
    """The PD runs among ``data``'s runs, in report order."""
    return [r for r in data.runs if r.is_pd]


def _finished(run: Run) -> pd.DataFrame:
    return run.finished()


def ttft_parts(run: Run) -> dict[str, float]:
    """Mean seconds of each :data:`PD_PARTS` step over the finished requests (warm-up left
    out), the mean TTFT (their sum) and the decode server's mean TPOT."""
    req = _finished(run)
    out = {
        part: float((req[b] - req[a]).mean()) if len(req) else math.nan for part, a, b in PD_PARTS
    }
    out["ttft"] = float(req["ttft_s"].mean()) if len(req) else math.nan
    out["tpot"] = float(run.summary.get("tpot_mean_s", math.nan))
    return out


def _bins(run: Run, bins: int) -> tuple[Any, dict[str, list[float | None]]]:
    import numpy as np

    edges = _edges(run, bins)
    width = np.diff(edges)
    return edges, {
        "t_s": [sig(float(x)) for x in edges[:-1]],
        "width_s": [sig(float(w)) for w in width],
    }


def stage_counts(run: Run, role: str, bins: int = TIME_POINTS) -> dict[str, list[float | None]]:
    """Requests in each of ``role``'s :data:`STAGES`, time-averaged per bin over the whole run
    (all servers of the role together; finished requests only), and the timeline's own count
    (:data:`TIMELINE_COUNTS`, summed over the role's servers) as ``timeline``."""
    import numpy as np

    edges, out = _bins(run, bins)
    width = np.diff(edges)
    safe = np.where(width > 0, width, 1.0)
    req = run.table("requests")
    req = req[req["finish_s"] >= 0]
    for stage, a, b in STAGES[role]:
        start = req[a].to_numpy(dtype=float)
        dur = np.maximum(req[b].to_numpy(dtype=float) - start, 0.0)
        busy, _ = served_by(start, dur, np.zeros(len(start)), edges)
        out[stage] = [sig(float(v)) for v in np.diff(busy) / safe]
    tl = run.table("timeline")
    tl = tl[tl["role"] == role]
    col = TIMELINE_COUNTS[role][0]
    total = np.zeros(len(edges) - 1)
    for _, g in tl.groupby("instance"):
        total += step_means(g.reset_index(drop=True), col, edges)
    out["timeline"] = [sig(float(v)) for v in total]
    return out


def role_occupancy(run: Run, role: str, bins: int = TIME_POINTS) -> dict[str, list[float | None]]:
    """:func:`~studies.report.derive.occupancy` of ``role``'s servers: their HBM pool parts
    and host pool in use, fractions of one server's pools, the mean over the role's servers."""
    tl = run.table("timeline")
    return instances_occupancy(run, tl[tl["role"] == role], run.role_pools(role), bins)


def _links(run: Run) -> int:
    return int(run.summary.get("pd_config", {}).get("prefill_instances", 1))


def link_load(run: Run, bins: int = LINK_BINS) -> dict[str, list[float | None]]:
    """The KV links over time, per bin: the busy share of the links on average
    (``busy_mean``) and of the busiest one (``busy_max``), and the throughput of all of them
    together (``gb_s``, GB per rank per second, 1 GB = 1e9 B; a transfer's bytes spread over
    its time on the link)."""
    import numpy as np

    edges, out = _bins(run, bins)
    width = np.diff(edges)
    safe = np.where(width > 0, width, 1.0)
    req = run.table("requests")
    req = req[req["transfer_end_s"] >= 0]
    per_link = []
    moved_all = np.zeros(len(edges))
    for i in range(_links(run)):
        mine = req[req["prefill_instance"] == i]
        start = mine["transfer_start_s"].to_numpy(dtype=float)
        dur = mine["transfer_end_s"].to_numpy(dtype=float) - start
        busy, moved = served_by(start, dur, mine["transfer_bytes"].to_numpy(dtype=float), edges)
        per_link.append(np.diff(busy) / safe)
        moved_all += moved
    stack = np.array(per_link) if per_link else np.zeros((1, len(width)))
    out["busy_mean"] = [sig(float(v)) for v in stack.mean(axis=0)]
    out["busy_max"] = [sig(float(v)) for v in stack.max(axis=0)]
    out["gb_s"] = [sig(float(v)) for v in np.diff(moved_all) / safe / 1e9]
    return out


def link_totals(run: Run) -> dict[str, Any]:
    """Each KV link's busy share over the run (``per_link``; with a warm-up window, as for
    PCIe: the transfers that started after it, over the time after it), their mean and the
    busiest (NaN when that took no simulated time)."""
    req = run.table("requests")
    req = req[req["transfer_end_s"] >= 0]
    window = run.warmup_window_s
    if window is not None:
        req = req[req["transfer_start_s"] >= window[1]]
    span = float(run.summary["sim_duration_s"]) - (window[1] if window else 0.0)
    dur = req["transfer_end_s"] - req["transfer_start_s"]
    per = [
        float(dur[req["prefill_instance"] == i].sum()) / span if span > 0 else math.nan
        for i in range(_links(run))
    ]
    return {
        "per_link": per,
        "busy_mean": sum(per) / len(per) if per else math.nan,
        "busy_max": max(per, default=math.nan),
    }


def transfer_points(run: Run, most: int = MAX_POINTS) -> dict[str, list[float | None]]:
    """Per finished request (warm-up left out; at most ``most``, evenly picked in arrival
    order): the KV it sent (MB per rank, 1 MB = 1e6 B), its time on the link and its wait for
    the link before that (ms)."""
    from studies.report.derive import pick

    req = _finished(run)
    idx = pick(list(range(len(req))), most)
    sel = req.iloc[idx]
    on_link = (sel["transfer_end_s"] - sel["transfer_start_s"]) * 1e3
    wait = (sel["transfer_start_s"] - sel["prefill_end_s"]) * 1e3
    return {
        "mb": [sig(float(v)) for v in sel["transfer_bytes"] / 1e6],
        "transfer_ms": [sig(float(v)) for v in on_link],
        "wait_ms": [sig(float(v)) for v in wait],
    }


def role_rows(run: Run) -> dict[str, Any]:
    """What the per-role tables show of one PD run, raw: summary.json's ``roles`` and
    transfer keys, with the decode bootstrap and the links' busy shares from the tables."""
    s = run.summary
    pre, dec = s["roles"]["prefill"], s["roles"]["decode"]
    req = _finished(run)
    links = link_totals(run)
    boot = float((req["bootstrap_s"] - req["prealloc_s"]).mean()) if len(req) else math.nan
    return {
        "run": run.label,
        "dir": run.shown,
        "prefill": {k: pre.get(k) for k in (
            "instances", "requests_per_instance", "hit_rate", "device_hit_rate",
            "host_hit_rate", "storage_hit_rate", "bootstrap_wait_mean_s",
            "queue_after_bootstrap_mean_s", "prefill_mean_s", "load_stall_mean_s",
            "bytes_d2h", "bytes_h2d", "retractions")},
        "transfer": {
            **{k: s.get(k) for k in ("transfer_mean_s", "transfer_p90_s",
                                     "transfer_wait_mean_s", "transfer_bytes_per_rank",
                                     "transfer_bytes_saved_per_rank",
                                     "transfer_bytes_saved_share")},
            "link_busy_mean": links["busy_mean"], "link_busy_max": links["busy_max"],
        },
        "decode": {
            **{k: dec.get(k) for k in (
                "instances", "requests_per_instance", "prealloc_wait_mean_s",
                "merge_wait_mean_s", "tpot_mean_s", "tpot_p90_s", "radix_cache", "hit_rate",
                "device_hit_rate", "host_hit_rate", "bytes_d2h", "bytes_h2d", "retractions")},
            "bootstrap_mean_s": boot,
        },
    }  # fmt: skip


def _per_server(counts: Sequence[int] | None) -> str:
    c = list(counts or [])
    return ", ".join(map(str, c[:6])) + (", ..." if len(c) > 6 else "")


def role_tables(data: ReportData) -> list[tuple[str, pd.DataFrame]]:
    """The per-role tables of the PD runs, formatted (one row per run): the prefill role,
    the KV transfer, the decode role; [] without PD runs."""
    import pandas as pd

    rows = [role_rows(r) for r in pd_runs(data)]
    if not rows:
        return []
    index = pd.Index([r["run"] for r in rows], name="run")

    def table(columns: dict[str, Any]) -> pd.DataFrame:
        return pd.DataFrame({k: [f(r) for r in rows] for k, f in columns.items()}, index=index)

    prefill = table({
        "servers": lambda r: integer(r["prefill"]["instances"]),
        "requests per server": lambda r: _per_server(r["prefill"]["requests_per_instance"]),
        "hit rate": lambda r: pct(r["prefill"]["hit_rate"]),
        "device": lambda r: pct(r["prefill"]["device_hit_rate"]),
        "host": lambda r: pct(r["prefill"]["host_hit_rate"]),
        "L3": lambda r: pct(r["prefill"]["storage_hit_rate"]),
        "bootstrap queue [ms]": lambda r: ms(r["prefill"]["bootstrap_wait_mean_s"]),
        "waiting queue [ms]": lambda r: ms(r["prefill"]["queue_after_bootstrap_mean_s"]),
        "prefill [ms]": lambda r: ms(r["prefill"]["prefill_mean_s"]),
        "load stall [ms]": lambda r: ms(r["prefill"]["load_stall_mean_s"]),
        "D2H [GB]": lambda r: num((r["prefill"]["bytes_d2h"] or 0) / 1e9),
        "H2D [GB]": lambda r: num((r["prefill"]["bytes_h2d"] or 0) / 1e9),
        "retractions": lambda r: integer(r["prefill"]["retractions"]),
    })  # fmt: skip
    transfer = table({
        "transfer mean [ms]": lambda r: ms(r["transfer"]["transfer_mean_s"]),
        "transfer p90 [ms]": lambda r: ms(r["transfer"]["transfer_p90_s"]),
        "link wait mean [ms]": lambda r: ms(r["transfer"]["transfer_wait_mean_s"]),
        "sent [GB per rank]": lambda r: num(r["transfer"]["transfer_bytes_per_rank"] / 1e9),
        "saved by the decode cache [GB per rank]":
            lambda r: num(_gb(r["transfer"]["transfer_bytes_saved_per_rank"])),
        "saved share": lambda r: pct(r["transfer"]["transfer_bytes_saved_share"]),
        "link busy, mean": lambda r: pct(r["transfer"]["link_busy_mean"]),
        "link busy, busiest": lambda r: pct(r["transfer"]["link_busy_max"]),
    })  # fmt: skip
    decode = table({
        "servers": lambda r: integer(r["decode"]["instances"]),
        "requests per server": lambda r: _per_server(r["decode"]["requests_per_instance"]),
        "prealloc queue [ms]": lambda r: ms(r["decode"]["prealloc_wait_mean_s"]),
        "bootstrap [ms]": lambda r: ms(r["decode"]["bootstrap_mean_s"]),
        "merge wait [ms]": lambda r: ms(r["decode"]["merge_wait_mean_s"]),
        "TPOT mean [ms]": lambda r: ms(r["decode"]["tpot_mean_s"]),
        "TPOT p90 [ms]": lambda r: ms(r["decode"]["tpot_p90_s"]),
        "radix hit rate": lambda r: _radix(r, "hit_rate"),
        "radix device": lambda r: _radix(r, "device_hit_rate"),
        "radix host": lambda r: _radix(r, "host_hit_rate"),
        "D2H [GB]": lambda r: num((r["decode"]["bytes_d2h"] or 0) / 1e9),
        "H2D [GB]": lambda r: num((r["decode"]["bytes_h2d"] or 0) / 1e9),
        "retractions": lambda r: integer(r["decode"]["retractions"]),
    })  # fmt: skip
    return [("Prefill role", prefill), ("KV transfer", transfer), ("Decode role", decode)]


def _gb(x: Any) -> float | None:
    return None if x is None else float(x) / 1e9


def _radix(r: dict[str, Any], key: str) -> str:
    """A decode-side hit rate: only with the decode radix cache (else there is none)."""
    return pct(r["decode"][key]) if r["decode"].get("radix_cache") else "off"
