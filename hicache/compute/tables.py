"""Readers of the measured H100 operator tables shipped in ``hicache/data/vidur/``.

The tables are a compact copy of Vidur's profiles (microsoft/vidur ``data/profiling/``, commit
7d47513363ec447a741ac5e47241580b47724fbf, MIT licence; ``hicache/data/vidur/README.md``): the
median time of every op of one decoder layer per (model, tokens, TP degree), and the median NCCL
all-reduce time per (workers, bytes) on one DGX H100. Times stay in milliseconds as measured;
the models in this package convert to seconds.

Standard library only (``csv``), so a fit or a test needs no pandas.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

#: Where the derived tables live (inside the package, so a clean clone has them).
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "vidur"
#: Per-layer op table: ``model`` + shape columns + ``time_stats.<op>.median`` (ms).
MLP_TABLE = DATA_DIR / "h100_mlp.csv"
#: All-reduce table: ``num_workers``, ``size`` (bytes), ``time_stats.all_reduce.median`` (ms).
ALL_REDUCE_TABLE = DATA_DIR / "h100_dgx_all_reduce.csv"

#: Every op Vidur times in one layer, in forward order. ``emb`` (the token embedding) is not
#: part of a layer's linear time; ``post_attention_layernorm`` is absent for parallel blocks.
MLP_OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: The shape columns of the per-layer table, as Vidur names them.
SHAPE_COLUMNS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
)
ALL_REDUCE_COLUMNS = ("num_workers", "size", "time_stats.all_reduce.median")


def median_column(op: str) -> str:
    """The column of ``op``'s median time (ms), named as in Vidur's files."""
    return f"time_stats.{op}.median"


class LayerRow(NamedTuple):
    """One measured point: a layer of ``model`` at ``tokens`` tokens on ``tp`` ranks.

    ``op_ms`` maps each op the layer has to its median time in ms (per rank; the GEMMs are the
    rank's slice). ``hidden`` is Vidur's ``n_embd`` and ``mlp_width`` its ``n_expanded_embd``.
    """

    model: str
    heads: int
    kv_heads: int
    hidden: int
    mlp_width: int
    vocab_size: int
    gated: bool
    tokens: int
    tp: int
    op_ms: Mapping[str, float]


class AllReduceRow(NamedTuple):
    """One NCCL all-reduce of ``nbytes`` over ``workers`` GPUs: median time in ms."""

    workers: int
    nbytes: int
    median_ms: float


def _bool(text: str) -> bool:
    if text not in ("True", "False"):
        raise ValueError(f"use_gated_mlp must be True or False, got {text!r}")
    return text == "True"


def _layer_row(rec: Mapping[str, str]) -> LayerRow:
    ops = {op: float(rec[median_column(op)]) for op in MLP_OPS if rec[median_column(op)] != ""}
    return LayerRow(
        model=rec["model"],
        heads=int(rec["n_head"]),
        kv_heads=int(rec["n_kv_head"]),
        hidden=int(rec["n_embd"]),
        mlp_width=int(rec["n_expanded_embd"]),
        vocab_size=int(rec["vocab_size"]),
        gated=_bool(rec["use_gated_mlp"]),
        tokens=int(rec["num_tokens"]),
        tp=int(rec["num_tensor_parallel_workers"]),
        op_ms=ops,
    )


def _records(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_layer_rows(path: str | Path = MLP_TABLE) -> list[LayerRow]:
    """Every row of the per-layer op table, in file order (an empty cell = op absent)."""
    return [_layer_row(rec) for rec in _records(Path(path))]


def read_all_reduce_rows(path: str | Path = ALL_REDUCE_TABLE) -> list[AllReduceRow]:
    """Every row of the all-reduce table, in file order."""
    return [
        AllReduceRow(
            workers=int(rec["num_workers"]),
            nbytes=int(rec["size"]),
            median_ms=float(rec["time_stats.all_reduce.median"]),
        )
        for rec in _records(Path(path))
    ]


__all__ = [
    "ALL_REDUCE_COLUMNS",
    "ALL_REDUCE_TABLE",
    "DATA_DIR",
    "MLP_OPS",
    "MLP_TABLE",
    "SHAPE_COLUMNS",
    "AllReduceRow",
    "LayerRow",
    "median_column",
    "read_all_reduce_rows",
    "read_layer_rows",
]
