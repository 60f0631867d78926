"""Building blocks of the synthetic generators in `traces.generate` (not a public API).

Fresh hash ids, random lengths and arrival gaps, argument checks, prompts that grow turn by
turn, the bench_multiturn send schedule, requests behind a shared prefix, and the final
`Trace`. Every random draw goes through the `random.Random` the generator passes in, in a
documented order, so that a seed gives the same trace byte for byte.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from traces.schema import Request, Trace, TraceHeader, TraceParamError

DISTRIBUTIONS: tuple[str, ...] = ("poisson", "uniform")


# -- argument checks (ValueError naming the argument) ------------------------------------


def check_positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise TraceParamError(f"{name} must be > 0, got {value}")


def check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise TraceParamError(f"{name} must be >= 0, got {value}")


def check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise TraceParamError(
            f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}"
        )


def recorded_params(args: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parameters a generator records in its header: its arguments in signature order
    (pass ``locals()`` as the generator's first statement), less block_size, which the
    header holds on its own, and less each `optional` parameter (name -> default) that is at
    its default: those were added after traces had been made, which keep their bytes."""
    optional = optional or {}
    return {
        name: value
        for name, value in args.items()
        if name != "block_size" and not (name in optional and value == optional[name])
    }


# -- hash ids and random draws -------------------------------------------------------------


