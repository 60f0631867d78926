"""Run configuration: frozen dataclasses, TOML loading, ``--set`` overrides, validation.

A config has seven sections (``model``, ``gpu``, ``link``, ``cache``, ``scheduler``,
``workload``, ``run``); a TOML file sets any subset of their keys::

    [model]
    name = "llama-3-8b"
    [cache]
    page_size = 64
    write_policy = "write_back"

and ``--set cache.page_size=32`` overrides one key, parsed by the key's type. Every key has a
default, each with the reason for its value. Anything a user can get wrong (unknown section or
key, wrong type, out-of-range value, unknown preset, a pool that cannot be sized) raises
:class:`ConfigError` naming ``section.key``, the allowed range or choices, and where the value
came from (the TOML file or the ``--set`` item).

Standard library only, plus the presets (``hicache.hardware``), the shipped profile names
(``hicache.latency``) and the policy core's choice lists and host sizing (``hicache.policy``).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

from hicache import hardware
from hicache.latency import shipped_profile_path, shipped_profiles
from hicache.policy import STRATEGIES, WRITE_POLICIES, host_pool_tokens

#: ``--hicache-io-backend`` values the simulator models (``kernel_ascend`` is NPU-only).
IO_BACKENDS = ("kernel", "direct")
#: ``--hicache-mem-layout`` values the simulator models (``page_first_kv_split`` is Ascend-only).
MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
#: Admission orders the scheduler implements (ARCHITECTURE.md §4: FCFS or LPM).
SCHEDULE_POLICIES = ("fcfs", "lpm")
#: ``auto``: closed loop when the trace has session/turn/think_time; ``on``: require it; ``off``:
#: replay the trace's timestamps as they are.
CLOSED_LOOP_MODES = ("auto", "on", "off")
#: What ``cache_finished_req`` inserts: prompt + outputs, or the prompt only (as sim.hitrate).
OUTPUT_MODES = ("cache", "skip")


class ConfigError(ValueError):
    """A configuration a user wrote is invalid. ``str()`` is one line:
    ``SOURCE: section.key: problem`` (``SOURCE`` is a file or a ``--set`` item, when known)."""

    def __init__(self, field: str, problem: str, source: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.field, self.problem) if p]
        return ": ".join(parts)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str | None]]:
        # rebuild from the parts, so the error survives pickling (process-pool sweeps)
        return (ConfigError, (self.field, self.problem, self.source))

    def with_source(self, source: str | None) -> ConfigError:
        """The same error attributed to ``source`` (kept if already attributed)."""
        return ConfigError(self.field, self.problem, self.source or source)


# --- validation helpers (each raises ConfigError naming section.key) -------------------------


def _choice(where: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(where, f"{value!r} is not one of: {', '.join(choices)}")


def _at_least(where: str, value: float, lo: float) -> None:
    if not value >= lo:
        raise ConfigError(where, f"must be >= {lo:g}, got {value:g}")


def _positive(where: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(where, f"must be > 0, got {value:g}")


def _in_unit(where: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ConfigError(where, f"must be in (0, 1], got {value:g}")


def _preset(where: str, getter: Any, name: str) -> None:
    try:
        getter(name)
    except ValueError as e:
        raise ConfigError(where, str(e)) from None


# --- sections --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Which model is served, and how it is split."""

    section: ClassVar[str] = "model"

    # the most common single-GPU HiCache target in SGLang's docs and benchmarks
    name: str = "llama-3-8b"
    # one GPU: the simplest setup, and the host pool is sized per rank anyway
    tp: int = 1

    def __post_init__(self) -> None:
        _preset("model.name", hardware.get_model, self.name)
        _at_least("model.tp", self.tp, 1)
        try:
            hardware.kv_bytes_per_token(hardware.get_model(self.name), self.tp)
        except ValueError as e:
            raise ConfigError("model.tp", str(e)) from None


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

    def __post_init__(self) -> None:
        _preset("gpu.name", hardware.get_gpu, self.name)
        _in_unit("gpu.mem_fraction", self.mem_fraction)
        _at_least("gpu.reserve_gb", self.reserve_gb, 0)
        _at_least("gpu.device_tokens", self.device_tokens, 0)


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
    # SGLang's --hicache-ratio default: host pool = 2 x device pool
    hicache_ratio: float = 2.0
    # SGLang's --hicache-size default: 0 = size by ratio; > 0 = GB (1e9 B) per rank, wins
    hicache_size_gb: float = 0.0
    # the host tier is what is being studied; False = plain RadixCache, the baseline
    enable_host: bool = True
    # hard-coded in SGLang 0.5.14 (POLICY_CORE.md §4.3): shorter host hits are recomputed
    load_back_threshold: int = 10

    def __post_init__(self) -> None:
        _at_least("cache.page_size", self.page_size, 1)
        _choice("cache.write_policy", self.write_policy, WRITE_POLICIES)
        _choice("cache.eviction", self.eviction, tuple(STRATEGIES))
        _positive("cache.hicache_ratio", self.hicache_ratio)
        _at_least("cache.hicache_size_gb", self.hicache_size_gb, 0)
        _at_least("cache.load_back_threshold", self.load_back_threshold, 0)
        if self.enable_host and self.hicache_size_gb == 0 and not self.hicache_ratio > 1:
            raise ConfigError(
                "cache.hicache_ratio",
                f"must be > 1 when the host tier sizes by ratio (SGLang needs a host pool "
                f"larger than the device pool), got {self.hicache_ratio:g}",
            )


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

    def __post_init__(self) -> None:
        _choice("scheduler.policy", self.policy, SCHEDULE_POLICIES)
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

    # the trace as recorded; arrival timestamps are divided by this (2.0 = twice the load)
    rate_scale: float = 1.0
    # 0 = every request in the trace
    max_requests: int = 0
    # closed loop exactly when the trace says how (session_id/turn/think_time_ms present)
    closed_loop: str = "auto"
    # outputs enter the cache at finish, as cache_finished_req does in SGLang
    outputs: str = "cache"

    def __post_init__(self) -> None:
        _positive("workload.rate_scale", self.rate_scale)
        _at_least("workload.max_requests", self.max_requests, 0)
        _choice("workload.closed_loop", self.closed_loop, CLOSED_LOOP_MODES)
        _choice("workload.outputs", self.outputs, OUTPUT_MODES)


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

    def __post_init__(self) -> None:
        _at_least("run.seed", self.seed, 0)
        _at_least("run.timeline_max_rows", self.timeline_max_rows, 0)


