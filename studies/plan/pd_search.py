"""The search for the cheapest prefill:decode split that meets the targets, one configuration
at a time (:class:`PdSearch`), and in waves over many configurations
(:func:`run_pd_searches`).

Assumption (as :mod:`~studies.plan.search` makes in one dimension): a run's verdict is monotone
in each role's count. Adding a prefill server never turns a passing run into a failing one
(TTFT falls: less prefill queueing), and neither does adding a decode server (TPOT falls: a
smaller running batch; TTFT falls too: pre-allocation waits less for decode memory). So the
passing points of the box ``[1, max_prefill] x [1, max_decode]`` form an up-set whose lower
edge is a staircase ``D*(P)`` (the fewest decode servers that pass with ``P`` prefill
servers), non-increasing in ``P``.

The search, for GPUs = ``P x prefill TP + D x decode TP``:

1. Bounds, side by side. ``P_lo``: the fewest prefill servers that pass with ``max_decode``
   decode servers; ``D_lo``: the fewest decode servers that pass with ``max_prefill``
   prefill servers (each by doubling, then bisection, :class:`~studies.plan.search.Search`).
   Under the assumption every passing point has ``P >= P_lo`` and ``D >= D_lo``; when either
   is missing, no point of the box passes.
2. The staircase, from ``P = P_lo`` upward: first the corner ``(P_lo, D_lo)`` (when it
   passes it is the cheapest point of the box), then ``D*(P)`` by bisection between
   ``D_lo - 1`` (fails: it fails even at ``max_prefill``) and ``D*(P - 1)`` (passes, or
   ``max_decode`` at ``P_lo``). The walk stops once ``D*(P) = D_lo`` (more prefill servers
   cannot lower it) or ``(P + 1) x prefill TP + D_lo x decode TP`` is no cheaper than the
   best point found.

The answer is the cheapest evaluated passing split (ties: fewer prefill servers); under the
assumption every split it is compared against was evaluated or is implied.
Where the evaluated points contradict it (a point fails although a point with no more servers
of either role passed), :attr:`PdSearch.monotone` is false and the answer, which passed, may
not be the cheapest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, NamedTuple

from studies.errors import StudyError
from studies.plan.search import TREND_TOLERANCE, Evaluation, Search, Summary, judge
from studies.plan.targets import Target, format_seconds

#: A prefill:decode split: (prefill servers, decode servers).
Point = tuple[int, int]


class PdEvaluation(NamedTuple):
    """One evaluated split: its verdict and the run's summary."""

    prefill: int
    decode: int
    passed: bool
    reason: str
    summary: dict[str, Any]

    @property
    def point(self) -> Point:
        return (self.prefill, self.decode)


def pd_evaluation(point: Point, summary: Summary, targets: Sequence[Target]) -> PdEvaluation:
    """The :class:`PdEvaluation` of a run at ``point``."""
    verdict = judge(summary, targets)
    return PdEvaluation(point[0], point[1], verdict.passed, verdict.reason, dict(summary))


def split(point: Point) -> str:
    """``4:8`` (prefill:decode)."""
    return f"{point[0]}:{point[1]}"


