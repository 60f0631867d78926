"""Transfer-time and compute-time models, and the latency profiles (JSON) that parameterise them.

Transfers (ENGINEERING.md "PCIe model"): one copy op moving ``nbytes`` in ``runs`` contiguous
pieces takes ``alpha + runs * gamma + nbytes / (beta * eta_if_coupled)``; the five constants per
IO backend and direction live in a :class:`Profile`.

Compute (HARDWARE.md C6, **[model]**): a roofline. Prefill is FLOP-bound for any sizeable
extend, with a floor set by reading the weights once; decode is HBM-bound (weights + KV of the
batch) with a FLOP ceiling for large batches. Both add a fixed per-batch overhead (scheduling,
kernel launches, sampling) from the profile.

Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hicache.hardware import GpuSpec, ModelSpec, kv_bytes_per_token, weight_bytes_per_rank

#: IO backends a profile must describe (SGLang ``--hicache-io-backend`` on CUDA).
BACKENDS = ("kernel", "direct")
#: Copy directions: device->host (writes/backups) and host->device (load_back).
DIRECTIONS = ("d2h", "h2d")
#: Where the shipped default profiles live: ``<gpu>-<link>-default.json``.
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: Version of the profile JSON format this module reads and writes.
PROFILE_VERSION = 1

# ---------------------------------------------------------------------------------------------
# Transfers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkParams:
    """Cost model of one IO backend in one direction.

    ``alpha_s``: fixed cost per copy op (launch, index upload, stream event). ``beta_Bps``:
    bandwidth of a large copy, bytes/s. ``gamma_s``: extra cost per contiguous run of pages in
    the op (what the ``direct`` backend pays per ``cudaMemcpyAsync``; ~0 for the gather/scatter
    kernels). ``eta`` in (0, 1]: service-rate factor while the other direction is busy, so the
    effective bandwidth is ``beta * eta`` then.
    """

    alpha_s: float
    beta_Bps: float
    gamma_s: float = 0.0
    eta: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha_s", "beta_Bps", "gamma_s", "eta"):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v}")
        if self.alpha_s < 0:
            raise ValueError(f"alpha_s must be >= 0, got {self.alpha_s}")
        if self.beta_Bps <= 0:
            raise ValueError(f"beta_Bps must be > 0, got {self.beta_Bps}")
        if self.gamma_s < 0:
            raise ValueError(f"gamma_s must be >= 0, got {self.gamma_s}")
        if not 0 < self.eta <= 1:
            raise ValueError(f"eta must be in (0, 1], got {self.eta}")


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
# Profiles
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Every latency constant for one GPU + host link.

    ``links[backend][direction]`` holds a :class:`LinkParams` for each backend in ``BACKENDS``
    and direction in ``DIRECTIONS``. Compute: ``mfu`` (fraction of dense bf16 peak that prefill
    reaches), ``prefill_overhead_s`` (per prefill batch), ``attn_efficiency`` (attention FLOPs
    run at ``mfu * attn_efficiency``), ``decode_hbm_efficiency`` (fraction of HBM bandwidth a
    decode step achieves), ``decode_overhead_s`` (per decode step). ``measured`` is True only
    for a profile fitted to measurements (replay calibration); ``provenance`` says where the
    numbers come from (``source`` at least; usually ``date`` and ``notes``).

    The dicts are not copied or frozen: treat them as read-only.
    """

    gpu: str
    link_name: str
    links: dict[str, dict[str, LinkParams]] = field(hash=False)
    mfu: float
    prefill_overhead_s: float
    attn_efficiency: float = 1.0
    decode_hbm_efficiency: float
    decode_overhead_s: float
    measured: bool = False
    provenance: dict[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for backend in BACKENDS:
            for direction in DIRECTIONS:
                if direction not in self.links.get(backend, {}):
                    raise ValueError(f"links.{backend}.{direction}: missing")
        for backend, by_dir in self.links.items():
            if backend not in BACKENDS:
                raise ValueError(f"links.{backend}: unknown backend; choices: {BACKENDS}")
            for direction in by_dir:
                if direction not in DIRECTIONS:
                    raise ValueError(
                        f"links.{backend}.{direction}: unknown direction; choices: {DIRECTIONS}"
                    )
        for name, lo_open, hi in (
            ("mfu", 0.0, 1.0),
            ("attn_efficiency", 0.0, math.inf),
            ("decode_hbm_efficiency", 0.0, 1.0),
        ):
            v = getattr(self, name)
            if not lo_open < v <= hi:
                raise ValueError(f"compute.{name} must be in (0, {hi:g}], got {v}")
        for name in ("prefill_overhead_s", "decode_overhead_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"compute.{name} must be >= 0, got {v}")

    def link(self, backend: str, direction: str) -> LinkParams:
        """The transfer constants for ``backend`` (``kernel``/``direct``) and ``direction``
        (``d2h``/``h2d``); ``ValueError`` naming the choices for anything else."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown io backend {backend!r}; choices: {', '.join(BACKENDS)}")
        if direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}; choices: {', '.join(DIRECTIONS)}")
        return self.links[backend][direction]


_LINK_KEYS = ("alpha_s", "beta_Bps", "gamma_s", "eta")
_COMPUTE_KEYS = (
    "mfu",
    "prefill_overhead_s",
    "attn_efficiency",
    "decode_hbm_efficiency",
    "decode_overhead_s",
)
_TOP_KEYS = ("version", "gpu", "link", "measured", "provenance", "links", "compute")


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The JSON-ready form of ``profile`` (on-disk format: ``hicache/profiles/README.md``)."""
    return {
        "version": PROFILE_VERSION,
        "gpu": profile.gpu,
        "link": profile.link_name,
        "measured": profile.measured,
        "provenance": dict(profile.provenance),
        "links": {
            b: {d: {k: getattr(profile.links[b][d], k) for k in _LINK_KEYS} for d in DIRECTIONS}
            for b in BACKENDS
        },
        "compute": {k: getattr(profile, k) for k in _COMPUTE_KEYS},
    }


def profile_to_json(profile: Profile) -> str:
    """``profile_to_dict`` as indented JSON text ending in a newline."""
    return json.dumps(profile_to_dict(profile), indent=2) + "\n"


def _check_keys(obj: Any, where: str, required: Sequence[str], source: str) -> dict[str, Any]:
    """``obj`` as a dict with exactly the ``required`` keys, or ``ValueError`` naming the key."""
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: {where or 'top level'}: expected an object")
    for k in obj:
        if k not in required:
            raise ValueError(
                f"{source}: {where + '.' if where else ''}{k}: unknown key; "
                f"allowed: {', '.join(required)}"
            )
    for k in required:
        if k not in obj:
            raise ValueError(f"{source}: {where + '.' if where else ''}{k}: missing")
    return obj


def _number(v: Any, where: str, source: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{source}: {where}: expected a finite number, got {v!r}")
    return float(v)


def profile_from_dict(data: Mapping[str, Any], source: str = "<profile>") -> Profile:
    """Parse and validate the on-disk form. Every key is required and unknown keys are
    errors; every ``ValueError`` starts with ``source`` and names the offending key."""
    top = _check_keys(dict(data), "", _TOP_KEYS, source)
    if top["version"] != PROFILE_VERSION or isinstance(top["version"], bool):
        raise ValueError(
            f"{source}: version: unsupported {top['version']!r} (this build reads "
            f"{PROFILE_VERSION})"
        )
    for k in ("gpu", "link"):
        if not isinstance(top[k], str) or not top[k]:
            raise ValueError(f"{source}: {k}: expected a non-empty string")
    if not isinstance(top["measured"], bool):
        raise ValueError(f"{source}: measured: expected true or false")
    prov = top["provenance"]
    if not isinstance(prov, dict) or not all(isinstance(v, str) for v in prov.values()):
        raise ValueError(f"{source}: provenance: expected an object of strings")
    if "source" not in prov:
        raise ValueError(f"{source}: provenance.source: missing")
    links_in = _check_keys(top["links"], "links", BACKENDS, source)
    links: dict[str, dict[str, LinkParams]] = {}
    for b in BACKENDS:
        by_dir = _check_keys(links_in[b], f"links.{b}", DIRECTIONS, source)
        links[b] = {}
        for d in DIRECTIONS:
            where = f"links.{b}.{d}"
            raw = _check_keys(by_dir[d], where, _LINK_KEYS, source)
            vals = {k: _number(raw[k], f"{where}.{k}", source) for k in _LINK_KEYS}
            try:
                links[b][d] = LinkParams(**vals)
            except ValueError as e:
                raise ValueError(f"{source}: {where}.{e}") from None
    comp = _check_keys(top["compute"], "compute", _COMPUTE_KEYS, source)
    cvals = {k: _number(comp[k], f"compute.{k}", source) for k in _COMPUTE_KEYS}
    try:
        return Profile(
            gpu=top["gpu"],
            link_name=top["link"],
            links=links,
            measured=top["measured"],
            provenance=dict(prov),
            **cvals,
        )
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def default_profile_path(gpu: str, link: str) -> Path:
    """Where the shipped default profile for ``gpu`` + ``link`` lives (it may not exist)."""
    return PROFILE_DIR / f"{gpu}-{link}-default.json"


def measured_profile_path(gpu: str) -> Path:
    """Where a profile measured on ``gpu`` is committed (``replay``'s device check writes it
    under this name): ``hicache/profiles/<gpu>-measured.json``. It may not exist."""
    return PROFILE_DIR / f"{gpu}-measured.json"


def shipped_profile_path(gpu: str, link: str) -> Path:
    """The shipped profile a run on ``gpu`` over ``link`` uses when it names none: the one
    measured on that GPU when there is one for that link, else the ``-default.json`` estimate
    (which may not exist either)."""
    measured = measured_profile_path(gpu)
    if measured.is_file():
        try:
            link_of = json.loads(measured.read_text(encoding="utf-8")).get("link")
        except (OSError, ValueError, AttributeError):
            return measured  # unreadable: loading it reports what is wrong with it
        if link_of == link:
            return measured
    return default_profile_path(gpu, link)


def shipped_profiles() -> list[str]:
    """Stems of the profiles shipped in ``hicache/profiles``: ``<gpu>-<link>`` for the defaults,
    ``<gpu>-measured`` for measured ones."""
    return sorted(
        [p.name.removesuffix("-default.json") for p in PROFILE_DIR.glob("*-default.json")]
        + [p.name.removesuffix(".json") for p in PROFILE_DIR.glob("*-measured.json")]
    )


def load_profile(path: str | Path | None, gpu: str, link: str) -> Profile:
    """Load a profile for a run on ``gpu`` over ``link``.

    ``path`` None (or ``""``) selects the shipped profile (:func:`shipped_profile_path`):
    ``hicache/profiles/<gpu>-measured.json`` when one was measured on that GPU over ``link``, else
    the estimate ``hicache/profiles/<gpu>-<link>-default.json``. The profile's own ``gpu``/``link``
    must match the run's: constants measured on one machine silently applied to another would
    be a wrong answer, not a what-if. Every problem (missing file, bad JSON, unknown or
    missing key, out-of-range value, mismatch) raises ``ValueError`` whose message starts
    with the file name and names the key.
    """
    if path is None or str(path) == "":
        p = shipped_profile_path(gpu, link)
        if not p.is_file():
            raise ValueError(
                f"{p}: no shipped default profile for gpu {gpu!r} with link {link!r}; shipped: "
                f"{', '.join(shipped_profiles())} (or give a calibrated profile file)"
            )
    else:
        p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{p}: cannot read profile: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level: expected an object")
    prof = profile_from_dict(data, source=str(p))
    if prof.gpu != gpu:
        raise ValueError(f"{p}: gpu: profile is for {prof.gpu!r}, the run uses {gpu!r}")
    if prof.link_name != link:
        raise ValueError(f"{p}: link: profile is for {prof.link_name!r}, the run uses {link!r}")
    return prof


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile_to_json(profile)`` to ``path`` atomically (temp file + rename), so a
    reader never sees half a profile."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 & ~umask)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(profile_to_json(profile))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Compute
# ---------------------------------------------------------------------------------------------


def _attn_flops_per_pair(model: ModelSpec) -> int:
    # QK^T costs 2 * head_dim and PV 2 * v_head_dim FLOPs per (query, key) pair and head, per
    # layer: 4 * heads * head_dim when the two dims are equal
    return 2 * model.num_layers * model.num_attention_heads * (model.head_dim + model.v_head_dim)


def prefill_flops_split(
    model: ModelSpec, new_tokens: int, cached_tokens: int, tp: int = 1
) -> tuple[float, float]:
    """(linear, attention) FLOPs on one rank to extend one request by ``new_tokens`` on top of
    ``cached_tokens`` already in the KV cache. **[model]**, after HARDWARE.md C6 (Mooncake eq. 1):

    * linear: ``2 * body_active_params * new_tokens`` plus the LM head for one position,
      ``2 * vocab * hidden`` (SGLang computes logits only for the last position of an extend;
      the embedding lookup is a gather). Counting the embeddings per token, as ``2 *
      active_params * n`` would, overstates Llama-3-8B by 15 %.
    * attention (causal, QK^T and PV): ``2 * layers * heads * (head_dim + v_head_dim) *
      (new * cached + new * (new + 1) / 2)``, i.e. ``4 * layers * heads * head_dim * ...`` for
      the usual equal dims. Mooncake's ``a = 4`` counts the full square; a causal kernel skips
      the upper triangle.

    Both are divided by ``tp`` (all-reduce time is not modelled). For a batch, sum per request.
    """
    if new_tokens < 0 or cached_tokens < 0:
        raise ValueError(f"token counts must be >= 0, got new={new_tokens} cached={cached_tokens}")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if new_tokens == 0:
        return 0.0, 0.0
    n, p = float(new_tokens), float(cached_tokens)
    linear = 2.0 * model.body_active_params * n + 2.0 * model.vocab_size * model.hidden_size
    attention = _attn_flops_per_pair(model) * (n * p + n * (n + 1) / 2)
    return linear / tp, attention / tp


def prefill_flops(model: ModelSpec, new_tokens: int, cached_tokens: int, tp: int = 1) -> float:
    """Total FLOPs of :func:`prefill_flops_split` (linear + causal attention), per rank."""
    linear, attention = prefill_flops_split(model, new_tokens, cached_tokens, tp)
    return linear + attention


def prefill_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    reqs: Sequence[tuple[int, int]],
    tp: int = 1,
) -> float:
    """Seconds for one prefill batch; ``reqs`` holds ``(new_tokens, cached_tokens)`` per request.

    **[model]** roofline: ``max(compute, memory) + prefill_overhead_s`` where
    ``compute = sum(linear) / (peak * mfu) + sum(attention) / (peak * mfu * attn_efficiency)``
    (FLOPs from :func:`prefill_flops_split`) and ``memory`` is reading the weights once plus the
    KV of every request's cached and new tokens, at ``hbm_bw * decode_hbm_efficiency``. The
    memory floor only matters for small extends (a request that is almost all cache hit costs
    at least one pass over the weights, ~6 ms for Llama-3-8B on an H100). An empty batch takes 0.
    """
    if not reqs:
        return 0.0
    linear = attention = 0.0
    kv_tokens = 0
    for new, cached in reqs:
        lin, att = prefill_flops_split(model, new, cached, tp)
        linear += lin
        attention += att
        kv_tokens += new + cached
    peak = gpu.peak_flops_bf16 * profile.mfu
    compute = linear / peak + attention / (peak * profile.attn_efficiency)
    nbytes = weight_bytes_per_rank(model, tp) + kv_bytes_per_token(model, tp) * kv_tokens
    memory = nbytes / (gpu.hbm_bw * profile.decode_hbm_efficiency)
    return max(compute, memory) + profile.prefill_overhead_s


def layer_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    reqs: Sequence[tuple[int, int]],
    tp: int = 1,
) -> float:
    """``prefill_time / num_layers``: one layer's share, for the layer-wise load pipeline."""
    return prefill_time(model, gpu, profile, reqs, tp) / model.num_layers


def decode_step_time(
    model: ModelSpec,
    gpu: GpuSpec,
    profile: Profile,
    batch_size: int,
    kv_tokens_total: int,
    tp: int = 1,
) -> float:
    """Seconds for one decode step of ``batch_size`` requests holding ``kv_tokens_total`` KV
    tokens between them (the KV every request reads this step).

    **[model]** roofline: ``max(memory, compute) + decode_overhead_s`` with
    ``memory = (weight_bytes_per_rank + kv_bytes_per_token(model, tp) * kv_tokens_total) /
    (hbm_bw * decode_hbm_efficiency)`` and ``compute`` the FLOPs of one new token per request
    (:func:`prefill_flops_split` with ``new = 1``) at ``peak * mfu``. Decode is memory-bound
    until batches of a few hundred; the compute ceiling keeps very large batches honest. For MoE
    models all weights are read every step (true once the batch touches every expert; an upper
    bound for small batches). ``batch_size == 0`` takes 0.
    """
    if batch_size < 0 or kv_tokens_total < 0:
        raise ValueError(
            f"batch_size and kv_tokens_total must be >= 0, got {batch_size}, {kv_tokens_total}"
        )
    if batch_size == 0:
        return 0.0
    nbytes = weight_bytes_per_rank(model, tp) + kv_bytes_per_token(model, tp) * kv_tokens_total
    memory = nbytes / (gpu.hbm_bw * profile.decode_hbm_efficiency)
    lin_one, _ = prefill_flops_split(model, 1, 0, tp)
    attention = _attn_flops_per_pair(model) * kv_tokens_total / tp
    peak = gpu.peak_flops_bf16 * profile.mfu
    compute = batch_size * lin_one / peak + attention / (peak * profile.attn_efficiency)
    return max(memory, compute) + profile.decode_overhead_s


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


def count_runs(device_pages: Sequence[int], host_pages: Sequence[int]) -> int:
    """Contiguous runs of a paired page copy: a new run starts wherever either side is not the
    previous page + 1 (one ``cudaMemcpyAsync`` per run and layer for ``direct`` IO). This is
    the ``runs`` that :func:`op_charges` charges ``gamma`` for."""
    n = len(device_pages)
    if n != len(host_pages):
        raise ValueError(f"page lists differ in length: {n} device vs {len(host_pages)} host")
    if not n:
        return 0
    runs = 1
    for i in range(1, n):
        if device_pages[i] != device_pages[i - 1] + 1 or host_pages[i] != host_pages[i - 1] + 1:
            runs += 1
    return runs


class OpCharges(NamedTuple):
    """What one copy op is charged: ``n_alpha`` fixed costs, ``n_gamma`` per-run costs and
    ``nbytes`` at the link's bandwidth."""

    n_alpha: int
    n_gamma: int
    nbytes: int


def op_charges(kind: str, nbytes: int, runs: int, layers: int) -> OpCharges:
    """THE cost rule of a HiCache copy op (the simulator, the bench rows, the calibration fit
    and the replay's predictions all use it).

    * ``"write"``: one device->host backup of a node is a single op for all layers (``alpha``
      once); the KV of each contiguous run of pages is copied per layer (``gamma`` per run per
      layer, ~0 for the kernel backend);
    * ``"load"``: a batch's merged host->device load is issued layer by layer (``alpha`` per
      layer), ``gamma`` per run per layer.
    """
    if kind == "write":
        return OpCharges(1, runs * layers, nbytes)
    if kind == "load":
        return OpCharges(layers, runs * layers, nbytes)
    raise ValueError(f"unknown op kind {kind!r}; expected one of {', '.join(OP_KINDS)}")


def charged_time(alpha_s: Any, gamma_s: Any, beta_Bps: Any, c: OpCharges) -> Any:
    """Seconds for charges ``c``: ``n_alpha * alpha + n_gamma * gamma + nbytes / beta``
    (element-wise when the arguments are arrays, as in a least-squares fit)."""
    return c.n_alpha * alpha_s + c.n_gamma * gamma_s + c.nbytes / beta_Bps


def op_time(link: LinkParams, c: OpCharges) -> float:
    """Uncoupled seconds of an op with charges ``c`` on ``link`` (one backend, one direction)."""
    return float(charged_time(link.alpha_s, link.gamma_s, link.beta_Bps, c))
