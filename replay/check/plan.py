"""What the device check measures: the bench sweep, the replays' geometry and pool budgets, the
trace replayed and the GPU preset the calibrated profile is for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replay.bench import BenchConfig
    from traces.schema import Trace

DEFAULT_TRACE = "shared-prefix"
#: requests replayed per IO backend unless ``--max-requests`` says otherwise
CUDA_MAX_REQUESTS = 400
CPU_MAX_REQUESTS = 120
#: the preset of a profile made on CPU tensors (unmeasured anyway)
CPU_GPU_PRESET = "h100-sxm"


@dataclass(frozen=True)
class CheckPlan:
    """What the check measures: the bench config, the replay's geometry overrides, the pool
    budgets (device, host bytes) and the requests replayed."""

    bench: BenchConfig
    geometry: dict[str, Any]
    budgets: tuple[int, int]
    max_requests: int


def check_plan(cuda: bool, model: str) -> CheckPlan:
    """The plan for a CUDA device (the model's real geometry; estimated at 1.5-2.5 minutes on
    an H100/H200 from the copies and bytes it moves, not yet timed on one) or for CPU tensors
    (a small geometry, seconds)."""
    from replay.bench import BenchConfig

    if cuda:
        # the full size range, fewer repeats; the pageable plain copies cost seconds and
        # answer "what does pinning buy". A 1 GiB device pool (8k tokens of Llama-3-8B) under
        # 8 GiB of host: with 400 requests of the shared-prefix trace, ~800 writes and ~70
        # loads (a 4 GiB pool gives only a handful of loads, too few for the h2d figures)
        return CheckPlan(
            bench=BenchConfig.for_model(model, page_size=64, repeats=5),
            geometry={"page_size": 64},
            budgets=(1 << 30, 8 << 30),
            max_requests=CUDA_MAX_REQUESTS,
        )
    cfg = BenchConfig.quick()
    return CheckPlan(
        bench=cfg,
        # the replay uses the bench's op geometry so the fit covers its ops
        geometry={
            "page_size": cfg.page_size,
            "num_layers": cfg.op_layers[-1],
            "token_layer_bytes": cfg.token_layer_bytes,
        },
        budgets=(16 << 20, 32 << 20),
        max_requests=CPU_MAX_REQUESTS,
    )


def load_trace(trace_kind: str) -> Trace:
    """The trace file ``trace_kind``, or else the bundled synthetic trace of that kind
    (``ValueError`` for neither)."""
    from traces.bundled import synthetic_path
    from traces.io import read_trace

    if Path(trace_kind).is_file():
        return read_trace(Path(trace_kind))
    try:
        return read_trace(synthetic_path(trace_kind))
    except KeyError as e:
        raise ValueError(str(e).strip("'\"")) from None


def profile_gpu(gpu_name: str, cuda: bool) -> str:
    """The ``hicache.hardware`` preset of the CUDA device ``gpu_name`` (:data:`CPU_GPU_PRESET`
    on CPU tensors); ``ValueError`` for a device that matches no preset."""
    from replay.presets import gpu_preset_for

    if not cuda:
        return CPU_GPU_PRESET
    gpu = gpu_preset_for(gpu_name)
    if gpu is None:
        raise ValueError(f"GPU {gpu_name!r} matches no hicache.hardware preset; pass --gpu NAME")
    return gpu


__all__ = [
    "CPU_GPU_PRESET",
    "CPU_MAX_REQUESTS",
    "CUDA_MAX_REQUESTS",
    "DEFAULT_TRACE",
    "CheckPlan",
    "check_plan",
    "load_trace",
    "profile_gpu",
]
