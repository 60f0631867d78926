"""`hicache-sim run`: run directory, determinism, closed-form costs, bad input."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from hicache.config import load_config
from hicache.latency import load_profile
from sim.costs import build_costs

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
TRACE = DATA / "synthetic" / "multiturn.jsonl"
SMALL = ["--set", "gpu.device_tokens=65536"]


def test_run_writes_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    rc = main(["run", str(TRACE), "--out", str(out), *SMALL, "--set", "run.chrome_trace=true"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "hit rate" in text and "TTFT" in text
    # the resolved setup first: GPU, pools in tokens and GB per rank, the loop mode
    assert text.startswith("setup: llama-3-8b on h100-sxm x TP1 (server dgx-h100), SGLang ")
    bpt = 32 * 8 * 128 * 2 * 2  # Llama-3-8B: layers x KV heads x head dim x K,V x bf16
    assert f"pools: device 65,536 tokens ({65536 * bpt / 1e9:,.1f} GB per rank)" in text
    assert "arrivals: closed loop (the trace records think times" in text
    for name in ("config.json", "summary.json", "requests.parquet", "timeline.parquet",
                 "transfers.parquet", "trace.json"):  # fmt: skip
        assert (out / name).exists(), name
    conf = json.loads((out / "config.json").read_text())
    assert conf["model"]["name"] == "llama-3-8b" and conf["model"]["num_layers"] == 32
    summary = json.loads((out / "summary.json").read_text())
    for key in ("requests", "prompt_tokens", "hit_rate", "device_hit_rate", "host_hit_rate",
                "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
                "e2e_mean_s", "throughput_output_tok_s", "bytes_d2h", "bytes_h2d",
                "sim_duration_s", "wall_time_s"):  # fmt: skip
        assert key in summary, key
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == summary["requests"]
    assert summary["hit_rate"] == pytest.approx(
        (req["device_hit_tokens"].sum() + req["host_hit_tokens"].sum()) / req["prompt_tokens"].sum()
    )
    conf = json.loads((out / "config.json").read_text())
    assert conf["config"]["gpu"]["device_tokens"] == 65536 and conf["trace_sha256"]
    trace_events = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert {e.get("tid") for e in trace_events} >= {1, 2}


def test_same_config_gives_identical_results(tmp_path: Path) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["run", str(TRACE), "--out", str(out), *SMALL, "--seed", "3"]) == 0
    a, b = (json.loads((o / "summary.json").read_text()) for o in outs)
    a.pop("wall_time_s")
    b.pop("wall_time_s")
    assert a == b
    for name in ("requests", "timeline", "transfers"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(outs[0] / f"{name}.parquet"),
            pd.read_parquet(outs[1] / f"{name}.parquet"),
        )


def test_copy_costs_are_the_profile_closed_form() -> None:
    """Direct IO: page_first (the default layout) becomes page_first_direct, a copy per page,
    layer and K/V; layer_first merges runs (a copy per run, layer and K/V)."""
    cfg = load_config(None, ["link.io_backend=direct"])
    assert cfg.link.mem_layout == "page_first_direct"
    costs = build_costs(cfg)
    prof = load_profile(None, cfg.gpu.name, cfg.link.name)
    d2h, h2d = prof.link("direct", "d2h"), prof.link("direct", "h2d")
    layers = costs.num_layers
    nbytes = 64 * 131072 * 10
    assert costs.op_time("write", nbytes, 1) == pytest.approx(
        d2h.alpha_s + 2 * 10 * layers * d2h.gamma_s + nbytes / d2h.beta_Bps
    )
    assert costs.op_time("load", nbytes, 3) == pytest.approx(
        layers * h2d.alpha_s + 2 * 10 * layers * h2d.gamma_s + nbytes / h2d.beta_Bps
    )
    lf = build_costs(load_config(None, ["link.io_backend=direct", "link.mem_layout=layer_first"]))
    assert lf.op_time("load", nbytes, 3) == pytest.approx(
        layers * h2d.alpha_s + 2 * 3 * layers * h2d.gamma_s + nbytes / h2d.beta_Bps
    )
    assert costs.bytes_per_page == 64 * 131072


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "cache.write_policy=later"], "cache.write_policy"),
        (["--set", "cache.nonsense=1"], "cache.nonsense"),
        (["--set", "gpu.device_tokens=100"], "gpu.device_tokens"),
        (["--set", "cache.page_size=3"], "page"),
    ],
)
def test_bad_config_one_line_exit_2(
    tmp_path: Path, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["run", str(TRACE), "--out", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and len(err.splitlines()) == 1, err


def test_bad_trace_and_existing_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["run", str(bad), "--out", str(tmp_path / "r")]) == 2
    assert "bad.jsonl:1:" in capsys.readouterr().err
    out = tmp_path / "used"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["run", str(TRACE), "--out", str(out), *SMALL]) == 2
    assert "--force" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text("[cache]\nwrite_policy = 'write_back'\nbogus = 1\n")
    assert main(["run", str(TRACE), "--out", str(tmp_path / "r2"), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "c.toml" in err and "cache.bogus" in err


def test_closed_loop_turns_follow_their_previous_turn(tmp_path: Path) -> None:
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    assert any(r.session_id is not None for r in trace)
    cfg = load_config(None, ["gpu.device_tokens=65536", "workload.closed_loop=on"])
    run_simulation(cfg, trace, tmp_path / "r", progress=False)
    req = pd.read_parquet(tmp_path / "r" / "requests.parquet").set_index("rid")
    by_session: dict[object, list[tuple[int, int]]] = {}
    for i, r in enumerate(trace):
        by_session.setdefault(r.session_id, []).append((r.turn or 0, i))
    checked = 0
    for turns in by_session.values():
        turns.sort()
        for (_, prev), (_, cur) in itertools.pairwise(turns):
            think = (trace[cur].think_time_ms or 0.0) / 1000
            assert req.loc[cur, "arrival_s"] == pytest.approx(req.loc[prev, "finish_s"] + think)
            checked += 1
    assert checked > 10


def test_closed_loop_auto_follows_think_times_not_session_ids(tmp_path: Path) -> None:
    """Issue 13 item 6: a multiturn trace generated without think times keeps its session ids,
    and ``auto`` must replay its timestamps (open loop); the same trace with think times runs
    closed loop."""
    from sim.engine import resolve_closed_loop, run_simulation
    from traces.generate import multiturn

    kw = dict(clients=8, rounds=3, request_length=256, output_length=16, request_rate=4.0)
    open_trace = multiturn(closed_loop=False, **kw)  # type: ignore[arg-type]
    closed_trace = multiturn(closed_loop=True, **kw)  # type: ignore[arg-type]
    assert all(r.session_id is not None for r in open_trace)
    assert all(r.think_time_ms is None for r in open_trace)
    n = len(open_trace)
    assert resolve_closed_loop("auto", open_trace, n) is False
    assert resolve_closed_loop("auto", closed_trace, n) is True
    assert resolve_closed_loop("on", open_trace, n) is True
    assert resolve_closed_loop("off", closed_trace, n) is False
    # only the requests the run uses count: turn 0 of every session carries no think time
    first_turns = sum(1 for r in closed_trace if r.think_time_ms is None)
    ordered = sorted(closed_trace.requests, key=lambda r: r.think_time_ms is not None)
    closed_trace.requests[:] = ordered
    assert resolve_closed_loop("auto", closed_trace, first_turns) is False
    cfg = load_config(None, ["gpu.device_tokens=65536"])
    run_simulation(cfg, open_trace, tmp_path / "open", progress=False)
    conf = json.loads((tmp_path / "open" / "config.json").read_text())
    assert conf["closed_loop"] is False
    req = pd.read_parquet(tmp_path / "open" / "requests.parquet").sort_values("rid")
    stamps = [r.timestamp / 1000 for r in open_trace]
    assert list(req["arrival_s"]) == pytest.approx([t - stamps[0] for t in stamps])


def test_summary_prints_long_times_in_minutes_and_warns_on_overload() -> None:
    from cli.run_output import format_summary

    s = {
        "requests": 3000, "rejected_requests": 0, "sim_duration_s": 2981.1, "wall_time_s": 1.6,
        "hit_rate": 0.05, "device_hit_rate": 0.04, "host_hit_rate": 0.01,
        "ttft_mean_s": 1026.0, "ttft_p50_s": 0.0421, "ttft_p90_s": 12.5, "ttft_p99_s": 9000.0,
        "tpot_mean_s": 0.1003, "e2e_mean_s": float("nan"), "throughput_output_tok_s": 352.0,
        "bytes_d2h": 5.2e12, "bytes_h2d": 2.2e10, "retractions": 6,
        "overloaded": True, "overload_message": "overloaded: requests arrive at 3.04/s ...",
    }  # fmt: skip
    text = format_summary(s)
    assert "TTFT mean 17.1 min  p50 42.1 ms  p90 12.50 s  p99 2.5 h" in text
    assert "TPOT mean 100.3 ms  E2E mean n/a" in text
    assert text.splitlines()[-1] == "WARNING: overloaded: requests arrive at 3.04/s ..."
    s["overloaded"] = False
    assert "WARNING" not in format_summary(s)
