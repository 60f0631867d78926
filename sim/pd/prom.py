"""``metrics.prom`` of a PD run: every server's SGLang metrics, as its ``/metrics`` would export
them, one file for the fleet (:func:`write_pd_metrics`).

In PD mode each server is its own SGLang process with its own ``/metrics``. Here every server's
series are in one file, told apart by two labels: SGLang's own ``engine_type`` (``prefill`` or
``decode``, ``DisaggregationMode.to_engine_type``, disaggregation/utils.py:156-161, on the
scheduler's labels, observability/metrics_collector.py:1376-1381, and the tokenizer's,
metrics_collector.py:1805-1811) and ``server`` (``prefill-0``, ``decode-1``, ...), as if each
were launched with ``--extra-metric-labels '{"server": "prefill-0"}'`` (observability fields,
arg_groups/fields/observability.py:97-103, added to every collector's labels,
metrics_collector.py:1393-1394, mem_cache/base_prefix_cache.py:411-412). Concatenating the
``/metrics`` of servers launched that way, family by family, gives the same file. (Line numbers
are SGLang 0.5.23's, ``python/sglang/srt/``.)

What each server counts (the families of :func:`sim.prom.run_families`, per server):

- a prefill server runs each request for one token (``max_new_tokens = 1``,
  disaggregation/prefill.py:478-482) and streams it once the KV transfer is done
  (``process_disagg_prefill_inflight_queue``, prefill.py:1245, 1266): its requests, prompt
  tokens, one generation token each, its cached tokens per tier, TTFT and e2e latency from the
  request's arrival to the end of its transfer, no TPOT or inter-token observation, its PCIe
  load-back / backup copies and its pools;
- a decode server streams the first token at the merge and decodes the rest: TTFT from the
  arrival to the first token, e2e to the finish, TPOT and inter-token latency, the output
  tokens; its ``cached_tokens`` are the prefill server's per tier (sent with the KV,
  decode.py:2710-2720) plus, with the decode radix cache, the decode prefix beyond them as
  device (``prepare_for_prebuilt``, disaggregation/decode_schedule_batch_mixin.py:66-72); its
  own host copies (decode radix cache with a host tier) and its pools.

PD families (metrics_collector.py:637-647, 682-699, SGLang's buckets), on the scheduler labels:

- ``sglang:kv_transfer_latency_ms``, ``sglang:kv_transfer_total_mb``,
  ``sglang:kv_transfer_speed_gb_s`` (prefill servers, one observation per request when its
  transfer completes, observability/req_time_stats.py:954-997, called from prefill.py:1255):
  Mooncake reports no transfer latency of its own (``reports_transfer_latency`` False,
  disaggregation/common/conn.py:299-301), so the latency is from the last chunk's enqueue
  (``set_prefill_transfer_queue_entry_time``, prefill.py:1074) to the completion,
  req_time_stats.py:968-976: here the prefill's end to the transfer's end (the wait for the
  link included); the size is the pages sent times one rank's bytes per page
  (``get_transfer_metric``, common/conn.py:2238-2246) in MiB (req_time_stats.py:981); the
  speed is GiB over the latency (req_time_stats.py:986). Observed only when the latency is
  positive (req_time_stats.py:977).
- ``sglang:kv_transfer_bootstrap_ms``, ``sglang:kv_transfer_alloc_ms``: on a prefill server
  (req_time_stats.py:999-1024) the bootstrap is the request's arrival to the end of its
  bootstrap (``finalize_bootstrap``, prefill.py:436) and the allocation wait the bootstrap's end
  to its entry into the waiting queue (prefill.py:547): the same instant here, so 0; on a
  decode server (req_time_stats.py:1068-1082) the allocation wait is the arrival to the
  pre-allocation (``set_decode_transfer_queue_entry_time`` after the indices went out,
  decode.py:1875) and the bootstrap the handshake (decode.py:1157). The simulator charges
  the bootstrap (``pd.bootstrap_s``, plus ``pd.handshake_s`` once per pair) after the
  pre-allocation rather than before it: the decode bootstrap observed is that delay, so each
  histogram has SGLang's count and its sum the simulated delays, in another order.

Left out: the PD queue gauges (``num_prefill_bootstrap_queue_reqs``,
``num_prefill_inflight_queue_reqs``, ``num_decode_prealloc_queue_reqs``,
``num_decode_transfer_queue_reqs``, ``pending_prealloc_token_usage``, ...,
metrics_collector.py:582-665): sampled instants, as :mod:`sim.prom` leaves out
``num_queue_reqs`` (``timeline.parquet`` and ``requests.parquet`` have them over time); the
failure and retry counters (``num_bootstrap_failed_reqs_total``,
``num_transfer_failed_reqs_total``, ``num_prefill_retries_total``, metrics_collector.py:667-681):
nothing fails in a simulated run, and SGLang exports no series before the first increment;
decode host-receive and deferred-release metrics: not modelled.

Like ``summary.json``, the requests of the warm-up window (``workload.warmup_s``) are left out
and the copy counters count the copies that started after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.prom import Family, histogram, render, run_families

if TYPE_CHECKING:
    import pandas as pd

    from hicache.config import SimConfig

# SGLang 0.5.23's buckets of the PD histograms (observability/metrics_collector.py:637-699)
KV_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_LATENCY_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
KV_BOOTSTRAP_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
KV_TOTAL_MB_BUCKETS = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
#: the label that tells the servers apart (``--extra-metric-labels``)
SERVER_LABEL = "server"
_CACHED = ("cached_tokens", "cached_tokens_device", "cached_tokens_host", "cached_tokens_storage")


def server_name(role: str, instance: int) -> str:
    """The ``server`` label of one server: ``prefill-0``, ``decode-3``."""
    return f"{role}-{instance}"


def measured_rows(req: pd.DataFrame, summary: Mapping[str, Any]) -> pd.DataFrame:
    """The PD rows that count, as summary.json counts them: those that arrived at or after
    the warm-up window's end (``warmup_end_s``; all of them without a window)."""
    end = summary.get("warmup_end_s")
    return req if end is None else req[req["arrival_s"] >= float(end)]


