"""Cache-only replay (`sim.hitrate`, `hicache-sim hitrate`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from hicache.lifecycle import PagedRequest
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.io import read_trace
from traces.stats import infinite_capacity_hit_rate

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
SYNTH = sorted((DATA / "synthetic").glob("*.jsonl"))
MOONCAKE_SYNTH = DATA / "mooncake" / "synthetic_trace.jsonl"


def R(symbols: list[int], output: int = 0) -> PagedRequest:
    return PagedRequest(symbols, len(symbols), output)


def test_hand_computed_device_only() -> None:
    reqs = [
        R(list(range(1, 11)), output=2),  # nothing cached yet
        R(list(range(1, 16))),  # matches the 10-token prompt (outputs are unique)
        R(list(range(1, 6)) + list(range(20, 25))),  # matches 5 (splits the node)
    ]
    res = replay(reqs, HitRateConfig(device_tokens=100, host_tokens=0, page_size=1))
    assert (res.prompt_tokens, res.device_hit_tokens, res.host_hit_tokens) == (35, 15, 0)
    assert res.hit_rate == pytest.approx(15 / 35)
    assert res.tokens_written == 0 and res.device_evicted_tokens == 0


def test_hand_computed_with_host_tier() -> None:
    a = list(range(1, 11))
    reqs = [
        R(a),  # A written through (10)
        R(list(range(30, 42))),  # needs 12, 6 free: evict(12) demotes A; B written (12)
        R([*a, 50, 51]),  # host hit 10: load needs 10, 4 free: evict(10) demotes B; +2 written
    ]
    res = replay(reqs, HitRateConfig(device_tokens=16, host_tokens=40, page_size=1))
    assert (res.prompt_tokens, res.device_hit_tokens, res.host_hit_tokens) == (34, 0, 10)
    assert res.tokens_written == 24 and res.tokens_loaded == 10
    assert res.device_evicted_tokens == 22 and res.host_evicted_tokens == 0


def test_match_never_uses_the_last_prompt_token() -> None:
    reqs = [R(list(range(1, 11))), R(list(range(1, 11)))]
    res = replay(reqs, HitRateConfig(device_tokens=100, host_tokens=0, page_size=1))
    assert res.device_hit_tokens == 9  # SGLang matches input_len - 1 tokens


@pytest.mark.parametrize("path", [*SYNTH, MOONCAKE_SYNTH], ids=lambda p: p.name)
def test_unlimited_capacity_equals_infinite_capacity_hit_rate(path: Path) -> None:
    trace = read_trace(path)
    p = 64
    reqs = requests_for(trace, p)
    huge = 1 << 30
    for host in (0, 2 * huge):
        res = replay(reqs, HitRateConfig(device_tokens=huge, host_tokens=host, page_size=p))
        assert res.hit_rate == pytest.approx(infinite_capacity_hit_rate(trace, p), abs=1e-12)
        assert res.host_hit_tokens == 0


def test_hit_rate_never_drops_when_host_grows() -> None:
    trace = read_trace(MOONCAKE_SYNTH)
    p = 64
    reqs = requests_for(trace, p)
    dev = 300_032
    rates = [
        replay(reqs, HitRateConfig(dev, host, p, "lru", "write_through")).hit_rate
        for host in (0, 2 * dev, 4 * dev, 8 * dev, 16 * dev)
    ]
    assert rates == sorted(rates), rates
    assert rates[-1] > rates[0]


def test_no_host_tier_ignores_write_policy_and_never_touches_host() -> None:
    trace = read_trace(MOONCAKE_SYNTH)
    reqs = requests_for(trace, 64)
    results = [
        replay(reqs, HitRateConfig(400_000, 0, 64, "lru", wp)).as_dict()
        for wp in ("write_through", "write_through_selective", "write_back")
    ]
    assert results[0] == results[1] == results[2]
    assert results[0]["host_hit_tokens"] == results[0]["tokens_written"] == 0


@pytest.mark.parametrize("dev", [200_000, 1_000_000])
def test_oracle_is_never_worse_than_lru(dev: int) -> None:
    trace = read_trace(MOONCAKE_SYNTH)
    reqs = requests_for(trace, 64)
    for host in (0, 2 * dev):
        lru = replay(reqs, HitRateConfig(dev, host, 64, "lru")).hit_rate
        oracle = replay(reqs, HitRateConfig(dev, host, 64, "oracle")).hit_rate
        assert oracle >= lru, (dev, host, lru, oracle)


def test_outputs_skip_still_counts_the_second_hit() -> None:
    # write_through_selective writes a prompt at its second insert, which is the finish insert
    reqs = [R(list(range(1, 21)), output=5)]
    for outputs in ("cache", "skip"):
        res = replay(reqs, HitRateConfig(64, 256, 1, "lru", "write_through_selective", outputs))
        assert res.tokens_written == 20 if outputs == "skip" else res.tokens_written >= 20


# ------------------------------------------------------------------------------------- CLI --
def test_cli_grid_csv_json_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = DATA / "synthetic" / "multiturn.jsonl"
    rc = main(
        [
            "hitrate", str(trace), "--device-tokens", "4096,16384", "--host-tokens", "0,65536",
            "--eviction", "lru,oracle", "--jobs", "2", "--json", "--sglang-version", "0.5.14",
            "--csv", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "t.png"),
        ]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert len(rows) == 8
    assert (tmp_path / "t.csv").read_text().count("\n") == 9
    assert (tmp_path / "t.png").stat().st_size > 1000
    for r in rows:
        assert r["hit_rate"] == pytest.approx(r["device_hit_rate"] + r["host_hit_rate"])
        assert r["hit_rate"] <= r["infinite_capacity_hit_rate"] + 1e-12


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device-tokens", "1024", "--eviction", "random"], "unknown eviction policy"),
        # a count that is not a page multiple is rounded down with a note; under one page is
        # an error
        (["--device-tokens", "10", "--page-size", "64"], "less than one page"),
        (
            ["--device-tokens", "4096", "--host-tokens", "4096", "--sglang-version", "0.5.14"],
            "must be larger than the device",
        ),  # 0.5.23 allows it (with SGLang's warning)
        (["--device-tokens", "4096", "--write-policy", "later"], "unknown write policy"),
        (["--device-tokens", "4096", "--hicache-ratio", "0.5"], "must be larger than the device"),
    ],
)
def test_cli_bad_arguments(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["hitrate", str(DATA / "synthetic" / "multiturn.jsonl"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cli_unreadable_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["hitrate", str(tmp_path / "missing.jsonl"), "--device-tokens", "4096"])
    assert rc == 2 and "missing.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": []}\n')
    rc = main(["hitrate", str(bad), "--device-tokens", "4096"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.jsonl:1:" in err


@pytest.mark.parametrize("page_size", [1, 4, 64])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_replay_keeps_every_invariant_under_pressure(page_size: int, write_policy: str) -> None:
    """Small pools so eviction, host eviction and load-back happen constantly; after every
    request all pages are back with the tree or the free lists, each owned exactly once."""
    from sim.hitrate import CacheReplay

    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    reqs = requests_for(trace, page_size)
    dev = 6144 // page_size * page_size
    rp = CacheReplay(HitRateConfig(dev, 2 * dev, page_size, "lru", write_policy))
    for r in reqs[:120]:
        rp.step(r)
        rp.cache.check_invariants(device_pages_outside=[])
    res = rp.finish()
    assert res.device_evicted_tokens > 0 and res.host_hit_tokens > 0
