"""Run configuration: frozen dataclasses, TOML loading, ``--set`` overrides, validation.

A config has its sections (``model``, ``gpu``, ``link``, ``cache``, ``scheduler``,
``workload``, ``cluster``, ``router``, ``storage``, ``run``, ``sglang``); a TOML file sets any
subset of their keys::

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

Every key, its default and meaning: :mod:`hicache.config.keys` (``hicache-sim config keys``).

Standard library only, plus the presets (``hicache.hardware``), the shipped profile names
(``hicache.latency``) and the policy core's choice lists and host sizing (``hicache.policy``).
"""

from hicache.config.base import ROUTER_POLICIES, ConfigError
from hicache.config.loading import (
    config_from_dict,
    config_to_dict,
    load_config,
    with_overrides,
)
from hicache.config.pd import PdConfig
from hicache.config.pools import (
    HostMemory,
    HostMemoryError,
    auto_size,
    check_host_memory,
    host_memory,
    resolve_pools,
)
from hicache.config.sections import (
    CLOSED_LOOP_MODES,
    IO_BACKENDS,
    MAX_POOL_PAGES,
    MEM_LAYOUTS,
    OUTPUT_MODES,
    OUTPUT_REUSE_MODES,
    SCHEDULE_POLICIES,
    SCHEDULER_ENGINES,
    SECTIONS,
    CacheConfig,
    ClusterConfig,
    GpuConfig,
    LinkConfig,
    ModelConfig,
    RouterConfig,
    RunConfig,
    SchedulerConfig,
    SglangConfig,
    SimConfig,
    StorageConfig,
    WorkloadConfig,
    profile_mismatch,
    server_for,
)

__all__ = [
    "CLOSED_LOOP_MODES",
    "IO_BACKENDS",
    "MAX_POOL_PAGES",
    "MEM_LAYOUTS",
    "OUTPUT_MODES",
    "OUTPUT_REUSE_MODES",
    "ROUTER_POLICIES",
    "SCHEDULER_ENGINES",
    "SCHEDULE_POLICIES",
    "SECTIONS",
    "CacheConfig",
    "ClusterConfig",
    "ConfigError",
    "GpuConfig",
    "HostMemory",
    "HostMemoryError",
    "LinkConfig",
    "ModelConfig",
    "PdConfig",
    "RouterConfig",
    "RunConfig",
    "SchedulerConfig",
    "SglangConfig",
    "SimConfig",
    "StorageConfig",
    "WorkloadConfig",
    "auto_size",
    "check_host_memory",
    "config_from_dict",
    "config_to_dict",
    "host_memory",
    "load_config",
    "profile_mismatch",
    "resolve_pools",
    "server_for",
    "with_overrides",
]