class PdSearch:
    """The cheapest passing split of ``[1, max_prefill] x [1, max_decode]`` (module
    docstring), a few evaluations at a time: ask :meth:`next` for the splits to evaluate
    (empty: done), then :meth:`record` each one's verdict."""

    def __init__(
        self, max_prefill: int, max_decode: int, prefill_gpus: int = 1, decode_gpus: int = 1
    ) -> None:
        if max_prefill < 1 or max_decode < 1:
            raise StudyError(f"max instances per role must be >= 1, got {max_prefill}, "
                             f"{max_decode}")  # fmt: skip
        if prefill_gpus < 1 or decode_gpus < 1:
            raise StudyError("GPUs per instance must be >= 1")
        self.max_prefill, self.max_decode = max_prefill, max_decode
        self.weights = (prefill_gpus, decode_gpus)
        self.evaluations: dict[Point, PdEvaluation] = {}
        self.bounds: Point | None = None  # (P_lo, D_lo) once step 1 is done
        self.answer: Point | None = None
        self._pending: list[Point] = []
        self._along = (Search(max_prefill), Search(max_decode))
        self._steps = self._walk()
        self._advance()

    def gpus(self, point: Point) -> int:
        return point[0] * self.weights[0] + point[1] * self.weights[1]

    def next(self) -> list[Point]:
        """The splits to evaluate now (none evaluated before; empty: the search is over)."""
        return [p for p in dict.fromkeys(self._pending) if p not in self.evaluations]

    def record(self, evaluation: PdEvaluation) -> None:
        """The verdict on one of the splits :meth:`next` asked for."""
        point = evaluation.point
        if point in self.evaluations:
            raise ValueError(f"{split(point)} was evaluated already")
        self.evaluations[point] = evaluation
        if not self.next():
            self._advance()

    @property
    def done(self) -> bool:
        return not self._pending

    def _advance(self) -> None:
        """Run the walk until it asks for a split not yet evaluated (or ends)."""
        while True:
            try:
                self._pending = next(self._steps)
            except StopIteration:
                self._pending = []
                return
            if self.next():
                return

    def _passed(self, point: Point) -> bool:
        return self.evaluations[point].passed

    def _walk(self) -> Generator[list[Point], None, None]:
        """The search as a sequence of requests: each yield is a list of splits that are
        evaluated before the walk goes on."""
        mp, md = self.max_prefill, self.max_decode
        along_p, along_d = self._along  # P at D = max_decode; D at P = max_prefill
        while True:
            p, d = along_p.next(), along_d.next()
            asked = [*([(p, md)] if p is not None else []), *([(mp, d)] if d is not None else [])]
            if not asked:
                break
            yield asked
            if p is not None:
                along_p.record(_one_d(p, self.evaluations[(p, md)]))
            if d is not None:
                along_d.record(_one_d(d, self.evaluations[(mp, d)]))
        if along_p.answer is None or along_d.answer is None:
            # not even the largest split passes (or, against the assumption, one axis passed
            # somewhere while the other never did: the cheapest split seen to pass, if any)
            self.answer = self._cheapest_passed()
            return
        p_lo, d_lo = along_p.answer, along_d.answer
        self.bounds = (p_lo, d_lo)
        best: Point = (p_lo, md)
        if d_lo < md:
            yield [(p_lo, d_lo)]  # the corner: when it passes, nothing is cheaper
            if self._passed((p_lo, d_lo)):
                self.answer = self._cheapest_passed()
                return
        p, d_hi = p_lo, md
        while True:
            fail, ok = d_lo - 1, d_hi  # fail: fails at max_prefill; ok: passes (or implied)
            if p == p_lo and d_lo < md:
                fail = d_lo  # the corner failed
            while ok - fail > 1:
                mid = (fail + ok) // 2
                yield [(p, mid)]
                fail, ok = (fail, mid) if self._passed((p, mid)) else (mid, ok)
            if (p, ok) in self.evaluations and self.gpus((p, ok)) < self.gpus(best):
                best = (p, ok)
            p, d_hi = p + 1, ok
            if ok == d_lo or p > mp or self.gpus((p, d_lo)) >= self.gpus(best):
                break
        # under the assumption ``best`` is the cheapest passing split; where the data break
        # it another evaluated split may pass for fewer GPUs: the cheapest seen, ties to
        # fewer prefill servers (the walk's own order)
        self.answer = self._cheapest_passed()

    def _cheapest_passed(self) -> Point | None:
        passed = [p for p, e in self.evaluations.items() if e.passed]
        return min(passed, key=lambda p: (self.gpus(p), p), default=None)

    @property
    def monotone(self) -> bool:
        """False when an evaluated split failed although one with no more servers of either
        role passed."""
        passed = [p for p, e in self.evaluations.items() if e.passed]
        return not any(
            not e.passed and any(a[0] <= b[0] and a[1] <= b[1] for a in passed)
            for b, e in self.evaluations.items()
        )

    def remaining_bound(self) -> int:
        """About this many evaluations are left (for a progress bar's total; not a promise:
        the staircase's length is known only as it is walked)."""
        if self.done:
            return 0
        stair = 1 + math.ceil(math.log2(max(2, self.max_decode)))
        if self.bounds is None:
            return sum(s.remaining_bound() for s in self._along) + stair
        return stair


