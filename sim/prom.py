"""``metrics.prom``: a run's figures under SGLang's Prometheus names, labels and buckets.

What an SGLang server exports at ``/metrics`` (``--enable-metrics``), for the whole run: the
counters are totals, the histograms have SGLang's default buckets. Like ``summary.json`` the
request figures leave out the warm-up window's arrivals (``workload.warmup_s``, the requests
table's ``warmup`` column) and the copy counters the copies that started in it; the L3
counters are the whole run's (the tier's own counters, as in ``summary.json``'s ``storage``).
With several instances (``cluster.instances``) the counters and histograms are the fleet's
sums; the gauges are one instance's (every instance has the same pools).

Names per ``sglang.version`` (``observability/metrics_collector.py`` of each wheel):

=================================================  =========================================
metric                                             labels (both versions unless said)
=================================================  =========================================
``sglang:num_requests_total``                      model_name, engine_type (+ is_streaming
                                                   in 0.5.23)
``sglang:prompt_tokens_total``                     as num_requests_total
``sglang:generation_tokens_total``                 as num_requests_total
``sglang:cached_tokens_total``                     model_name, engine_type, cache_source:
                                                   device, host, and L3 as
                                                   ``storage_<BackendClass>`` (0.5.14) or
                                                   ``storage`` (0.5.23)
``sglang:time_to_first_token_seconds``             histogram (+ is_streaming in 0.5.23)
``sglang:e2e_request_latency_seconds``             histogram (+ is_streaming in 0.5.23)
``sglang:inter_token_latency_seconds``             histogram, model_name, engine_type
``sglang:request_time_per_output_token_seconds``   0.5.23 only; histogram (+ is_streaming)
``sglang:prompt_tokens_histogram``                 histogram
``sglang:uncached_prompt_tokens_histogram``        histogram
``sglang:generation_tokens_histogram``             histogram
``sglang:num_retracted_requests_total``            scheduler labels (model_name, engine_type,
                                                   moe_ep_rank, pp_rank, tp_rank)
``sglang:max_total_num_tokens``                    gauge, scheduler labels
``sglang:hicache_host_total_tokens``               gauge, scheduler labels (host tier on)
``sglang:load_back_tokens_total``                  cache_type (0.5.23: + dp_rank, pp_rank,
                                                   tp_rank, pool="kv")
``sglang:load_back_bytes_total``                   0.5.23 only
``sglang:hicache_backup_tokens_total``             0.5.23 only (pool="kv")
``sglang:hicache_backup_bytes_total``              0.5.23 only
``sglang:prefetched_tokens_total``                 L3 on; storage_backend + rank labels
``sglang:backuped_tokens_total``                   L3 on; as prefetched_tokens_total
=================================================  =========================================

``model_name`` is the run's model (SGLang's ``--served-model-name``, by default the model
path: compare-metrics ignores it), ``engine_type`` ``unified`` (no PD disaggregation; a PD
run's servers are ``prefill`` / ``decode``, :mod:`sim.pd.prom`), every rank label 0,
``is_streaming`` ``true`` (``bench_serving`` streams), ``cache_type`` ``HiRadixCache``
(0.5.14) or ``UnifiedRadixCache`` (0.5.23).

How each is counted, as SGLang counts it:

- per request at its finish (``TokenizerMetricsCollector.observe_one_finished_request``): the
  prompt and output tokens, one request, the ``cached_tokens_*`` columns of the request table
  (reported only when ``cached_tokens`` > 0, each source only when > 0), the e2e latency, the
  prompt / uncached (``prompt - cached_tokens``) / output token lengths; TTFT once per
  request; the per-request TPOT (0.5.23) when it has more than one output token;
- ``inter_token_latency_seconds``: SGLang observes every streamed chunk (interval over its new
  tokens, counted once per token). The simulator keeps no per-token times, so each request's
  ``output - 1`` tokens go to the bucket of its mean TPOT: ``_count`` and ``_sum`` (the
  decode time, finish - first token) are what SGLang counts at ``--stream-interval 1``; the
  bucket shape is that of per-request means (narrower than per-token intervals);
- copies: a load-back's tokens are its pages x page size (h2d ``load`` jobs), a backup's the
  d2h ``write`` jobs; bytes as moved.

Left out, and why:

- duration histograms of cache operations (``eviction_duration_seconds``,
  ``load_back_duration_seconds``, ``hicache_backup_duration_seconds``): SGLang times the
  host-side call or the copy's GPU-stream span per merged op, which the simulator does not
  model op for op (its copies are link jobs); ``evicted_tokens_total``,
  ``hicache_dropped_tokens_total``: the tree's eviction counts are not kept per token;
- gauges sampled over time (``num_running_reqs``, ``num_queue_reqs``, ``token_usage``,
  ``cache_hit_rate``, ``gen_throughput``, ``hicache_host_used_tokens``, ...): a scrape holds
  one instant's value, not the run's; the ``timeline`` table has them over time;
- queueing and stage times (``queue_time_seconds``, ``per_stage_req_latency_seconds``),
  scheduler CPU / idle seconds, forward-pass FLOPs and bytes estimates, realtime tokens:
  SGLang's own process and kernel accounting, not the simulated server's;
- L3 detail counters (``storage_prefetch_hit_tokens_total``,
  ``storage_prefetch_unfulfilled_tokens_total`` by reason, ``prefetch_pgs``,
  ``prefetch_bandwidth``, ...): per-attempt and per-batch figures the tier does not record;
- speculative decoding, grammar, LoRA, DP attention, encoder, routing-key, startup and memory
  metrics: not simulated (a PD run's metrics, per server: :mod:`sim.pd.prom`).

The text format is written here (Prometheus text exposition 0.0.4, as
``prometheus_client.generate_latest`` prints it: sorted labels, Go float formatting, no
``_created`` series, as SGLang's multiprocess registry prints none) rather than with
``prometheus_client``: the layer table (ARCHITECTURE.md §2) keeps ``sim`` to simpy, numpy and
pandas, and the values are totals known at the end (``prometheus_client``'s metric objects
count observations one by one and add ``_created`` series). The tests parse the file with
``prometheus_client`` and compare it with ``generate_latest`` of the same families.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# SGLang's default buckets (0.5.14 and 0.5.23 have the same ones):
# observability/metrics_collector.py, TokenizerMetricsCollector.__init__
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
               8.000)  # fmt: skip
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000,
                 9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000,
                 40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000,
                 1000000, 1100000)  # fmt: skip

#: the class name SGLang 0.5.14 puts in ``cache_source="storage_<name>"`` (``type(backend)
#: .__name__``, mem_cache/storage/backend_factory.py) for each simulated backend
STORAGE_BACKEND_CLASS = {"file": "HiCacheFile", "mooncake": "MooncakeStore", "3fs": "HiCacheHF3FS"}
#: the radix cache class whose name is the ``cache_type`` label
CACHE_TYPE = {"0.5.14": "HiRadixCache", "0.5.23": "UnifiedRadixCache"}


def go_float(value: float) -> str:
    """A sample value or bucket bound as Go (and ``prometheus_client``) print it: ``+Inf``,
    ``1.0``, ``1.2345678e+07``."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


