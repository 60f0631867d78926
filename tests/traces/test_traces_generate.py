"""Synthetic trace generators and the bundled synthetic traces."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from traces.bundled import SYNTHETIC_RECIPES, synthetic_path, write_synthetic
from traces.generate import GENERATORS, PARAM_HELP, generate, generator_params
from traces.io import read_trace, write_trace
from traces.keys import token_ids_of
from traces.schema import Trace
from traces.stats import infinite_capacity_hit_rate

SMALL: dict[str, dict[str, Any]] = {
    "multiturn": {
        "clients": 6,
        "rounds": 4,
        "request_length": 300,
        "output_length": 40,
        "sub_question_length": 100,
        "request_rate": 5.0,
        "think_time_ms": 200.0,
    },
    "shared-prefix": {"requests": 60, "prefixes": 3, "prefix_length": 1100, "jitter": 0.5},
    "long-context-qa": {"documents": 2, "document_length": 3000, "questions_per_document": 5},
    "agentic": {"sessions": 4, "steps": 5, "system_length": 700, "tool_output_length": 300},
}


@pytest.mark.parametrize("kind", list(GENERATORS))
@pytest.mark.parametrize("block_size", [512, 64])
def test_deterministic_and_valid(kind: str, block_size: int, tmp_path: Path) -> None:
    params = {**SMALL[kind], "block_size": block_size}
    a = generate(kind, seed=3, **params)
    b = generate(kind, seed=3, **params)
    c = generate(kind, seed=4, **params)
    assert a.requests == b.requests
    assert a.header == b.header
    assert a.requests != c.requests
    assert a.header.extra["generator"] == kind
    assert a.header.extra["params"]["seed"] == 3
    assert a.block_size == block_size
    # the writer validates every request, the reader validates again
    path = write_trace(a, tmp_path / f"{kind}.jsonl")
    assert read_trace(path).requests == a.requests
    assert infinite_capacity_hit_rate(a, 1) > 0


@pytest.mark.parametrize("kind", list(GENERATORS))
def test_header_records_every_argument_but_block_size(kind: str) -> None:
    # the generators record their arguments with locals(): same names, order and values as
    # the signature, block_size left out (the header holds it on its own)
    trace = generate(kind, seed=5, **SMALL[kind])
    defaults = generator_params(kind)
    want = {**defaults, **SMALL[kind], "seed": 5}
    del want["block_size"]
    assert list(trace.header.extra["params"].items()) == list(want.items())


def _sessions(trace: Trace) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for r in trace:
        assert r.session_id is not None
        out[r.session_id].append(r)
    return out


def test_multiturn_shape() -> None:
    p = SMALL["multiturn"]
    trace = generate("multiturn", **p)
    assert len(trace) == p["clients"] * p["rounds"]
    sessions = _sessions(trace)
    assert len(sessions) == p["clients"]
    for turns in sessions.values():
        assert [r.turn for r in turns] == list(range(p["rounds"]))
        assert turns[0].think_time_ms is None
        assert all(r.think_time_ms == p["think_time_ms"] for r in turns[1:])
        for prev, cur in itertools.pairwise(turns):
            # next prompt = previous prompt + output + sub-question, and starts with it
            assert cur.input_length == prev.input_length + p["output_length"] + 100
            assert token_ids_of(cur)[: prev.input_length] == token_ids_of(prev)
            assert cur.timestamp >= prev.timestamp + p["think_time_ms"]
    open_loop = generate("multiturn", **{**p, "closed_loop": False})
    assert all(r.think_time_ms is None for r in open_loop)


def test_shared_prefix_shares_full_blocks_only() -> None:
    trace = generate("shared-prefix", **SMALL["shared-prefix"])
    by_first: dict[int, list[Any]] = defaultdict(list)
    for r in trace:
        assert r.hash_ids is not None
        by_first[r.hash_ids[0]].append(r)
        assert r.input_length >= 1100
    assert len(by_first) <= 3
    all_ids = [r.hash_ids for r in trace if r.hash_ids is not None]
    # 1100 tokens = 2 full blocks shared; block 3 holds the tail and a unique suffix
    for ids in all_ids:
        assert sum(1 for other in all_ids if other[2] == ids[2]) == 1
    assert max(len(v) for v in by_first.values()) > 20  # Zipf: the first prompt dominates


def test_long_context_qa_shape() -> None:
    trace = generate("long-context-qa", **SMALL["long-context-qa"])
    assert len(trace) == 10
    docs = {tuple(r.hash_ids[:2]) for r in trace if r.hash_ids is not None}
    assert len(docs) == 2


def test_agentic_context_grows() -> None:
    p = SMALL["agentic"]
    trace = generate("agentic", **p)
    sessions = _sessions(trace)
    assert len(sessions) == p["sessions"]
    first_blocks = {r.hash_ids[0] for r in trace if r.hash_ids is not None}
    assert len(first_blocks) == 1  # the system prompt's first block is shared
    for steps in sessions.values():
        assert [r.turn for r in steps] == list(range(p["steps"]))
        for prev, cur in itertools.pairwise(steps):
            assert cur.input_length >= prev.input_length + prev.output_length
            assert token_ids_of(cur)[: prev.input_length] == token_ids_of(prev)
            assert cur.think_time_ms is not None
            assert cur.timestamp == pytest.approx(prev.timestamp + cur.think_time_ms, abs=1e-3)


@pytest.mark.parametrize(
    ("kind", "params", "match"),
    [
        ("multiturn", {"clients": 0}, "clients must be > 0"),
        ("multiturn", {"distribution": "bursty"}, "distribution must be one of"),
        ("shared-prefix", {"request_rate": 0.0}, "request_rate must be > 0"),
        ("agentic", {"tool_time_ms": -1.0}, "tool_time_ms must be >= 0"),
        ("nope", {}, "unknown generator"),
    ],
)
def test_bad_parameters(kind: str, params: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(kind, **params)


def test_every_parameter_has_help() -> None:
    for kind in GENERATORS:
        for name in generator_params(kind):
            assert name in PARAM_HELP, (kind, name)


def test_bundled_synthetic_traces_are_up_to_date(tmp_path: Path) -> None:
    for path in write_synthetic(tmp_path):
        bundled = synthetic_path(path.name.removesuffix(".jsonl"))
        assert bundled.read_bytes() == path.read_bytes(), bundled
        assert bundled.stat().st_size < 1_000_000
    assert {p.name for p in tmp_path.iterdir()} == {f"{k}.jsonl" for k in SYNTHETIC_RECIPES}
