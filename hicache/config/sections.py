"""The config sections (frozen dataclasses with their defaults and the reasons) and the
whole-run :class:`SimConfig` with its cross-section checks (loading: :mod:`.loading`; the
shared validation helpers: :mod:`.base`; the ``[pd]`` section: :mod:`.pd`)."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, cast

from hicache import hardware
from hicache.config.base import (
    ROUTER_POLICIES,
    ConfigError,
    _at_least,
    _between,
    _choice,
    _in_unit,
    _positive,
    _preset,
)
from hicache.config.pd import PdConfig
from hicache.latency import shipped_profile_path, shipped_profiles
from hicache.policy import STRATEGIES, WRITE_POLICIES
from hicache.policy.storage import PREFETCH_POLICIES
from hicache.profile import machine_mismatch
from hicache.servers import DEFAULT_SERVER, ServerSpec, get_server, rank_link_share
from hicache.versions import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS

#: ``--hicache-io-backend`` values the simulator models (``kernel_ascend`` is NPU-only).
IO_BACKENDS = ("kernel", "direct")
#: ``--hicache-mem-layout`` values the simulator models (``page_first_kv_split`` is Ascend-only).
MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
#: Admission orders the scheduler implements (ARCHITECTURE.md §4: FCFS or LPM).
SCHEDULE_POLICIES = ("fcfs", "lpm")
#: ``scheduler.engine``: the fast scheduler (decode segments, chains, gates, spans) or the
#: reference one (one event per forward, sim/reference.py); the differential test holds them equal.
SCHEDULER_ENGINES = ("fast", "reference")
#: ``auto``: closed loop when the requests used record ``think_time_ms`` (a session id alone is
#: not enough); ``on``: closed loop for every session; ``off``: replay the timestamps as they are.
CLOSED_LOOP_MODES = ("auto", "on", "off")
#: What ``cache_finished_req`` inserts: prompt + outputs, or the prompt only (as sim.hitrate).
OUTPUT_MODES = ("cache", "skip")
#: Which symbols a request's output pages get (``workload.output_reuse``, hicache.output_keys).
OUTPUT_REUSE_MODES = ("none", "next_turn")
#: ``cache.eviction`` names: SGLang 0.5.14's strategies, and ``tlru`` (0.5.21+, so
#: ``sglang.version`` 0.5.23 only; checked across sections by :class:`SimConfig`).
EVICTION_CHOICES = (*STRATEGIES, "tlru")
#: ``model.weight_dtype`` / ``model.kv_dtype`` values (``hicache.models``: their bytes).
WEIGHT_DTYPES = (hardware.AUTO_DTYPE, *hardware.WEIGHT_DTYPE_BYTES)
KV_DTYPES = (hardware.AUTO_DTYPE, *hardware.KV_DTYPE_BYTES)
#: SGLang's --hicache-ratio when none is given (0.5.14 pool_host/base.py; 0.5.23
#: hicache_hook.py:100-126 resolves None to it in the default host mode).
DEFAULT_HICACHE_RATIO = 2.0
#: ... and in ``--hicache-host-memory-mode buffer_only`` (0.5.23 hicache_hook.py:121-124: host
#: RAM only stages copies to and from L3, so it needs less).
BUFFER_ONLY_HICACHE_RATIO = 1.2
#: ``cache.host_memory_mode`` values: SGLang 0.5.19+'s --hicache-host-memory-mode
#: (arg_groups/hicache_hook.py:247-252).
HOST_MEMORY_MODES = ("cache", "buffer_only")
#: The most pages a pool may have: the policy core keeps a free list per pool (about 40 B a
#: page), so a pool beyond this is a typo (1e12 tokens) rather than a study, and would exhaust
#: memory instead of giving an error. A real pool at page size 1 is ~10^6 pages.
MAX_POOL_PAGES = 1 << 26


# --- sections --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Which model is served, and how it is split."""

    section: ClassVar[str] = "model"

    # the most common single-GPU HiCache target in SGLang's docs and benchmarks
    name: str = "llama-3-8b"
    # "" = the preset model.name; else a Hugging Face config.json path (or a preset name): any
    # dense GQA, MoE or MLA model; KV bytes, weights and FLOPs come from it
    config: str = ""
    # one GPU: the simplest setup, and the host pool is sized per rank anyway
    tp: int = 1
    # SGLang's --ep-size (expert parallelism of the MoE layers; 1 = off, as SGLang's default):
    # each rank holds num_experts / ep whole experts instead of every expert's 1 / tp slice;
    # SGLang needs ep = tp (ep_size x moe_dp_size = tp_size, moe_dp_size 1). MoE models only;
    # the standard token dispatcher (--moe-a2a-backend none), so the all-reduce stays
    ep: int = 1
    # bytes per weight as served: "auto" = the model's own (bf16, or a quantized config.json's
    # width), else bf16/fp16 (2 B), fp8/int8 (1 B: an FP8 or Int8 checkpoint, SGLang's
    # --quantization fp8) or int4 (0.5 B: AWQ, GPTQ-Int4); sets the weights' HBM and so the
    # derived device pool, and the weight-read time of a forward pass
    weight_dtype: str = "auto"
    # SGLang's --kv-cache-dtype: "auto" = the model's dtype (bf16 for every preset), bf16, or
    # fp8_e4m3 / fp8_e5m2 (1 byte per element): sets the KV bytes per token, so the tokens a
    # device or host GB holds, the bytes every copy moves and the KV read time of attention
    kv_dtype: str = "auto"

    def __post_init__(self) -> None:
        where = "model.config" if self.config else "model.name"
        if self.config:
            object.__setattr__(self, "config", hardware.preset_name(self.config) or self.config)
        else:
            object.__setattr__(self, "name", hardware.preset_name(self.name) or self.name)
        _preset(where, hardware.get_model, self.config or self.name)
        _at_least("model.tp", self.tp, 1)
        _at_least("model.ep", self.ep, 1)
        _choice("model.weight_dtype", self.weight_dtype, WEIGHT_DTYPES)
        _choice("model.kv_dtype", self.kv_dtype, KV_DTYPES)
        try:
            hardware.kv_bytes_per_token(self.spec, self.tp)
        except ValueError as e:
            raise ConfigError("model.tp", str(e)) from None
        if self.ep > 1:
            self._check_ep()

    def _check_ep(self) -> None:
        """SGLang's rule for ``--ep-size`` > 1 (arg_groups/parallel_hook.py:175-183:
        ``ep_size * moe_dp_size == tp_size``; ``moe_dp_size`` is 1 here), and whole experts
        per rank (fused_moe_triton/layer.py:390-428)."""
        m = self.spec
        if not m.num_experts:
            raise ConfigError("model.ep", f"{m.name} has no MoE layers: expert parallelism "
                                          "applies to MoE models")  # fmt: skip
        if self.ep != self.tp:
            raise ConfigError("model.ep", f"SGLang needs --ep-size equal to --tp-size (ep_size x "
                                          f"moe_dp_size = tp_size), got ep {self.ep}, tp "
                                          f"{self.tp}")  # fmt: skip
        if m.num_experts % self.ep:
            raise ConfigError("model.ep", f"ep {self.ep} does not split {m.name}'s "
                                          f"{m.num_experts} experts")  # fmt: skip

    @functools.cached_property
    def spec(self) -> hardware.ModelSpec:
        """The served model: ``model.config`` when set, else the preset ``model.name``, at
        ``model.weight_dtype`` and ``model.kv_dtype``."""
        model = hardware.get_model(self.config or self.name)
        return hardware.with_dtypes(model, self.kv_dtype, self.weight_dtype)


