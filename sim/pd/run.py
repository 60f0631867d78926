"""``run_pd_simulation``: a PD run of a trace, the run directory it writes and its summary.

The run directory holds what a single-server run's does, per role, plus the PD requests:
``config.json`` (the config and each role's resolved config and pools), ``summary.json``
(:mod:`sim.pd.summary`), ``requests.parquet`` (one row per request: both instances, the
pre-allocation, bootstrap, prefill, transfer start and end, first token and finish times),
``prefill_requests.parquet`` / ``decode_requests.parquet`` (each role's own request tables, as
a fleet writes them, with ``instance``), and ``timeline.parquet`` / ``transfers.parquet``
(PCIe copies) of both roles with a ``role`` column.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import simpy

from hicache.config import ConfigError, SimConfig, config_to_dict, resolve_pools, with_overrides
from hicache.lifecycle import PagedTrace, page_keys
from hicache.output_keys import output_keys_for
from sim.costs import build_costs
from sim.instance import Instance
from sim.metrics import write_json_atomic, write_parquet_atomic
from sim.pd.engine import PdEngine, RoleSpec
from sim.pd.offload import DecodeOffload
from sim.pd.request import PdRow, pd_row
from sim.pd.retraction import resolve_backup
from sim.pd.summary import pd_summary
from sim.pd.transfer import TransferCost, rank_bytes_per_token
from sim.routers import build_router
from sim.scheduler import SchedulerParams
from sim.storage_setup import StorageSetup

if TYPE_CHECKING:
    from traces.schema import Trace


def role_configs(cfg: SimConfig) -> tuple[SimConfig, SimConfig]:
    """The prefill and the decode role's configs: ``cfg`` (PD off) with ``pd.prefill_set`` /
    ``pd.decode_set`` applied. Both must serve the same model at the same page size (the KV
    goes page for page from one pool to the other)."""
    base = replace(cfg, pd=replace(cfg.pd, enabled=False, prefill_set="", decode_set=""))
    out = []
    for role in ("prefill", "decode"):
        try:
            out.append(with_overrides(base, cfg.pd.role_overrides(role)))
        except ConfigError as e:
            raise ConfigError(f"pd.{role}_set", str(e)) from None
    pre, dec = out
    if pre.model.spec != dec.model.spec:
        raise ConfigError("pd.decode_set", "both roles must serve the same model (model.*)")
    if pre.cache.page_size != dec.cache.page_size:
        raise ConfigError("pd.decode_set", "both roles need the same cache.page_size")
    return pre, dec


def _role_kwargs(
    rc: SimConfig, storage: StorageSetup | None, host_tier: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``Instance`` keyword arguments of a role (its L3 tier ``storage``, see
    :func:`role_storage`; a host tier if ``host_tier``) and what config.json says of its
    pools."""
    device, host, _ = resolve_pools(rc)
    host = host if host_tier else 0
    costs = build_costs(rc)
    ps = rc.cache.page_size
    kwargs = {
        "device_tokens": device,
        "host_tokens": host,
        "page_size": ps,
        "write_policy": rc.cache.write_policy,
        "eviction": rc.cache.eviction,
        "costs": costs,
        "sched": SchedulerParams(page_size=ps, outputs=rc.workload.outputs, **asdict(rc.scheduler)),
        "timeline_max_rows": rc.run.timeline_max_rows,
        "load_back_threshold": rc.cache.load_back_threshold,
        "storage": storage,
        "sglang_version": rc.sglang.version,
        "eviction_params": rc.cache.eviction_params(),
    }
    return kwargs, {"device_tokens": device, "host_tokens": host}


def decode_hicache(dec: SimConfig) -> bool:
    """The decode servers run HiCache: their radix cache (``pd.decode_radix_cache``) and
    ``cache.enable_host`` (SGLang's ``enable_decode_hicache``, scheduler.py:520-523). Without
    it a decode server has no host tier and no L3."""
    return dec.pd.decode_radix_cache and dec.cache.enable_host


