"""The search for the smallest instance count that meets the targets, one configuration at a
time (:class:`Search`), and in waves over many configurations (:func:`run_searches`).

Assumption: a run's latencies do not grow as instances are added (more instances, less load on
each). Then "meets every target and is not overloaded" flips from false to true once, and the
smallest passing N is found by doubling (1, 2, 4, ... capped at the maximum) until a run passes,
then bisecting between the last failing and the first passing N: about ``2 log2 N``
evaluations, none repeated. Where the assumption fails (a router that piles cache hits onto
one instance, say), the answer still passes, but a smaller N might pass too; :attr:`Search.
monotone` tells whether the evaluated points contradict the assumption.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from studies.errors import StudyError
from studies.plan.targets import Target

Summary = Mapping[str, Any]


class Verdict(NamedTuple):
    """Whether one run meets the targets, and if not, why (the first reason found)."""

    passed: bool
    reason: str


def judge(summary: Summary, targets: Sequence[Target]) -> Verdict:
    """A run passes when it is not ``overloaded`` and every target's key is within its bound
    (a NaN, e.g. no request finished, fails). Raises ``StudyError`` naming the summary's
    numeric keys when a target's key is missing."""
    if summary.get("overloaded"):
        return Verdict(False, "overloaded")
    for t in targets:
        if t.key not in summary:
            raise StudyError(
                f"the run's summary has no {t.key!r}; numeric keys: "
                f"{', '.join(numeric_keys(summary))}"
            )
        value = float(summary[t.key])
        if not t.meets(value):  # NaN fails too
            miss = ">" if t.op == "<=" else "<"
            return Verdict(False, f"{t.key} {value:.4g} {miss} {t.limit:.4g}")
    return Verdict(True, "")


#: A target's value counts as worse at a larger N when it is worse by more than this share
#: (the simulator is deterministic; routing alone moves p90s by a few tenths of a percent).
TREND_TOLERANCE = 0.02


def trend_notes(evaluations: Mapping[int, Evaluation], targets: Sequence[Target]) -> list[str]:
    """Where a target's value gets worse as N grows (latency rising with instances, goodput
    falling): the search's assumption fails there, so a smaller passing N may have been
    skipped. One note per target: its worst step between evaluated N."""
    ns = sorted(evaluations)
    notes = []
    for t in targets:
        values = [(n, float(evaluations[n].summary.get(t.key, math.nan))) for n in ns]
        values = [(n, v) for n, v in values if v == v]
        worst: tuple[float, int, float, int, float] | None = None
        for (n0, v0), (n1, v1) in itertools.pairwise(values):
            scale = max(abs(v0), abs(v1), 1e-12)
            worse = (v1 - v0) / scale if t.op == "<=" else (v0 - v1) / scale
            if worse > TREND_TOLERANCE and (worst is None or worse > worst[0]):
                worst = (worse, n0, v0, n1, v1)
        if worst is not None:
            _, n0, v0, n1, v1 = worst
            verb = "rises" if t.op == "<=" else "falls"
            notes.append(
                f"{t.key} {verb} with more instances: {_value(t.key, v0)} at N = {n0}, "
                f"{_value(t.key, v1)} at N = {n1}"
            )
    return notes


def _value(key: str, v: float) -> str:
    from studies.plan.targets import format_seconds

    return format_seconds(v) if key.endswith("_s") else f"{v:.4g}"


def numeric_keys(summary: Summary) -> list[str]:
    """The keys of ``summary`` a target may name: numbers, not flags."""
    return [k for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)]


class Evaluation(NamedTuple):
    """One evaluated instance count: its verdict and the run's summary."""

    instances: int
    passed: bool
    reason: str
    summary: dict[str, Any]