_Section = (
    ModelConfig
    | GpuConfig
    | LinkConfig
    | CacheConfig
    | SchedulerConfig
    | WorkloadConfig
    | RunConfig
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
        RunConfig,
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
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
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
        resolve_pools(self)


# --- pools -----------------------------------------------------------------------------------


def resolve_pools(cfg: SimConfig) -> tuple[int, int, int]:
    """``(device_tokens, host_tokens, kv_bytes_per_token)`` for ``cfg``.

    Device: ``gpu.device_tokens`` when set, else :func:`hicache.hardware.device_pool_tokens`
    (HBM x mem_fraction - weights - reserve) rounded down to a page multiple. Host: 0 without a
    host tier, else SGLang's ``HostKVCache`` sizing (:func:`hicache.policy.host_pool_tokens`: ratio
    or GB, always one extra page, must exceed the device pool). Bytes are per rank. Raises
    :class:`ConfigError` when a pool cannot be sized.
    """
    model = hardware.get_model(cfg.model.name)
    tp = cfg.model.tp
    bpt = hardware.kv_bytes_per_token(model, tp)
    page = cfg.cache.page_size
    if cfg.gpu.device_tokens:
        device = cfg.gpu.device_tokens
    else:
        try:
            raw = hardware.device_pool_tokens(
                model,
                hardware.get_gpu(cfg.gpu.name),
                tp,
                cfg.gpu.mem_fraction,
                cfg.gpu.reserve_gb * 1e9,
            )
        except ValueError as e:
            raise ConfigError("gpu.device_tokens", f"derived from HBM: {e}") from None
        device = raw // page * page
        if device <= 0:
            raise ConfigError(
                "gpu.device_tokens",
                f"derived from HBM: {raw} tokens is less than one page ({page})",
            )
    if not cfg.cache.enable_host:
        return device, 0, bpt
    by_size = cfg.cache.hicache_size_gb > 0
    try:
        host = host_pool_tokens(
            device,
            page,
            hicache_ratio=cfg.cache.hicache_ratio,
            hicache_size_gb=cfg.cache.hicache_size_gb,
            bytes_per_token=bpt,
        )
    except ValueError as e:
        where = "cache.hicache_size_gb" if by_size else "cache.hicache_ratio"
        raise ConfigError(where, str(e)) from None
    return device, host, bpt


# --- loading ---------------------------------------------------------------------------------


def _field_types(cls: type[_Section]) -> dict[str, type]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, typ: type, where: str) -> Any:
    """A parsed TOML/JSON value checked (and widened: int -> float, integral float -> int)."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(where, f"expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(where, f"expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(where, f"expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(where, f"expected a number, got {value!r}")
    if isinstance(value, str):
        return value
    raise ConfigError(where, f"expected a string, got {value!r}")


def _parse_text(text: str, typ: type, where: str) -> Any:
    """A ``--set`` value (always text) parsed by the field's type."""
    t = text.strip()
    if typ is bool:
        low = t.lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
        raise ConfigError(where, f"expected true/false/1/0, got {text!r}")
    if typ is int:
        try:
            return int(t)
        except ValueError:
            pass
        try:
            return _coerce(float(t), int, where)
        except ValueError:
            raise ConfigError(where, f"expected an integer, got {text!r}") from None
    if typ is float:
        try:
            number = float(t)
        except ValueError:
            raise ConfigError(where, f"expected a number, got {text!r}") from None
        return _coerce(number, float, where)
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        t = t[1:-1]
    return t