@dataclass
class Family:
    """One metric: ``name`` as exported (a counter's with ``_total``), its type and help, and
    its samples ``(sample name, labels, value)``."""

    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: Mapping[str, Any], value: float, suffix: str = "") -> None:
        self.samples.append((self.name + suffix, {k: str(v) for k, v in labels.items()}, value))


def counter(name: str, doc: str, series: Iterable[tuple[Mapping[str, Any], float]]) -> Family:
    fam = Family(name, "counter", doc)
    for labels, value in series:
        fam.add(labels, value)
    return fam


def gauge(name: str, doc: str, labels: Mapping[str, Any], value: float) -> Family:
    fam = Family(name, "gauge", doc)
    fam.add(labels, value)
    return fam


def histogram(
    name: str,
    doc: str,
    labels: Mapping[str, Any],
    values: Any,
    buckets: Sequence[float],
    *,
    weights: Any = None,
    total: float | None = None,
) -> Family:
    """A histogram of ``values`` (each counted ``weights`` times, default once) with SGLang's
    ``buckets`` (``le``: value <= bound; cumulative, ``+Inf`` last); ``_sum`` is ``total``
    (default the weighted sum of the values). No sample at all when nothing was observed (a
    labelled SGLang histogram has no child until its first observation)."""
    import numpy as np

    fam = Family(name, "histogram", doc)
    v = np.asarray(values, dtype=float)
    w = np.ones(len(v)) if weights is None else np.asarray(weights, dtype=float)
    if not len(v) or w.sum() == 0:
        return fam
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.concatenate([[0.0], np.cumsum(w)])
    for b in buckets:
        count = float(cum[np.searchsorted(v, b, side="right")])
        fam.add({**labels, "le": go_float(b)}, count, "_bucket")
    fam.add({**labels, "le": "+Inf"}, float(cum[-1]), "_bucket")
    fam.add(labels, float(cum[-1]), "_count")
    fam.add(labels, float((v * w).sum()) if total is None else float(total), "_sum")
    return fam