class Search:
    """The smallest N in ``[1, max_instances]`` that passes, one evaluation at a time: ask
    :meth:`next` for the N to evaluate (None: done), then :meth:`record` its verdict."""

    def __init__(self, max_instances: int) -> None:
        if max_instances < 1:
            raise StudyError(f"max_instances must be >= 1, got {max_instances}")
        self.max_instances = max_instances
        self.evaluations: dict[int, Evaluation] = {}
        self._fail = 0  # the largest failing N so far (0: none)
        self._pass: int | None = None  # the smallest passing N so far

    def next(self) -> int | None:
        """The next N to evaluate, or None when the search is over (never an N evaluated)."""
        if self._pass is None:  # doubling
            if self._fail >= self.max_instances:
                return None
            return 1 if self._fail == 0 else min(2 * self._fail, self.max_instances)
        if self._pass - self._fail <= 1:
            return None
        return (self._fail + self._pass) // 2  # bisection

    def record(self, evaluation: Evaluation) -> None:
        """The verdict on ``evaluation.instances`` (which :meth:`next` asked for)."""
        n = evaluation.instances
        if n in self.evaluations:
            raise ValueError(f"N = {n} was evaluated already")
        self.evaluations[n] = evaluation
        if evaluation.passed:
            self._pass = n if self._pass is None else min(self._pass, n)
        else:
            self._fail = max(self._fail, n)

    @property
    def done(self) -> bool:
        return self.next() is None

    @property
    def answer(self) -> int | None:
        """The smallest passing N once :attr:`done` (None: even ``max_instances`` fails)."""
        return self._pass

    @property
    def monotone(self) -> bool:
        """False when some evaluated N passed while a larger one failed."""
        passed = [n for n, e in self.evaluations.items() if e.passed]
        return not passed or all(e.passed for n, e in self.evaluations.items() if n > min(passed))

    def remaining_bound(self) -> int:
        """At most this many evaluations are left (for a progress bar's total)."""
        if self.done:
            return 0
        if self._pass is not None:
            return math.ceil(math.log2(self._pass - self._fail))
        steps, n = 0, self._fail
        while n < self.max_instances:
            n = 1 if n == 0 else min(2 * n, self.max_instances)
            steps += 1
        gap = max(1, self.max_instances - max(1, self._fail))
        return steps + math.ceil(math.log2(gap)) if gap > 1 else steps


def evaluation(n: int, summary: Summary, targets: Sequence[Target]) -> Evaluation:
    """The :class:`Evaluation` of a run with ``n`` instances."""
    verdict = judge(summary, targets)
    return Evaluation(n, verdict.passed, verdict.reason, dict(summary))


#: Runs one wave: ``(configuration index, N)`` pairs -> their summaries, in order.
WaveRunner = Callable[[Sequence[tuple[int, int]]], Sequence[Summary]]


def run_searches(
    count: int,
    targets: Sequence[Target],
    max_instances: int,
    run_wave: WaveRunner,
    on_wave: Callable[[Sequence[Search]], None] | None = None,
) -> list[Search]:
    """Search ``count`` configurations together: each wave evaluates the next N of every
    configuration not yet done (at most one job per configuration) with ``run_wave``;
    ``on_wave(searches)`` after each wave (a progress bar). The searches, done."""
    searches = [Search(max_instances) for _ in range(count)]
    while True:
        wave = [(i, n) for i, s in enumerate(searches) if (n := s.next()) is not None]
        if not wave:
            return searches
        for (i, n), summary in zip(wave, run_wave(wave), strict=True):
            searches[i].record(evaluation(n, summary, targets))
        if on_wave is not None:
            on_wave(searches)


def find_min_instances(
    evaluate: Callable[[int], Summary], targets: Sequence[Target], max_instances: int
) -> Search:
    """One configuration's search, evaluating N with ``evaluate(N)`` in this process."""
    return run_searches(1, targets, max_instances, lambda wave: [evaluate(n) for _, n in wave])[0]


__all__ = [
    "Evaluation",
    "Search",
    "Summary",
    "Verdict",
    "WaveRunner",
    "evaluation",
    "find_min_instances",
    "judge",
    "numeric_keys",
    "run_searches",
    "trend_notes",
]
