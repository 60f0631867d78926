"""Transfer-time model: the one cost rule of a HiCache copy op, and the layer-wise load overlap.

Transfers (ENGINEERING.md "PCIe model"): one copy op moving ``nbytes`` in ``runs`` contiguous
pieces takes ``alpha + runs * gamma + nbytes / (beta * eta_if_coupled)``; the constants per IO
backend and direction live in a :class:`~hicache.profile.Profile` (:mod:`hicache.profile`,
re-exported here). What a HiCache op is charged is the one cost rule, :func:`op_charges`.
Compute (prefill and decode passes) is :mod:`hicache.forward`.

Standard library only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# counted page by page, so it lives in the compiled core's modules (hicache.policy.native)
from hicache.policy.allocator import count_runs
from hicache.profile import (
    BACKENDS,
    DIRECTIONS,
    PROFILE_DIR,
    PROFILE_VERSION,
    LinkParams,
    Profile,
    default_profile_path,
    load_profile,
    measured_profile_path,
    profile_from_dict,
    profile_to_dict,
    profile_to_json,
    save_profile,
    shipped_profile_path,
    shipped_profiles,
)

__all__ = [  # the profile names are re-exported from hicache.profile
    "BACKENDS",
    "DIRECTIONS",
    "OP_DIRECTION",
    "OP_KINDS",
    "PROFILE_DIR",
    "PROFILE_VERSION",
    "LinkParams",
    "OpCharges",
    "Profile",
    "charged_time",
    "count_runs",
    "default_profile_path",
    "layer_pipeline_end",
    "load_profile",
    "measured_profile_path",
    "op_charges",
    "op_time",
    "profile_from_dict",
    "profile_to_dict",
    "profile_to_json",
    "save_profile",
    "shipped_profile_path",
    "shipped_profiles",
    "transfer_time",
]

# ---------------------------------------------------------------------------------------------
# Transfers
# ---------------------------------------------------------------------------------------------


def transfer_time(p: LinkParams, nbytes: int, runs: int = 1, coupled: bool = False) -> float:
    """Seconds one copy op takes: ``alpha + runs * gamma + nbytes / (beta * e)``, where ``e`` is
    ``eta`` when ``coupled`` (the opposite direction is busy for the whole op) and 1 otherwise.

    A caller whose op is coupled for only part of its life (the SimPy link) should integrate the
    rate itself; this is the closed form for the two constant cases. ``nbytes`` and ``runs``
    must be >= 0.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if runs < 0:
        raise ValueError(f"runs must be >= 0, got {runs}")
    bw = p.beta_Bps * (p.eta if coupled else 1.0)
    return p.alpha_s + runs * p.gamma_s + nbytes / bw


# ---------------------------------------------------------------------------------------------
# Layer-wise load overlap
# ---------------------------------------------------------------------------------------------


def layer_pipeline_end(
    batch_start: float,
    compute_total: float,
    num_layers: int,
    load_start: float,
    load_end: float,
) -> float:
    """When a prefill batch whose KV is loaded layer by layer from host finishes.

    The load delivers layer ``i`` (1..L) at ``ld_i = load_start + i * (load_end - load_start) /
    L``; layer ``i`` computes for ``c = compute_total / L`` once its KV has arrived and layer
    ``i - 1`` has finished (layer 0 "finishes" at ``batch_start``). So ``f_i = max(f_{i-1},
    ld_i) + c`` and, unrolled, ``f_L = max(batch_start + L*c, max_i(ld_i + (L - i + 1) * c))``.
    The inner term is linear in ``i``, so its maximum is at ``i = 1`` or ``i = L``: the batch
    ends at ``max(batch_start + compute_total, load_start + (load_end - load_start) / L +
    compute_total, load_end + c)``. Needs ``num_layers >= 1``, ``compute_total >= 0`` and
    ``load_end >= load_start``; the load may start before the batch.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if compute_total < 0:
        raise ValueError(f"compute_total must be >= 0, got {compute_total}")
    if load_end < load_start:
        raise ValueError(f"load_end ({load_end}) is before load_start ({load_start})")
    c = compute_total / num_layers
    first_layer_loaded = load_start + (load_end - load_start) / num_layers
    return max(batch_start + compute_total, first_layer_loaded + compute_total, load_end + c)


# ---------------------------------------------------------------------------------------------
# HiCache copy ops (what the simulator charges and what replay predicts)
# ---------------------------------------------------------------------------------------------


#: the two kinds of HiCache copy op: a node's device->host backup, a batch's merged load
OP_KINDS = ("write", "load")
OP_DIRECTION = {"write": "d2h", "load": "h2d"}


class OpCharges(NamedTuple):
    """What one copy op is charged: ``n_alpha`` fixed costs, ``n_gamma`` per-run costs and
    ``nbytes`` at the link's bandwidth."""

    n_alpha: int
    n_gamma: int
    nbytes: int