def prefill_view(rows: pd.DataFrame, pre: pd.DataFrame) -> pd.DataFrame:
    """The requests as one prefill server's tokenizer counts them (``rows``: its PD rows;
    ``pre``: the prefill role's request table): finished when its transfer ended (the one
    token streams then), TTFT = e2e = arrival to the transfer's end, one output token, the
    prefill server's cached tokens per tier."""
    import numpy as np

    own = pre[["rid", "prompt_tokens", "output_tokens", "retractions", *_CACHED]]
    v = rows[["rid", "arrival_s", "transfer_end_s", "finish_s"]].merge(own, on="rid")
    done = (v["finish_s"] >= 0) & (v["transfer_end_s"] >= 0)
    end = v["transfer_end_s"].where(done, -1.0)
    return v.assign(
        first_token_s=end,
        finish_s=end,
        ttft_s=(end - v["arrival_s"]).where(done),
        e2e_s=(end - v["arrival_s"]).where(done),
        tpot_s=np.nan,
    )


def decode_view(rows: pd.DataFrame, dec: pd.DataFrame, pre: pd.DataFrame) -> pd.DataFrame:
    """The requests as one decode server's tokenizer counts them (``rows``: its PD rows;
    ``dec`` / ``pre``: the decode and prefill roles' request tables): TTFT to the first
    token, e2e to the finish, the decode server's TPOT and output tokens; cached tokens are
    the prefill server's per tier plus the decode prefix beyond them as device."""
    own = dec[["rid", "output_tokens", "tpot_s", "retractions"]]
    sent = pre[["rid", *_CACHED]]
    cols = ["rid", "arrival_s", "first_token_s", "finish_s", "prompt_tokens",
            "decode_device_hit_tokens", "decode_host_hit_tokens",
            "decode_storage_hit_tokens"]  # fmt: skip
    v = rows[cols].merge(own, on="rid").merge(sent, on="rid", how="left")
    v[list(_CACHED)] = v[list(_CACHED)].fillna(0).astype("int64")
    prefix = (v["decode_device_hit_tokens"] + v["decode_host_hit_tokens"]
              + v["decode_storage_hit_tokens"])  # fmt: skip
    extra = (prefix - v["cached_tokens"]).clip(lower=0)
    done = v["finish_s"] >= 0
    return v.assign(
        cached_tokens=v["cached_tokens"] + extra,
        cached_tokens_device=v["cached_tokens_device"] + extra,
        ttft_s=(v["first_token_s"] - v["arrival_s"]).where(done),
        e2e_s=(v["finish_s"] - v["arrival_s"]).where(done),
    )


