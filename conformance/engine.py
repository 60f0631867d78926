"""Run one sequence on two sides in lock step, stop at the first mismatch, minimise it.

Standard library only (plus whatever the sides import), so the harness test runs it with our
core on both sides.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.compare import compare_results, compare_states
from conformance.driver import Driver, Side, snapshot
from conformance.known_differences import explain
from conformance.ops import Config, Op

SideFactory = Callable[[Config], Side]
#: called after each step with (step index, side B): lets tests tamper with one side
Tamper = Callable[[int, Side], None]


@dataclass
class Mismatch:
    step: int
    op: Op
    diffs: list[str]
    flags: list[tuple[int, str]]
    """(step, flag) raised on side A (the reference) up to and including this step."""
    explained_by: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "op": self.op.describe(),
            "diffs": self.diffs,
            "flags": [list(f) for f in self.flags],
            "explained_by": self.explained_by,
        }


@dataclass
class Outcome:
    steps: int = 0
    mismatch: Mismatch | None = None
    agreed_errors: list[str] = field(default_factory=list)
    b_flags: list[tuple[int, str]] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)
    """Side B's counters at the end (see ``Side.coverage``)."""


def _step(driver: Driver, op: Op) -> tuple[dict[str, Any], str | None]:
    """The op's result, or an ``error`` result naming the exception (the side is then in an
    unknown state, so the sequence ends there)."""
    try:
        return driver.step(op), None
    except Exception as e:  # the cache under test may raise anything
        where = traceback.extract_tb(e.__traceback__)[-1]
        err = f"{type(e).__name__}: {e} ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
        return {"error": type(e).__name__}, err


def _snap(side: Side) -> tuple[dict[str, Any], str | None]:
    try:
        return snapshot(side), None
    except Exception as e:
        return {}, f"snapshot: {type(e).__name__}: {e}"


def run_sequence(
    cfg: Config,
    ops: Sequence[Op],
    make_a: SideFactory,
    make_b: SideFactory,
    names: tuple[str, str] = ("sglang", "ours"),
    tamper: Tamper | None = None,
) -> Outcome:
    """Play ``ops`` on fresh sides A (reference) and B; compare after every step."""
    a, b = make_a(cfg), make_b(cfg)
    try:
        out = _run(cfg, ops, a, b, names, tamper)
        out.coverage = b.coverage()
        return out
    finally:
        a.close()
        b.close()


def _run(
    cfg: Config,
    ops: Sequence[Op],
    a: Side,
    b: Side,
    names: tuple[str, str],
    tamper: Tamper | None,
) -> Outcome:
    da, db = Driver(a), Driver(b)
    out = Outcome()
    flags: list[tuple[int, str]] = []
    for i, op in enumerate(ops):
        ra, err_a = _step(da, op)
        rb, err_b = _step(db, op)
        if tamper is not None:
            tamper(i, b)
        flags += [(i, f) for f in a.take_flags()]
        out.b_flags += [(i, f) for f in b.take_flags()]
        out.steps = i + 1
        diffs = compare_results(ra, rb, names)
        if err_a or err_b:
            if not diffs and err_a and err_b:
                out.agreed_errors.append(f"step {i}: {err_a}")
                return out
            diffs += [f"error.{n}: {e}" for n, e in zip(names, (err_a, err_b), strict=True) if e]
        else:
            sa, snap_err_a = _snap(a)
            sb, snap_err_b = _snap(b)
            diffs += [
                f"error.{n}: {e}" for n, e in zip(names, (snap_err_a, snap_err_b), strict=True) if e
            ]
            if not (snap_err_a or snap_err_b):
                diffs += compare_states(sa, sb, names)
                # stale records are SGLang's (KD-RESET-STALE); side B having any is a bug
                if any(sb["stale"].values()) and not any(sa["stale"].values()):
                    diffs.append(f"state.stale: {names[1]} only: {sb['stale']}")
        if diffs:
            kd = explain(f for _, f in flags)
            out.mismatch = Mismatch(i, op, diffs, flags, kd.id if kd else None)
            return out
    return out


def _signature(outcome: Outcome) -> tuple[bool, str | None] | None:
    m = outcome.mismatch
    return None if m is None else (True, m.explained_by)


def minimise(
    cfg: Config,
    ops: Sequence[Op],
    make_a: SideFactory,
    make_b: SideFactory,
    names: tuple[str, str] = ("sglang", "ours"),
    budget_s: float = 60.0,
) -> list[Op]:
    """A shorter sequence with a mismatch of the same kind (explained by the same entry, or
    unexplained): greedy chunk removal, halving the chunk size (ddmin-like), within a time
    budget. The ops stay valid when others are removed (see :mod:`conformance.ops`)."""
    target = _signature(run_sequence(cfg, ops, make_a, make_b, names))
    if target is None:
        return list(ops)
    best = list(ops)
    deadline = time.monotonic() + budget_s
    chunk = max(1, len(best) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        i, removed = 0, False
        while i < len(best) and time.monotonic() < deadline:
            cand = best[:i] + best[i + chunk :]
            outcome = run_sequence(cfg, cand, make_a, make_b, names)
            if cand and _signature(outcome) == target:
                assert outcome.mismatch is not None
                best, removed = cand[: outcome.mismatch.step + 1], True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return best


def sequence_rng(seed: int, combo: str, index: int) -> random.Random:
    """The generator of sequence ``index`` of ``combo``: independent of run order and jobs."""
    return random.Random(f"{seed}/{combo}/{index}")
