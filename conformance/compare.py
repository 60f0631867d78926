"""Structural comparison of two sides' step results and states.

States and results are plain data (dicts, lists, ints, strings, None; see
:func:`conformance.driver.snapshot`), so one recursive diff covers every section. The only
section never compared is ``stale`` (see KD-RESET-STALE in :mod:`conformance.known_differences`).
"""

from __future__ import annotations

from typing import Any

#: state sections not compared (each one is justified by an entry in known_differences)
NOT_COMPARED = ("stale",)
#: at most this many difference lines per step are kept
MAX_LINES = 40


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 300 else text[:297] + "..."


def diff(
    a: Any, b: Any, names: tuple[str, str], path: str = "", out: list[str] | None = None
) -> list[str]:
    """Lines ``path: <name_a>=... <name_b>=...`` for every leaf where ``a`` and ``b`` differ.

    Dicts are compared key by key (a key on one side only is reported as ``<absent>``); lists
    of different length, or of scalars, are reported whole (free lists, eviction orders read
    better that way); other lists element by element.
    """
    if out is None:
        out = []
    if len(out) >= MAX_LINES:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                va = a.get(k, "<absent>")
                vb = b.get(k, "<absent>")
                out.append(f"{sub}: {names[0]}={_short(va)} {names[1]}={_short(vb)}")
            else:
                diff(a[k], b[k], names, sub, out)
        return out
    nested = isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
    if nested and all(isinstance(x, dict | list) for x in a + b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diff(x, y, names, f"{path}[{i}]", out)
        return out
    if a != b or (type(a) is not type(b) and not _same_number(a, b)):
        out.append(f"{path}: {names[0]}={_short(a)} {names[1]}={_short(b)}")
    return out


def _same_number(a: Any, b: Any) -> bool:
    """1 and 1.0 are the same tick (SGLang's clock values pass through float-typed code)."""
    numbers = (int, float)
    return isinstance(a, numbers) and isinstance(b, numbers) and a == b


def compare_states(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> list[str]:
    """Differences between two snapshots, without the sections in :data:`NOT_COMPARED`."""
    keep_a = {k: v for k, v in a.items() if k not in NOT_COMPARED}
    keep_b = {k: v for k, v in b.items() if k not in NOT_COMPARED}
    return diff(keep_a, keep_b, names, "state")


def compare_results(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> list[str]:
    return diff(a, b, names, "result")
