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

The building blocks (id allocation, random lengths and gaps, argument checks, growing
prompts, the multiturn send schedule) are in `traces.gen_parts`.
"""

from __future__ import annotations

import inspect
import itertools
import random
from collections.abc import Callable
from typing import Any

from traces.gen_parts import (
    DISTRIBUTIONS,
    GrowingPrompt,
    IdAllocator,
    check_distribution,
    check_non_negative,
    check_positive,
    finish_trace,
    gap_ms,
    jittered_length,
    jittered_ms,
    multiturn_schedule,
    prefixed_requests,
    recorded_params,
)
from traces.schema import DEFAULT_BLOCK_SIZE, Request, Trace, TraceParamError

__all__ = [
    "DISTRIBUTIONS",
    "GENERATORS",
    "GENERATOR_SUMMARY",
    "OPEN_LOOP_NOTE",
    "PARAM_HELP",
    "agentic",
    "generate",
    "generator_params",
    "long_context_qa",
    "multiturn",
    "shared_prefix",
]

OPEN_LOOP_NOTE = (
    "timestamps are an open-loop estimate (service time taken as zero); a closed-loop replay "
    "sends turn k think_time_ms after turn k-1 finishes"
)


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
    params = recorded_params(locals())
    check_positive(
        clients=clients,
        rounds=rounds,
        request_length=request_length,
        request_rate=request_rate,
        block_size=block_size,
    )
    check_non_negative(
        sub_question_length=sub_question_length,
        output_length=output_length,
        think_time_ms=think_time_ms,
    )
    check_distribution(distribution)
    rng = random.Random(seed)
    ids = IdAllocator()
    sub = sub_question_length or request_length
    prompts = [GrowingPrompt(ids, [], request_length, block_size) for _ in range(clients)]
    requests: list[Request] = []
    schedule = multiturn_schedule(rng, clients, rounds, think_time_ms, request_rate, distribution)
    for now, c, k in schedule:
        think = think_time_ms if closed_loop and k > 0 else None
        requests.append(prompts[c].request(now, output_length, f"c{c}", k, think))
        if k + 1 < rounds:
            prompts[c].grow(ids, output_length + sub, block_size)
    return finish_trace(
        "multiturn", requests, block_size, params, OPEN_LOOP_NOTE if closed_loop else ""
    )


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
    params = recorded_params(locals())
    check_positive(
        requests=requests, prefixes=prefixes, request_rate=request_rate, block_size=block_size
    )
    check_non_negative(
        zipf=zipf,
        prefix_length=prefix_length,
        suffix_length=suffix_length,
        output_length=output_length,
        jitter=jitter,
    )
    if prefix_length + suffix_length < 1:
        raise TraceParamError("prefix_length + suffix_length must be >= 1")
    check_distribution(distribution)
    rng = random.Random(seed)
    ids = IdAllocator()
    shared = [ids.fresh(prefix_length // block_size) for _ in range(prefixes)]
    cum_weights = list(itertools.accumulate(1.0 / (i + 1) ** zipf for i in range(prefixes)))
    choices = range(prefixes)

    def pick() -> tuple[list[int], int]:
        k = rng.choices(choices, cum_weights=cum_weights)[0]
        return shared[k], prefix_length

    out = prefixed_requests(
        rng, ids, pick, requests, suffix_length, output_length, jitter, request_rate,
        distribution, block_size,
    )  # fmt: skip
    return finish_trace("shared-prefix", out, block_size, params, "")


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
    params = recorded_params(locals())
    check_positive(
        documents=documents,
        document_length=document_length,
        questions_per_document=questions_per_document,
        request_rate=request_rate,
        block_size=block_size,
    )
    check_non_negative(question_length=question_length, output_length=output_length, jitter=jitter)
    check_distribution(distribution)
    rng = random.Random(seed)
    ids = IdAllocator()
    doc_length = [jittered_length(rng, document_length, jitter) for _ in range(documents)]
    doc_blocks = [ids.fresh(n // block_size) for n in doc_length]
    questions = [d for d in range(documents) for _ in range(questions_per_document)]
    rng.shuffle(questions)
    order = iter(questions)

    def pick() -> tuple[list[int], int]:
        d = next(order)
        return doc_blocks[d], doc_length[d]

    out = prefixed_requests(
        rng, ids, pick, len(questions), question_length, output_length, jitter, request_rate,
        distribution, block_size,
    )  # fmt: skip
    return finish_trace("long-context-qa", out, block_size, params, "")


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
    params = recorded_params(locals())
    check_positive(sessions=sessions, steps=steps, session_rate=session_rate, block_size=block_size)
    check_non_negative(
        system_length=system_length,
        task_length=task_length,
        output_length=output_length,
        tool_output_length=tool_output_length,
        tool_time_ms=tool_time_ms,
        jitter=jitter,
    )
    if system_length + task_length < 1:
        raise TraceParamError("system_length + task_length must be >= 1")
    check_distribution(distribution)
    rng = random.Random(seed)
    ids = IdAllocator()
    system = ids.fresh(system_length // block_size)
    out: list[Request] = []
    start = 0.0
    for s in range(sessions):
        task = jittered_length(rng, task_length, jitter, minimum=1)
        prompt = GrowingPrompt(ids, system, system_length + task, block_size)
        now = start
        for k in range(steps):
            think: float | None = None
            if k > 0:
                think = jittered_ms(rng, tool_time_ms, jitter)
                now += think
            n_out = jittered_length(rng, output_length, jitter)
            out.append(prompt.request(now, n_out, f"a{s}", k, think if closed_loop else None))
            tool_output = jittered_length(rng, tool_output_length, jitter, minimum=0)
            prompt.grow(ids, n_out + tool_output, block_size)
        start += gap_ms(rng, session_rate, distribution)
    return finish_trace("agentic", out, block_size, params, OPEN_LOOP_NOTE if closed_loop else "")


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
        raise TraceParamError(
            f"unknown generator {kind!r} (choose from " + ", ".join(GENERATORS) + ")"
        ) from None
    return fn(**params)
