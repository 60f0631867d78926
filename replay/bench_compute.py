"""The bench's compute rows (CUDA only): one transformer layer's linear GEMMs in the model's
shapes (:func:`model_gemm_shapes`) in bf16, for ``gemm_scale``, and a large device-to-device
copy, for ``decode_hbm_efficiency``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from replay.bench_copies import timed
from replay.bench_rows import BenchRows
from replay.runtime import Runtime

if TYPE_CHECKING:
    from replay.bench import BenchConfig


def model_gemm_shapes(model: str, tp: int = 1) -> tuple[tuple[str, int, int], ...]:
    """One layer's linear GEMMs on one tensor-parallel rank, ``(name, k, n)``: the QKV
    projection ``hidden -> (heads + 2 kv_heads) head_dim``, the output projection, and a SwiGLU
    MLP (``gate_up`` ``hidden -> 2 I``, ``down`` ``I -> hidden``) whose width ``I`` makes the
    layer's weights add up to the preset's ``body_active_params / layers`` (14,336 for
    Llama-3-8B, as its config says). Column-parallel GEMMs split ``n`` by ``tp``, row-parallel
    ones ``k``. The FLOPs these shapes do per token are what ``hicache.latency`` charges as the
    linear part of prefill, so their measured time over ``hicache.forward``'s prediction for the
    same shapes is the profile's ``gemm_scale``.

    MoE and MLA presets get the same dense shapes with the active weights (an approximation:
    their experts run as several smaller GEMMs, and MLA projects through a latent)."""
    from hicache.hardware import get_model

    m = get_model(model)
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    h = m.hidden_size
    qkv = (
        (m.num_attention_heads + m.num_kv_heads) * m.head_dim + m.num_kv_heads * m.v_head_dim
    ) // tp
    o = m.num_attention_heads * m.v_head_dim // tp
    per_layer = m.body_active_params / m.num_layers / tp
    mlp = per_layer - h * qkv - o * h
    # 3 matrices of h x I; round I to 128 as model widths are
    width = max(128, round(mlp / (3 * h) / 128) * 128)
    return (("qkv", h, qkv), ("o", o, h), ("gate_up", h, 2 * width), ("down", width, h))


def gemm_label(name: str, m: int, n: int, k: int) -> str:
    """The ``layout`` label of a GEMM row: its name and shape, ``"qkv 4096x4096x6144"`` for
    ``[m x k] @ [k x n]`` (``hicache.forward`` predicts the same shape to measure
    ``gemm_scale``)."""
    return f"{name} {m}x{k}x{n}"


def parse_gemm_label(label: str) -> tuple[int, int, int] | None:
    """``(m, n, k)`` of a :func:`gemm_label`, or None for a label without a shape."""
    import re

    got = re.fullmatch(r".* (\d+)x(\d+)x(\d+)", label)
    if got is None:
        return None
    m, k, n = (int(g) for g in got.groups())
    return m, n, k


def compute_rows(cfg: BenchConfig, rt: Runtime, rows: BenchRows) -> None:
    """A layer's linear GEMMs in bf16 (``gemm_scale``; a row per GEMM and repeat, its name and
    shape in the ``layout`` column, :func:`gemm_label`) and a large device-to-device copy (HBM
    bandwidth). :func:`run_bench` runs these on CUDA only; on CPU tensors they work but say
    nothing about a GPU."""
    m = cfg.gemm_tokens
    for name, k, n in cfg.gemm_shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device=rt.device)
        b = torch.randn(k, n, dtype=torch.bfloat16, device=rt.device)
        c = torch.empty(m, n, dtype=torch.bfloat16, device=rt.device)

        def gemm(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> None:
            torch.mm(a, b, out=c)

        # randn ran on the default stream: order the timed stream after it
        times = [timed(rt, "h2d", gemm) for _ in range(cfg.warmup + cfg.repeats)]
        rows.add(
            times[cfg.warmup :],
            kind="gemm",
            backend="gemm",
            layout=gemm_label(name, m, n, k),
            flops=2.0 * m * n * k,
            n_alpha=0,
            calls=0,
        )
        del a, b, c
    x = rt.device_empty((cfg.hbm_bytes // 8,), torch.int64).zero_()
    y = torch.empty_like(x)

    def device_copy() -> None:
        y.copy_(x)

    times = [timed(rt, "h2d", device_copy) for _ in range(cfg.warmup + cfg.repeats)]
    # a device copy reads and writes every byte
    rows.add(times[cfg.warmup :], kind="hbm", backend="hbm", bytes=2 * cfg.hbm_bytes, n_alpha=0)


__all__ = ["compute_rows", "model_gemm_shapes"]
