"""`trace gen multiturn` system prompts, length distributions and `--fit`; `trace gen agentic
--subagents` (issue 27, item 2)."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from cli.main import main as hicache_main
from cli.traces import main as trace_main
from traces.gen_parts import parse_dist
from traces.generate import (
    OPTIONAL_PARAMS,
    PARAM_HELP,
    agentic,
    fit_multiturn,
    generate,
    generator_params,
    multiturn,
)
from traces.io import read_trace, write_trace
from traces.keys import token_ids_of
from traces.schema import Request, Trace, TraceParamError

# sha256 of the JSONL files that the generators wrote *before* the options of this file
# existed (computed with the previous commit's traces/generate.py): every old option still
# gives the same bytes, and so does passing the new options at their defaults.
GOLDEN: list[tuple[str, dict[str, Any], str]] = [
    (
        "multiturn",
        {
            "clients": 12,
            "rounds": 4,
            "request_length": 300,
            "sub_question_length": 100,
            "output_length": 40,
            "request_rate": 5.0,
            "think_time_ms": 200.0,
            "seed": 7,
        },
        "ea5a3e7e246351d7a8fb8910255eaccd2ed14a971ff1077fb3f8100eb374a2cb",
    ),
    (
        "multiturn",
        {
            "clients": 9,
            "rounds": 3,
            "distribution": "uniform",
            "closed_loop": False,
            "block_size": 64,
            "seed": 2,
        },
        "dfb961ce011898ddcaa43a15aabb444b6dad42452a05b5d7bb83c2c7f364e3dc",
    ),
    (
        "agentic",
        {"sessions": 5, "steps": 6, "system_length": 700, "tool_output_length": 300, "seed": 3},
        "b71884514187188aad291164830cc46fea935752ddf45fd2e30fb4a83c587e25",
    ),
    (
        "agentic",
        {
            "sessions": 3,
            "steps": 4,
            "jitter": 0.0,
            "closed_loop": False,
            "block_size": 64,
            "seed": 9,
        },
        "17cab7b084c2c5bbba47a5aac69e6fd11f481f72a6decd3cabda4c6be9321207",
    ),
]


def _digest(trace: Trace, tmp_path: Path, name: str = "t.jsonl") -> str:
    return hashlib.sha256(write_trace(trace, tmp_path / name).read_bytes()).hexdigest()


def _sessions(trace: Trace) -> dict[str, list[Request]]:
    out: dict[str, list[Request]] = defaultdict(list)
    for r in trace:
        assert r.session_id is not None
        out[r.session_id].append(r)
    return out


def _ids(r: Request) -> list[int]:
    assert r.hash_ids is not None
    return list(r.hash_ids)


# -- defaults unchanged, reproducibility -------------------------------------------------


@pytest.mark.parametrize(("kind", "params", "digest"), GOLDEN)
def test_old_options_give_the_old_bytes(
    kind: str, params: dict[str, Any], digest: str, tmp_path: Path
) -> None:
    assert _digest(generate(kind, **params), tmp_path) == digest
    # the new options spelt out at their defaults change nothing either (not even the
    # header: they are recorded only when set)
    spelt = {**OPTIONAL_PARAMS[kind], **params}
    assert _digest(generate(kind, **spelt), tmp_path) == digest


def test_cli_defaults_match_the_bundled_recipe(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from traces.bundled import synthetic_path

    out = tmp_path / "m.jsonl"
    argv = ["gen", "multiturn", "--clients", "32", "--rounds", "5", "--request-rate", "4"]
    assert trace_main([*argv, "--seed", "1", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert out.read_bytes() == synthetic_path("multiturn").read_bytes()
    assert "system_prompt_length" not in summary["params"]


NEW_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "multiturn",
        {
            "clients": 20,
            "rounds": 4,
            "system_prompt_length": 1024,
            "system_prompts": 3,
            "system_prompt_assignment": "random",
            "request_length_dist": "lognormal:400,0.6",
            "sub_question_length_dist": "uniform:20,200",
            "output_length_dist": "lognormal:80,0.5",
            "think_time_dist": "lognormal:1500,0.7",
        },
    ),
    ("agentic", {"sessions": 4, "steps": 5, "subagents": 3, "fanout_probability": 0.5}),
]


@pytest.mark.parametrize(("kind", "params"), NEW_OPTIONS)
def test_same_seed_same_bytes(kind: str, params: dict[str, Any], tmp_path: Path) -> None:
    a = _digest(generate(kind, seed=11, **params), tmp_path, "a.jsonl")
    b = _digest(generate(kind, seed=11, **params), tmp_path, "b.jsonl")
    c = _digest(generate(kind, seed=12, **params), tmp_path, "c.jsonl")
    assert a == b
    assert a != c
    trace = generate(kind, seed=11, **params)
    recorded = trace.header.extra["params"]
    for name, value in params.items():
        assert recorded[name] == value  # set: recorded
    assert read_trace(tmp_path / "a.jsonl").requests == trace.requests


def test_new_options_have_help_and_cli_flags(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for kind, names in OPTIONAL_PARAMS.items():
        assert set(names) <= set(generator_params(kind, optional=True))
        assert not set(names) & set(generator_params(kind))
        for name in names:
            assert name in PARAM_HELP, name
    # the CLI passes each flag through to the generator
    out = tmp_path / "cli.jsonl"
    argv = ["gen", "multiturn", "--clients", "20", "--rounds", "4", "--seed", "11"]
    for name, value in NEW_OPTIONS[0][1].items():
        if name not in ("clients", "rounds"):
            argv += ["--" + name.replace("_", "-"), str(value)]
    assert trace_main([*argv, "--out", str(out)]) == 0
    assert read_trace(out).requests == multiturn(seed=11, **NEW_OPTIONS[0][1]).requests
    capsys.readouterr()


# -- system prompts -------------------------------------------------------------------------


def test_system_prompt_is_shared_by_every_turn_of_every_client() -> None:
    bs, n = 64, 1024
    trace = multiturn(
        clients=10, rounds=3, request_length=100, system_prompt_length=n, block_size=bs
    )
    heads = {tuple(_ids(r)[: n // bs]) for r in trace}
    assert len(heads) == 1  # every request of every client starts with the same 16 ids
    # ... and nothing after it is shared between clients
    firsts = [_ids(turns[0])[n // bs] for turns in _sessions(trace).values()]
    assert len(set(firsts)) == 10
    for r in trace:
        assert token_ids_of(r)[:n] == list(range(n))  # ids 0..15: tokens 0..1023
        assert r.input_length >= n + 100


def test_unaligned_system_prompt_shares_its_full_blocks_only() -> None:
    trace = multiturn(clients=5, rounds=1, request_length=50, system_prompt_length=600)
    # 600 tokens at block size 512: one full block shared, the tail block per client
    assert {_ids(r)[0] for r in trace} == {0}
    assert len({_ids(r)[1] for r in trace}) == 5


@pytest.mark.parametrize("assignment", ["round-robin", "random"])
def test_several_system_prompts(assignment: str) -> None:
    trace = multiturn(
        clients=30,
        rounds=2,
        system_prompt_length=512,
        system_prompts=3,
        system_prompt_assignment=assignment,
    )
    by_client = {s: {_ids(r)[0] for r in turns} for s, turns in _sessions(trace).items()}
    assert all(len(v) == 1 for v in by_client.values())  # one prompt per client, every turn
    assert {next(iter(v)) for v in by_client.values()} == {0, 1, 2}
    if assignment == "round-robin":
        assert all(by_client[f"c{c}"] == {c % 3} for c in range(30))
    else:
        assert any(by_client[f"c{c}"] != {c % 3} for c in range(30))


def _hit_rate(path: Path, capsys: pytest.CaptureFixture[str]) -> float:
    code = hicache_main(["hitrate", str(path), "--device-tokens", "1e7", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    rate = json.loads(out)["rows"][0]["hit_rate"]
    assert isinstance(rate, float)
    return rate


def test_hitrate_is_higher_with_a_system_prompt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # one turn per client: without a system prompt nothing repeats (hit rate 0); with one,
    # every client after the first finds its 2048 tokens cached
    clients, n, length = 40, 2048, 512
    common = {"clients": clients, "rounds": 1, "request_length": length}
    bare = write_trace(multiturn(**common), tmp_path / "bare.jsonl")
    shared = write_trace(multiturn(**common, system_prompt_length=n), tmp_path / "sys.jsonl")
    without, with_prompt = _hit_rate(bare, capsys), _hit_rate(shared, capsys)
    assert without == 0.0
    assert with_prompt == pytest.approx((clients - 1) * n / (clients * (n + length)))
    assert with_prompt > without


# -- length distributions ---------------------------------------------------------------------


def _log_tolerances(sigma: float, n: int) -> tuple[float, float]:
    """4 standard errors of the sample mean and standard deviation of n normal log-values:
    sigma / sqrt(n) and sigma / sqrt(2 n). A seed fails a 4-SE check with probability
    about 6e-5 per statistic, so the tests hold for almost any seed; rounding lengths to
    integers moves a log by at most 0.5 / length (< 0.01 here), well inside."""
    return 4 * sigma / math.sqrt(n), 4 * sigma / math.sqrt(2 * n)


def test_lognormal_lengths_have_the_asked_mean_and_sigma() -> None:
    mean, sigma = 500.0, 0.6
    trace = multiturn(
        clients=500,
        rounds=4,
        request_length_dist=f"lognormal:{mean},{sigma}",
        output_length_dist="lognormal:200,0.4",
        seed=5,
    )
    sessions = _sessions(trace)
    firsts = [turns[0].input_length for turns in sessions.values()]
    subs = [
        cur.input_length - prev.input_length - prev.output_length
        for turns in sessions.values()
        for prev, cur in itertools.pairwise(turns)
    ]
    outputs = [r.output_length for r in trace]
    # the later questions follow request_length_dist (sub_question_length 0 = the same)
    for values, m, s in ((firsts, mean, sigma), (subs, mean, sigma), (outputs, 200.0, 0.4)):
        logs = [math.log(v) for v in values]
        tol_mu, tol_sigma = _log_tolerances(s, len(values))
        # MEAN is the mean of the lengths, not their median: mu = ln MEAN - sigma^2 / 2 (a
        # median reading would be off by sigma^2 / 2 = 0.18, far outside tol_mu = 0.11)
        assert statistics.fmean(logs) == pytest.approx(math.log(m) - s * s / 2, abs=tol_mu)
        assert statistics.pstdev(logs) == pytest.approx(s, abs=tol_sigma)
        # and the arithmetic mean is near MEAN: 4 SE of a lognormal sample's mean
        se = m * math.sqrt(math.exp(s * s) - 1) / math.sqrt(len(values))
        assert statistics.fmean(values) == pytest.approx(m, abs=4 * se)


def test_uniform_and_fixed_lengths() -> None:
    trace = multiturn(
        clients=50,
        rounds=3,
        sub_question_length=77,
        request_length_dist="uniform:100,300",
        output_length_dist="uniform:5,5",
        think_time_dist="uniform:100,200",
        think_time_ms=10.0,
    )
    sessions = _sessions(trace)
    firsts = [t[0].input_length for t in sessions.values()]
    assert all(100 <= x <= 300 for x in firsts) and len(set(firsts)) > 20
    for turns in sessions.values():
        for prev, cur in itertools.pairwise(turns):
            # sub_question_length set: the later questions stay fixed
            assert cur.input_length - prev.input_length - prev.output_length == 77
            assert cur.think_time_ms is not None and 100 <= cur.think_time_ms <= 200
            assert cur.timestamp >= prev.timestamp + cur.think_time_ms
    assert {r.output_length for r in trace} == {5}


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"request_length_dist": "normal:3,4"}, "request_length_dist must be fixed, lognormal"),
        ({"output_length_dist": "lognormal:0,1"}, "MEAN > 0"),
        ({"think_time_dist": "uniform:5,1"}, "0 <= LO <= HI"),
        ({"request_length_dist": "lognormal:5"}, "request_length_dist must be"),
        ({"request_length_dist": "uniform:1,nan"}, "request_length_dist must be"),
        ({"system_prompts": 0}, "system_prompts must be > 0"),
        ({"system_prompt_assignment": "zipf"}, "system_prompt_assignment must be one of"),
    ],
)
def test_bad_options(params: dict[str, Any], match: str) -> None:
    with pytest.raises(TraceParamError, match=match):
        multiturn(clients=2, **params)


def test_bad_dist_on_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["gen", "multiturn", "--request-length-dist", "lognormal:x,1"]
    assert trace_main([*argv, "--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hicache-sim: trace gen: request_length_dist must be fixed")
    assert not (tmp_path / "x.jsonl").exists()


# -- --fit ----------------------------------------------------------------------------------

KNOWN = {
    "request_length_dist": (800.0, 0.5),
    "sub_question_length_dist": (200.0, 0.7),
    "output_length_dist": (150.0, 0.4),
    "think_time_dist": (2000.0, 0.8),
}


def _known_trace(seed: int = 3) -> Trace:
    dists = {k: f"lognormal:{m},{s}" for k, (m, s) in KNOWN.items()}
    return multiturn(clients=500, rounds=4, seed=seed, **dists)


def _check_fit(fitted: dict[str, str], trace: Trace) -> None:
    sizes = {
        "request_length_dist": 500,  # first turns
        "sub_question_length_dist": 1500,  # 3 later turns per client
        "output_length_dist": 2000,
        "think_time_dist": 1500,
    }
    assert set(fitted) == set(KNOWN)
    for name, (m, s) in KNOWN.items():
        d = parse_dist(name, fitted[name])
        assert d.kind == "lognormal"
        n = sizes[name]
        _, tol_sigma = _log_tolerances(s, n)
        assert d.b == pytest.approx(s, abs=tol_sigma), name
        # MEAN = exp(mu + sigma^2 / 2); by the delta method its relative standard error is
        # sqrt(sigma^2 / n + sigma^4 / (2 n)): 4 of them
        rel = 4 * math.sqrt(s * s / n + s**4 / (2 * n))
        assert d.a == pytest.approx(m, rel=rel), name


def test_fit_recovers_known_parameters() -> None:
    trace = _known_trace()
    fitted = fit_multiturn(trace)
    _check_fit(fitted, trace)
    # a trace without sessions or think times fits only what it has
    flat = Trace(
        requests=[
            Request(timestamp=i, input_length=100 + i, output_length=i, hash_ids=[i])
            for i in range(1, 50)
        ],
        header=trace.header,
    )
    assert set(fit_multiturn(flat)) == {"request_length_dist", "output_length_dist"}


def test_fit_on_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write_trace(_known_trace(), tmp_path / "known.jsonl")
    out = tmp_path / "fitted.jsonl"
    argv = ["gen", "multiturn", "--clients", "500", "--rounds", "4", "--seed", "9"]
    assert trace_main([*argv, "--fit", str(source), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    fitted = {k: v for k, v in summary["params"].items() if k.endswith("_dist")}
    _check_fit(fitted, read_trace(source))
    made = read_trace(out)
    assert made.header.extra["fitted_from"] == str(source)
    assert made.header.extra["params"]["request_length_dist"] == fitted["request_length_dist"]
    # the generated trace has the fitted shape too: fitting it again lands near the source
    _check_fit(fit_multiturn(made), made)
    # --fit and an explicit distribution do not mix
    bad = [*argv, "--fit", str(source), "--output-length-dist", "fixed"]
    assert (
        trace_main([*bad, "--output-length-dist", "uniform:1,2", "--out", str(out), "--force"]) == 2
    )
    assert "--fit replaces the length distributions" in capsys.readouterr().err


# -- agentic subagents ----------------------------------------------------------------------


def test_no_subagents_by_default_and_parents_unchanged() -> None:
    base = {"sessions": 6, "steps": 5, "seed": 4}
    plain = agentic(**base)
    assert all("::sa:" not in (r.session_id or "") for r in plain)
    fanned = agentic(**base, subagents=2, fanout_probability=0.6)
    parents = [r for r in fanned if "::sa:" not in (r.session_id or "")]

    # the parents draw from their own generator: same lengths with and without subagents
    # (their times move: a step after a fan-out waits for the subagents)
    def shape(requests: list[Request]) -> list[tuple[Any, ...]]:
        return sorted((r.session_id, r.turn, r.input_length, r.output_length) for r in requests)

    assert shape(parents) == shape(list(plain))
    assert len(fanned) > len(plain)


def test_subagents_share_the_parents_prefix() -> None:
    bs, k_sub, sub_steps = 64, 3, 2
    trace = agentic(
        sessions=5,
        steps=4,
        subagents=k_sub,
        fanout_probability=1.0,
        subagent_steps=sub_steps,
        block_size=bs,
        seed=2,
    )
    sessions = _sessions(trace)
    subs = {s: turns for s, turns in sessions.items() if "::sa:" in s}
    # every step but the last fans out to K subagents of subagent_steps turns each
    assert len(subs) == 5 * 3 * k_sub
    for name, turns in subs.items():
        parent_name, _, where = name.partition("::sa:")
        step = int(where.split(".")[0])
        parent = sessions[parent_name]
        spawn = parent[step]
        spawned_at = spawn.input_length + spawn.output_length
        shared = spawned_at // bs
        first = turns[0]
        assert [r.turn for r in turns] == list(range(sub_steps))
        assert first.think_time_ms is None and turns[1].think_time_ms is not None
        assert first.timestamp == spawn.timestamp  # starts with the parent's step
        # its prompt: the parent's full blocks at the spawn (context + output), then its own
        assert _ids(first)[:shared] == _ids(parent[step + 1])[:shared]
        assert _ids(first)[: len(_ids(spawn)) - 1] == _ids(spawn)[:-1]
        assert token_ids_of(first)[: shared * bs] == token_ids_of(parent[step + 1])[: shared * bs]
        assert first.input_length > spawned_at
        # nothing after the shared blocks is anyone else's
        own = _ids(first)[shared]
        assert all(own not in _ids(r) for s, t in sessions.items() if s != name for r in t)
        for prev, cur in itertools.pairwise(turns):
            assert token_ids_of(cur)[: prev.input_length] == token_ids_of(prev)
        # the parent's next step comes after the subagents' last step
        assert parent[step + 1].timestamp >= turns[-1].timestamp
        nxt = parent[step + 1]
        assert nxt.think_time_ms == pytest.approx(nxt.timestamp - spawn.timestamp, abs=2e-3)


def test_subagents_raise_the_hit_rate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a subagent re-reads its parent's context: its first prompt mostly hits
    trace = agentic(sessions=4, steps=4, subagents=2, fanout_probability=1.0, block_size=64)
    subs = [r for r in trace if r.session_id and r.session_id.endswith(".0") and r.turn == 0]
    assert subs
    path = write_trace(trace, tmp_path / "a.jsonl")
    code = hicache_main(["hitrate", str(path), "--device-tokens", "1e7", "--json"])
    assert code == 0
    with_subs = json.loads(capsys.readouterr().out)["rows"][0]["hit_rate"]
    path = write_trace(agentic(sessions=4, steps=4, block_size=64), tmp_path / "b.jsonl")
    assert hicache_main(["hitrate", str(path), "--device-tokens", "1e7", "--json"]) == 0
    without = json.loads(capsys.readouterr().out)["rows"][0]["hit_rate"]
    assert with_subs > without


def test_bad_subagent_options() -> None:
    with pytest.raises(TraceParamError, match="fanout_probability must be in"):
        agentic(subagents=1, fanout_probability=1.5)
    with pytest.raises(TraceParamError, match="subagent_steps must be > 0"):
        agentic(subagents=1, subagent_steps=0)