@dataclass(frozen=True)
class GpuConfig:
    """The GPU and how much of its HBM becomes the device KV pool."""

    section: ClassVar[str] = "gpu"

    # the GPU SGLang's HiCache benchmarks and blog mostly report
    name: str = "h100-sxm"
    # SGLang's typical --mem-fraction-static on 80 GB cards; the rest holds activations/graphs
    mem_fraction: float = 0.9
    # GB (1e9 B) already in use before the pool is sized (CUDA context, cuBLAS/NCCL workspaces)
    # that SGLang sees as not free; ~1 GB on Hopper [model]
    reserve_gb: float = 1.0
    # 0 = derive from HBM (an estimate); set it to the max_total_num_tokens SGLang logs at
    # start-up for exact fidelity (recommended)
    device_tokens: int = 0
    # the machine the GPUs sit in: how tensor-parallel ranks share PCIe uplinks and socket
    # memory when they copy at once; "" = the GPU's usual server (dgx-h100 for h100-sxm)
    server: str = ""
    # GB (1e9 B) of host RAM free for this instance (all its ranks) when SGLang starts, which
    # 0.5.23 sizes its default host pool from; 0 = the server's DRAM split evenly among the
    # instances that fill it (its GPUs / model.tp) [estimate: SGLang reads psutil's free
    # memory at start-up, which depends on what else runs and started first]
    host_memory_gb: float = 0.0
    # run a configuration whose host pools (every rank on a server, plus SGLang's 10 GiB
    # reserve) exceed the server's DRAM (or gpu.host_memory_gb) anyway, with a warning;
    # false = refuse it, as the machine would fail to pin the memory
    allow_host_overcommit: bool = False

    def __post_init__(self) -> None:
        _preset("gpu.name", hardware.get_gpu, self.name)
        object.__setattr__(self, "name", hardware.gpu_name(self.name))  # H100 -> h100-sxm
        if self.server:
            _preset("gpu.server", get_server, self.server)
        _in_unit("gpu.mem_fraction", self.mem_fraction)
        _at_least("gpu.reserve_gb", self.reserve_gb, 0)
        _at_least("gpu.device_tokens", self.device_tokens, 0)
        _at_least("gpu.host_memory_gb", self.host_memory_gb, 0)


