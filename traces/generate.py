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
    DIST_KINDS,
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
    lognormal_fit,
    multiturn_schedule,
    parse_dist,
    prefixed_requests,
    recorded_params,
)
from traces.schema import DEFAULT_BLOCK_SIZE, Request, Trace, TraceParamError

__all__ = [
    "ASSIGNMENTS",
    "DISTRIBUTIONS",
    "DIST_KINDS",
    "GENERATORS",
    "GENERATOR_SUMMARY",
    "OPEN_LOOP_NOTE",
    "OPTIONAL_PARAMS",
    "PARAM_HELP",
    "agentic",
    "fit_multiturn",
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


# Parameters added after traces (the bundled ones too) had been made: a generator records
# one in its header only when it is not at its default, so those traces keep their bytes.
# `generator_params` leaves them out unless asked (`optional=True`).
OPTIONAL_PARAMS: dict[str, dict[str, Any]] = {
    "multiturn": {
        "system_prompt_length": 0,
        "system_prompts": 1,
        "system_prompt_assignment": "round-robin",
        "request_length_dist": "fixed",
        "sub_question_length_dist": "",
        "output_length_dist": "fixed",
        "think_time_dist": "fixed",
    },
    "shared-prefix": {},
    "long-context-qa": {},
    "agentic": {
        "subagents": 0,
        "fanout_probability": 0.25,
        "subagent_steps": 3,
        "subagent_task_length": 256,
    },
}

#: How `multiturn` gives clients their system prompt (``--system-prompt-assignment``).
ASSIGNMENTS: tuple[str, ...] = ("round-robin", "random")


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
    system_prompt_length: int = 0,
    system_prompts: int = 1,
    system_prompt_assignment: str = "round-robin",
    request_length_dist: str = "fixed",
    sub_question_length_dist: str = "",
    output_length_dist: str = "fixed",
    think_time_dist: str = "fixed",
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

    With `system_prompt_length` > 0 every prompt of a client starts with one of
    `system_prompts` shared system prompts of that many tokens (given to the clients
    round-robin, or at random: `system_prompt_assignment`). The `*_dist` options draw
    lengths and think times per turn: ``fixed`` (the value above), ``lognormal:MEAN,SIGMA``
    (MEAN the mean, SIGMA the standard deviation of the log) or ``uniform:LO,HI``;
    `sub_question_length_dist` "" = as today: request_length_dist's distribution when
    sub_question_length is 0, else fixed.
    """
    params = recorded_params(locals(), OPTIONAL_PARAMS["multiturn"])
    check_positive(
        clients=clients,
        rounds=rounds,
        request_length=request_length,
        request_rate=request_rate,
        block_size=block_size,
        system_prompts=system_prompts,
    )
    check_non_negative(
        sub_question_length=sub_question_length,
        output_length=output_length,
        think_time_ms=think_time_ms,
        system_prompt_length=system_prompt_length,
    )
    check_distribution(distribution)
    if system_prompt_assignment not in ASSIGNMENTS:
        raise TraceParamError(
            "system_prompt_assignment must be one of "
            f"{', '.join(ASSIGNMENTS)}, got {system_prompt_assignment!r}"
        )
    first_dist = parse_dist("request_length_dist", request_length_dist)
    if sub_question_length_dist:
        sub_dist = parse_dist("sub_question_length_dist", sub_question_length_dist)
    else:
        sub_dist = first_dist if sub_question_length == 0 else parse_dist("", "fixed")
    out_dist = parse_dist("output_length_dist", output_length_dist)
    think_dist = parse_dist("think_time_dist", think_time_dist)
    rng = random.Random(seed)
    # Everything the options above add is drawn from a second generator, so that the
    # schedule draws of `rng` stay what they were (and a default trace keeps its bytes).
    extra = random.Random(f"multiturn:{seed}")
    assigned = [
        extra.randrange(system_prompts) if system_prompt_assignment == "random" else c
        for c in range(clients)
    ]
    # per client, per turn: the new user tokens (prompt, then question), output, think time
    sub = sub_question_length or request_length
    user = [[0] * rounds for _ in range(clients)]
    outs = [[0] * rounds for _ in range(clients)]
    thinks = [[think_time_ms] * rounds for _ in range(clients)]
    for c in range(clients):
        for k in range(rounds):
            user[c][k] = (
                first_dist.length(extra, request_length, 1)
                if k == 0
                else sub_dist.length(extra, sub, 1)
            )
            outs[c][k] = out_dist.length(extra, output_length, 0)
            if k > 0:
                thinks[c][k] = think_dist.ms(extra, think_time_ms)
    ids = IdAllocator()
    n_shared = system_prompt_length // block_size if system_prompt_length else 0
    systems = [ids.fresh(n_shared) for _ in range(system_prompts if n_shared else 0)]
    prompts = [
        GrowingPrompt(
            ids,
            systems[assigned[c] % system_prompts] if systems else [],
            system_prompt_length + user[c][0],
            block_size,
        )
        for c in range(clients)
    ]
    requests: list[Request] = []
    schedule = multiturn_schedule(
        rng, clients, rounds, lambda c, k: thinks[c][k], request_rate, distribution
    )
    for now, c, k in schedule:
        think = thinks[c][k] if closed_loop and k > 0 else None
        requests.append(prompts[c].request(now, outs[c][k], f"c{c}", k, think))
        if k + 1 < rounds:
            prompts[c].grow(ids, outs[c][k] + user[c][k + 1], block_size)
    return finish_trace(
        "multiturn", requests, block_size, params, OPEN_LOOP_NOTE if closed_loop else ""
    )


def fit_multiturn(trace: Trace) -> dict[str, str]:
    """Lognormal `multiturn` distributions fitted to a trace (for ``--fit TRACE``).

    Returns `multiturn` keyword arguments: ``request_length_dist`` from the prompts of each
    session's first turn (and of requests without a session), ``sub_question_length_dist``
    from what each later turn adds to its previous turn's prompt and output (where that is
    > 0: the turn extends the previous one), ``output_length_dist`` from the output lengths
    > 0, and ``think_time_dist`` from the think times > 0, each where the trace has at
    least 2 such values. Maximum-likelihood fits (mean and standard deviation of the logs),
    written as ``lognormal:MEAN,SIGMA`` with 6 significant digits. Turns are taken in
    `turn` order within a session (arrival order where `turn` is missing).
    """
    first: list[float] = []
    added: list[float] = []
    outputs: list[float] = []
    thinks: list[float] = []
    sessions: dict[str, list[tuple[int, int, Request]]] = {}
    for i, r in enumerate(trace.requests):
        if r.output_length > 0:
            outputs.append(r.output_length)
        if r.think_time_ms is not None and r.think_time_ms > 0:
            thinks.append(r.think_time_ms)
        if r.session_id is None:
            first.append(r.input_length)
        else:
            turn = r.turn if r.turn is not None else i
            sessions.setdefault(r.session_id, []).append((turn, i, r))
    for turns in sessions.values():
        turns.sort(key=lambda t: (t[0], t[1]))
        first.append(turns[0][2].input_length)
        for (_, _, prev), (_, _, cur) in itertools.pairwise(turns):
            new = cur.input_length - prev.input_length - prev.output_length
            if new > 0:
                added.append(new)
    out: dict[str, str] = {}
    for name, values in (
        ("request_length_dist", first),
        ("sub_question_length_dist", added),
        ("output_length_dist", outputs),
        ("think_time_dist", thinks),
    ):
        if len(values) >= 2:
            mean, sigma = lognormal_fit(values)
            out[name] = f"lognormal:{mean:.6g},{sigma:.6g}"
    if "request_length_dist" not in out:
        raise TraceParamError("fit: the trace needs at least 2 requests to fit lengths to")
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
    subagents: int = 0,
    fanout_probability: float = 0.25,
    subagent_steps: int = 3,
    subagent_task_length: int = 256,
) -> Trace:
    """Agent sessions whose context grows by tool outputs each step.

    All sessions share a system prompt (`system_length`, tool definitions); each starts with
    its own task (`task_length`). Step k's prompt is step k-1's prompt plus the model's
    output (`output_length`) plus a tool result (`tool_output_length`); the tool runs for
    `tool_time_ms` (the think time). Lengths and tool times vary by +-jitter. Sessions start
    at `session_rate` per second.

    With `subagents` K > 0, each step but the last fans out, with `fanout_probability`, to
    K subagents: sessions of their own (``<session>::sa:<step>.<j>``) of `subagent_steps`
    steps whose first prompt is the parent's prompt and output at that step (its full blocks
    shared) plus a task of `subagent_task_length` tokens, growing as the parent's do; they
    start with that step, and the parent's next step comes after the last of them.
    """
    params = recorded_params(locals(), OPTIONAL_PARAMS["agentic"])
    check_positive(
        sessions=sessions,
        steps=steps,
        session_rate=session_rate,
        block_size=block_size,
        subagent_steps=subagent_steps,
    )
    check_non_negative(
        system_length=system_length,
        task_length=task_length,
        output_length=output_length,
        tool_output_length=tool_output_length,
        tool_time_ms=tool_time_ms,
        jitter=jitter,
        subagents=subagents,
        subagent_task_length=subagent_task_length,
    )
    if system_length + task_length < 1:
        raise TraceParamError("system_length + task_length must be >= 1")
    if not 0 <= fanout_probability <= 1:
        raise TraceParamError(f"fanout_probability must be in [0, 1], got {fanout_probability}")
    check_distribution(distribution)
    rng = random.Random(seed)
    # fan-outs and subagents draw from their own generator: the parents' draws stay the
    # same with and without subagents (and a trace without them keeps its bytes)
    sub_rng = random.Random(f"agentic-subagents:{seed}")
    ids = IdAllocator()
    system = ids.fresh(system_length // block_size)
    out: list[Request] = []
    start = 0.0

    def subagent(session: str, shared: list[int], length: int, now: float) -> float:
        """The requests of one subagent from `now`; returns the time of its last step."""
        task = jittered_length(sub_rng, subagent_task_length, jitter, minimum=1)
        prompt = GrowingPrompt(ids, shared, length + task, block_size)
        for i in range(subagent_steps):
            think: float | None = None
            if i > 0:
                think = jittered_ms(sub_rng, tool_time_ms, jitter)
                now += think
            n_out = jittered_length(sub_rng, output_length, jitter)
            out.append(prompt.request(now, n_out, session, i, think if closed_loop else None))
            if i + 1 < subagent_steps:
                tool_output = jittered_length(sub_rng, tool_output_length, jitter, minimum=0)
                prompt.grow(ids, n_out + tool_output, block_size)
        return now

    for s in range(sessions):
        task = jittered_length(rng, task_length, jitter, minimum=1)
        prompt = GrowingPrompt(ids, system, system_length + task, block_size)
        now = start
        joined = now  # when the subagents of the previous step are done
        for k in range(steps):
            think: float | None = None
            if k > 0:
                think = jittered_ms(rng, tool_time_ms, jitter)
                if now + think < joined:
                    think = round(joined - now, 3)
                now += think
            n_out = jittered_length(rng, output_length, jitter)
            out.append(prompt.request(now, n_out, f"a{s}", k, think if closed_loop else None))
            tool_output = jittered_length(rng, tool_output_length, jitter, minimum=0)
            spawned_at = prompt.length + n_out
            prompt.grow(ids, n_out + tool_output, block_size)
            joined = now
            if subagents and k + 1 < steps and sub_rng.random() < fanout_probability:
                # the parent's context and output: its full blocks are the parent's ids
                shared = prompt.blocks[: spawned_at // block_size]
                for j in range(subagents):
                    end = subagent(f"a{s}::sa:{k}.{j}", shared, spawned_at, now)
                    joined = max(joined, end)
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
    "system_prompt_length": "tokens of a system prompt that starts every prompt of a client "
    "(0 = none; shared: use a multiple of block_size)",
    "system_prompts": "number of distinct system prompts",
    "system_prompt_assignment": "which system prompt a client gets: round-robin (client "
    "i gets i mod K) or random",
    "request_length_dist": "first-prompt tokens: fixed (request_length), lognormal:MEAN,SIGMA "
    "or uniform:LO,HI",
    "sub_question_length_dist": "tokens of each later question: as request_length_dist; "
    "'' = request_length_dist's when sub_question_length is 0, else fixed",
    "output_length_dist": "output tokens per turn: fixed (output_length), lognormal:MEAN,SIGMA "
    "or uniform:LO,HI",
    "think_time_dist": "think time per turn: fixed (think_time_ms), lognormal:MEAN,SIGMA or "
    "uniform:LO,HI (ms)",
    "subagents": "subagents per fan-out (0 = none)",
    "fanout_probability": "chance that a step (not the last) fans out to the subagents",
    "subagent_steps": "LLM calls per subagent",
    "subagent_task_length": "tokens of a subagent's own task after the parent's context",
}


def generator_params(kind: str, *, optional: bool = False) -> dict[str, Any]:
    """Parameter names and defaults of a generator (for the CLI and docs): those every
    header records, and with `optional` also those of `OPTIONAL_PARAMS` (recorded only
    when set)."""
    sig = inspect.signature(GENERATORS[kind])
    later = OPTIONAL_PARAMS[kind]
    return {name: p.default for name, p in sig.parameters.items() if optional or name not in later}


def generate(kind: str, **params: Any) -> Trace:
    """Run the generator named `kind` (a key of `GENERATORS`) with keyword parameters."""
    try:
        fn = GENERATORS[kind]
    except KeyError:
        raise TraceParamError(
            f"unknown generator {kind!r} (choose from " + ", ".join(GENERATORS) + ")"
        ) from None
    return fn(**params)
