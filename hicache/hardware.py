"""Model, GPU and host-link presets, KV-cache bytes per token, and device pool sizing.

Models are defined in ``hicache.models`` and ``hicache.model_config`` (presets are HF
``config.json`` files in ``hicache/model_configs/``) and re-exported here.

Every figure carries its source: a section of ``shared/design/HARDWARE.md`` (C1 GPU memory, C2
links, C4 KV bytes per token, C6 prefill), a published model config (HF ``config.json``), or a
vendor datasheet. **[model]** marks something we derived or assumed rather than looked up.

Standard library only. Sizes are bytes, bandwidths bytes per second, GB = 1e9 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

# The model half lives in hicache.models (ModelSpec, KV and weight bytes) and hicache.model_config
# (HF config.json parsing, the presets in hicache/model_configs/); re-exported here.
from hicache.model_config import MODELS as MODELS
from hicache.model_config import find_name, unknown_name
from hicache.model_config import get_model as get_model
from hicache.model_config import load_model_config as load_model_config
from hicache.model_config import preset_name as preset_name
from hicache.models import AUTO_DTYPE as AUTO_DTYPE
from hicache.models import KV_DTYPE_BYTES as KV_DTYPE_BYTES
from hicache.models import WEIGHT_DTYPE_BYTES as WEIGHT_DTYPE_BYTES
from hicache.models import ModelSpec as ModelSpec
from hicache.models import kv_bytes_per_token as kv_bytes_per_token
from hicache.models import weight_bytes_per_rank as weight_bytes_per_rank
from hicache.models import with_dtypes as with_dtypes

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# GPUs and links
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: HBM capacity (bytes) and bandwidth (bytes/s), dense bf16 peak (FLOP/s), the
    host link it normally comes with (a key of ``LINKS``), and its dense FP8 peak (0: no FP8
    tensor cores)."""

    name: str
    hbm_bytes: float
    hbm_bw: float
    peak_flops_bf16: float
    default_link: str
    peak_flops_fp8: float = 0.0


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="h100-sxm",
            # the card's own byte count, not the datasheet's "80 GB": nvidia-smi reports
            # 81,559 MiB (NVIDIA/nccl#1264; modal-labs/modal-client#2797: 85.52e9 B), which is
            # what SGLang's memory probe sees
            hbm_bytes=81559 * 2**20,
            hbm_bw=3.35e12,  # C1: 3.35 TB/s
            peak_flops_bf16=989e12,  # C6: 989 TFLOPS dense bf16
            default_link="pcie5-x16",  # H100 SXM hosts attach over PCIe Gen5 x16 (C2)
            peak_flops_fp8=1979e12,  # Hopper datasheet: 1,979 TFLOPS dense FP8
        ),
        GpuSpec(
            name="h200",
            # nvidia-smi: 143,771 MiB (150.76e9 B) on H200 SXM boards (public nvidia-smi logs,
            # e.g. in SGLang and vLLM issues), against the datasheet's "141 GB" (C1)
            hbm_bytes=143771 * 2**20,
            hbm_bw=4.8e12,  # C1: 4.8 TB/s
            peak_flops_bf16=989e12,  # same Hopper die as H100 SXM (C6 figure)
            default_link="pcie5-x16",  # C2: H200 spec sheets quote PCIe Gen5 128 GB/s bidir.
            peak_flops_fp8=1979e12,  # Hopper datasheet: 1,979 TFLOPS dense FP8
        ),
        GpuSpec(
            name="a100-80gb",
            # nvidia-smi: 81,920 MiB on A100 80GB (modal-labs/modal-client#2797), against the
            # datasheet's "80 GB HBM2e"
            hbm_bytes=81920 * 2**20,
            hbm_bw=2.039e12,  # A100 datasheet: 2,039 GB/s (SXM)
            peak_flops_bf16=312e12,  # A100 datasheet: 312 TFLOPS dense bf16
            default_link="pcie4-x16",  # A100 is a PCIe Gen4 part
        ),
        GpuSpec(
            name="gh200",
            # C1: 96 GB HBM3 (the 144 GB HBM3e variant is not modelled). [estimate] the
            # datasheet figure: no card's own byte count was found, unlike the others
            hbm_bytes=96e9,
            hbm_bw=4.0e12,  # C1: 4.0 TB/s
            peak_flops_bf16=989e12,  # Hopper die, as H100 SXM
            default_link="nvlink-c2c",  # C2: Grace-Hopper coherent NVLink-C2C
            peak_flops_fp8=1979e12,  # Hopper datasheet: 1,979 TFLOPS dense FP8
        ),
    )
}


