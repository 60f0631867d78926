"""Issue 26 item 4: a warm-up window left out of the summary (``workload.warmup_s``) and
repeated runs over resampled traces with intervals (``hicache-sim run --seeds K``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main
from hicache.config import load_config
from sim.metrics import RequestRow, TransferRow, request_frame, summarize
from sim.seeds import SEED_METRICS, seed_intervals
from traces.resample import resample_sessions, session_groups
from traces.schema import Request, Trace

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
TRACE = DATA / "synthetic" / "multiturn.jsonl"
SMALL = ["--set", "gpu.device_tokens=65536"]


def _row(rid: int, arrival: float, *, prompt: int, dev: int, host: int) -> RequestRow:
    # admitted 0.5 s after arrival, first token 1 s after, finished 2 s after, 3 outputs
    return RequestRow(rid, arrival, arrival + 0.5, arrival + 1.0, arrival + 2.0, 0.1, 0.0,
                      prompt, 3, dev, host, 0, prompt - dev - host, rid % 2)  # fmt: skip


def _frames() -> dict[str, pd.DataFrame]:
    rows = [
        _row(0, 0.0, prompt=100, dev=0, host=0),
        _row(1, 1.0, prompt=100, dev=50, host=0),
        _row(2, 2.0, prompt=100, dev=20, host=30),
        _row(3, 3.0, prompt=200, dev=100, host=100),
    ]
    copies = [
        TransferRow("d2h", "write", 1000, 1, 1, 0.5, 0.5, 0.6),
        TransferRow("h2d", "load", 300, 1, 1, 1.9, 2.1, 2.2),
        TransferRow("d2h", "write", 20, 1, 1, 2.5, 2.5, 2.6),
    ]
    return {
        "requests": request_frame(rows),
        "transfers": pd.DataFrame(copies, columns=list(TransferRow._fields)),
    }


def test_warmup_leaves_out_exactly_the_early_arrivals() -> None:
    # window [0, 1.5): requests 0 and 1 ran but count nowhere; 2 and 3 are measured
    s = summarize(_frames(), 10.0, 0.0, warmup_s=1.5)
    assert s["warmup_requests"] == 2 and s["warmup_end_s"] == 1.5 and s["warmup_s"] == 1.5
    assert s["requests"] == s["finished_requests"] == 2
    assert s["prompt_tokens"] == 300
    assert s["hit_rate"] == pytest.approx(250 / 300)
    assert s["device_hit_rate"] == pytest.approx(120 / 300)
    assert s["host_hit_rate"] == pytest.approx(130 / 300)
    assert s["ttft_p50_s"] == pytest.approx(1.0) and s["queue_mean_s"] == pytest.approx(0.5)
    assert s["retractions"] == 1  # rid 2: 0, rid 3: 1
    # copies that started after the window; output tokens over the time after it
    assert s["bytes_d2h"] == 20 and s["bytes_h2d"] == 300
    assert s["throughput_output_tok_s"] == pytest.approx(6 / (10.0 - 1.5))


def test_no_warmup_is_the_summary_as_before() -> None:
    frames = _frames()
    plain = summarize(frames, 10.0, 0.0)
    same = summarize(frames, 10.0, 0.0, warmup_s=0.0)
    assert json.dumps(same, sort_keys=True) == json.dumps(plain, sort_keys=True)  # NaN too
    assert not any(k.startswith("warmup") for k in plain)
    assert plain["requests"] == 4 and plain["bytes_d2h"] == 1020
    assert plain["throughput_output_tok_s"] == pytest.approx(12 / 10.0)
    # a window before the second arrival leaves out the first request only
    assert summarize(frames, 10.0, 0.0, warmup_s=1.0)["warmup_requests"] == 1


def test_run_marks_the_warmup_requests_and_keeps_them_all(tmp_path: Path) -> None:
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    cfg = load_config(None, ["gpu.device_tokens=65536", "workload.warmup_s=5"])
    s = run_simulation(cfg, trace, tmp_path / "r", progress=False)
    req = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    assert len(req) == len(trace)  # every request is in the table ...
    early = req["warmup"].to_numpy()
    assert early.sum() == s["warmup_requests"] > 0  # ... marked
    assert s["requests"] == len(req) - s["warmup_requests"]
    assert (req.loc[early, "arrival_s"] < 5).all() and (req.loc[~early, "arrival_s"] >= 5).all()
    done = req[~early & (req["finish_s"] >= 0)]
    hits = done[["device_hit_tokens", "host_hit_tokens", "storage_hit_tokens"]].sum().sum()
    assert s["hit_rate"] == pytest.approx(hits / done["prompt_tokens"].sum())
    on_disk = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert on_disk["warmup_requests"] == s["warmup_requests"]


def test_fleet_instances_share_the_fleets_window() -> None:
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(TRACE)
    sets = ["gpu.device_tokens=65536", "cluster.instances=2", "workload.warmup_s=5"]
    s = run_simulation(load_config(None, sets), trace, progress=False)
    per = s["per_instance"]
    assert sum(p["warmup_requests"] for p in per) == s["warmup_requests"]
    assert all(p["warmup_end_s"] == s["warmup_end_s"] for p in per)
    assert sum(p["requests"] for p in per) == s["requests"]


def _req(t: float, session: str | None, turn: int | None = None, think: float | None = None,
         ids: list[int] | None = None) -> Request:  # fmt: skip
    return Request(t, 64, 4, hash_ids=ids or [0], session_id=session, turn=turn,
                   think_time_ms=think)  # fmt: skip


def _session_trace() -> Trace:
    reqs = []
    for s in range(12):
        start = 1000.0 * s
        for k in range(s % 3 + 1):  # sessions of 1-3 turns, 250 ms apart
            think = None if k == 0 else 100.0 + s
            reqs.append(_req(start + 250.0 * k, f"s{s}", k, think, [s * 10 + k]))
    reqs += [_req(500.0 + 1000 * i, None, ids=[999 + i]) for i in range(3)]
    reqs.sort(key=lambda r: r.timestamp)
    return Trace(requests=reqs)


def test_resampling_keeps_sessions_whole() -> None:
    trace = _session_trace()
    assert resample_sessions(trace, 0) is trace
    out = resample_sessions(trace, 7)
    assert out == resample_sessions(trace, 7)  # a seed is reproducible
    assert [r.timestamp for r in out] != [r.timestamp for r in trace]
    assert [r.timestamp for r in out] == sorted(r.timestamp for r in out)
    assert out.header.extra["resampled"]["seed"] == 7
    assert len(out) == len(trace)
    assert out[0].timestamp == trace[0].timestamp  # the run's time 0 stays
    assert max(r.timestamp for r in out) <= max(r.timestamp for r in trace)

    Turn = tuple[object, float]  # (turn, think time, prompt), timestamp

    def sessions(t: Trace) -> dict[object, list[Turn]]:
        by: dict[object, list[Turn]] = {}
        for r in t:
            key = r.session_id or tuple(r.hash_ids or [])
            by.setdefault(key, []).append(((r.turn, r.think_time_ms, r.hash_ids), r.timestamp))
        return by

    before, after = sessions(trace), sessions(out)
    assert before.keys() == after.keys()
    starts = [turns[0][1] for turns in before.values()]
    last = max(r.timestamp for r in trace)
    for key, turns in before.items():
        moved = after[key]
        assert [m[0] for m in moved] == [t[0] for t in turns]  # turns, think times, prompts
        shift = moved[0][1] - turns[0][1]
        assert all(m[1] - t[1] == pytest.approx(shift) for m, t in zip(moved, turns, strict=True))
        # each session takes another's start (or earlier, to end within the trace's span)
        length = turns[-1][1] - turns[0][1]
        assert moved[0][1] in starts or moved[0][1] == pytest.approx(last - length)


def test_mooncake_conversations_are_found_from_prefix_hash_ids() -> None:
    reqs = [
        _req(0, None, ids=[0, 1, 2]),  # A
        _req(1, None, ids=[0, 5, 6]),  # C: shares only the system block 0 with A
        _req(2, None, ids=[0, 1, 2, 3, 4]),  # B continues A (it holds A's last full block 1)
        _req(3, None, ids=[0, 7]),  # D: its last full block (0) is not its own
        _req(4, None, ids=[0, 7, 8]),  # E: extends D's prefix, which D did not own
        _req(5, None, ids=[0, 1, 2, 3, 9]),  # F continues B (block 3)
        _req(6, None, ids=[0, 1, 10]),  # G: A was already continued (by B)
    ]
    assert session_groups(reqs) == [[0, 2, 5], [1], [3], [4], [6]]
    assert session_groups(reqs, infer=False) == [[i] for i in range(7)]
    tokens = [Request(0, 3, 1, token_ids=[1, 2, 3]), Request(1, 4, 1, token_ids=[1, 2, 3, 4])]
    assert session_groups(tokens) == [[0], [1]]


def test_intervals_contain_the_median() -> None:
    import random

    rng = random.Random(3)
    runs = [{k: rng.random() for k in SEED_METRICS} for _ in range(7)]
    runs[2]["ttft_p99_s"] = float("nan")  # a run without the figure is left out of it
    iv = seed_intervals(runs)
    assert set(iv) == set(SEED_METRICS)
    for key, v in iv.items():
        assert v["lo"] <= v["median"] <= v["hi"]
        values = [r[key] for r in runs if not math.isnan(r[key])]
        assert min(values) <= v["lo"] and v["hi"] <= max(values)
    one = seed_intervals(runs[:1])
    assert all(v["lo"] == v["median"] == v["hi"] == runs[0][k] for k, v in one.items())


def _read(out: Path) -> dict[str, object]:
    s = json.loads((out / "summary.json").read_text())
    s.pop("wall_time_s")
    return s  # type: ignore[no-any-return]


def test_one_seed_is_the_plain_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(TRACE), "--out", str(tmp_path / "plain"), *SMALL]) == 0
    assert main(["run", str(TRACE), "--out", str(tmp_path / "k1"), *SMALL, "--seeds", "1"]) == 0
    plain, k1 = _read(tmp_path / "plain"), _read(tmp_path / "k1")
    seeds = k1.pop("seeds")
    assert json.dumps(k1, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert seeds["runs"][0]["seed"] == 0  # type: ignore[index]
    for name in ("requests", "transfers", "timeline"):
        a = pd.read_parquet(tmp_path / "plain" / f"{name}.parquet")
        pd.testing.assert_frame_equal(a, pd.read_parquet(tmp_path / "k1" / f"{name}.parquet"))


def test_seeds_print_and_record_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r"
    assert main(["run", str(TRACE), "--out", str(out), *SMALL, "--seeds", "3"]) == 0
    text = capsys.readouterr().out
    assert "seeds: 3 runs (run.seed 0-2" in text
    for label in ("hit rate", "TTFT p90", "TPOT mean", "output tok/s"):
        assert label in text
    block = json.loads((out / "summary.json").read_text())["seeds"]
    assert [r["seed"] for r in block["runs"]] == [0, 1, 2]
    assert block["interval"] == [0.05, 0.95]
    for v in block["intervals"].values():
        assert v["lo"] <= v["median"] <= v["hi"]
    # every replica replays the same requests (a permutation keeps them all)
    assert len({r["requests"] for r in block["runs"]}) == 1