def role_storage(
    pre: SimConfig, dec: SimConfig, prefill_instances: int, decode_instances: int
) -> tuple[StorageSetup | None, StorageSetup | None]:
    """Each role's L3 tier. The prefill servers' as without PD; the decode servers' only with
    decode-side HiCache (:func:`decode_hicache`: their finished requests' KV, inserted into
    the decode tree, is backed up to it as on any HiCache server) or the offload manager
    (``pd.decode_offload_kvcache``, sim.pd.offload), and a storage backend in their config. A
    shared backend (Mooncake, 3FS: ``storage.shared``) is one store for both roles when both
    roles' L3 settings and TP agree (SGLang's page keys carry the TP rank's shard): what a
    decode server wrote, a prefill server can prefetch; with decode-side HiCache a decode
    server prefetches from it at pre-allocation too (sim.pd.decode_l3)."""
    pre_bytes = build_costs(pre).bytes_per_page
    p_setup = StorageSetup.from_config(pre, pre_bytes)
    if p_setup is not None:
        p_setup.instances = prefill_instances
    if not (decode_hicache(dec) or dec.pd.decode_offload_kvcache):
        return p_setup, None
    d_setup = StorageSetup.from_config(dec, build_costs(dec).bytes_per_page)
    if d_setup is None:
        return p_setup, None
    if (
        p_setup is not None
        and p_setup.shared
        and d_setup.shared
        and pre.storage == dec.storage
        and pre.model.tp == dec.model.tp
    ):
        p_setup.instances = prefill_instances + decode_instances
        return p_setup, p_setup
    d_setup.instances = decode_instances
    return p_setup, d_setup