@dataclass(frozen=True)
class LinkSpec:
    """A host<->device link: theoretical per-direction bandwidth and the usable figures for
    large pinned copies in each direction (bytes/s). The usable figures seed the shipped
    latency profiles (``hicache/profiles``); a calibrated profile supersedes them."""

    name: str
    spec_Bps: float
    h2d_Bps: float
    d2h_Bps: float


LINKS: dict[str, LinkSpec] = {
    lk.name: lk
    for lk in (
        LinkSpec(
            name="pcie4-x16",
            spec_Bps=31.5e9,  # [model] 16 GT/s x 16 lanes x 128b/130b / 8
            h2d_Bps=23e9,  # C2: Gen4 pinned H2D 22.5-23.9 GB/s (RTX 4090, cuda-oxide #976)
            d2h_Bps=25e9,  # C2: Gen4 pinned D2H 25.4-26.6 GB/s (same source)
        ),
        LinkSpec(
            name="pcie5-x16",
            spec_Bps=63e9,  # C2: 32 GT/s x 16 x 128b/130b ~ 63 GB/s per direction
            # C2 planning value 50-55 GB/s; measured H2D spans 35.2 (nvbandwidth SM copy) to
            # 54.1 (vLLM coalesced), so 50 sits inside the large-copy range
            h2d_Bps=50e9,
            d2h_Bps=53e9,  # C2: nvbandwidth device_to_host 52.8 GB/s on H100
        ),
        LinkSpec(
            name="nvlink-c2c",
            spec_Bps=450e9,  # C2: 900 GB/s total, 450 per direction
            h2d_Bps=375e9,  # C2: KTH Grace-Hopper study, measured H2D
            d2h_Bps=297e9,  # C2: same study, measured D2H
        ),
    )
}


def _lookup(table: dict[str, _T], kind: str, name: str) -> _T:
    found = find_name(name, table, prefix=True)
    if found is None:
        raise unknown_name(kind, name, table)
    return table[found]


def gpu_name(name: str) -> str:
    """The GPU preset ``name`` stands for: itself, case aside (``H200``), or the only preset it
    begins (``H100`` -> ``h100-sxm``); ``ValueError`` with the closest presets otherwise."""
    return get_gpu(name).name


def get_gpu(name: str) -> GpuSpec:
    """The preset called ``name`` (see :func:`gpu_name`); ``ValueError`` with the closest
    choices otherwise."""
    return _lookup(GPUS, "gpu", name)


def get_link(name: str) -> LinkSpec:
    """The preset called ``name`` (as :func:`get_gpu` finds it); ``ValueError`` with the
    closest choices otherwise."""
    return _lookup(LINKS, "link", name)


# ---------------------------------------------------------------------------------------------
# Pool sizing
# ---------------------------------------------------------------------------------------------


def device_pool_tokens(
    model: ModelSpec, gpu: GpuSpec, tp: int, mem_fraction: float, reserve_bytes: float
) -> int:
    """Device KV pool size in tokens, the way SGLang derives ``max_total_num_tokens``.

    ``floor((hbm_bytes * mem_fraction - weight_bytes_per_rank - reserve_bytes) /
    kv_bytes_per_token(model, tp))``. SGLang keeps ``1 - mem_fraction`` of HBM for activations
    and CUDA graphs and gives the rest, less the weights and whatever else is already allocated
    (``reserve_bytes``: CUDA context, workspaces), to the KV pool. **[model]** It is an estimate:
    the real figure depends on the driver's view of total memory and the runtime's own buffers,
    so the recommended input is ``gpu.device_tokens`` set to the ``max_total_num_tokens`` that
    SGLang logs at start-up. Not rounded to a page (the caller does). Raises ``ValueError`` when
    nothing is left for the KV cache.
    """
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if reserve_bytes < 0:
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes}")
    weights = weight_bytes_per_rank(model, tp)
    per_token = kv_bytes_per_token(model, tp)
    free = gpu.hbm_bytes * mem_fraction - weights - reserve_bytes
    tokens = math.floor(free / per_token) if free > 0 else 0
    if tokens <= 0:
        raise ValueError(
            f"{model.name} at tp={tp} leaves no KV cache on {gpu.name}: "
            f"{gpu.hbm_bytes / 1e9:g} GB x mem_fraction {mem_fraction:g} = "
            f"{gpu.hbm_bytes * mem_fraction / 1e9:.2f} GB, weights {weights / 1e9:.2f} GB per "
            f"rank, reserve {reserve_bytes / 1e9:.2f} GB; raise tp or mem_fraction, or set "
            "gpu.device_tokens"
        )
    return tokens