def kv_transfer_families(
    rows: pd.DataFrame, labels: Mapping[str, Any], bytes_scale: float
) -> list[Family]:
    """A prefill server's ``kv_transfer_latency_ms`` / ``total_mb`` / ``speed_gb_s`` over its
    finished requests (``rows``; ``bytes_scale``: one prefill rank's bytes per byte a link
    carries, 1 unless the roles' TP differ)."""
    done = rows[(rows["finish_s"] >= 0) & (rows["transfer_end_s"] >= 0)]
    latency_s = (done["transfer_end_s"] - done["prefill_end_s"]).to_numpy(dtype=float)
    keep = latency_s > 0  # req_time_stats.py:977
    latency_s = latency_s[keep]
    mb = done["transfer_bytes"].to_numpy(dtype=float)[keep] * bytes_scale / (1024 * 1024)
    return [
        histogram("sglang:kv_transfer_latency_ms", "Histogram of KV cache transfer latency in ms.",
                  labels, latency_s * 1000, KV_LATENCY_BUCKETS),
        histogram("sglang:kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.",
                  labels, mb, KV_TOTAL_MB_BUCKETS),
        histogram("sglang:kv_transfer_speed_gb_s",
                  "Histogram of KV cache transfer speed in GB/s.", labels,
                  mb / 1024 / latency_s if len(latency_s) else [], KV_SPEED_BUCKETS),
    ]  # fmt: skip


def bootstrap_families(bootstrap_ms: Any, alloc_ms: Any, labels: Mapping[str, Any]) -> list[Family]:
    """``kv_transfer_bootstrap_ms`` and ``kv_transfer_alloc_ms`` of one server."""
    return [
        histogram("sglang:kv_transfer_bootstrap_ms",
                  "Histogram of KV transfer bootstrap time in ms.", labels, bootstrap_ms,
                  KV_BOOTSTRAP_BUCKETS),
        histogram("sglang:kv_transfer_alloc_ms",
                  "Histogram of KV transfer allocation waiting time in ms.", labels, alloc_ms,
                  KV_BOOTSTRAP_BUCKETS),
    ]  # fmt: skip


def merge_families(groups: Iterable[Iterable[Family]]) -> list[Family]:
    """One family per metric name, in first-seen order, with every group's samples (the
    servers' series of that metric one after another, as the text format wants them)."""
    out: dict[str, Family] = {}
    for group in groups:
        for fam in group:
            have = out.get(fam.name)
            if have is None:
                out[fam.name] = Family(fam.name, fam.type, fam.help, list(fam.samples))
            else:
                have.samples.extend(fam.samples)
    return list(out.values())


def _role_info(cfg: SimConfig, roles: Mapping[str, Any], role: str) -> dict[str, Any]:
    """A role's pools, SGLang version and TP (``roles``: config.json's per-role part)."""
    one = roles[role]
    conf = one.get("config", {})
    return {
        "device_tokens": int(one["device_tokens"]),
        "host_tokens": int(one["host_tokens"]),
        "version": str(conf.get("sglang", {}).get("version", cfg.sglang.version)),
        "tp": int(conf.get("model", {}).get("tp", cfg.model.tp)),
    }