def render(families: Iterable[Family]) -> str:
    """The Prometheus text exposition (0.0.4) of ``families``, line for line as
    ``prometheus_client.generate_latest`` prints the same values."""

    def esc(s: str) -> str:
        return s.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")

    out: list[str] = []
    for fam in families:
        doc = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {fam.name} {doc}\n# TYPE {fam.name} {fam.type}\n")
        for name, labels, value in fam.samples:
            lab = ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels.items()))
            out.append(
                f"{name}{{{lab}}} {go_float(value)}\n" if lab else f"{name} {go_float(value)}\n"
            )
    return "".join(out)


# ------------------------------------------------------------------------------ the run --
def run_families(
    requests: Any,
    transfers: Any,
    *,
    sglang_version: str,
    model_name: str,
    page_size: int,
    device_tokens: int,
    host_tokens: int,
    warmup_end_s: float | None = None,
    storage: Mapping[str, Any] | None = None,
    engine_type: str = "unified",
    extra_labels: Mapping[str, str] | None = None,
) -> list[Family]:
    """The families of one run: ``requests`` and ``transfers`` are the run's tables (the
    requests with the ``cached_tokens*`` columns, and the ``warmup`` column when the run had a
    window); ``storage``: ``summary.json``'s ``storage`` block (L3 on), else None.

    ``engine_type``: SGLang's label of the server's disaggregation mode (``unified``, or
    ``prefill`` / ``decode`` for one server of a PD run, :mod:`sim.pd.prom`);
    ``extra_labels``: labels put on every series, as ``--extra-metric-labels`` does (a PD
    run's ``server``)."""
    v23 = sglang_version != "0.5.14"
    req = requests
    if "warmup" in req.columns:
        req = req[~req["warmup"].astype(bool)]
    done = req[req["finish_s"] >= 0]
    tr = transfers
    if warmup_end_s is not None and len(tr):
        tr = tr[tr["start_s"] >= warmup_end_s]
    extra = dict(extra_labels or {})
    tok = {"model_name": model_name, "engine_type": engine_type, **extra}
    stream = {**tok, "is_streaming": "true"} if v23 else tok
    sched = {**tok, "moe_ep_rank": 0, "pp_rank": 0, "tp_rank": 0}
    cache: dict[str, Any] = {
        "cache_type": CACHE_TYPE.get(sglang_version, "UnifiedRadixCache"),
        **extra,
    }
    if v23:
        cache |= {"dp_rank": 0, "pp_rank": 0, "tp_rank": 0}

    def total(df: Any, col: str) -> float:
        return float(df[col].sum()) if len(df) else 0.0

    n = len(done)
    fams = [
        counter("sglang:num_requests_total", "Number of requests processed.",
                [(stream, n)] if n else []),
        counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                [(stream, total(done, "prompt_tokens"))] if n else []),
        counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                [(stream, total(done, "output_tokens"))] if n else []),
    ]  # fmt: skip
    hit = done[done["cached_tokens"] > 0]
    backend = (storage or {}).get("backend")
    l3 = "storage" if v23 else f"storage_{STORAGE_BACKEND_CLASS.get(backend or '', 'unknown')}"
    sources = [("device", "cached_tokens_device"), ("host", "cached_tokens_host")]
    if storage is not None or total(hit, "cached_tokens_storage") > 0:
        sources.append((l3, "cached_tokens_storage"))
    fams.append(counter(
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens by source (device/host/storage).",
        [({**tok, "cache_source": s}, total(hit, c)) for s, c in sources if total(hit, c) > 0],
    ))  # fmt: skip
    ttft, e2e = done["ttft_s"].to_numpy(), done["e2e_s"].to_numpy()
    out = done["output_tokens"].to_numpy()
    decode = (done["finish_s"] - done["first_token_s"]).to_numpy(dtype=float)
    multi = out > 1
    fams += [
        histogram("sglang:time_to_first_token_seconds",
                  "Histogram of time to first token in seconds.", stream, ttft, TTFT_BUCKETS),
        histogram("sglang:inter_token_latency_seconds",
                  "Histogram of inter-token latency in seconds.", tok,
                  done["tpot_s"].to_numpy()[multi], ITL_BUCKETS, weights=out[multi] - 1,
                  total=float(decode[multi].sum())),
    ]  # fmt: skip
    if v23:
        fams.append(histogram(
            "sglang:request_time_per_output_token_seconds",
            "Per-request TPOT in seconds: (finished_time - first_token_time) / "
            "(completion_tokens - 1).", stream, done["tpot_s"].to_numpy()[multi], ITL_BUCKETS,
        ))  # fmt: skip
    fams += [
        histogram("sglang:e2e_request_latency_seconds",
                  "Histogram of End-to-end request latency in seconds", stream, e2e,
                  E2E_BUCKETS),
        histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", tok,
                  done["prompt_tokens"].to_numpy(), TOKEN_BUCKETS),
        histogram("sglang:uncached_prompt_tokens_histogram",
                  "Histogram of uncached (compute) prompt token length.", tok,
                  (done["prompt_tokens"] - done["cached_tokens"]).to_numpy(), TOKEN_BUCKETS),
        histogram("sglang:generation_tokens_histogram",
                  "Histogram of generation token length.", tok, out, TOKEN_BUCKETS),
        counter("sglang:num_retracted_requests_total",
                "Total number of retracted requests.",
                [(sched, total(req, "retractions"))]),
        gauge("sglang:max_total_num_tokens",
              "Maximum total number of tokens in the KV cache pool.", sched, device_tokens),
    ]  # fmt: skip
    if host_tokens:
        doc = "Total capacity of the host KV cache in tokens."
        fams.append(gauge("sglang:hicache_host_total_tokens", doc, sched, host_tokens))
    loads = tr[(tr["direction"] == "h2d") & (tr["kind"] == "load")] if len(tr) else tr
    writes = tr[(tr["direction"] == "d2h") & (tr["kind"] == "write")] if len(tr) else tr
    load_tokens = total(loads, "pages") * page_size
    pool = {**cache, "pool": "kv"} if v23 else cache
    fams.append(counter("sglang:load_back_tokens_total",
                        "The number of tokens loaded from CPU to GPU." if not v23 else
                        "The number of tokens loaded back from local host DRAM (L2) to GPU, "
                        "by host pool (kv, swa, mamba, ...). Every TP rank reports the same "
                        "logical count under its own rank labels; read one rank rather than "
                        "summing ranks.",
                        [(pool, load_tokens)] if load_tokens else []))  # fmt: skip
    if v23:
        backup_tokens = total(writes, "pages") * page_size
        fams += [
            counter("sglang:load_back_bytes_total",
                    "Bytes loaded back from local host DRAM (L2) to GPU, all pools combined, "
                    "including draft/sidecar transfers that the token counter excludes. Each "
                    "rank reports its own KV shard; sum ranks for the physical total. A "
                    "window's byte delta divided by the same window's "
                    "load_back_duration_seconds sum is the bytes-weighted active bandwidth; "
                    "the plain rate is wall-clock payload traffic that includes idle time.",
                    [(cache, total(loads, "bytes"))] if load_tokens else []),
            counter("sglang:hicache_backup_tokens_total",
                    "The number of tokens backed up from GPU to local host DRAM (L2), by host "
                    "pool (kv, swa, mamba, ...). Covers all D->H backups regardless of "
                    "--hicache-write-policy. Distinct from the host-to-storage (L3) "
                    "sglang:backuped_tokens_total. Every TP rank reports the same logical "
                    "count under its own rank labels; read one rank rather than summing "
                    "ranks.", [(pool, backup_tokens)] if backup_tokens else []),
            counter("sglang:hicache_backup_bytes_total",
                    "Bytes backed up from GPU to local host DRAM (L2), all pools combined, "
                    "including draft/sidecar transfers that the token counter excludes. Each "
                    "rank reports its own KV shard; sum ranks for the physical total. A "
                    "window's byte delta divided by the same window's "
                    "hicache_backup_duration_seconds sum is the bytes-weighted active "
                    "bandwidth; the plain rate is wall-clock payload traffic that includes "
                    "idle time.",
                    [(cache, total(writes, "bytes"))] if backup_tokens else []),
        ]  # fmt: skip
    if storage is not None:
        st = {"attn_cp_rank": 0, "attn_cp_size": 1, "dp_rank": 0, "pp_rank": 0, "pp_size": 1,
              "storage_backend": backend or "unknown", "tp_rank": 0, **extra}  # fmt: skip
        pre, back = storage.get("prefetched_tokens", 0), storage.get("backed_up_tokens", 0)
        fams += [
            counter("sglang:prefetched_tokens_total",
                    "Prompt tokens successfully transferred from L3 storage into host memory, "
                    "before admission-time reuse or discard." if v23 else
                    "Number of prefetched prompt tokens.",
                    [(st, pre)] if pre else []),
            counter("sglang:backuped_tokens_total", "Number of backuped tokens.",
                    [(st, back)] if back else []),
        ]  # fmt: skip
    return fams


# ------------------------------------------------------------------ reading histograms --
def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile(q, ...)`` over cumulative ``buckets`` ``(le, count)``
    (``+Inf`` last): linear interpolation inside the bucket the rank falls in, the first
    bucket from 0; a rank in the ``+Inf`` bucket gives the highest finite bound; NaN without
    observations."""
    bs = sorted(buckets)
    if len(bs) < 2 or not math.isinf(bs[-1][0]):
        return math.nan
    total = bs[-1][1]
    if total <= 0 or not 0 <= q <= 1:
        return math.nan
    rank = q * total
    i = next(i for i, (_, c) in enumerate(bs) if c >= rank)
    if i == len(bs) - 1:
        return bs[-2][0]
    if i == 0 and bs[0][0] <= 0:
        return bs[0][0]
    lo, below = (0.0, 0.0) if i == 0 else bs[i - 1]
    hi, count = bs[i]
    return lo + (hi - lo) * (rank - below) / (count - below) if count > below else hi