class IdAllocator:
    """Allocator of fresh hash ids (0, 1, 2, ...)."""

    def __init__(self) -> None:
        self.next = 0

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def for_length(self, prefix: list[int], length: int, block_size: int) -> list[int]:
        """`prefix` followed by fresh ids up to ceil(length / block_size) blocks."""
        return prefix + self.fresh(-(-length // block_size) - len(prefix))


def gap_ms(rng: random.Random, rate: float, distribution: str) -> float:
    """Time to the next arrival of a process with `rate` per second (bench_multiturn's
    choices: exponential gaps, or uniform on [0, 2 / rate])."""
    if distribution == "poisson":
        return rng.expovariate(rate) * 1000.0
    return rng.uniform(0.0, 2.0 / rate) * 1000.0


def jittered_length(rng: random.Random, mean: int, jitter: float, minimum: int = 1) -> int:
    """`mean`, or uniform on [mean (1 - jitter), mean (1 + jitter)] when jitter > 0."""
    if jitter <= 0 or mean == 0:
        return mean
    lo = max(minimum, round(mean * (1 - jitter)))
    hi = max(lo, round(mean * (1 + jitter)))
    return rng.randint(lo, hi)


def jittered_ms(rng: random.Random, mean_ms: float, jitter: float) -> float:
    """`mean_ms` times a factor uniform on [1 - jitter, 1 + jitter] (exactly `mean_ms` when
    jitter is 0), rounded to µs and at least 0."""
    return max(
        0.0, round(mean_ms * (1 + rng.uniform(-jitter, jitter)) if jitter > 0 else mean_ms, 3)
    )


# -- length and time distributions (``--request-length-dist`` and the like) ----------------

DIST_KINDS: tuple[str, ...] = ("fixed", "lognormal", "uniform")


@dataclass(frozen=True)
class Dist:
    """A distribution of lengths or times, parsed from ``fixed``, ``lognormal:MEAN,SIGMA``
    or ``uniform:LO,HI``.

    lognormal: MEAN is the arithmetic mean of the values (not of their logs) and SIGMA the
    standard deviation of their natural logs, so log(x) ~ N(mu, SIGMA) with
    mu = ln(MEAN) - SIGMA**2 / 2. uniform: on [LO, HI]. fixed: the generator's own value.
    """

    kind: str
    a: float = 0.0
    b: float = 0.0

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed"

    @property
    def mu(self) -> float:
        """The mean of log(x) of a lognormal."""
        return math.log(self.a) - self.b * self.b / 2

    def draw(self, rng: random.Random, value: float) -> float:
        """One draw (exactly `value` for fixed, without touching `rng`)."""
        if self.kind == "fixed":
            return value
        if self.kind == "lognormal":
            return rng.lognormvariate(self.mu, self.b)
        return rng.uniform(self.a, self.b)

    def length(self, rng: random.Random, value: int, minimum: int) -> int:
        """A draw rounded to an integer length of at least `minimum`."""
        return value if self.fixed else max(minimum, round(self.draw(rng, value)))

    def ms(self, rng: random.Random, value: float) -> float:
        """A draw as a time in ms, rounded to µs and at least 0."""
        return value if self.fixed else max(0.0, round(self.draw(rng, value), 3))


def parse_dist(name: str, text: str) -> Dist:
    """The `Dist` of a ``--*-dist`` value; a `TraceParamError` naming `name` otherwise."""
    kind, _, rest = text.strip().partition(":")
    problem = f"{name} must be fixed, lognormal:MEAN,SIGMA or uniform:LO,HI, got {text!r}"
    if kind == "fixed" and not rest:
        return Dist("fixed")
    if kind not in ("lognormal", "uniform"):
        raise TraceParamError(problem)
    try:
        a, b = (float(x) for x in rest.split(","))
    except ValueError:
        raise TraceParamError(problem) from None
    if not (math.isfinite(a) and math.isfinite(b)):
        raise TraceParamError(problem)
    if kind == "lognormal" and (a <= 0 or b < 0):
        raise TraceParamError(f"{name}: lognormal needs MEAN > 0 and SIGMA >= 0, got {text!r}")
    if kind == "uniform" and not 0 <= a <= b:
        raise TraceParamError(f"{name}: uniform needs 0 <= LO <= HI, got {text!r}")
    return Dist(kind, a, b)


def lognormal_fit(values: Sequence[float]) -> tuple[float, float]:
    """Maximum-likelihood lognormal of positive `values`: (MEAN, SIGMA) as `Dist` takes
    them (SIGMA = population standard deviation of the logs, MEAN = exp(mu + SIGMA**2 / 2))."""
    logs = [math.log(v) for v in values]
    mu = math.fsum(logs) / len(logs)
    sigma = math.sqrt(math.fsum((x - mu) ** 2 for x in logs) / len(logs))
    return math.exp(mu + sigma * sigma / 2), sigma


# -- requests ------------------------------------------------------------------------------


class GrowingPrompt:
    """The prompt of a conversation or agent session, which grows from turn to turn.

    It starts as `prefix` (shared full blocks) followed by fresh ids up to `length` tokens;
    each growth keeps every id, including the partial last block, and continues with fresh
    ids (see `traces.generate`).
    """

    __slots__ = ("blocks", "length")

    def __init__(self, ids: IdAllocator, prefix: list[int], length: int, block_size: int) -> None:
        self.length = length
        self.blocks = ids.for_length(prefix, length, block_size)

    def request(
        self, now: float, output_length: int, session_id: str, turn: int, think: float | None
    ) -> Request:
        """This turn's request (it shares the current id list, which growing replaces)."""
        return Request(
            timestamp=now,
            input_length=self.length,
            output_length=output_length,
            hash_ids=self.blocks,
            session_id=session_id,
            turn=turn,
            think_time_ms=think,
        )

    def grow(self, ids: IdAllocator, added: int, block_size: int) -> None:
        """The next turn's prompt: this one plus `added` tokens (output, new question)."""
        self.length += added
        self.blocks = ids.for_length(self.blocks, self.length, block_size)


def multiturn_schedule(
    rng: random.Random,
    clients: int,
    rounds: int,
    think_time_ms: float | Callable[[int, int], float],
    request_rate: float,
    distribution: str,
) -> Iterator[tuple[float, int, int]]:
    """(send time, client, turn) of every request of `multiturn`, in send order.

    Requests are sent at `request_rate` per second, each to a random client whose next turn
    is ready; a turn is ready `think_time_ms` after the previous turn of its client was sent
    (a number, or ``think(client, turn)`` for turn `turn` of `client`). Draws from `rng` in
    a fixed order (client, then gap), so the caller must not draw between two items.
    """
    think = think_time_ms if callable(think_time_ms) else (lambda c, k: think_time_ms)
    turn = [0] * clients
    ready = list(range(clients))
    waiting: list[tuple[float, int, int]] = []  # (ready time, tie-break, client)
    order = itertools.count()
    now = 0.0
    sent = 0
    while sent < clients * rounds:
        while waiting and waiting[0][0] <= now:
            ready.append(heapq.heappop(waiting)[2])
        if not ready:
            now = waiting[0][0]
            continue
        c = ready.pop(rng.randrange(len(ready)))
        k = turn[c]
        yield now, c, k
        sent += 1
        turn[c] = k + 1
        if k + 1 < rounds:
            heapq.heappush(waiting, (now + think(c, k + 1), next(order), c))
        now += gap_ms(rng, request_rate, distribution)


def prefixed_requests(
    rng: random.Random,
    ids: IdAllocator,
    pick: Callable[[], tuple[list[int], int]],
    count: int,
    suffix_length: int,
    output_length: int,
    jitter: float,
    request_rate: float,
    distribution: str,
    block_size: int,
) -> list[Request]:
    """Open-loop requests whose prompt is a shared prefix (``pick()`` -> its blocks and length)
    followed by a unique suffix; arrivals at ``request_rate``. The RNG is drawn in a fixed
    order per request (pick, suffix, output, gap), so traces are deterministic for a seed."""
    out: list[Request] = []
    now = 0.0
    for _ in range(count):
        blocks, base = pick()
        length = base + jittered_length(rng, suffix_length, jitter, minimum=1)
        out.append(
            Request(
                timestamp=now,
                input_length=length,
                output_length=jittered_length(rng, output_length, jitter),
                hash_ids=ids.for_length(blocks, length, block_size),
            )
        )
        now += gap_ms(rng, request_rate, distribution)
    return out


def finish_trace(
    kind: str, requests: list[Request], block_size: int, params: dict[str, Any], note: str
) -> Trace:
    """The generated trace: timestamps rounded to µs, requests sorted by time, and a header
    recording the generator, its parameters and `note` (if any)."""
    for r in requests:
        # µs resolution keeps the files short; rounding is monotone, so order is preserved.
        r.timestamp = round(r.timestamp, 3)
    requests.sort(key=lambda r: r.timestamp)  # stable: ties keep generation order
    extra: dict[str, Any] = {"generator": kind, "params": params}
    if note:
        extra["note"] = note
    return Trace(requests=requests, header=TraceHeader(block_size=block_size, extra=extra))