def _split_key(dotted: str, source: str | None) -> tuple[str, str, type]:
    """``section.key`` -> (section, key, field type), or ConfigError naming what is unknown."""
    section, sep, key = dotted.partition(".")
    if not sep or not section or not key:
        raise ConfigError(dotted, "expected section.key", source)
    if section not in SECTIONS:
        raise ConfigError(
            dotted, f"unknown section {section!r}; choices: {', '.join(SECTIONS)}", source
        )
    types = _field_types(SECTIONS[section])
    if key not in types:
        raise ConfigError(dotted, f"unknown key; {section} has: {', '.join(types)}", source)
    return section, key, types[key]


def _read_mapping(
    data: Mapping[str, Any], source: str | None
) -> tuple[dict[str, dict[str, Any]], dict[str, str | None]]:
    """Typed values per section from a parsed TOML/JSON mapping, and the source of each."""
    values: dict[str, dict[str, Any]] = {}
    origin: dict[str, str | None] = {}
    for section, body in data.items():
        if section not in SECTIONS:
            raise ConfigError(section, f"unknown section; choices: {', '.join(SECTIONS)}", source)
        if not isinstance(body, Mapping):
            raise ConfigError(section, "expected a table of keys", source)
        for key, value in body.items():
            where = f"{section}.{key}"
            _, _, typ = _split_key(where, source)
            try:
                values.setdefault(section, {})[key] = _coerce(value, typ, where)
            except ConfigError as e:
                raise e.with_source(source) from None
            origin[where] = source
    return values, origin


def _build(
    values: Mapping[str, Mapping[str, Any]],
    origin: Mapping[str, str | None],
    fallback: str | None,
) -> SimConfig:
    """Construct (and so validate) a SimConfig, attributing errors to where the value came from."""
    try:
        return SimConfig(
            model=ModelConfig(**values.get("model", {})),
            gpu=GpuConfig(**values.get("gpu", {})),
            link=LinkConfig(**values.get("link", {})),
            cache=CacheConfig(**values.get("cache", {})),
            scheduler=SchedulerConfig(**values.get("scheduler", {})),
            workload=WorkloadConfig(**values.get("workload", {})),
            run=RunConfig(**values.get("run", {})),
        )
    except ConfigError as e:
        raise e.with_source(origin.get(e.field, fallback)) from None


def _apply_overrides(
    values: dict[str, dict[str, Any]], origin: dict[str, str | None], overrides: Sequence[str]
) -> None:
    for item in overrides:
        source = f"--set {item}"
        dotted, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(item, "expected section.key=value", "--set")
        section, key, typ = _split_key(dotted.strip(), source)
        where = f"{section}.{key}"
        try:
            values.setdefault(section, {})[key] = _parse_text(text, typ, where)
        except ConfigError as e:
            raise e.with_source(source) from None
        origin[where] = source


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> SimConfig:
    """Defaults, then the TOML file at ``path`` (if any), then each ``section.key=value`` in
    ``overrides`` in order; validated. Raises :class:`ConfigError` for an unreadable or invalid
    file, an unknown section or key, a value of the wrong type or out of range."""
    values: dict[str, dict[str, Any]] = {}
    origin: dict[str, str | None] = {}
    source = None if path is None else str(path)
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError("", f"cannot read config: {e.strerror or e}", source) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError("", f"invalid TOML: {e}", source) from None
        values, origin = _read_mapping(data, source)
    _apply_overrides(values, origin, overrides)
    return _build(values, origin, source)


def with_overrides(cfg: SimConfig, overrides: Sequence[str]) -> SimConfig:
    """``cfg`` with ``section.key=value`` overrides applied and validated (for sweeps)."""
    values = {name: dict(body) for name, body in config_to_dict(cfg).items()}
    origin: dict[str, str | None] = {}
    _apply_overrides(values, origin, overrides)
    return _build(values, origin, None)


def config_to_dict(cfg: SimConfig) -> dict[str, dict[str, Any]]:
    """The resolved config as plain JSON-serializable data, ``{section: {key: value}}``, to be
    written beside every run; :func:`config_from_dict` reads it back to an equal config."""
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}


def config_from_dict(data: Mapping[str, Any], source: str | None = None) -> SimConfig:
    """The inverse of :func:`config_to_dict`; missing keys take defaults, unknown ones raise
    :class:`ConfigError` (attributed to ``source``, e.g. the ``config.json`` path)."""
    values, origin = _read_mapping(data, source)
    return _build(values, origin, source)
