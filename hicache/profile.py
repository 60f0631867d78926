"""Latency profiles: every timing constant for one GPU + host link, and their JSON files.

A :class:`Profile` holds, per IO backend and direction, the copy constants of a
:class:`LinkParams` (the one cost rule of :mod:`hicache.latency` charges them), and the compute
constants of the roofline. Shipped profiles live in ``hicache/profiles/`` (format:
``hicache/profiles/README.md``); a ``<gpu>-measured.json`` there, written by replay
calibration, replaces the estimate for its GPU and link.

Standard library only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: IO backends a profile must describe (SGLang ``--hicache-io-backend`` on CUDA).
BACKENDS = ("kernel", "direct")
#: Copy directions: device->host (writes/backups) and host->device (load_back).
DIRECTIONS = ("d2h", "h2d")
#: Where the shipped default profiles live: ``<gpu>-<link>-default.json``.
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: Version of the profile JSON format this module reads and writes.
PROFILE_VERSION = 2


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


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Every latency constant for one GPU + host link.

    ``links[backend][direction]`` holds a :class:`LinkParams` for each backend in ``BACKENDS``
    and direction in ``DIRECTIONS``. Compute (the operator model of :mod:`hicache.forward`):

    * ``gemm_scale``: multiplier on the GEMM/elementwise times of the fitted operator tables
      (:mod:`hicache.compute`); 1 = the tables as measured, a replay GEMM bench on the target
      GPU measures it as measured / predicted;
    * ``decode_hbm_efficiency``: fraction of nominal HBM bandwidth a decode step's KV read
      achieves (attention over the cached tokens);
    * overheads, seconds: ``prefill_forward_s`` the host time to launch an eager prefill pass
      (the GPU work overlaps it, so a pass takes at least this long), ``decode_forward_s`` per
      decode step (a CUDA-graph replay), ``request_s`` per request in a batch (scheduling,
      prefix match, input preparation), ``sampling_s`` per batch (logits to tokens, the host sync),
      ``hicache_check_s`` per HiCache completion check under tensor parallelism (a CPU
      all-reduce over the ranks; SGLang runs two per scheduler iteration, for writes and
      loads, only when ``tp > 1`` and the host tier is on).

    ``measured`` is True only for a profile fitted to measurements (replay calibration);
    ``provenance`` says where the numbers come from (``source`` at least; usually ``date`` and
    ``notes``). The dicts are not copied or frozen: treat them as read-only.
    """

    gpu: str
    link_name: str
    links: dict[str, dict[str, LinkParams]] = field(hash=False)
    gemm_scale: float = 1.0
    decode_hbm_efficiency: float
    prefill_forward_s: float
    decode_forward_s: float
    request_s: float
    sampling_s: float
    hicache_check_s: float = 0.0
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
        for name, hi in (("gemm_scale", 100.0), ("decode_hbm_efficiency", 1.0)):
            v = getattr(self, name)
            if not 0.0 < v <= hi:
                raise ValueError(f"compute.{name} must be in (0, {hi:g}], got {v}")
        for name in OVERHEAD_KEYS:
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
#: the fixed host-side costs of a forward pass, per pass, per request and per batch (seconds)
OVERHEAD_KEYS = (
    "prefill_forward_s",
    "decode_forward_s",
    "request_s",
    "sampling_s",
    "hicache_check_s",
)
#: the compute constants of a profile (a CUDA bench measures gemm_scale and
#: decode_hbm_efficiency)
COMPUTE_KEYS = ("gemm_scale", "decode_hbm_efficiency", *OVERHEAD_KEYS)
#: version 1's compute keys (a roofline at a guessed MFU), converted on read
_V1_COMPUTE_KEYS = (
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
        "compute": {k: getattr(profile, k) for k in COMPUTE_KEYS},
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
    version = top["version"]
    if version not in (1, PROFILE_VERSION) or isinstance(version, bool):
        raise ValueError(
            f"{source}: version: unsupported {version!r} (this build reads 1 and {PROFILE_VERSION})"
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
    if version == 1:
        comp = _check_keys(top["compute"], "compute", _V1_COMPUTE_KEYS, source)
        cvals = _compute_from_v1(
            {k: _number(comp[k], f"compute.{k}", source) for k in _V1_COMPUTE_KEYS},
            str(top["gpu"]),
            str(top["link"]),
        )
        prov = {**prov, "converted": V1_NOTE}
    else:
        comp = _check_keys(top["compute"], "compute", COMPUTE_KEYS, source)
        cvals = {k: _number(comp[k], f"compute.{k}", source) for k in COMPUTE_KEYS}
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


#: what a version-1 profile keeps when it is read (its provenance gains this as "converted")
V1_NOTE = (
    "read from a version-1 profile: links and decode_hbm_efficiency kept; mfu, attn_efficiency "
    "and the per-batch overheads dropped (they stood in for launch costs the operator tables "
    "now charge per op); gemm_scale 1 and the overheads of the shipped default profile for "
    "this GPU and link (zero when there is none)"
)


def _compute_from_v1(v1: Mapping[str, float], gpu: str, link: str) -> dict[str, float]:
    """Version 2's compute constants from version 1's (:data:`V1_NOTE` says how)."""
    out = {k: 0.0 for k in OVERHEAD_KEYS}
    default = default_profile_path(gpu, link)
    try:
        shipped = json.loads(default.read_text(encoding="utf-8"))
        if shipped.get("version") == PROFILE_VERSION:
            out.update({k: float(shipped["compute"][k]) for k in OVERHEAD_KEYS})
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no usable default for this GPU and link: the overheads stay 0, as the note says
    return {"gemm_scale": 1.0, "decode_hbm_efficiency": v1["decode_hbm_efficiency"], **out}


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
    except UnicodeDecodeError:
        raise ValueError(f"{p}: cannot read profile: not a UTF-8 text (JSON) file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}:{e.lineno}: invalid JSON: {json_error_text(e)}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level: expected an object")
    prof = profile_from_dict(data, source=str(p))
    if prof.gpu != gpu:
        raise ValueError(f"{p}: gpu: profile is for {prof.gpu!r}, the run uses {gpu!r}")
    if prof.link_name != link:
        raise ValueError(f"{p}: link: profile is for {prof.link_name!r}, the run uses {link!r}")
    return prof


def json_error_text(e: json.JSONDecodeError) -> str:
    """``e``'s message with its column: ``Unterminated string starting at column 5`` (the
    message of some errors already ends in "at")."""
    return f"{e.msg.removesuffix(' at')} at column {e.colno}"


# --- where a profile was measured ------------------------------------------------------------

#: Provenance key naming the machine a profile was measured on: ``"cpu"`` (CPU tensors), a
#: ``hicache.hardware`` GPU preset, or ``"cuda:<device name>"`` for a GPU without a preset.
#: Written by ``replay.calibrate``; absent from the shipped estimates (nothing was measured).
MEASURED_ON = "measured_on"


def measured_on(provenance: Mapping[str, Any]) -> str | None:
    """The machine a profile was measured on (see :data:`MEASURED_ON`), or None for an
    estimate or a profile that does not say. Profiles written before the key existed are
    recognised by the calibration's ``machine_device`` = ``cpu``."""
    value = provenance.get(MEASURED_ON)
    if isinstance(value, str) and value:
        return value
    if provenance.get("machine_device") == "cpu":
        return "cpu"
    return None


def machine_mismatch(provenance: Mapping[str, Any], gpu: str) -> str | None:
    """Why a profile with this provenance does not describe ``gpu`` (a GPU preset), or None
    when it does or was not measured at all (the shipped estimates are per GPU already)."""
    where = measured_on(provenance)
    if where is None or where == gpu:
        return None
    if where == "cpu":
        return f"it was measured on CPU tensors, not on a GPU: its numbers are not {gpu}'s"
    return f"it was measured on {where}, not on {gpu}"


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write ``profile_to_json(profile)`` to ``path`` with the one atomic writer, so a reader
    never sees half a profile."""
    from traces.fsutil import write_text_atomic  # lazily: reading a config stays stdlib-only

    write_text_atomic(profile_to_json(profile), path)
