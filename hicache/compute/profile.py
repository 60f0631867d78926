"""Compute profiles: the fitted GEMM, attention and all-reduce models of one GPU, as JSON.

Shipped files live in ``hicache/profiles/compute/<gpu>.json``. ``bench/fit_compute.py`` writes
them from the measured tables (:mod:`hicache.compute.fit`), and a test checks that the file on
disk equals a fresh fit, so nobody edits a coefficient by hand. Format::

    {"version": 1, "gpu": "h100-sxm", "provenance": {...},
     "gemm": {GemmModel fields}, "attention": {AttentionModel fields},
     "all_reduce": {"<workers>": {AllReduceFit fields}, ...}}

Numbers are SI (seconds, bytes/s, FLOP/s). Standard library only.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hicache.compute.allreduce import AllReduceFit, AllReduceModel
from hicache.compute.attention import AttentionModel
from hicache.compute.gemm import GemmModel

#: Where shipped compute profiles live: ``<gpu>.json``.
COMPUTE_PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "compute"
#: Version of the compute profile format this module reads and writes.
COMPUTE_PROFILE_VERSION = 1
_TOP_KEYS = ("version", "gpu", "provenance", "gemm", "attention", "all_reduce")


@dataclass(frozen=True)
class ComputeProfile:
    """The compute models of one GPU, with where their numbers come from."""

    gpu: str
    gemm: GemmModel
    attention: AttentionModel
    all_reduce: AllReduceModel
    provenance: dict[str, Any]


def _exact(d: dict[str, Any], names: tuple[str, ...], where: str) -> None:
    """A ``ValueError`` naming the keys of ``d`` that are not exactly ``names``."""
    unknown = sorted(set(d) - set(names))
    missing = [n for n in names if n not in d]
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {unknown}, missing keys {missing}")


def _floats(d: Any, cls: type[Any], where: str) -> dict[str, float]:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
    names = tuple(f.name for f in fields(cls))
    _exact(d, names, where)
    return {n: float(d[n]) for n in names}


def compute_from_dict(d: dict[str, Any]) -> ComputeProfile:
    """A profile from its JSON object; wrong keys or version are a ``ValueError`` naming them."""
    _exact(d, _TOP_KEYS, "compute profile")
    if d["version"] != COMPUTE_PROFILE_VERSION:
        raise ValueError(f"compute profile: version {d['version']!r}, this build reads 1")
    att: dict[str, Any] = _floats(d["attention"], AttentionModel, "attention")
    fits = {
        int(w): AllReduceFit(**_floats(v, AllReduceFit, f"all_reduce.{w}"))
        for w, v in d["all_reduce"].items()
    }
    return ComputeProfile(
        gpu=str(d["gpu"]),
        gemm=GemmModel(**_floats(d["gemm"], GemmModel, "gemm")),
        attention=AttentionModel(**(att | {"causal_tile": int(att["causal_tile"])})),
        all_reduce=AllReduceModel(fits),
        provenance=dict(d["provenance"]),
    )


def compute_to_dict(p: ComputeProfile) -> dict[str, Any]:
    """The JSON object of ``p`` (all-reduce keyed by worker count as a string)."""
    return {
        "version": COMPUTE_PROFILE_VERSION,
        "gpu": p.gpu,
        "provenance": p.provenance,
        "gemm": asdict(p.gemm),
        "attention": asdict(p.attention),
        "all_reduce": {str(w): asdict(f) for w, f in sorted(p.all_reduce.fits.items())},
    }


def profile_differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two profile JSON objects differ, ignoring ``provenance.date``: coefficients to a
    relative 1e-6 (a refit on another machine's BLAS moves the last digits), provenance
    percentages to 0.01 (they are rounded to 0.001)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - ({"date"} if where == "provenance" else set())
        return [
            diff
            for k in sorted(keys)
            for diff in (
                profile_differences(a[k], b[k], f"{where}.{k}" if where else k)
                if k in a and k in b
                else [f"{where}.{k}: only in one"]
            )
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in profile_differences(x, y, f"{where}[{i}]")
        ]
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        tol = 1e-2 if where.startswith("provenance") else 0.0
        if math.isclose(a, b, rel_tol=1e-6, abs_tol=tol):
            return []
    elif a == b:
        return []
    return [f"{where}: {a!r} != {b!r}"]


def compute_profile_path(gpu: str) -> Path:
    return COMPUTE_PROFILE_DIR / f"{gpu}.json"


def shipped_compute_profiles() -> list[str]:
    """GPU names with a shipped compute profile."""
    return sorted(p.stem for p in COMPUTE_PROFILE_DIR.glob("*.json"))


def load_compute(gpu: str = "h100-sxm") -> ComputeProfile:
    """The shipped compute profile of ``gpu``; an unknown GPU is a ``ValueError`` listing the
    GPUs that have one."""
    path = compute_profile_path(gpu)
    if not path.is_file():
        have = ", ".join(shipped_compute_profiles()) or "none"
        raise ValueError(f"no compute profile for GPU {gpu!r} (have: {have})")
    with open(path, encoding="utf-8") as f:
        return compute_from_dict(json.load(f))


__all__ = [
    "COMPUTE_PROFILE_DIR",
    "COMPUTE_PROFILE_VERSION",
    "ComputeProfile",
    "compute_from_dict",
    "compute_profile_path",
    "compute_to_dict",
    "load_compute",
    "profile_differences",
    "shipped_compute_profiles",
]
