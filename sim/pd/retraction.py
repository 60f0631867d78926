"""What a decode server's retraction backup costs (``pd.decode_retraction_backup``): SGLang
0.5.23's ``--disaggregation-decode-retraction-backup``.

A PD decode server cannot send a retracted request back to be prefilled again; it keeps the
request's KV in host memory and restores it on resumption (``backup_kv_cache`` /
``restore_kv_cache``, mem_cache/common.py:331-379; the installed 0.5.23 wheel). Both copies
are synchronous: the scheduler waits for them before its next step.

- ``host_pool`` (the default on a decode server without the decode radix cache, the offload
  manager or priority preemption, mem_cache/kv_cache_builder.py:228-241): one device->host
  write through the HiCache controller into the pinned host pool, then
  ``finish_event.synchronize()`` (unified_radix_cache.py:1554-1592); the restore is the same
  copy back. Timed here as one HiCache copy op of the request's KV (``Costs.op_time``).
- ``cpu_tensor`` (the default otherwise): ``Req.offload_kv_cache`` copies the KV, per layer and
  per ``cpu_offloading_chunk_size`` tokens (8,192, memory_pool.py:2044), K and V apart, to
  pageable CPU tensors between two device synchronisations (memory_pool.py:2791-2811), and
  back on resumption. Timed here as those ops, each one copy-op latency of the link model,
  plus the bytes at the link's bandwidth times the pageable share below.

Not modelled: a host pool too small for the backup (SGLang then aborts the request); the
decode step that retracted waits here for the copy at the next step (SGLang: before it).
"""

from __future__ import annotations

import math
from typing import Any

from hicache.config.pd import PD_RETRACTION_BACKUPS

#: Pageable copies' share of the pinned bandwidth [estimate: HARDWARE.md C2 measured it on an
#: RTX 4090 over PCIe Gen4, pageable D2H 9.2-12.3 GB/s against 25.4-26.6 pinned (0.36-0.48)
#: and H2D 13.7-18.4 against 22.5-23.9 (0.61-0.77); the midpoints]
PAGEABLE_SHARE = {"d2h": 0.42, "h2d": 0.69}

#: ``cpu_offloading_chunk_size`` of SGLang 0.5.23's KV pools (memory_pool.py:2044)
CPU_OFFLOAD_CHUNK_TOKENS = 8192

#: ``pd.decode_retraction_backup`` values (``auto``: SGLang's default for the server)
RETRACTION_BACKUPS = PD_RETRACTION_BACKUPS


def resolve_backup(
    mode: str, *, radix_cache: bool, offload: bool, priority_preemption: bool
) -> str:
    """The backup SGLang uses: ``mode`` unless ``auto``, then its default
    (kv_cache_builder.py:228-241)."""
    if mode != "auto":
        return mode
    if radix_cache or offload or priority_preemption:
        return "cpu_tensor"
    return "host_pool"


def copy_seconds(mode: str, direction: str, tokens: int, costs: Any, page_size: int) -> float:
    """Seconds the scheduler waits to back up (``d2h``) or restore (``h2d``) ``tokens``
    tokens of a request's KV under ``mode`` (``host_pool`` or ``cpu_tensor``)."""
    if tokens <= 0:
        return 0.0
    nbytes = tokens * costs.bytes_per_page // page_size
    if mode == "host_pool":
        return float(costs.op_time("write" if direction == "d2h" else "load", nbytes, 1))
    link = costs.d2h if direction == "d2h" else costs.h2d
    ops = costs.kv_parts * costs.num_layers * math.ceil(tokens / CPU_OFFLOAD_CHUNK_TOKENS)
    return float(ops * link.alpha_s + nbytes / (link.beta_Bps * PAGEABLE_SHARE[direction]))