def _one_d(n: int, e: PdEvaluation) -> Evaluation:
    return Evaluation(n, e.passed, e.reason, e.summary)


#: Runs one wave: ``(configuration index, split)`` pairs -> their summaries, in order.
PdWaveRunner = Callable[[Sequence[tuple[int, Point]]], Sequence[Summary]]


def run_pd_searches(
    searches: Sequence[PdSearch],
    targets: Sequence[Target],
    run_wave: PdWaveRunner,
    on_wave: Callable[[Sequence[PdSearch]], None] | None = None,
) -> list[PdSearch]:
    """Drive ``searches`` together: each wave evaluates every split any search asks for
    now (up to two per search while the bounds are found, one on the staircase) with
    ``run_wave``; ``on_wave(searches)`` after each wave. The searches, done."""
    while True:
        wave = [(i, p) for i, s in enumerate(searches) for p in s.next()]
        if not wave:
            return list(searches)
        for (i, p), summary in zip(wave, run_wave(wave), strict=True):
            searches[i].record(pd_evaluation(p, summary, targets))
        if on_wave is not None:
            on_wave(searches)


def find_cheapest_split(
    evaluate: Callable[[Point], Summary],
    targets: Sequence[Target],
    max_prefill: int,
    max_decode: int,
    prefill_gpus: int = 1,
    decode_gpus: int = 1,
) -> PdSearch:
    """One configuration's search, evaluating a split with ``evaluate(point)`` here."""
    search = PdSearch(max_prefill, max_decode, prefill_gpus, decode_gpus)
    return run_pd_searches([search], targets, lambda wave: [evaluate(p) for _, p in wave])[0]


def pd_trend_notes(
    evaluations: Mapping[Point, PdEvaluation], targets: Sequence[Target]
) -> list[str]:
    """Where a target's value gets worse as one role's count grows and the other's stays
    (between evaluated splits next to each other on that axis, neither overloaded: an
    overloaded run fails whatever its latencies): the assumption may fail there. One note per
    target and role, its worst step."""
    live = {p: e for p, e in evaluations.items() if not e.summary.get("overloaded")}
    notes = []
    for t in targets:
        for axis, role in ((0, "prefill"), (1, "decode")):
            worst = _worst_step(live, t, axis)
            if worst is None:
                continue
            _, a, va, b, vb = worst
            verb = "rises" if t.op == "<=" else "falls"
            notes.append(
                f"{t.key} {verb} with more {role} servers: {_value(t.key, va)} at "
                f"{split(a)}, {_value(t.key, vb)} at {split(b)} (prefill:decode)"
            )
    return notes


def _worst_step(
    live: Mapping[Point, PdEvaluation], t: Target, axis: int
) -> tuple[float, Point, float, Point, float] | None:
    other = 1 - axis
    worst: tuple[float, Point, float, Point, float] | None = None
    for _, group in itertools.groupby(sorted(live, key=lambda p: (p[other], p[axis])),
                                      key=lambda p: p[other]):  # fmt: skip
        values = [(p, float(live[p].summary.get(t.key, math.nan))) for p in group]
        values = [(p, v) for p, v in values if v == v]
        for (a, va), (b, vb) in itertools.pairwise(values):
            scale = max(abs(va), abs(vb), 1e-12)
            worse = (vb - va) / scale if t.op == "<=" else (va - vb) / scale
            if worse > TREND_TOLERANCE and (worst is None or worse > worst[0]):
                worst = (worse, a, va, b, vb)
    return worst


def _value(key: str, v: float) -> str:
    return format_seconds(v) if key.endswith("_s") else f"{v:.4g}"


__all__ = [
    "PdEvaluation",
    "PdSearch",
    "PdWaveRunner",
    "Point",
    "find_cheapest_split",
    "pd_evaluation",
    "pd_trend_notes",
    "run_pd_searches",
    "split",
]
