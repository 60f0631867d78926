"""``summary.json`` of a PD run: the headline figures as a single-server run has them (so
``hicache-sim run`` prints them the same way), what PD adds (the KV transfer) and one block
per role (``roles.prefill``, ``roles.decode``: the role's own summary, its queueing and its
instances).

Where the figures come from, as SGLang measures them:
- TTFT ends when the decode server streams the first token, which the prefill server
  computed: at the merge of the prebuilt batch after the KV arrived (decode.py:3253-3256,
  batch_result_processor.py:117-132), before the first decode step. So TTFT = bootstrap +
  prefill queue + prefill + transfer + the wait for the decode loop's next iteration.
- TPOT is the decode server's: (finish - first token) / (outputs - 1).
- Hits per tier are the prefill server's. With the decode radix cache
  (``pd.decode_radix_cache``) ``roles.decode`` has the decode server's own hits per tier (its
  match at pre-allocation over the prompt, sim.pd.decode_cache) and the summary the transfer
  bytes per rank they saved (the prefill side sends only the pages past the decode prefix).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sim.metrics import summarize

if TYPE_CHECKING:
    from hicache.config import SimConfig
    from sim.pd.engine import PdEngine


def _stats(values: Any) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if not len(v):
        nan = float("nan")
        return {"mean": nan, "p50": nan, "p90": nan, "p99": nan}
    return {
        "mean": float(v.mean()),
        "p50": float(np.quantile(v, 0.5)),
        "p90": float(np.quantile(v, 0.9)),
        "p99": float(np.quantile(v, 0.99)),
    }


def _measured(req: Any, warmup_s: float) -> Any:
    """The requests that count: all, or those arriving after the warm-up window."""
    if warmup_s <= 0 or not len(req):
        return req
    return req[req["arrival_s"] >= float(req["arrival_s"].min()) + warmup_s]


def _role(
    frames: dict[str, Any], role: str, duration: float, closed_loop: bool, warmup_s: float,
    start: float | None, instances: int,
) -> dict[str, Any]:  # fmt: skip
    own = frames[role]
    if role == "decode":
        own = {**own, "requests": _decode_queue(own["requests"], frames["requests"])}
    one = summarize(own, duration, 0.0, closed_loop, warmup_s, start)
    one.pop("wall_time_s", None)
    req = frames[role]["requests"]
    counts = req.groupby("instance").size() if len(req) else {}
    one["instances"] = instances
    one["requests_per_instance"] = [int(counts.get(i, 0)) for i in range(instances)]
    done = req[req["finish_s"] >= 0]
    one["prefill_mean_s"] = float(done["prefill_s"].mean()) if len(done) else float("nan")
    return one


def _decode_queue(dec: Any, pd_rows: Any) -> Any:
    """The decode role's requests with ``queue_s`` its own queueing: the pre-allocation wait
    (arrival to pre-allocated) and the merge wait (KV arrived to merged into the running
    batch). Its frame's admission is the first token, so its own ``queue_s`` would be the whole
    TTFT, prefill included, and a prefill-bound run would read as an overloaded decode role."""
    if not len(dec):
        return dec
    rows = pd_rows.set_index("rid")
    wait = (rows["prealloc_s"] - rows["arrival_s"]) + (
        rows["first_token_s"] - rows["transfer_end_s"]
    )
    out = dec.copy()
    got = wait.reindex(out["rid"]).to_numpy()
    keep = out["queue_s"].to_numpy()
    out["queue_s"] = np.where(
        np.isnan(got) | (rows["first_token_s"].reindex(out["rid"]).to_numpy() < 0), keep, got
    )
    return out


def pd_summary(
    frames: dict[str, Any], duration: float, wall: float, engine: PdEngine, cfg: SimConfig
) -> dict[str, Any]:
    """The summary of a finished PD run (``frames``: ``requests`` of the PD rows, and each
    role's frames)."""
    warm = cfg.workload.warmup_s
    all_req = frames["requests"]
    start = float(all_req["arrival_s"].min()) if warm > 0 and len(all_req) else None
    req = _measured(all_req, warm)
    done = req[req["finish_s"] >= 0]
    ttft = done["first_token_s"] - done["arrival_s"]
    xfer = done["transfer_end_s"] - done["transfer_start_s"]
    roles = {
        "prefill": _role(frames, "prefill", duration, engine.closed_loop, warm, start,
                         len(engine.prefill)),
        "decode": _role(frames, "decode", duration, engine.closed_loop, warm, start,
                        len(engine.decode)),
    }  # fmt: skip
    pre, dec = roles["prefill"], roles["decode"]
    pre["bootstrap_wait_mean_s"] = _mean(done["bootstrap_s"] - done["arrival_s"])
    pre["queue_after_bootstrap_mean_s"] = _mean(done["prefill_admitted_s"] - done["bootstrap_s"])
    dec["prealloc_wait_mean_s"] = _mean(done["prealloc_s"] - done["arrival_s"])
    dec["merge_wait_mean_s"] = _mean(done["first_token_s"] - done["transfer_end_s"])
    t, x = _stats(ttft), _stats(xfer)
    out_tokens = int(done["output_tokens"].sum())
    measured = duration - (start + warm if start is not None else 0.0)
    summary: dict[str, Any] = {
        "pd": True,
        "requests": len(req),
        "finished_requests": len(done),
        "rejected_requests": int(len(req) - len(done)),
        "prompt_tokens": pre["prompt_tokens"],
        **{k: pre[k] for k in ("hit_rate", "device_hit_rate", "host_hit_rate",
                               "storage_hit_rate", "host_hit_recomputed_tokens")},
        "ttft_mean_s": t["mean"], "ttft_p50_s": t["p50"], "ttft_p90_s": t["p90"],
        "ttft_p99_s": t["p99"],
        "tpot_mean_s": dec["tpot_mean_s"], "tpot_p90_s": dec["tpot_p90_s"],
        "e2e_mean_s": _mean(done["finish_s"] - done["arrival_s"]),
        "queue_mean_s": pre["queue_mean_s"],
        "load_stall_mean_s": pre["load_stall_mean_s"],
        "throughput_output_tok_s": out_tokens / measured if measured > 0 else 0.0,
        "retractions": pre["retractions"] + dec["retractions"],
        "bytes_d2h": pre["bytes_d2h"] + dec["bytes_d2h"],
        "bytes_h2d": pre["bytes_h2d"] + dec["bytes_h2d"],
        "transfer_mean_s": x["mean"], "transfer_p90_s": x["p90"],
        "transfer_wait_mean_s": _mean(done["transfer_start_s"] - done["prefill_end_s"]),
        "transfer_bytes_per_rank": int(done["transfer_bytes"].sum()),
        "sim_duration_s": duration,
        "wall_time_s": wall,
        "closed_loop": engine.closed_loop,
        "sglang_version": cfg.sglang.version,
        "pd_config": {"prefill_instances": cfg.pd.prefill_instances,
                      "decode_instances": cfg.pd.decode_instances,
                      "transfer": cfg.pd.transfer},
        "roles": roles,
    }  # fmt: skip
    if cfg.pd.decode_radix_cache:
        saved = int(done["transfer_bytes_saved"].sum())
        full = saved + int(done["transfer_bytes"].sum())
        dec["radix_cache"] = True
        dec["decode_prefix_tokens"] = int(
            (done["decode_device_hit_tokens"] + done["decode_host_hit_tokens"]
             + done["decode_storage_hit_tokens"]).sum()
        )  # fmt: skip
        # restores of a promised L3 prefix that fell short: SGLang aborts those requests
        dec["restore_failed_requests"] = int(req["decode_restore_failed"].sum())
        dec["transfer_bytes_saved_per_rank"] = saved
        summary["transfer_bytes_saved_per_rank"] = saved
        summary["transfer_bytes_saved_share"] = saved / full if full else 0.0
    over = [role for role, one in roles.items() if one.get("overloaded")]
    if over == ["prefill", "decode"]:
        # a decode server pre-allocates before the prefill: requests waiting for an overloaded
        # prefill hold the decode pool, so the decode side's pre-allocation wait grows with
        # the prefill backlog; whether the decode role keeps up shows once the prefill does
        dec["overloaded"] = False
        dec["overload_message"] = (
            "not judged: the prefill role is overloaded, and the requests waiting for it hold "
            "the decode pool (pre-allocated before their prefill)"
        )
        over = ["prefill"]
    summary["overloaded"] = bool(over)
    if over:
        summary["overload_message"] = (
            f"overloaded: the {' and '.join(over)} role cannot keep up (more "
            f"{'/'.join(over)} servers would)"
        )
    if start is not None:
        summary["warmup_s"] = warm
        summary["warmup_end_s"] = start + warm
        summary["warmup_requests"] = int(len(all_req) - len(req))
    return summary


def _mean(s: Any) -> float:
    v = np.asarray(s, dtype=float)
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else float("nan")
