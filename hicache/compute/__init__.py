"""Compute-time primitives fitted to measured H100 operator times (HARDWARE.md C6-C7).

* :mod:`~hicache.compute.gemm`: one GEMM and one memory-bound op (:class:`GemmModel`);
* :mod:`~hicache.compute.layer`: a dense decoder layer's linear ops per tensor-parallel rank;
* :mod:`~hicache.compute.attention`: causal prefill attention at an FA3 efficiency curve;
* :mod:`~hicache.compute.allreduce`: NCCL all-reduce inside one server;
* :mod:`~hicache.compute.profile`: the fitted coefficients of one GPU, shipped as
  ``hicache/profiles/compute/<gpu>.json`` (:func:`load_compute`);
* :mod:`~hicache.compute.fit` and :mod:`~hicache.compute.tables`: the offline fit and the
  measured tables it reads (``hicache/data/vidur/``).

The runtime models are plain Python floats; numpy is used only inside the fit functions.
"""

from hicache.compute.allreduce import (
    CUSTOM_AR_MAX_BYTES,
    SGLANG_CUSTOM_AR_H100,
    AllReduceFit,
    AllReduceModel,
    CustomAllReduce,
)
from hicache.compute.attention import (
    AttentionModel,
    prefill_attention_flops,
    prefill_attention_time,
)
from hicache.compute.gemm import GemmModel
from hicache.compute.layer import DenseLayer, LayerOp, dense_layer_ops, layer_op_times, linear_time
from hicache.compute.profile import ComputeProfile, load_compute, shipped_compute_profiles

__all__ = [
    "CUSTOM_AR_MAX_BYTES",
    "SGLANG_CUSTOM_AR_H100",
    "AllReduceFit",
    "AllReduceModel",
    "AttentionModel",
    "ComputeProfile",
    "CustomAllReduce",
    "DenseLayer",
    "GemmModel",
    "LayerOp",
    "dense_layer_ops",
    "layer_op_times",
    "linear_time",
    "load_compute",
    "prefill_attention_flops",
    "prefill_attention_time",
    "shipped_compute_profiles",
]
