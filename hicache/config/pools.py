"""Sizing the KV pools of a config: the device pool from HBM (or given), the host pool as the
SGLang version sizes it (0.5.14: ratio or GB; 0.5.23: the same, or -- with neither given --
auto-sized to the server's free DRAM, ``--hicache-host-memory-fraction``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hicache import hardware
from hicache.config.base import ConfigError
from hicache.config.sections import (
    DEFAULT_HICACHE_RATIO,
    MAX_POOL_PAGES,
    default_hicache_ratio,
    server_for,
)
from hicache.policy import host_pool_tokens

if TYPE_CHECKING:
    from hicache.config.sections import SimConfig

#: Host RAM SGLang leaves free before sizing HiCache pools (``HICACHE_HOST_MEMORY_RESERVE_BYTES``,
#: 0.5.23 pool_host/base.py:28).
HOST_MEMORY_RESERVE_BYTES = 10 * 1024**3
#: The share of the budget the device bytes may take (``_ALLOCATION_SLACK_FRACTION`` 0.05:
#: page rounding, metadata and staging buffers; 0.5.23 hicache_auto_size.py).
ALLOCATION_SLACK = 0.05


@dataclass(frozen=True)
class AutoSize:
    """How 0.5.23 auto-sized a host pool: the ratio it chose, the per-rank budget it had, the
    free host memory of the instance and its ranks on the host."""

    ratio: float
    budget_bytes: int
    free_bytes: float
    ranks: int
    requested: float = DEFAULT_HICACHE_RATIO
    """The host mode's default ratio that was asked for (2.0; 1.2 in buffer_only)."""

    @property
    def shrunk(self) -> bool:
        """True when the default ratio did not fit and the pool was made smaller."""
        return self.ratio < self.requested

    def describe(self) -> str:
        budget = (
            f"{self.budget_bytes / 1e9:,.1f} GB per rank of {self.free_bytes / 1e9:,.0f} GB free "
            f"host memory for {self.ranks} rank(s)"
        )
        if not self.shrunk:
            return f"host pool: the default ratio {self.requested:g} fits ({budget})"
        return (
            f"host pool auto-sized by SGLang 0.5.23 (--hicache-host-memory-fraction): ratio "
            f"{self.ratio:.3f} of the device pool instead of {self.requested:g} "
            f"({budget}; gpu.host_memory_gb sets the free memory)"
        )