def offload_factory(
    dec: SimConfig, setup: StorageSetup | None
) -> Callable[[simpy.Environment, Instance, int], DecodeOffload] | None:
    """What builds each decode server's offload manager (``pd.decode_offload_kvcache``), or
    None when it is off. SGLang refuses the flag without a storage backend
    (arg_groups/kv_cache_hook.py:399-405); so does this."""
    if not dec.pd.decode_offload_kvcache:
        return None
    if setup is None:
        raise ConfigError(
            "pd.decode_offload_kvcache",
            "needs a storage backend on the decode role (storage.backend), as SGLang's "
            "--disaggregation-decode-enable-offload-kvcache does",
        )
    ps = dec.cache.page_size
    raw = dec.pd.decode_offload_stride
    stride = ps if raw <= 0 else max(ps, raw // ps * ps)
    _, host, _ = resolve_pools(dec)
    costs = build_costs(dec)

    def build(env: simpy.Environment, inst: Instance, index: int) -> DecodeOffload:
        store, hasher, link = setup.store_for(env, index)
        return DecodeOffload(
            env, inst.link, inst.recorder, costs, store, hasher, link, setup.spec, ps, stride, host,
            setup.page_bytes_per_rank, setup.ranks,
        )  # fmt: skip

    return build


def build_pd_engine(cfg: SimConfig, trace: Trace) -> tuple[PdEngine, dict[str, Any]]:
    """The engine of a PD run of ``trace`` and config.json's per-role part."""
    from sim.engine import resolve_closed_loop

    pre, dec = role_configs(cfg)
    if cfg.pd.decode_radix_cache and dec.sglang.version != "0.5.23":
        raise ConfigError(
            "pd.decode_radix_cache", "the decode radix cache is modelled for sglang.version 0.5.23"
        )
    pd = cfg.pd
    p_store, d_store = role_storage(pre, dec, pd.prefill_instances, pd.decode_instances)
    pre_kw, pre_pools = _role_kwargs(pre, p_store, pre.cache.enable_host)
    dec_kw, dec_pools = _role_kwargs(dec, d_store if decode_hicache(dec) else None,
                                     decode_hicache(dec))  # fmt: skip
    ps = pre.cache.page_size
    paged = PagedTrace(
        trace, ps, rate_scale=cfg.workload.rate_scale, limit=cfg.workload.max_requests
    )
    routers = (
        build_router(replace(pre.router, policy=pd.prefill_router), pd.prefill_instances, ps),
        build_router(replace(dec.router, policy=pd.decode_router), pd.decode_instances, ps),
    )
    engine = PdEngine(
        paged,
        page_keys(trace, ps),
        prefill=RoleSpec(pd.prefill_instances, pre_kw),
        decode=RoleSpec(pd.decode_instances, dec_kw),
        routers=routers,
        cost=TransferCost.of(pd),
        rank_bytes=rank_bytes_per_token(pre.model.spec, pre.model.tp, dec.model.tp),
        chunk_size=pre.scheduler.chunked_prefill_size,
        reserved_decode_tokens=pd.num_reserved_decode_tokens,
        closed_loop=resolve_closed_loop(cfg.workload.closed_loop, trace, len(paged)),
        decode_radix_cache=cfg.pd.decode_radix_cache,
        outs=output_keys_for(cfg.workload.output_reuse, trace, ps, cfg.workload.max_requests),
        offload=offload_factory(dec, d_store),
        retraction_backup=resolve_backup(
            pd.decode_retraction_backup,
            radix_cache=pd.decode_radix_cache,
            offload=pd.decode_offload_kvcache,
            priority_preemption=False,
        ),
    )
    engine.storage_setups = (p_store, d_store)
    roles = {
        "prefill": {"config": config_to_dict(pre), **pre_pools},
        "decode": {"config": config_to_dict(dec), **dec_pools},
    }
    return engine, roles


def run_pd_simulation(
    cfg: SimConfig,
    trace: Trace,
    out_dir: Path | None = None,
    progress: bool | None = None,
    frames_out: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` (``pd.enabled``) over ``trace``; write the run directory if ``out_dir``;
    return the summary. ``frames_out`` receives the tables (``requests``, ``prefill``, ``decode``:
    each role's frames)."""
    import pandas as pd

    del progress  # no progress bar for PD runs yet
    t0 = time.perf_counter()
    engine, roles = build_pd_engine(cfg, trace)
    duration = engine.run()
    rows = [pd_row(r) for r in sorted(engine.records, key=lambda r: r.rid)]
    req = pd.DataFrame(rows, columns=list(PdRow._fields))
    frames = {
        "requests": req,
        "prefill": engine.role_frames("prefill", take=True),
        "decode": engine.role_frames("decode", take=True),
    }
    if frames_out is not None:
        frames_out.update(frames)
    summary = pd_summary(frames, duration, time.perf_counter() - t0, engine, cfg)
    _storage_blocks(summary, engine, frames)
    if engine.offloads:  # pd.decode_offload_kvcache: what the decode servers offloaded to L3
        total: dict[str, int] = {}
        for off in engine.offloads:
            for k, v in off.stats.as_dict().items():
                total[k] = total.get(k, 0) + v
        summary["roles"]["decode"]["offload"] = total
    if out_dir is not None:
        _write_run(out_dir, cfg, trace, roles, frames, summary, engine.closed_loop)
    return summary


def _storage_blocks(summary: dict[str, Any], engine: PdEngine, frames: dict[str, Any]) -> None:
    """Each role's L3 block (``roles.<role>.storage``, as a single-server run's ``storage``)
    where the role has an L3 tier attached to its caches. A store both roles share counts its
    reads and writes in both blocks (one store)."""
    from types import SimpleNamespace

    from sim.storage_setup import storage_summary

    for role, insts, setup in (
        ("prefill", engine.prefill, engine.storage_setups[0]),
        ("decode", [d.inst for d in engine.decode], engine.storage_setups[1]),
    ):
        if setup is None or not any(inst.storage is not None for inst in insts):
            continue
        view = SimpleNamespace(instances=insts, storage=setup)
        block = storage_summary(view, frames[role])
        summary["roles"][role]["storage"] = block.get("storage", {})


def _write_run(
    out_dir: Path, cfg: SimConfig, trace: Trace, roles: dict[str, Any],
    frames: dict[str, Any], summary: dict[str, Any], closed_loop: bool,
) -> None:  # fmt: skip
    import pandas as pd

    from hicache import __version__
    from hicache.policy import NATIVE
    from sim.engine import trace_checksum

    out_dir.mkdir(parents=True, exist_ok=True)
    conf = {
        "config": config_to_dict(cfg),
        "roles": roles,
        "trace": os.path.relpath(trace.path, out_dir) if trace.path else "",
        "trace_sha256": trace_checksum(Path(trace.path)) if trace.path else None,
        "closed_loop": closed_loop,
        "model": dataclasses.asdict(cfg.model.spec),
        "version": __version__,
        "compiled_core": NATIVE.active,
    }
    write_json_atomic(conf, out_dir / "config.json")
    write_parquet_atomic(frames["requests"], out_dir / "requests.parquet")
    for role in ("prefill", "decode"):
        write_parquet_atomic(frames[role]["requests"], out_dir / f"{role}_requests.parquet")
    for name in ("timeline", "transfers"):
        both = [frames[role][name].assign(role=role) for role in ("prefill", "decode")]
        full = [d for d in both if len(d)]
        table = pd.concat(full, ignore_index=True) if len(full) > 1 else (full or both)[0]
        write_parquet_atomic(table, out_dir / f"{name}.parquet")
    write_json_atomic(summary, out_dir / "summary.json")
    from sim.pd.prom import write_pd_metrics

    write_pd_metrics(out_dir, cfg, frames, summary, roles)