@dataclass(frozen=True)
class LinkConfig:
    """The host link and how HiCache drives it.

    As SGLang's ``_handle_hicache`` does, ``page_first`` with ``direct`` IO becomes
    ``page_first_direct`` (the direct-IO form of the same layout). ``page_first_direct`` with
    ``kernel`` IO is rejected rather than silently switching the backend.
    """

    section: ClassVar[str] = "link"

    # "" = the GPU's usual host link (pcie5-x16 on H100/H200), filled in by SimConfig
    name: str = ""
    # SGLang 0.5.14's --hicache-io-backend default (gather/scatter kernels)
    io_backend: str = "kernel"
    # SGLang 0.5.14's --hicache-mem-layout default (token-major host pool)
    mem_layout: str = "page_first"

    def __post_init__(self) -> None:
        if self.name:
            _preset("link.name", hardware.get_link, self.name)
        _choice("link.io_backend", self.io_backend, IO_BACKENDS)
        _choice("link.mem_layout", self.mem_layout, MEM_LAYOUTS)
        if self.io_backend == "direct" and self.mem_layout == "page_first":
            object.__setattr__(self, "mem_layout", "page_first_direct")
        if self.io_backend == "kernel" and self.mem_layout == "page_first_direct":
            raise ConfigError(
                "link.mem_layout",
                "page_first_direct needs io_backend=direct (use page_first with kernel IO)",
            )
        if self.io_backend == "direct" and self.mem_layout == "page_head":
            raise ConfigError(
                "link.mem_layout",
                "page_head needs io_backend=kernel (SGLang 0.5.14 has no direct copy for it)",
            )