#: pages the page_first write-back stages and copies per chunk (SGLang 0.5.14
#: ``_WRITE_BACK_STAGING_PAGE_CHUNK``: one relayout kernel and one batched copy per chunk)
STAGING_CHUNK_PAGES = 64
#: the host layouts each IO backend runs with on CUDA (SGLang 0.5.14 ``_handle_hicache``:
#: page_first + direct becomes page_first_direct, page_first_direct + kernel becomes direct;
#: page_head + direct fails at run time)
LAYOUTS_BY_BACKEND = {
    "kernel": ("layer_first", "page_first", "page_head"),
    "direct": ("layer_first", "page_first_direct"),
}


def op_charges(
    kind: str,
    nbytes: int,
    runs: int,
    layers: int,
    *,
    backend: str = "direct",
    layout: str = "layer_first",
    pages: int = 0,
    kv_parts: int = 1,
) -> OpCharges:
    """THE cost rule of a HiCache copy op: the fixed costs, the per-copy costs and the bytes
    that SGLang 0.5.14 issues for it (the simulator, the bench rows, the calibration fit and the
    replay's predictions all use it).

    ``runs``: contiguous runs of (device, host) page pairs; ``pages``: pages in the op;
    ``kv_parts``: 2 for an MHA pool (K and V are separate buffers, copied separately), 1 for
    MLA. A write is a node's device->host backup, all layers in one op; a load is a batch's
    host->device load, issued layer by layer (one fixed cost per layer).

    * ``kernel`` IO (``layer_first``, ``page_first``, ``page_head``): one gather/scatter kernel
      per layer (load) or for all layers (write), whatever the fragmentation: no per-copy
      cost. Except the default ``page_first`` write-back: per chunk of
      :data:`STAGING_CHUNK_PAGES` pages a relayout kernel (a fixed cost) and a batched copy of
      one descriptor per page and K/V (``kv_parts * pages`` per-copy costs).
    * ``direct`` + ``layer_first``: one ``cudaMemcpyAsync`` per contiguous run, layer and K/V
      (SGLang merges neighbouring indices): ``kv_parts * runs * layers`` copies.
    * ``direct`` + ``page_first_direct``: one copy per page, layer and K/V, never merged:
      ``kv_parts * pages * layers`` copies.

    The defaults (``direct``, ``layer_first``, one part) are the structure the replay's copies
    emulate. Source: the SGLang 0.5.14 wheel's ``memory_pool_host.py`` and
    ``cache_controller.py`` and sgl-kernel's ``transfer.cu`` (README "Copy cost by backend and
    layout").
    """
    if kind not in OP_KINDS:
        raise ValueError(f"unknown op kind {kind!r}; expected one of {', '.join(OP_KINDS)}")
    layouts = LAYOUTS_BY_BACKEND.get(backend)
    if layouts is None:
        raise ValueError(f"unknown io backend {backend!r}; choices: kernel, direct")
    if layout not in layouts:
        raise ValueError(
            f"SGLang does not run layout {layout!r} with the {backend} backend "
            f"(it runs: {', '.join(layouts)})"
        )
    fixed = 1 if kind == "write" else layers
    if backend == "kernel":
        if kind == "write" and layout == "page_first":
            chunks = -(-pages // STAGING_CHUNK_PAGES)
            return OpCharges(max(1, chunks), kv_parts * pages, nbytes)
        return OpCharges(fixed, 0, nbytes)
    pieces = runs if layout == "layer_first" else pages
    return OpCharges(fixed, kv_parts * pieces * layers, nbytes)


def charged_time(alpha_s: Any, gamma_s: Any, beta_Bps: Any, c: OpCharges) -> Any:
    """Seconds for charges ``c``: ``n_alpha * alpha + n_gamma * gamma + nbytes / beta``
    (element-wise when the arguments are arrays, as in a least-squares fit)."""
    return c.n_alpha * alpha_s + c.n_gamma * gamma_s + c.nbytes / beta_Bps


def op_time(link: LinkParams, c: OpCharges) -> float:
    """Uncoupled seconds of an op with charges ``c`` on ``link`` (one backend, one direction)."""
    return float(charged_time(link.alpha_s, link.gamma_s, link.beta_Bps, c))
