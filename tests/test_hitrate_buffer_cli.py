"""``hicache-sim hitrate --host-memory-mode buffer_only``: the option reaches the replay, the
host pool defaults to SGLang's 1.2 x device in that mode, write_back is said to resolve to
write_through, and a missing L3 store is an error naming the option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

TRACE = Path(__file__).resolve().parent.parent / "traces/data/mooncake/conversation_trace.jsonl"
BASE = ["hitrate", str(TRACE), "--device-tokens", "1000000", "--max-requests", "200", "--jobs", "1"]


def test_buffer_only_rows_have_no_host_hits_and_a_smaller_default_pool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*BASE, "--storage-tokens", "unlimited", "--json"]
    assert main([*args, "--host-memory-mode", "buffer_only"]) == 0
    (buf,) = json.loads(capsys.readouterr().out)["rows"]
    assert main(args) == 0
    (cache,) = json.loads(capsys.readouterr().out)["rows"]
    # 1.2 and 2.0 x 1,000,000 tokens, in pages of 64 (one page of SGLang's padding each)
    assert (buf["host_tokens"], cache["host_tokens"]) == (1_200_064, 2_000_064)
    assert buf["host_hit_rate"] == 0 and buf["storage_hit_rate"] > 0
    assert cache["host_hit_rate"] > 0


def test_write_back_is_said_to_resolve(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*BASE, "--storage-tokens", "unlimited", "--host-memory-mode", "buffer_only"]
    assert main([*args, "--write-policy", "write_back"]) == 0
    assert "write_back resolves to write_through" in capsys.readouterr().err


def test_buffer_only_needs_a_store(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--host-memory-mode", "buffer_only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hicache-sim: --host-memory-mode: ") and "storage" in err