@dataclass(frozen=True)
class CacheConfig:
    """HiCache policy and the host tier."""

    section: ClassVar[str] = "cache"

    # SGLang's default is 1 on CUDA, but HiCache setups use 64: 1-token pages make tiny,
    # slow host copies (HARDWARE.md C3) and 64 is what its docs and benchmarks run
    page_size: int = 64
    # SGLang 0.5.14's --hicache-write-policy default
    write_policy: str = "write_through"
    # SGLang's --radix-eviction-policy default
    eviction: str = "lru"
    # SGLang's --hicache-ratio (host pool = ratio x device pool); 0 = not given: SGLang's
    # default, 2.0, which 0.5.23 shrinks to fit the server's free DRAM
    # (cache.hicache_host_memory_fraction)
    hicache_ratio: float = 0.0
    # SGLang's --hicache-size default: 0 = size by ratio; > 0 = GB (1e9 B) per rank, wins
    hicache_size_gb: float = 0.0
    # SGLang 0.5.21+'s --hicache-host-memory-fraction default: with neither ratio nor size
    # given, the host pool takes at most this share of the free DRAM (after a 10 GiB reserve)
    # per rank, and never more than 2 x device; 0.5.14 has no such cap
    hicache_host_memory_fraction: float = 0.8
    # the host tier is what is being studied; False = plain RadixCache, the baseline
    enable_host: bool = True
    # hard-coded in SGLang 0.5.14 (POLICY_CORE.md §4.3): shorter host hits are recomputed
    load_back_threshold: int = 10
    # SGLang 0.5.20+'s --radix-eviction-policy-config: a JSON object of the strategy's
    # parameters (slru protected_threshold; tlru threshold, next_prompt_estimate, in tokens);
    # "" = SGLang's defaults. sglang.version 0.5.23 only
    eviction_policy_config: str = ""
    # SGLang 0.5.19+'s --hicache-host-memory-mode: "cache" (its default: host RAM is the L2
    # tier) or "buffer_only" (host RAM only stages copies between HBM and the L3 store:
    # nothing is host-cached, every hit is device or L3; needs storage.backend, turns
    # write_back into write_through, and an unset cache.hicache_ratio means 1.2, not 2.0).
    # sglang.version 0.5.23 only
    host_memory_mode: str = "cache"

    def __post_init__(self) -> None:
        _at_least("cache.page_size", self.page_size, 1)
        _choice("cache.write_policy", self.write_policy, WRITE_POLICIES)
        _choice("cache.host_memory_mode", self.host_memory_mode, HOST_MEMORY_MODES)
        if self.host_memory_mode == "buffer_only" and self.write_policy == "write_back":
            # SGLang resolves it so (hicache_hook.py:278-288): no host tier to write back to
            object.__setattr__(self, "write_policy", "write_through")
        _choice("cache.eviction", self.eviction, EVICTION_CHOICES)
        _at_least("cache.hicache_ratio", self.hicache_ratio, 0)
        if self.hicache_ratio > 0 and not self.hicache_ratio > 0:
            raise ConfigError("cache.hicache_ratio", f"must be > 0, got {self.hicache_ratio:g}")
        _between("cache.hicache_host_memory_fraction", self.hicache_host_memory_fraction, 0.01, 1.0)
        _at_least("cache.hicache_size_gb", self.hicache_size_gb, 0)
        _at_least("cache.load_back_threshold", self.load_back_threshold, 0)
        self.eviction_params()  # a bad JSON object is refused here

    #: parameter names each strategy reads from ``eviction_policy_config``
    EVICTION_PARAMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "slru": ("protected_threshold",),
        "tlru": ("threshold", "next_prompt_estimate"),
    }

    def eviction_params(self) -> dict[str, int]:
        """``eviction_policy_config`` parsed: ``{}`` when empty; ConfigError for text that
        is not a JSON object of integers, or a name the strategy does not read."""
        if not self.eviction_policy_config.strip():
            return {}
        where = "cache.eviction_policy_config"
        try:
            data = json.loads(self.eviction_policy_config)
        except json.JSONDecodeError as e:
            raise ConfigError(where, f"not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(where, 'expected a JSON object, e.g. {"threshold": 1024}')
        known = self.EVICTION_PARAMS.get(self.eviction, ())
        out = {}
        for k, v in data.items():
            if k not in known:
                reads = ", ".join(known) if known else "no parameters"
                raise ConfigError(where, f"{k!r}: eviction {self.eviction} reads {reads}")
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(where, f"{k!r}: expected an integer, got {v!r}")
            out[k] = v
        return out


@dataclass(frozen=True)
class SchedulerConfig:
    """SGLang scheduler knobs that shape HiCache behaviour (POLICY_CORE.md §4.4, §6)."""

    section: ClassVar[str] = "scheduler"

    # SGLang's --schedule-policy default (no reordering, no matching at admission)
    policy: str = "fcfs"
    # SGLang's --chunked-prefill-size default for 80-160 GB GPUs (H100/H200); -1 disables
    chunked_prefill_size: int = 8192
    # SGLang's --max-prefill-tokens default
    max_prefill_tokens: int = 16384
    # SGLang's --enable-mixed-chunk (default off): with chunked prefill on, a prefill batch
    # also carries one decode step of every running request (mix_with_running), so decoding
    # does not pause while a long prompt prefills; the prefill budgets give up one token per
    # running request
    enable_mixed_chunk: bool = False
    # 0 = no limit beyond the KV pool (SGLang derives a cap from the pool size)
    max_running_requests: int = 0
    # env SGLANG_INIT_NEW_TOKEN_RATIO default
    init_new_token_ratio: float = 0.7
    # env SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR default: min ratio = init x factor
    min_new_token_ratio_factor: float = 0.14
    # env SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS default
    new_token_ratio_decay_steps: int = 600
    # SGLang's --schedule-conservativeness default (scales new_token_ratio)
    schedule_conservativeness: float = 1.0
    # env SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION default: cap on reserved decode tokens
    clip_max_new_tokens: int = 4096
    # env SGLANG_RETRACT_DECODE_STEPS default: tokens reserved per request after a retract
    retract_decode_steps: int = 20
    # "fast": the scheduler that runs decode steps in segments (the default); "reference":
    # SGLang's loop one forward per event (sim/reference.py), same results, several times slower
    engine: str = "fast"

    def __post_init__(self) -> None:
        _choice("scheduler.policy", self.policy, SCHEDULE_POLICIES)
        _choice("scheduler.engine", self.engine, SCHEDULER_ENGINES)
        if self.chunked_prefill_size != -1 and self.chunked_prefill_size < 1:
            raise ConfigError(
                "scheduler.chunked_prefill_size",
                f"must be -1 (off) or >= 1, got {self.chunked_prefill_size}",
            )
        _at_least("scheduler.max_prefill_tokens", self.max_prefill_tokens, 1)
        _at_least("scheduler.max_running_requests", self.max_running_requests, 0)
        _in_unit("scheduler.init_new_token_ratio", self.init_new_token_ratio)
        _in_unit("scheduler.min_new_token_ratio_factor", self.min_new_token_ratio_factor)
        _at_least("scheduler.new_token_ratio_decay_steps", self.new_token_ratio_decay_steps, 1)
        _positive("scheduler.schedule_conservativeness", self.schedule_conservativeness)
        _at_least("scheduler.clip_max_new_tokens", self.clip_max_new_tokens, 1)
        _at_least("scheduler.retract_decode_steps", self.retract_decode_steps, 0)


@dataclass(frozen=True)
class WorkloadConfig:
    """How the trace is replayed."""

    section: ClassVar[str] = "workload"

    # the trace as recorded; arrival timestamps are divided by this (2.0 = twice the load);
    # within [1e-6, 1e6], so that scaled timestamps stay finite
    rate_scale: float = 1.0
    # 0 = every request in the trace
    max_requests: int = 0
    # closed loop exactly when the trace records think times (sim.engine.resolve_closed_loop)
    closed_loop: str = "auto"
    # outputs enter the cache at finish, as cache_finished_req does in SGLang
    outputs: str = "cache"
    # none: output pages get symbols of their own (they take cache space, no later prompt
    # hits them). next_turn: a session turn's output pages get the symbols of its session's
    # next prompt at those positions, when that prompt extends this one (a chat client sends
    # the answer back in the next turn, so SGLang matches the cached output KV there;
    # hicache.output_keys)
    output_reuse: str = "none"
    # 0 = no warm-up window. Else the requests that arrive within this many simulated seconds
    # (after rate_scale) of the first arrival run (they fill the caches and load the server as
    # on a server already running) but count in no summary figure (sim.metrics.summarize;
    # PCIe bytes: the copies started after the window); summary.json says how many
    # (warmup_requests), requests.parquet marks them (column warmup)
    warmup_s: float = 0.0
    # true: the run replays a replica of the trace with its sessions' start offsets permuted
    # by run.seed (traces.resample.resample_sessions; seed 0 keeps the trace as recorded),
    # so that runs with different seeds give an interval (run/sweep/plan --seeds K set it)
    resample_sessions: bool = False
    # SGLang's --context-length: 0 = none (every request as recorded; the pool alone bounds
    # them). Else a prompt of min(max_context - 1, device pool - 1) - 5 tokens or more is
    # aborted at arrival, or cut to that length with auto_truncate, and outputs are capped
    # to fit (traces.context, as SGLang's validate_input_length and init_req_max_new_tokens)
    max_context: int = 0
    # SGLang's --allow-auto-truncate: cut over-long prompts (their head kept) instead of
    # aborting them
    auto_truncate: bool = False

    def __post_init__(self) -> None:
        _between("workload.rate_scale", self.rate_scale, 1e-6, 1e6)
        _between("workload.warmup_s", self.warmup_s, 0.0, 1e12)
        _at_least("workload.max_requests", self.max_requests, 0)
        _at_least("workload.max_context", self.max_context, 0)
        if 0 < self.max_context < 7:  # SGLang keeps at most max_context - 6 prompt tokens
            raise ConfigError(
                "workload.max_context",
                f"must be 0 (none) or at least 7 tokens, got {self.max_context}",
            )
        _choice("workload.closed_loop", self.closed_loop, CLOSED_LOOP_MODES)
        _choice("workload.outputs", self.outputs, OUTPUT_MODES)
        _choice("workload.output_reuse", self.output_reuse, OUTPUT_REUSE_MODES)


@dataclass(frozen=True)
class SglangConfig:
    """The SGLang release whose HiCache decisions the run reproduces (``hicache.versions``)."""

    section: ClassVar[str] = "sglang"

    # 0.5.23: UnifiedRadixCache (SGLang >= 0.5.19, what its users run today; the default);
    # 0.5.14: HiRadixCache (SGLang <= 0.5.18), the release this tool was first built against
    version: str = DEFAULT_SGLANG_VERSION

    def __post_init__(self) -> None:
        _choice("sglang.version", self.version, tuple(SGLANG_VERSIONS))


@dataclass(frozen=True)
class RunConfig:
    """Reproducibility and outputs."""

    section: ClassVar[str] = "run"

    # a fixed seed: same config + same seed => byte-identical summary (ARCHITECTURE.md §5)
    seed: int = 0
    # "" = the shipped default profile for gpu + link; else a (calibrated) profile JSON path
    profile: str = ""
    # enough rows to plot a run, small enough to keep timeline.parquet to a few MB; 0 = none
    timeline_max_rows: int = 20000
    # off: Chrome traces get large and are only needed when debugging a schedule
    chrome_trace: bool = False
    # off: a run.profile measured on another machine (CPU tensors, another GPU; its provenance
    # says) is refused for gpu.name, since its constants would be silently wrong; true uses it
    # anyway, for a deliberate what-if (the CLI prints a warning)
    allow_profile_mismatch: bool = False

    def __post_init__(self) -> None:
        _at_least("run.seed", self.seed, 0)
        _at_least("run.timeline_max_rows", self.timeline_max_rows, 0)


#: ``storage.backend`` names: "none" plus the presets of ``hicache.storage_backends``.
STORAGE_BACKENDS = ("none", "file", "3fs", "mooncake")


@dataclass(frozen=True)
class ClusterConfig:
    """Many copies of the configured server behind one router, in one simulation."""

    section: ClassVar[str] = "cluster"

    # one server: a cluster of one is exactly the single-server run
    instances: int = 1

    def __post_init__(self) -> None:
        _between("cluster.instances", self.instances, 1, 4096)


@dataclass(frozen=True)
class RouterConfig:
    """How requests are routed to instances (only used with cluster.instances > 1).

    Defaults are the SGLang model gateway's as its Python launcher sets them
    (``sglang_router`` ``RouterArgs``: cache_threshold 0.3, balance_abs_threshold 64,
    balance_rel_threshold 1.5, eviction_interval_secs 60, max_tree_size 2^26 characters) and
    NVIDIA Dynamo's KV router's tier credits (host 0.75, disk 0.25; device 1).
    """

    section: ClassVar[str] = "router"

    # the SGLang model gateway's default policy
    policy: str = "cache_aware"
    # seeds random and power_of_two (the same seed routes the same way)
    seed: int = 0
    # cache_aware: route to the best-matching instance when its match rate is above this
    cache_threshold: float = 0.3
    # cache_aware: imbalanced when max - min in-flight requests exceeds this ...
    balance_abs_threshold: int = 64
    # ... and max > this x min; then the least-loaded instance gets the request
    balance_rel_threshold: float = 1.5
    # cache_aware: seconds between evictions of the router's approximate prefix tree
    eviction_interval_s: float = 60.0
    # cache_aware: tokens of prefix the router remembers per instance; the gateway's 2^26
    # characters at ~4 characters per token [model]
    max_tree_tokens: int = 16_777_216
    # cache_aware: tokens per node of the router's prefix tree (whole pages; 0 = one page). The
    # gateway keys characters; Mooncake-format traces share prefixes in 512-token blocks, so
    # nothing finer carries information for them, and a node per page costs 8x the memory
    tree_block_tokens: int = 512
    # tier_aware: credit per cached prefix block on the device (Dynamo overlap_score_credit)
    device_weight: float = 1.0
    # tier_aware: credit per block cached on host only (Dynamo host_cache_hit_weight)
    host_weight: float = 0.75

    def __post_init__(self) -> None:
        _choice("router.policy", self.policy, ROUTER_POLICIES)
        _at_least("router.seed", self.seed, 0)
        _between("router.cache_threshold", self.cache_threshold, 0.0, 1.0)
        _at_least("router.balance_abs_threshold", self.balance_abs_threshold, 0)
        _at_least("router.balance_rel_threshold", self.balance_rel_threshold, 1.0)
        _positive("router.eviction_interval_s", self.eviction_interval_s)
        _at_least("router.max_tree_tokens", self.max_tree_tokens, 1)
        _at_least("router.tree_block_tokens", self.tree_block_tokens, 0)
        _between("router.device_weight", self.device_weight, 0.0, 1.0)
        _between("router.host_weight", self.host_weight, 0.0, 1.0)


@dataclass(frozen=True)
class StorageConfig:
    """The L3 storage tier behind host DRAM (SGLang's ``--hicache-storage-*``; STORAGE_TIER.md).

    ``backend = "none"`` is SGLang's default: no L3. A backend preset (``hicache.storage_backends``)
    gives the I/O costs; the ``*_override`` keys replace single figures of it.
    """

    section: ClassVar[str] = "storage"

    # --hicache-storage-backend; "none" = no L3 tier (SGLang's default)
    backend: str = "none"
    # --hicache-storage-prefetch-policy (0.5.14 default: timeout)
    prefetch_policy: str = "timeout"
    # extra-config prefetch_threshold: tokens a prefetch must ask for (and find) at least
    prefetch_threshold: int = 256
    # extra-config prefetch_timeout_base, seconds (timeout policy); -1 = the version's default
    # (0.5.14: 2.0 from the operation's start; 0.5.23: 1.0 from the first blocked admission poll)
    prefetch_timeout_base: float = -1.0
    # extra-config prefetch_timeout_per_ki_token, seconds per 1,024 tokens (timeout policy;
    # 0.5.14: hit tokens, 0.5.23: requested tokens); -1 = the version's default (0.1 / 0.25)
    prefetch_timeout_per_ki_token: float = -1.0
    # extra-config prefetch_timeout_max, seconds (timeout policy; SGLang 0.5.14 only, 0.5.23 has
    # no cap); -1 = the default (30)
    prefetch_timeout_max: float = -1.0
    # store size in GB (1e9 B) of KV; 0 = unbounded (the file backend's default); when set, a
    # page LRU evicts as the file backend's max_size evictor does
    capacity_gb: float = 0.0
    # the file backend's eviction_ratio: a full store evicts down to this share of its size
    eviction_ratio: float = 0.9
    # auto: as the backend preset says (3FS and Mooncake stores are shared by every instance,
    # local files are not); yes: one store and link for the cluster; no: one per instance
    shared: str = "auto"
    # a shared store's total bandwidth for all instances together, GB/s (0 = it grows with
    # its clients: each instance moves at its own link's rate); below instances x the
    # instance rate, instances slow each other down
    store_gbps: float = 0.0
    # replaces the preset's read bandwidth, GB/s per instance link (0 = the preset's)
    read_gbps_override: float = 0.0
    # replaces the preset's write bandwidth, GB/s (0 = the preset's)
    write_gbps_override: float = 0.0

    def __post_init__(self) -> None:
        _choice("storage.backend", self.backend, STORAGE_BACKENDS)
        _choice("storage.prefetch_policy", self.prefetch_policy, PREFETCH_POLICIES)
        _choice("storage.shared", self.shared, ("auto", "yes", "no"))
        _at_least("storage.prefetch_threshold", self.prefetch_threshold, 1)
        for key in ("prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                    "prefetch_timeout_max"):  # fmt: skip
            value = getattr(self, key)
            if value != -1:
                _at_least(f"storage.{key}", value, 0)
        _at_least("storage.capacity_gb", self.capacity_gb, 0)
        _between("storage.eviction_ratio", self.eviction_ratio, 0.01, 1.0)
        _at_least("storage.read_gbps_override", self.read_gbps_override, 0)
        _at_least("storage.store_gbps", self.store_gbps, 0)
        _at_least("storage.write_gbps_override", self.write_gbps_override, 0)

    @property
    def enabled(self) -> bool:
        return self.backend != "none"

    def timeouts(self, version: str) -> tuple[float, float, float | None]:
        """The timeout policy's ``(base s, s per 1,024 tokens, cap s or None)`` under SGLang
        ``version``, -1 keys at that version's defaults (0.5.14: ``hicache_storage.py:49-54``;
        0.5.23: ``unified_radix_cache.py:316-318``, no cap)."""
        defaults = TIMEOUT_DEFAULTS[version]
        base = defaults[0] if self.prefetch_timeout_base == -1 else self.prefetch_timeout_base
        per_ki = self.prefetch_timeout_per_ki_token
        per_ki = defaults[1] if per_ki == -1 else per_ki
        cap = defaults[2] if self.prefetch_timeout_max == -1 else self.prefetch_timeout_max
        return base, per_ki, cap


#: The timeout policy's defaults per SGLang version: base s, s per 1,024 tokens, cap s (None:
#: no cap).
TIMEOUT_DEFAULTS: dict[str, tuple[float, float, float | None]] = {
    "0.5.14": (2.0, 0.1, 30.0),
    "0.5.23": (1.0, 0.25, None),
}


_Section = (
    ModelConfig
    | GpuConfig
    | LinkConfig
    | CacheConfig
    | SchedulerConfig
    | WorkloadConfig
    | ClusterConfig
    | RouterConfig
    | StorageConfig
    | RunConfig
    | SglangConfig
)

#: Section name -> its dataclass, in file order.
SECTIONS: dict[str, type[_Section]] = {
    c.section: c
    for c in (
        ModelConfig,
        GpuConfig,
        LinkConfig,
        CacheConfig,
        SchedulerConfig,
        WorkloadConfig,
        ClusterConfig,
        RouterConfig,
        StorageConfig,
        RunConfig,
        SglangConfig,
    )
}


@dataclass(frozen=True)
class SimConfig:
    """A complete, validated run configuration.

    Construction checks every section, then what spans sections: ``link.name`` ``""`` becomes
    the GPU's default link; ``gpu.device_tokens`` and ``scheduler.chunked_prefill_size`` must be
    page multiples; a shipped latency profile must exist for gpu + link unless ``run.profile``
    names one; and the pools must be sizeable (:func:`resolve_pools`). So a ``SimConfig`` that
    exists can be run.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    run: RunConfig = field(default_factory=RunConfig)
    sglang: SglangConfig = field(default_factory=SglangConfig)
    pd: PdConfig = field(default_factory=lambda: PdConfig())

    def __post_init__(self) -> None:
        _check_version_sections(self)
        if not self.link.name:
            default = hardware.get_gpu(self.gpu.name).default_link
            object.__setattr__(self, "link", dataclasses.replace(self.link, name=default))
        page = self.cache.page_size
        if self.gpu.device_tokens % page:
            raise ConfigError(
                "gpu.device_tokens",
                f"must be a multiple of cache.page_size ({page}), got {self.gpu.device_tokens}",
            )
        chunk = self.scheduler.chunked_prefill_size
        if chunk != -1 and (chunk < page or chunk % page):
            raise ConfigError(
                "scheduler.chunked_prefill_size",
                f"must be -1 (off) or a multiple of cache.page_size ({page}) >= {page}, "
                f"got {chunk}",
            )
        if (
            not self.run.profile
            and not shipped_profile_path(self.gpu.name, self.link.name).is_file()
        ):
            raise ConfigError(
                "link.name",
                f"no shipped latency profile for gpu {self.gpu.name!r} with link "
                f"{self.link.name!r} (shipped: {', '.join(shipped_profiles())}); "
                "set run.profile to a calibrated profile",
            )
        if self.model.spec.mla and self.link.mem_layout == "page_head":
            raise ConfigError(
                "link.mem_layout",
                f"{self.model.spec.name} has an MLA KV cache, whose SGLang host pool has no "
                "page_head layout (use page_first or layer_first)",
            )
        try:
            rank_link_share(server_for(self), 1.0, self.model.tp)
        except ValueError as e:
            raise ConfigError("model.tp", str(e)) from None
        problem = profile_mismatch(self)
        if problem and not self.run.allow_profile_mismatch:
            raise ConfigError(
                "run.profile",
                f"{self.run.profile}: {problem}; calibrate on the {self.gpu.name} (hicache-sim "
                "replay bench + calibrate there), or use it anyway with "
                "--allow-profile-mismatch (run.allow_profile_mismatch = true)",
            )
        from hicache.config.pools import check_host_memory, resolve_pools

        resolve_pools(self)
        check_host_memory(self)


def default_hicache_ratio(cfg: SimConfig) -> float:
    """SGLang's ``--hicache-ratio`` when none is given: 2.0, or 1.2 in buffer_only mode."""
    if cfg.cache.host_memory_mode == "buffer_only":
        return BUFFER_ONLY_HICACHE_RATIO
    return DEFAULT_HICACHE_RATIO


def _check_host_memory_mode(cfg: SimConfig) -> None:
    """``cache.host_memory_mode = "buffer_only"``: what SGLang requires of it
    (hicache_hook.py:247-296, unified_radix_cache.py:457-470)."""
    if cfg.cache.host_memory_mode != "buffer_only":
        return
    where = "cache.host_memory_mode"
    if cfg.sglang.version == "0.5.14":
        raise ConfigError(
            where,
            'buffer_only is SGLang\'s since 0.5.19: set sglang.version = "0.5.23" to use it',
        )
    if not cfg.cache.enable_host:
        raise ConfigError(
            where, "buffer_only stages copies through the host pool: it needs cache.enable_host"
        )
    if not cfg.storage.enabled:
        raise ConfigError(
            where,
            "buffer_only requires an L3 storage tier (set storage.backend; SGLang refuses to "
            "start without --hicache-storage-backend: host memory is only a staging buffer "
            "and all cached data lives in storage)",
        )


def _check_version_sections(cfg: SimConfig) -> None:
    """What ``sglang.version`` allows in the other sections."""
    version, c = cfg.sglang.version, cfg.cache
    _check_host_memory_mode(cfg)
    if version == "0.5.14":
        if c.eviction == "tlru":
            raise ConfigError(
                "cache.eviction",
                'tlru is SGLang\'s since 0.5.21: set sglang.version = "0.5.23" to use it',
            )
        ratio = c.hicache_ratio or DEFAULT_HICACHE_RATIO
        if c.eviction_policy_config.strip():
            raise ConfigError(
                "cache.eviction_policy_config",
                "--radix-eviction-policy-config is SGLang's since 0.5.20: set "
                'sglang.version = "0.5.23" to use it',
            )
        if c.enable_host and c.hicache_size_gb == 0 and not ratio > 1:
            raise ConfigError(
                "cache.hicache_ratio",
                f"must be > 1 when the host tier sizes by ratio (SGLang 0.5.14 needs a host pool "
                f"larger than the device pool), got {ratio:g}",
            )
        return


def server_for(cfg: SimConfig) -> ServerSpec:
    """The server of ``cfg``: ``gpu.server``, or the GPU's usual one when that is ""."""
    return get_server(cfg.gpu.server or DEFAULT_SERVER.get(cfg.gpu.name, "single"))


def profile_mismatch(cfg: SimConfig) -> str | None:
    """Why ``run.profile`` was not measured for ``gpu.name`` (measured on CPU tensors or on
    another GPU, as its provenance records: :func:`hicache.profile.machine_mismatch`), or None
    (no profile named, an estimate, the right GPU, or a file that cannot be read: loading it
    reports that). ``SimConfig`` refuses a mismatch unless ``run.allow_profile_mismatch``."""
    if not cfg.run.profile:
        return None
    try:
        data = json.loads(Path(cfg.run.profile).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    prov = data.get("provenance") if isinstance(data, dict) else None
    if not isinstance(prov, dict):
        return None
    return machine_mismatch(prov, cfg.gpu.name)


SECTIONS["pd"] = cast("type[_Section]", PdConfig)  # registered last: the section after "sglang"
