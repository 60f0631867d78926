"""The linear (non-attention) ops of one dense decoder layer on one tensor-parallel rank.

Each op Vidur times (``hicache/data/vidur/``, ops named as there) maps to one GEMM or one
memory-bound op of the rank's slice, timed by a :class:`~hicache.compute.gemm.GemmModel`:

| op | kind | per-rank shape / bytes moved (x ``dtype_bytes``) |
| --- | --- | --- |
| ``input_layernorm`` | elementwise | read + write ``T * hidden`` |
| ``attn_pre_proj`` | GEMM | fused QKV: ``T x hidden -> (heads + 2 kv_heads) * head_dim / tp`` |
| ``attn_rope`` | elementwise | read + write Q and K: ``T * (heads + kv_heads) * head_dim / tp`` |
| ``attn_post_proj`` | GEMM | ``T x heads * head_dim / tp -> hidden`` |
| ``post_attention_layernorm`` | elementwise | read + write ``T * hidden`` (not parallel blocks) |
| ``mlp_up_proj`` | GEMM | ``T x hidden -> (2 if gated else 1) * mlp_width / tp`` |
| ``mlp_act`` | elementwise | gated: read ``2F``, write ``F``; else read, write ``F`` (1) |
| ``mlp_down_proj`` | GEMM | ``T x mlp_width / tp -> hidden`` |
| ``add`` | elementwise | residual add: read 2, write 1 ``T * hidden`` (parallel block: read 3) |

(1) ``F = T * mlp_width / tp``.

The norms and the add act on the whole hidden state on every rank (TP does not split them).
Vidur's ``emb`` (token embedding) is not a layer op. A parallel block (GPT-J style, phi-2) has
one norm feeding attention and MLP, and adds both to the residual at once.

For MoE the same primitives apply: an expert is an up/down GEMM pair
(``gemm.time(tokens_routed, expert_width, hidden)`` ...), see :func:`mlp_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from hicache.compute.gemm import GemmModel


@dataclass(frozen=True, kw_only=True)
class DenseLayer:
    """Shape of one dense decoder layer and its tensor-parallel degree.

    ``head_dim`` defaults to ``hidden // heads`` when 0. ``parallel_block``: attention and MLP
    read the same norm output and one add merges both (no ``post_attention_layernorm``).
    """

    hidden: int
    heads: int
    kv_heads: int
    mlp_width: int
    gated: bool = True
    tp: int = 1
    head_dim: int = 0
    parallel_block: bool = False
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "kv_heads", "mlp_width", "tp", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim < 0:
            raise ValueError(f"head_dim must be >= 0, got {self.head_dim}")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        for name in ("heads", "kv_heads", "mlp_width"):
            if getattr(self, name) % self.tp:
                raise ValueError(
                    f"{name} = {getattr(self, name)} is not divisible by tp = {self.tp}"
                )


class LayerOp(NamedTuple):
    """One op on one rank: a GEMM ``[m x k] @ [k x n]`` (``nbytes`` 0), or a memory-bound op
    moving ``nbytes`` (``m = n = k = 0``). ``m`` and ``nbytes`` may be fractional: a mean over
    MoE experts."""

    name: str
    m: float
    n: int
    k: int
    nbytes: float


def _gemm(name: str, m: float, n: int, k: int) -> LayerOp:
    return LayerOp(name, m, n, k, 0)


def _elementwise(name: str, nbytes: float) -> LayerOp:
    return LayerOp(name, 0, 0, 0, nbytes)


def attention_ops(layer: DenseLayer, tokens: int) -> list[LayerOp]:
    """The norm, QKV projection, RoPE and output projection of ``tokens`` tokens."""
    t, b, tp, hd = tokens, layer.dtype_bytes, layer.tp, layer.head_dim
    qkv = (layer.heads + 2 * layer.kv_heads) * hd // tp
    return [
        _elementwise("input_layernorm", 2 * t * layer.hidden * b),
        _gemm("attn_pre_proj", t, qkv, layer.hidden),
        _elementwise("attn_rope", 2 * t * (layer.heads + layer.kv_heads) * hd // tp * b),
        _gemm("attn_post_proj", t, layer.hidden, layer.heads * hd // tp),
    ]


def mlp_ops(
    hidden: int, width: int, gated: bool, tokens: float, dtype_bytes: int = 2
) -> list[LayerOp]:
    """Up projection, activation and down projection of an MLP of ``width`` on one rank (an
    MoE expert is one such MLP over the tokens routed to it; ``tokens`` may be a mean)."""
    t, up = tokens, (2 if gated else 1) * width
    return [
        _gemm("mlp_up_proj", t, up, hidden),
        _elementwise("mlp_act", t * (up + width) * dtype_bytes),
        _gemm("mlp_down_proj", t, hidden, width),
    ]


def dense_layer_ops(layer: DenseLayer, tokens: int) -> list[LayerOp]:
    """Every linear op of ``layer`` for a forward pass of ``tokens`` tokens, in order."""
    t, h, b = tokens, layer.hidden, layer.dtype_bytes
    ops = attention_ops(layer, t)
    if not layer.parallel_block:
        ops.append(_elementwise("post_attention_layernorm", 2 * t * h * b))
    ops += mlp_ops(h, layer.mlp_width // layer.tp, layer.gated, t, b)
    ops.append(_elementwise("add", (4 if layer.parallel_block else 3) * t * h * b))
    return ops


def op_time(model: GemmModel, op: LayerOp) -> float:
    """Seconds of one op under ``model``."""
    if op.nbytes:
        return model.elementwise_time(op.nbytes)
    return model.time(op.m, op.n, op.k)


def layer_op_times(model: GemmModel, layer: DenseLayer, tokens: int) -> dict[str, float]:
    """Predicted seconds of each linear op of ``layer`` at ``tokens`` tokens, by Vidur op name."""
    return {op.name: op_time(model, op) for op in dense_layer_ops(layer, tokens)}


def linear_time(model: GemmModel, layer: DenseLayer, tokens: int) -> float:
    """``linear_s``: seconds of all linear ops of one layer on one rank (no attention kernel,
    no all-reduce)."""
    return sum(op_time(model, op) for op in dense_layer_ops(layer, tokens))


__all__ = [
    "DenseLayer",
    "LayerOp",
    "attention_ops",
    "dense_layer_ops",
    "layer_op_times",
    "linear_time",
    "mlp_ops",
    "op_time",
]
