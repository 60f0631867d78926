"""Number formatting shared by the report's figures and tables (no heavy imports)."""

from __future__ import annotations

import math
from typing import Any


def tokens(n: float) -> str:
    """16384 -> '16.4K', 2_000_000 -> '2M' (for ticks and titles)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"


def capacity_text(cap: tuple[int, int]) -> str:
    """``(device, host)`` tokens as ``"16.4K HBM + 32.8K host"`` (``"16.4K HBM"`` without a
    host pool)."""
    device, host = cap
    return f"{tokens(device)} HBM + {tokens(host)} host" if host else f"{tokens(device)} HBM"


def sig(x: float, digits: int = 6) -> float | None:
    """``digits`` significant digits (compact JSON); None for NaN/inf (valid JSON)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def pct(x: Any) -> str:
    return "–" if missing(x) else f"{100 * float(x):.2f} %"


def ms(x: Any) -> str:
    return "–" if missing(x) else f"{1e3 * float(x):,.1f}"


def num(x: Any, digits: int = 2) -> str:
    return "–" if missing(x) else f"{float(x):,.{digits}f}"


def integer(x: Any) -> str:
    return "–" if missing(x) else f"{int(x):,}"


def missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))