def instance_host_memory(cfg: SimConfig) -> float:
    """Bytes of host RAM free for one instance when SGLang starts: ``gpu.host_memory_gb``, else
    the server's DRAM split evenly among the instances filling it (``inf`` for a server preset
    without a DRAM figure)."""
    if cfg.gpu.host_memory_gb > 0:
        return cfg.gpu.host_memory_gb * 1e9
    server = server_for(cfg)
    if not math.isfinite(server.dram_bytes):
        return math.inf
    return server.dram_bytes / max(1, server.gpus // cfg.model.tp)


def auto_size(cfg: SimConfig, device_tokens: int, bytes_per_token: int) -> AutoSize | None:
    """0.5.23's ``auto_size_hicache`` for ``cfg``, or None where it does not apply (0.5.14, a
    ratio or size given, no host tier, a server without a DRAM figure). Per rank: budget =
    (free - 10 GiB) / ranks x fraction; ratio = min(the host mode's default ratio, budget x
    0.95 / device bytes). Raises
    :class:`ConfigError` when no memory is left (SGLang refuses to start)."""
    c = cfg.cache
    if (
        cfg.sglang.version == "0.5.14"
        or not c.enable_host
        or c.hicache_ratio > 0
        or c.hicache_size_gb > 0
    ):
        return None
    free = instance_host_memory(cfg)
    if not math.isfinite(free):
        return None
    ranks = cfg.model.tp  # one instance on one host: its launch ranks
    budget = int((int(free) - HOST_MEMORY_RESERVE_BYTES) // ranks * c.hicache_host_memory_fraction)
    device_bytes = device_tokens * bytes_per_token
    # the requested ratio is the host mode's default (2.0, or 1.2 in buffer_only)
    requested = default_hicache_ratio(cfg)
    ratio = min(requested, budget * (1 - ALLOCATION_SLACK) / device_bytes)
    if ratio <= 0:
        raise ConfigError(
            "gpu.host_memory_gb",
            f"{free / 1e9:,.0f} GB of host memory leaves nothing for HiCache after SGLang's "
            "10 GiB reserve (SGLang 0.5.23 refuses to start); give more, or set "
            "cache.hicache_ratio or cache.hicache_size_gb",
        )
    return AutoSize(ratio, budget, free, ranks, requested)


class HostMemoryError(ConfigError):
    """The host pools of a configuration do not fit the server's DRAM."""


@dataclass(frozen=True)
class HostMemory:
    """What a configuration's host pools take of the host memory they live in.

    ``scope``: ``"server"`` (the busiest server: ``ranks`` ranks of the instances packed onto
    it, against its DRAM) or ``"instance"`` (one instance's ranks against
    ``gpu.host_memory_gb``). ``need_bytes`` = ranks x ``per_rank_bytes`` + SGLang's reserve
    (:data:`HOST_MEMORY_RESERVE_BYTES`, left free once per machine: every rank checks the same
    machine-wide free memory against it)."""

    scope: str
    where: str
    ranks: int
    instances: int
    per_rank_bytes: int
    need_bytes: int
    have_bytes: float

    @property
    def over(self) -> bool:
        return self.need_bytes > self.have_bytes

    def describe(self) -> str:
        per = self.ranks // max(1, self.instances)
        packed = (
            f"{self.instances} instance{'s' if self.instances != 1 else ''} x "
            f"{per} rank{'s' if per != 1 else ''}"
        )
        return (
            f"host pools need {self.need_bytes / 1e9:,.0f} GB on {self.where} ({packed} x "
            f"{self.per_rank_bytes / 1e9:,.1f} GB per rank + SGLang's 10 GiB reserve), "
            f"{'more than' if self.over else 'within'} its {self.have_bytes / 1e9:,.0f} GB"
        )


def host_memory(cfg: SimConfig, instances: int | None = None) -> HostMemory | None:
    """The host memory ``cfg``'s host pools need against what they have (None: no host tier,
    or a server preset without a DRAM figure and no ``gpu.host_memory_gb``). ``instances``:
    how many instances to pack onto servers (default ``cluster.instances``); a plan passes a
    full server's worth, since it may propose that many."""
    if not cfg.cache.enable_host:
        return None
    _, host, bpt = resolve_pools(cfg)
    per_rank, tp = host * bpt, cfg.model.tp
    if cfg.gpu.host_memory_gb > 0:
        need = tp * per_rank + HOST_MEMORY_RESERVE_BYTES
        have = cfg.gpu.host_memory_gb * 1e9
        return HostMemory("instance", "one instance (gpu.host_memory_gb)", tp, 1, per_rank,
                          need, have)  # fmt: skip
    server = server_for(cfg)
    if not math.isfinite(server.dram_bytes):
        return None
    per_server = max(1, server.gpus // tp)
    packed = min(instances or cfg.cluster.instances, per_server)
    need = packed * tp * per_rank + HOST_MEMORY_RESERVE_BYTES
    where = f"one {server.name} server"
    return HostMemory("server", where, packed * tp, packed, per_rank, need, server.dram_bytes)


def check_host_memory(cfg: SimConfig, instances: int | None = None) -> HostMemory | None:
    """:func:`host_memory`, refused with its figures (:class:`HostMemoryError`) when it does not
    fit, unless ``gpu.allow_host_overcommit`` (then the caller warns: ``.over`` is true)."""
    got = host_memory(cfg, instances)
    if got is not None and got.over and not cfg.gpu.allow_host_overcommit:
        where = "cache.hicache_size_gb" if cfg.cache.hicache_size_gb > 0 else "cache.hicache_ratio"
        raise HostMemoryError(
            where,
            f"{got.describe()}: SGLang could not pin it; lower the host pool, or run anyway "
            "with --allow-host-overcommit (gpu.allow_host_overcommit = true)",
        )
    return got


def resolve_pools(cfg: SimConfig) -> tuple[int, int, int]:
    """``(device_tokens, host_tokens, kv_bytes_per_token)`` for ``cfg``.

    Device: ``gpu.device_tokens`` when set, else :func:`hicache.hardware.device_pool_tokens`
    (HBM x mem_fraction - weights - reserve) rounded down to a page multiple. Host: 0 without a
    host tier, else SGLang's ``HostKVCache`` sizing (:func:`hicache.policy.host_pool_tokens`: ratio
    or GB, always one extra page; 0.5.14 needs it larger than the device pool), the ratio
    auto-sized for 0.5.23 when none is given (:func:`auto_size`). Bytes are per rank. Raises
    :class:`ConfigError` when a pool cannot be sized.
    """
    model = cfg.model.spec
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
    _max_pages("gpu.device_tokens", device, page)
    if not cfg.cache.enable_host:
        return device, 0, bpt
    by_size = cfg.cache.hicache_size_gb > 0
    sized = auto_size(cfg, device, bpt)
    ratio = sized.ratio if sized else (cfg.cache.hicache_ratio or default_hicache_ratio(cfg))
    try:
        host = host_pool_tokens(
            device,
            page,
            hicache_ratio=ratio,
            hicache_size_gb=cfg.cache.hicache_size_gb,
            bytes_per_token=bpt,
            must_exceed_device=cfg.sglang.version == "0.5.14",
        )
    except ValueError as e:
        where = "cache.hicache_size_gb" if by_size else "cache.hicache_ratio"
        raise ConfigError(where, str(e)) from None
    _max_pages("cache.hicache_size_gb" if by_size else "cache.hicache_ratio", host, page)
    return device, host, bpt


def _max_pages(where: str, tokens: int, page: int) -> None:
    if tokens // page > MAX_POOL_PAGES:
        raise ConfigError(
            where,
            f"a pool of {tokens // page:,} pages ({tokens:,} tokens) is more than the simulator "
            f"holds ({MAX_POOL_PAGES:,} pages); use a larger cache.page_size or a smaller pool",
        )


__all__ = [
    "ALLOCATION_SLACK",
    "HOST_MEMORY_RESERVE_BYTES",
    "AutoSize",
    "HostMemory",
    "HostMemoryError",
    "auto_size",
    "check_host_memory",
    "host_memory",
    "instance_host_memory",
    "resolve_pools",
]