def pd_families(
    cfg: SimConfig, frames: Mapping[str, Any], summary: Mapping[str, Any],
    roles: Mapping[str, Any],
) -> list[Family]:  # fmt: skip
    """Every server's families of a finished PD run (``frames``: ``requests`` of the PD rows
    and each role's frames, as :func:`sim.pd.run.run_pd_simulation` has them; ``roles``:
    config.json's per-role part with each role's pools)."""
    from hicache.models import kv_bytes_per_token

    rows = measured_rows(frames["requests"], summary)
    pre_req = frames["prefill"]["requests"]
    dec_req = frames["decode"]["requests"]
    info = {r: _role_info(cfg, roles, r) for r in ("prefill", "decode")}
    spec = cfg.model.spec
    link = kv_bytes_per_token(spec, min(info["prefill"]["tp"], info["decode"]["tp"]))
    scale = kv_bytes_per_token(spec, info["prefill"]["tp"]) / link
    counts = summary.get("pd_config", {})
    n = {"prefill": int(counts.get("prefill_instances", cfg.pd.prefill_instances)),
         "decode": int(counts.get("decode_instances", cfg.pd.decode_instances))}  # fmt: skip
    storage = summary.get("roles", {}).get("prefill", {}).get("storage")
    groups: list[list[Family]] = []
    for role in ("prefill", "decode"):
        tr = frames[role]["transfers"]
        for i in range(n[role]):
            mine = rows[rows[f"{role}_instance"] == i]
            name = server_name(role, i)
            extra = {SERVER_LABEL: name}
            if role == "prefill":
                view = prefill_view(mine, pre_req[pre_req["instance"] == i])
            else:
                view = decode_view(mine, dec_req[dec_req["instance"] == i], pre_req)
            copies = tr[tr["instance"] == i] if len(tr) else tr
            fams = run_families(
                view, copies, sglang_version=info[role]["version"], model_name=spec.name,
                page_size=cfg.cache.page_size, device_tokens=info[role]["device_tokens"],
                host_tokens=info[role]["host_tokens"],
                warmup_end_s=summary.get("warmup_end_s"),
                storage=storage if role == "prefill" else None, engine_type=role,
                extra_labels=extra,
            )  # fmt: skip
            sched = {"model_name": spec.name, "engine_type": role, "moe_ep_rank": 0,
                     "pp_rank": 0, "tp_rank": 0, **extra}  # fmt: skip
            fams += _pd_only(role, mine, sched, scale)
            groups.append(fams)
    return merge_families(groups)


def _pd_only(role: str, rows: pd.DataFrame, sched: Mapping[str, Any], scale: float) -> list[Family]:
    """The PD families of one server (``rows``: its measured PD rows)."""
    done = rows[rows["finish_s"] >= 0]
    if role == "prefill":
        boot = (done["bootstrap_s"] - done["arrival_s"]).to_numpy(dtype=float) * 1000
        alloc = boot * 0.0  # bootstrap end and waiting-queue entry: one instant here
        return [*kv_transfer_families(rows, sched, scale), *bootstrap_families(boot, alloc, sched)]
    boot = (done["bootstrap_s"] - done["prealloc_s"]).to_numpy(dtype=float) * 1000
    alloc = (done["prealloc_s"] - done["arrival_s"]).to_numpy(dtype=float) * 1000
    return bootstrap_families(boot, alloc, sched)


def write_pd_metrics(
    out_dir: Path, cfg: SimConfig, frames: Mapping[str, Any], summary: Mapping[str, Any],
    roles: Mapping[str, Any],
) -> Path:  # fmt: skip
    """Write ``out_dir/metrics.prom`` of a PD run (:func:`pd_families`); returns its path."""
    from traces import fsutil

    path = Path(out_dir) / "metrics.prom"
    fsutil.write_text_atomic(render(pd_families(cfg, frames, summary, roles)), path)
    return path
