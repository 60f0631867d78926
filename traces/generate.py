"""Seeded synthetic trace generators (hash-id traces).

Each generator is a pure function of its keyword arguments: the same arguments (seed
included) give the same `Trace`, request for request. Randomness comes from one
`random.Random(seed)` per call, never the global generator.

Block ids follow the token mapping of `traces.keys` (block h holds tokens
``h * block_size + k``), so content that is shared gets the same ids and everything else
fresh ids:

* a shared prefix (system prompt, document) shares only its *full* blocks; the block that
  holds its unaligned tail also holds per-request text, so it gets a fresh id per request
  (its first tokens are then not shared: lengths that are multiples of block_size avoid
  that loss);
* a conversation or agent session extends its previous prompt: the new prompt keeps every
  id of the previous one, including the partial last block (whose first tokens are the
  same), and continues with fresh ids.

Closed-loop generators (multiturn, agentic) set `session_id`, `turn` (0-based) and, on every
turn after the first, `think_time_ms`: the delay between the end of turn k-1 and the
arrival of turn k. Their timestamps are an *open-loop estimate* that takes service time as
zero; a closed-loop simulator recomputes them from think_time_ms and actual finish times.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import random
from collections.abc import Callable
from typing import Any, Literal

from traces.schema import DEFAULT_BLOCK_SIZE, Request, Trace, TraceHeader

Distribution = Literal["poisson", "uniform"]
DISTRIBUTIONS: tuple[str, ...] = ("poisson", "uniform")
OPEN_LOOP_NOTE = (
    "timestamps are an open-loop estimate (service time taken as zero); a closed-loop replay "
    "sends turn k think_time_ms after turn k-1 finishes"
)


class _Ids:
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


def _gap_ms(rng: random.Random, rate: float, distribution: str) -> float:
    """Time to the next arrival of a process with `rate` per second (bench_multiturn's
    choices: exponential gaps, or uniform on [0, 2 / rate])."""
    if distribution == "poisson":
        return rng.expovariate(rate) * 1000.0
    return rng.uniform(0.0, 2.0 / rate) * 1000.0


def _length(rng: random.Random, mean: int, jitter: float, minimum: int = 1) -> int:
    """`mean`, or uniform on [mean (1 - jitter), mean (1 + jitter)] when jitter > 0."""
    if jitter <= 0 or mean == 0:
        return mean
    lo = max(minimum, round(mean * (1 - jitter)))
    hi = max(lo, round(mean * (1 + jitter)))
    return rng.randint(lo, hi)


def _check(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def _check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(
            f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}"
        )


def _finish(
    kind: str, requests: list[Request], block_size: int, params: dict[str, Any], note: str
) -> Trace:
    for r in requests:
        # µs resolution keeps the files short; rounding is monotone, so order is preserved.
        r.timestamp = round(r.timestamp, 3)
    requests.sort(key=lambda r: r.timestamp)  # stable: ties keep generation order
    extra: dict[str, Any] = {"generator": kind, "params": params}
    if note:
        extra["note"] = note
    return Trace(requests=requests, header=TraceHeader(block_size=block_size, extra=extra))


def multiturn(
    *,
    clients: int = 256,
    rounds: int = 5,
    request_length: int = 512,
    sub_question_length: int = 0,
    output_length: int = 64,
    request_rate: float = 1.0,
    distribution: str = "poisson",
    closed_loop: bool = True,
    think_time_ms: float = 0.0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """SGLang ``benchmark/hicache/bench_multiturn.py`` workload.

    `clients` conversations of `rounds` turns each. Turn 0 is a unique prompt of
    `request_length` tokens; turn k's prompt is turn k-1's prompt plus its output
    (`output_length` tokens) plus a new sub-question (`sub_question_length`, 0 = same as
    request_length). Requests are sent at `request_rate` per second (poisson or uniform
    gaps), each time picking a random client whose next turn is ready; a turn is ready
    `think_time_ms` after the previous turn of its client was sent (the open-loop estimate
    of "after it finished"). Without `closed_loop` no think_time_ms is recorded and the
    timestamps are the schedule.
    """
    _check_positive(
        clients=clients,
        rounds=rounds,
        request_length=request_length,
        request_rate=request_rate,
        block_size=block_size,
    )
    _check(
        sub_question_length=sub_question_length,
        output_length=output_length,
        think_time_ms=think_time_ms,
    )
    _check_distribution(distribution)
    params = dict(
        clients=clients,
        rounds=rounds,
        request_length=request_length,
        sub_question_length=sub_question_length,
        output_length=output_length,
        request_rate=request_rate,
        distribution=distribution,
        closed_loop=closed_loop,
        think_time_ms=think_time_ms,
        seed=seed,
    )
    rng = random.Random(seed)
    ids = _Ids()
    sub = sub_question_length or request_length
    # per-client state: prompt length and hash ids of the next turn
    length = [request_length] * clients
    blocks = [ids.fresh(-(-request_length // block_size)) for _ in range(clients)]
    turn = [0] * clients
    ready = list(range(clients))
    waiting: list[tuple[float, int, int]] = []  # (ready time, tie-break, client)
    order = itertools.count()
    requests: list[Request] = []
    now = 0.0
    while len(requests) < clients * rounds:
        while waiting and waiting[0][0] <= now:
            ready.append(heapq.heappop(waiting)[2])
        if not ready:
            now = waiting[0][0]
            continue
        c = ready.pop(rng.randrange(len(ready)))
        k = turn[c]
        requests.append(
            Request(
                timestamp=now,
                input_length=length[c],
                output_length=output_length,
                hash_ids=blocks[c],
                session_id=f"c{c}",
                turn=k,
                think_time_ms=think_time_ms if closed_loop and k > 0 else None,
            )
        )
        turn[c] = k + 1
        if k + 1 < rounds:
            new_length = length[c] + output_length + sub
            blocks[c] = ids.for_length(blocks[c], new_length, block_size)
            length[c] = new_length
            heapq.heappush(waiting, (now + think_time_ms, next(order), c))
        now += _gap_ms(rng, request_rate, distribution)
    return _finish("multiturn", requests, block_size, params, OPEN_LOOP_NOTE if closed_loop else "")


def _prefixed_requests(
    rng: random.Random,
    ids: _Ids,
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
        length = base + _length(rng, suffix_length, jitter, minimum=1)
        out.append(
            Request(
                timestamp=now,
                input_length=length,
                output_length=_length(rng, output_length, jitter),
                hash_ids=ids.for_length(blocks, length, block_size),
            )
        )
        now += _gap_ms(rng, request_rate, distribution)
    return out


def shared_prefix(
    *,
    requests: int = 1000,
    prefixes: int = 8,
    zipf: float = 1.0,
    prefix_length: int = 2048,
    suffix_length: int = 256,
    output_length: int = 128,
    jitter: float = 0.0,
    request_rate: float = 4.0,
    distribution: str = "poisson",
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """`prefixes` system prompts of `prefix_length` tokens, chosen per request with Zipf
    popularity (prompt i has weight 1 / (i + 1) ** zipf; zipf 0 = uniform), each followed by
    a unique suffix of `suffix_length` tokens. Lengths vary by +-jitter (a fraction)."""
    _check_positive(
        requests=requests, prefixes=prefixes, request_rate=request_rate, block_size=block_size
    )
    _check(
        zipf=zipf,
        prefix_length=prefix_length,
        suffix_length=suffix_length,
        output_length=output_length,
        jitter=jitter,
    )
    if prefix_length + suffix_length < 1:
        raise ValueError("prefix_length + suffix_length must be >= 1")
    _check_distribution(distribution)
    params = dict(
        requests=requests,
        prefixes=prefixes,
        zipf=zipf,
        prefix_length=prefix_length,
        suffix_length=suffix_length,
        output_length=output_length,
        jitter=jitter,
        request_rate=request_rate,
        distribution=distribution,
        seed=seed,
    )
    rng = random.Random(seed)
    ids = _Ids()
    shared = [ids.fresh(prefix_length // block_size) for _ in range(prefixes)]
    cum_weights = list(itertools.accumulate(1.0 / (i + 1) ** zipf for i in range(prefixes)))
    choices = range(prefixes)

    def pick() -> tuple[list[int], int]:
        k = rng.choices(choices, cum_weights=cum_weights)[0]
        return shared[k], prefix_length

    out = _prefixed_requests(
        rng, ids, pick, requests, suffix_length, output_length, jitter, request_rate,
        distribution, block_size,
    )  # fmt: skip
    return _finish("shared-prefix", out, block_size, params, "")


def long_context_qa(
    *,
    documents: int = 4,
    document_length: int = 32768,
    questions_per_document: int = 16,
    question_length: int = 64,
    output_length: int = 64,
    jitter: float = 0.25,
    request_rate: float = 1.0,
    distribution: str = "poisson",
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """LooGLE-like long-context QA: a few long documents (`document_length` tokens, +-jitter
    per document), each asked `questions_per_document` short questions; the prompt is the
    document followed by the question. Questions arrive in random order across
    documents."""
    _check_positive(
        documents=documents,
        document_length=document_length,
        questions_per_document=questions_per_document,
        request_rate=request_rate,
        block_size=block_size,
    )
    _check(question_length=question_length, output_length=output_length, jitter=jitter)
    _check_distribution(distribution)
    params = dict(
        documents=documents,
        document_length=document_length,
        questions_per_document=questions_per_document,
        question_length=question_length,
        output_length=output_length,
        jitter=jitter,
        request_rate=request_rate,
        distribution=distribution,
        seed=seed,
    )
    rng = random.Random(seed)
    ids = _Ids()
    doc_length = [_length(rng, document_length, jitter) for _ in range(documents)]
    doc_blocks = [ids.fresh(n // block_size) for n in doc_length]
    questions = [d for d in range(documents) for _ in range(questions_per_document)]
    rng.shuffle(questions)
    order = iter(questions)

    def pick() -> tuple[list[int], int]:
        d = next(order)
        return doc_blocks[d], doc_length[d]

    out = _prefixed_requests(
        rng, ids, pick, len(questions), question_length, output_length, jitter, request_rate,
        distribution, block_size,
    )  # fmt: skip
    return _finish("long-context-qa", out, block_size, params, "")


def agentic(
    *,
    sessions: int = 32,
    steps: int = 8,
    system_length: int = 2048,
    task_length: int = 512,
    output_length: int = 128,
    tool_output_length: int = 1024,
    tool_time_ms: float = 1000.0,
    jitter: float = 0.5,
    session_rate: float = 0.5,
    distribution: str = "poisson",
    closed_loop: bool = True,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 0,
) -> Trace:
    """Agent sessions whose context grows by tool outputs each step.

    All sessions share a system prompt (`system_length`, tool definitions); each starts with
    its own task (`task_length`). Step k's prompt is step k-1's prompt plus the model's
    output (`output_length`) plus a tool result (`tool_output_length`); the tool runs for
    `tool_time_ms` (the think time). Lengths and tool times vary by +-jitter. Sessions start
    at `session_rate` per second.
    """
    _check_positive(
        sessions=sessions, steps=steps, session_rate=session_rate, block_size=block_size
    )
    _check(
        system_length=system_length,
        task_length=task_length,
        output_length=output_length,
        tool_output_length=tool_output_length,
        tool_time_ms=tool_time_ms,
        jitter=jitter,
    )
    if system_length + task_length < 1:
        raise ValueError("system_length + task_length must be >= 1")
    _check_distribution(distribution)
    params = dict(
        sessions=sessions,
        steps=steps,
        system_length=system_length,
        task_length=task_length,
        output_length=output_length,
        tool_output_length=tool_output_length,
        tool_time_ms=tool_time_ms,
        jitter=jitter,
        session_rate=session_rate,
        distribution=distribution,
        closed_loop=closed_loop,
        seed=seed,
    )
    rng = random.Random(seed)
    ids = _Ids()
    system = ids.fresh(system_length // block_size)
    out: list[Request] = []
    start = 0.0
    for s in range(sessions):
        length = system_length + _length(rng, task_length, jitter, minimum=1)
        blocks = ids.for_length(system, length, block_size)
        now = start
        for k in range(steps):
            think: float | None = None
            if k > 0:
                think = round(
                    tool_time_ms * (1 + rng.uniform(-jitter, jitter))
                    if jitter > 0
                    else tool_time_ms,
                    3,
                )
                think = max(0.0, think)
                now += think
            n_out = _length(rng, output_length, jitter)
            out.append(
                Request(
                    timestamp=now,
                    input_length=length,
                    output_length=n_out,
                    hash_ids=blocks,
                    session_id=f"a{s}",
                    turn=k,
                    think_time_ms=think if closed_loop else None,
                )
            )
            new_length = length + n_out + _length(rng, tool_output_length, jitter, minimum=0)
            blocks = ids.for_length(blocks, new_length, block_size)
            length = new_length
        start += _gap_ms(rng, session_rate, distribution)
    return _finish("agentic", out, block_size, params, OPEN_LOOP_NOTE if closed_loop else "")


GENERATORS: dict[str, Callable[..., Trace]] = {
    "multiturn": multiturn,
    "shared-prefix": shared_prefix,
    "long-context-qa": long_context_qa,
    "agentic": agentic,
}

# One line per generator for `trace gen --help`.
GENERATOR_SUMMARY: dict[str, str] = {
    "multiturn": "SGLang bench_multiturn: clients x rounds of growing conversations",
    "shared-prefix": "K system prompts with Zipf popularity, unique per-request suffixes",
    "long-context-qa": "a few long documents, many short questions each (LooGLE-like)",
    "agentic": "agent sessions whose context grows by tool outputs each step",
}

# Help text for every generator parameter (the CLI builds its options from the signatures).
PARAM_HELP: dict[str, str] = {
    "clients": "number of conversations (bench_multiturn --num-clients)",
    "rounds": "turns per conversation (--num-rounds)",
    "request_length": "tokens of the first prompt of a conversation (--request-length)",
    "sub_question_length": "tokens added per later turn besides the previous output; 0 = "
    "request_length (--sub-question-input-length)",
    "output_length": "output tokens per request",
    "request_rate": "requests per second",
    "session_rate": "new sessions per second",
    "distribution": "inter-arrival gaps: poisson (exponential) or uniform on [0, 2/rate]",
    "closed_loop": "record think_time_ms so that a simulator can replay in closed loop",
    "think_time_ms": "delay between the end of a turn and the next turn of the same client",
    "block_size": "tokens per hash-id block",
    "seed": "random seed (same seed, same trace)",
    "requests": "number of requests",
    "prefixes": "number of distinct shared system prompts",
    "zipf": "Zipf exponent of system-prompt popularity (0 = uniform)",
    "prefix_length": "tokens per shared system prompt",
    "suffix_length": "tokens of the unique per-request suffix",
    "jitter": "relative spread of lengths: uniform on [x (1 - jitter), x (1 + jitter)]",
    "documents": "number of long documents",
    "document_length": "tokens per document",
    "questions_per_document": "questions asked about each document",
    "question_length": "tokens per question",
    "sessions": "number of agent sessions",
    "steps": "LLM calls per session",
    "system_length": "tokens of the system prompt shared by all sessions",
    "task_length": "tokens of each session's own task description",
    "tool_output_length": "tokens a tool call adds to the context",
    "tool_time_ms": "tool run time = think time between two steps",
}


def generator_params(kind: str) -> dict[str, Any]:
    """Parameter names and defaults of a generator (for the CLI and docs)."""
    sig = inspect.signature(GENERATORS[kind])
    return {name: p.default for name, p in sig.parameters.items()}


def generate(kind: str, **params: Any) -> Trace:
    """Run the generator named `kind` (a key of `GENERATORS`) with keyword parameters."""
    try:
        fn = GENERATORS[kind]
    except KeyError:
        raise ValueError(
            f"unknown generator {kind!r} (choose from " + ", ".join(GENERATORS) + ")"
        ) from None
    return fn(**params)
