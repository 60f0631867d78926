"""`trace convert --from openai`: OpenAI chat-completions logs, tokenized with a tokenizer
made here (tokenizers WordLevel) and a jinja chat template, or block-hashed (--hash-text)."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.importers.openai_chat import ChatOptions, read_openai_chat
from traces.io import read_trace
from traces.schema import TraceParamError
from traces.stats import infinite_capacity_hit_rate

SYSTEM = "You are a careful assistant for the finance team of a large company . " * 16
TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> "
    "{% endfor %}{% if add_generation_prompt %}<assistant> {% endif %}"
)
T0 = 1_700_000_000.0  # unix seconds of the first request


def write_chat_log(path: Path, conversations: int = 4, turns: int = 3) -> list[dict[str, Any]]:
    """Write a chat log: `conversations` conversations of `turns` turns sharing SYSTEM.
    Even conversations name their session (``session_id``); odd ones do not (each turn's
    messages extend the previous turn's messages and reply). Turn k of conversation c
    arrives at T0 + c + 10 k seconds and takes 2 s (``latency``); replies have c + 3
    tokens. Returns the lines written."""
    lines = []
    for k in range(turns):
        for c in range(conversations):
            msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
            for j in range(k + 1):
                msgs.append({"role": "user", "content": f"question {j} of client {c} about q{j}"})
                if j < k:
                    msgs.append({"role": "assistant", "content": f"answer {j} for {c}"})
            line: dict[str, Any] = {
                "timestamp": T0 + c + 10 * k,
                "latency": 2.0,
                "request": {"model": "m", "messages": msgs},
                "response": {
                    "choices": [
                        {"message": {"role": "assistant", "content": f"answer {k} for {c}"}}
                    ],
                    "usage": {"completion_tokens": c + 3},
                },
            }
            if c % 2 == 0:
                line["session_id"] = f"client-{c}"
            lines.append(line)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return lines


def make_tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer trained on the log's words, with a tokenizer_config.json that
    holds TEMPLATE; returns the folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = [SYSTEM, "<system> <user> <assistant> </s> <bos> question answer of client about for"]
    words += [f"q{i} {i}" for i in range(10)]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(words, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "bos_token": {"content": "<bos>"}, "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_tokenized_sessions_turns_and_think_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "chat.jsonl"
    write_chat_log(log)
    tok = make_tokenizer(tmp_path / "tok")
    out = tmp_path / "chat_trace.jsonl"
    # detected from the content (no --from)
    assert main(["trace", "convert", str(log), str(out), "--tokenizer", str(tok)]) == 0
    assert "12 requests, 4 sessions" in capsys.readouterr().out
    trace = read_trace(out)
    assert trace.header.extra["chat_template"].endswith("tokenizer_config.json")
    reqs = list(trace.requests)
    assert len(reqs) == 12 and all(r.token_ids is not None for r in reqs)
    by_session: dict[str, list[Any]] = {}
    for r in reqs:
        by_session.setdefault(r.session_id or "", []).append(r)
    assert sorted(by_session) == ["client-0", "client-2", "conv-0", "conv-1"]
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        # arrivals 10 s apart, 2 s of latency: 8 s of think time
        assert [r.think_time_ms for r in turns] == [None, 8000.0, 8000.0]
        for a, b in itertools.pairwise(turns):
            assert b.token_ids[: len(a.token_ids)] == a.token_ids  # a turn extends the last
    # the rendered template, tokenized: <bos> first, no unknown words
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok / "tokenizer.json")).get_vocab()
    assert reqs[0].token_ids[0] == vocab["<bos>"] and vocab["[UNK]"] not in reqs[0].token_ids
    assert [r.output_length for r in by_session["client-2"]] == [5, 5, 5]
    assert infinite_capacity_hit_rate(trace, 1) > 0.5  # the system prompt and the history
    stats = roundtrip(out, tmp_path, capsys, requests=12)
    assert stats["sessions"]["sessions"] == 4  # type: ignore[index]


def test_hash_text_shares_prefix_blocks_and_writes_no_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "chat.jsonl"
    write_chat_log(log, conversations=6)
    out = tmp_path / "hashed.jsonl"
    args = ["trace", "convert", str(log), str(out), "--from", "openai", "--hash-text"]
    assert main([*args, "--block-size", "64"]) == 0
    capsys.readouterr()
    assert "finance" not in out.read_text() and "question" not in out.read_text()
    trace = read_trace(out)
    assert trace.block_size == 64 and trace.header.extra["chat_template"] == "builtin-plain"
    reqs = list(trace.requests)
    first = reqs[0]
    rendered = f"<|system|>\n{SYSTEM}\n<|user|>\nquestion 0 of client 0 about q0\n<|assistant|>\n"
    assert first.input_length == -(-len(rendered.encode()) // 4)
    assert len(first.hash_ids or []) == -(-first.input_length // 64)
    # every first turn shares the system prompt's full 256-byte chunks (64 tokens x 4 bytes)
    shared = len(f"<|system|>\n{SYSTEM}".encode()) // 256
    assert shared >= 4
    turn0 = [r for r in reqs if r.turn == 0]
    assert len(turn0) == 6
    assert all((r.hash_ids or [])[:shared] == (first.hash_ids or [])[:shared] for r in turn0)
    assert len({(r.hash_ids or [])[-1] for r in turn0}) == 6  # the questions differ
    stats = roundtrip(out, tmp_path, capsys, requests=18)
    rates = stats["prefix_cache"]["infinite_capacity_hit_rate"]  # type: ignore[index]
    assert rates["64"] > 0.5


@pytest.mark.parametrize(
    ("bad", "field", "says"),
    [
        ({"messages": "hi"}, "messages", "non-empty list"),
        ({"messages": [{"content": "x"}]}, "messages[0]", "string 'role'"),
        ({"timestamp": "yesterday", "messages": [{"role": "user", "content": "x"}]}, "timestamp",
         "ISO 8601"),
        ({"messages": [{"role": "user", "content": "x"}]}, "response", "usage.completion_tokens"),
        ("[1, 2]", "line", "JSON object"),
    ],
)  # fmt: skip
def test_malformed_line_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: Any, field: str, says: str
) -> None:
    log = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    log.write_text(
        json.dumps(good) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n"
    )
    out = tmp_path / "o.jsonl"
    assert main(["trace", "convert", str(log), str(out), "--from", "openai", "--hash-text"]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(log), "2", field)
    assert says in m["problem"] and not out.exists()


def test_needs_a_tokenizer_or_hash_text_and_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "chat.jsonl"
    write_chat_log(log, conversations=1, turns=1)
    assert main(["trace", "convert", str(log), str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tokenizer" in err and "--hash-text" in err
    tok = make_tokenizer(tmp_path / "tok")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    with pytest.raises(TraceParamError, match=r"pip install 'hicache-sim\[import\]'"):
        read_openai_chat(log, ChatOptions(tokenizer=tok))


def test_unknown_jsonl_object_lists_the_known_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "what.jsonl"
    src.write_text(json.dumps({"prompt": "hello", "completion": "hi"}) + "\n")
    assert main(["trace", "convert", str(src), str(tmp_path / "o.jsonl")]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert m["line"] == "1" and "OpenAI chat request (messages)" in m["problem"]
