"""``hicache-sim plan``: target parsing, the instance search (with a fake evaluator), the
savings line, and the command end to end on a tiny trace."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from cli.main import main
from studies.plan import (
    ConfigPlan,
    Evaluation,
    Plan,
    PlanConfig,
    Target,
    arrival_span_s,
    parse_target,
    parse_variant,
    savings_lines,
)
from studies.plan.search import Search, find_min_instances, judge, run_searches

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "data" / "synthetic" / "multiturn.jsonl"
KEYS = ("ttft_p90_s", "tpot_mean_s", "hit_rate", "requests")

# --- targets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_p90=2s", ("ttft_p90_s", 2.0)),
        ("ttft_p90_s=2", ("ttft_p90_s", 2.0)),
        ("tpot_mean=50ms", ("tpot_mean_s", 0.05)),
        ("ttft_p90<=1.5min", ("ttft_p90_s", 90.0)),
        (" ttft_p90 = 250 MS ", ("ttft_p90_s", 0.25)),
        ("requests=10", ("requests", 10.0)),
        ("hit_rate>=0.5", ("hit_rate", 0.5)),
        ("hit_rate<=0.5", ("hit_rate", 0.5)),
    ],
)
def test_parse_target(text: str, expected: tuple[str, float]) -> None:
    got = parse_target(text, KEYS)
    assert got.key == expected[0]
    assert got.limit == pytest.approx(expected[1])
    assert got.op == (">=" if ">=" in text else "<=")
    assert parse_target(text).key == expected[0]  # no key list: the unit implies seconds


def test_lower_bounds_are_judged_as_lower_bounds() -> None:
    t = parse_target("hit_rate>=0.5", KEYS)
    assert t.label == "hit_rate >= 0.5"
    assert judge({"hit_rate": 0.6}, [t]).passed
    verdict = judge({"hit_rate": 0.4}, [t])
    assert not verdict.passed and verdict.reason == "hit_rate 0.4 < 0.5"
    assert not judge({"hit_rate": math.nan}, [t]).passed
    assert judge({"ttft_p90_s": 3.0}, [parse_target("ttft_p90=2s", KEYS)]).reason == (
        "ttft_p90_s 3 > 2"
    )


def test_goodput_counts_requests_within_the_slo() -> None:
    import pandas as pd

    from studies.plan.evaluate import goodput
    from studies.plan.targets import parse_slo

    slo = parse_slo("ttft=2s,tpot=50ms")
    assert (slo.ttft_s, slo.tpot_s) == (2.0, 0.05)
    assert parse_slo("tpot=20ms").ttft_s == math.inf
    req = pd.DataFrame({
        "finish_s": [5.0, 5.0, 5.0, -1.0, 5.0],
        "ttft_s": [1.0, 3.0, 1.0, math.nan, 1.5],
        "tpot_s": [0.04, 0.01, 0.06, math.nan, math.nan],  # the last: one output token
    })  # fmt: skip
    # met: the first (both bounds) and the last (TTFT only); missed: a slow TTFT, a slow TPOT,
    # and a rejected request
    assert goodput(req, slo) == pytest.approx(2 / 5)
    for bad in ("ttft", "ttft=2s,ttft=3s", "latency=2s", "ttft=soon", ""):
        with pytest.raises(ValueError, match="--slo"):
            parse_slo(bad)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft_p90", "expected NAME<=VALUE"),
        ("ttft_p90=", "expected NAME<=VALUE"),
        ("=2s", "expected NAME<=VALUE"),
        ("ttft_p90=>2s", "expected NAME<=VALUE"),
        ("ttft_p90=fast", "expected a number"),
        ("ttft_p90=-1s", ">= 0"),
        ("ttft_p90=2h", "expected a number"),
        ("hit_rate=0.5", "hit_rate is better when higher: write hit_rate>=0.5"),
        ("hit_rate>=0.5s", "not in seconds"),
        ("ttft_p95=2s", "unknown summary key 'ttft_p95'; choose from ttft_p90_s, tpot_mean_s"),
    ],
)
def test_parse_target_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--target") as info:
        parse_target(text, KEYS)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_target_label() -> None:
    assert Target("ttft_p90_s", 2.0).label == "ttft_p90 <= 2 s"
    assert Target("tpot_mean_s", 0.05).label == "tpot_mean <= 50 ms"
    assert Target("requests", 3).label == "requests <= 3"


def test_parse_variant() -> None:
    v = parse_variant("big host: cache.hicache_ratio=8, gpu.device_tokens=8192")
    assert v.name == "big host"
    assert v.overrides == ("cache.hicache_ratio=8", "gpu.device_tokens=8192")
    assert parse_variant("base:").overrides == ()
    for bad, message in [
        ("no colon", "expected NAME:"),
        (":cache.hicache_ratio=3", "expected NAME:"),
        ("x:cache.hicache_ratio", "expected SECTION.KEY=VALUE"),
        ("x:cluster.instances=4", "what the plan searches"),
        ("x:router.policy=random", "--router"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_variant(bad)


# --- the search ------------------------------------------------------------------------------


def _latency(c: float, calls: list[int]) -> Callable[[int], dict[str, object]]:
    def evaluate(n: int) -> dict[str, object]:
        calls.append(n)
        return {"ttft_p90_s": c / n, "overloaded": False}

    return evaluate


TARGET = [Target("ttft_p90_s", 1.0)]


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8, 13, 37, 63, 64])
def test_search_finds_the_minimum(c: int) -> None:
    calls: list[int] = []
    s = find_min_instances(_latency(c, calls), TARGET, 64)
    assert s.answer == c  # c / N <= 1 exactly when N >= c
    assert len(calls) == len(set(calls))  # never an N twice
    k = math.ceil(math.log2(c))
    assert len(calls) == (1 if c == 1 else 2 * k)  # doubling k+1, bisection k-1
    assert s.monotone


def test_search_passes_at_one() -> None:
    calls: list[int] = []
    s = find_min_instances(_latency(0.5, calls), TARGET, 64)
    assert (s.answer, calls) == (1, [1])


def test_search_more_than_max() -> None:
    calls: list[int] = []
    s = find_min_instances(_latency(100, calls), TARGET, 10)
    assert s.answer is None
    assert calls == [1, 2, 4, 8, 10]  # doubling capped at the maximum, nothing to bisect


def test_search_max_not_a_power_of_two() -> None:
    calls: list[int] = []
    s = find_min_instances(_latency(9.5, calls), TARGET, 12)
    assert s.answer == 10
    assert calls == [1, 2, 4, 8, 12, 10, 9]


def test_search_bounds_and_no_repeats() -> None:
    s = Search(64)
    assert s.remaining_bound() >= 12
    with pytest.raises(ValueError):
        Search(0)
    s.record(Evaluation(1, False, "", {}))
    with pytest.raises(ValueError, match="evaluated already"):
        s.record(Evaluation(1, False, "", {}))


def test_non_monotone_is_flagged() -> None:
    # a smaller N passes while a larger one fails: the assumption does not hold
    s = Search(8)
    s.record(Evaluation(2, True, "", {}))
    s.record(Evaluation(4, False, "", {}))
    assert not s.monotone


def test_waves_search_configurations_together() -> None:
    waves: list[list[tuple[int, int]]] = []
    limits = [3, 1, 20]

    def run_wave(wave: Sequence[tuple[int, int]]) -> list[dict[str, object]]:
        pairs = list(wave)
        waves.append(pairs)
        return [{"ttft_p90_s": limits[i] / n, "overloaded": False} for i, n in pairs]

    searches = run_searches(3, TARGET, 16, run_wave)
    assert [s.answer for s in searches] == [3, 1, None]
    assert waves[0] == [(0, 1), (1, 1), (2, 1)]
    assert all(len({i for i, _ in w}) == len(w) for w in waves)  # one job per config a wave


def test_overloaded_fails_and_nan_fails() -> None:
    ok = {"ttft_p90_s": 0.1, "overloaded": False}
    assert judge(ok, TARGET).passed
    assert judge({**ok, "overloaded": True}, TARGET) == (False, "overloaded")
    assert not judge({**ok, "ttft_p90_s": float("nan")}, TARGET).passed
    with pytest.raises(ValueError, match="numeric keys: ttft_p90_s"):
        judge(ok, [Target("tpot_p99_s", 1.0)])


def test_overloaded_run_is_not_chosen() -> None:
    def evaluate(n: int) -> dict[str, object]:
        return {"ttft_p90_s": 0.0, "overloaded": n < 5}

    assert find_min_instances(evaluate, TARGET, 64).answer == 5


# --- results ---------------------------------------------------------------------------------


def _config(variant: str, host: bool, router: str = "cache_aware", tp: int = 2) -> PlanConfig:
    config = {"cache": {"enable_host": host}, "model": {"tp": tp}}
    # 8-GPU servers: 4 instances of TP2 on each
    return PlanConfig(variant, router, (), config, 1024, 2048 if host else 0, 1000, tp, 3600.0,
                      8 // tp, f"m on g x TP{tp}")  # fmt: skip


def _plan(base: int | None, tiered: list[int | None], cap: int = 64) -> Plan:
    configs = [ConfigPlan(_config("no host tier", False), base, [], True)]
    for k, n in enumerate(tiered):
        configs.append(ConfigPlan(_config(f"host x{2 * (k + 1)}", True), n, [], True))
    return Plan(TARGET, cap, configs)


def test_savings_line() -> None:
    (line,) = savings_lines(_plan(8, [6, 5]))
    assert line == (
        "cache_aware: HiCache saves 3 instances, 6 GPUs, 0 servers (37.5%; 6 GPU-hours) against "
        "no host tier: 5 instances (10 GPUs, 2 servers) with host x4, 8 instances (16 GPUs, 2 "
        "servers) without"
    )
    (line,) = savings_lines(_plan(8, [5]), gpu_hour_usd=2.5)
    assert "(37.5%; 6 GPU-hours, $15) against" in line
    (line,) = savings_lines(_plan(None, [6], cap=8))
    assert "saves at least 3 instances" in line
    (line,) = savings_lines(_plan(4, [5]))
    assert "needs 1 more instance (25.0%) against" in line  # singular
    (line,) = savings_lines(_plan(6, [5]))
    assert "HiCache saves 1 instance, 2 GPUs, 0 servers (16.7%; 2 GPU-hours) against" in line
    (line,) = savings_lines(_plan(None, [None], cap=8))
    assert "neither" in line
    assert savings_lines(Plan(TARGET, 8, _plan(4, [5]).configs[1:])) == []


def test_savings_only_like_for_like() -> None:
    """A TP4 variant with a host tier against a TP2 baseline: the TP, not HiCache, would make
    the difference, so no saving is claimed; another router is not a baseline either."""
    configs = [
        ConfigPlan(_config("tp2 no host", False), 3, [], True),
        ConfigPlan(_config("tp4 host", True, tp=4), 1, [], True),
        ConfigPlan(_config("tp2 host", True), 3, [], True),
        ConfigPlan(_config("rr host", True, router="round_robin"), 2, [], True),
    ]
    lines = savings_lines(Plan(TARGET, 8, configs))
    assert lines[0].startswith("cache_aware: HiCache saves 0 instances") and "tp2 host" in lines[0]
    assert "tp4 host / cache_aware: no baseline" in lines[1] and "model.tp" in lines[1]
    assert "rr host / round_robin: no baseline" in lines[2]
    assert len(lines) == 3
    # the host-tier keys alone may differ
    from studies.plan.savings import differences

    a = {"cache": {"enable_host": False, "page_size": 64}, "storage": {"backend": "none"}}
    b = {"cache": {"enable_host": True, "page_size": 64, "hicache_ratio": 2.0,
                   "write_policy": "write_back"}, "storage": {"backend": "file"}}  # fmt: skip
    assert differences(a, b) == []
    assert differences(a, {**b, "cache": {**b["cache"], "page_size": 16}}) == ["cache.page_size"]


def test_gpu_hours_servers_and_dram() -> None:
    c = ConfigPlan(_config("host x2", True), 3, [], True)
    assert c.gpus == 6  # 3 instances x tp 2
    assert c.servers == 1  # 4 TP2 instances per 8-GPU server
    assert ConfigPlan(_config("host x2", True), 5, [], True).servers == 2
    assert c.gpu_hours == pytest.approx(6.0)  # x one hour of arrivals
    assert c.config.host_dram_gb == pytest.approx(2048 * 1000 * 2 / 1e9)


def _evals(values: dict[int, float], key: str = "ttft_p90_s") -> list[Evaluation]:
    return [Evaluation(n, False, "", {key: v}) for n, v in values.items()]


def test_best_value_floor_and_trend_notes() -> None:
    from studies.plan.search import trend_notes

    t = Target("ttft_p90_s", 1.0)
    evals = _evals({1: 4.0, 2: 2.5, 4: 2.0, 8: 2.6})
    c = ConfigPlan(_config("x", True), None, evals, True, trend_notes(
        {e.instances: e for e in evals}, [t]), {"ttft_p90_s": 1.5})  # fmt: skip
    assert c.best(t) == (2.0, 4)
    assert c.out_of_reach(t)
    assert c.trends == ["ttft_p90_s rises with more instances: 2 s at N = 4, 2.6 s at N = 8"]
    notes = Plan([t], 8, [c]).notes()
    assert any("out of reach" in n and "1.5 s of prefill at TP2" in n for n in notes)
    # the floor below the target: the best value is reported instead
    c.floors["ttft_p90_s"] = 0.5
    notes = Plan([t], 8, [c]).notes()
    assert any("ttft_p90 <= 1 s missed; best 2 s at N = 4; zero-load floor 500 ms" in n
               for n in notes)  # fmt: skip
    # within the tolerance, or improving: no trend note
    flat = _evals({1: 2.0, 2: 2.01, 4: 1.0})
    assert trend_notes({e.instances: e for e in flat}, [t]) == []
    up = _evals({1: 0.2, 2: 0.1}, "hit_rate")
    (note,) = trend_notes({e.instances: e for e in up}, [Target("hit_rate", 0.3, ">=")])
    assert note.startswith("hit_rate falls with more instances")


def test_zero_load_floor_is_a_lower_bound_of_every_ttft() -> None:
    """Each request's floor is at most its TTFT in a real run (here at a light load), and the
    floor of an uncached request is its plain prefill."""
    from hicache.config import load_config
    from sim.engine import run_simulation
    from studies.plan.floor import request_floors, target_floor
    from traces.io import read_trace

    trace = read_trace(TRACE)
    cfg = load_config(None, ["gpu.device_tokens=65536", "workload.max_requests=60",
                             "workload.rate_scale=0.2"])  # fmt: skip
    frames: dict[str, object] = {}
    run_simulation(cfg, trace, None, False, frames)
    ttft = frames["requests"]["ttft_s"].to_numpy()  # type: ignore[index]
    floors = request_floors(cfg, trace)
    assert len(floors) == 60
    assert all(f <= t + 1e-12 for f, t in zip(floors, ttft, strict=True))
    assert sum(f < t for f, t in zip(floors, ttft, strict=True)) > 0
    p90 = target_floor(Target("ttft_p90_s", 1.0), floors)
    assert p90 is not None and 0 < p90 <= float(frames["requests"]["ttft_s"].quantile(0.9))  # type: ignore[index]
    assert target_floor(Target("tpot_mean_s", 1.0), floors) is None


def test_arrival_span() -> None:
    from traces.io import read_trace

    trace = read_trace(TRACE)
    full = arrival_span_s(trace)
    assert full > 0
    assert arrival_span_s(trace, rate_scale=2.0) == pytest.approx(full / 2)
    assert arrival_span_s(trace, max_requests=1) == 0.0
    assert arrival_span_s(trace, max_requests=40) < full


def test_process_pool_matches_in_process() -> None:
    from hicache.config import load_config
    from studies.plan import build_configs, run_plan
    from traces.io import read_trace

    trace = read_trace(TRACE)
    base = load_config(None, ["gpu.device_tokens=8192", "workload.max_requests=20"])
    configs = build_configs(base, trace)
    target = [Target("ttft_p90_s", 600.0)]
    one = run_plan(configs, trace, target, 2, jobs=1, progress=False)
    two = run_plan(configs, trace, target, 2, jobs=2, progress=False)
    assert one.rows() == two.rows()
    assert [c.instances for c in one.configs] == [1, 1, 1]


# --- the command -----------------------------------------------------------------------------

TINY = ["--set", "gpu.device_tokens=8192", "--set", "workload.max_requests=40"]


def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    argv = ["plan", str(TRACE), "--target", "ttft_p90=10min", *TINY, "--max-instances", "4",
            "--jobs", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "no host tier / cache_aware" in text
    assert (
        "HiCache saves 0 instances, 0 GPUs, 0 servers (0.0%; 0 GPU-hours) against no host "
        "tier" in text
    )
    assert "setup: llama-3-8b on h100-sxm x TP1, dgx-h100 (8 GPUs per server)" in text
    data = json.loads((out / "plan.json").read_text())
    assert [c["variant"] for c in data["configurations"]] == ["no host tier", "host x2", "host x4"]
    for c in data["configurations"]:
        assert c["instances"] == 1
        assert c["evaluations"][0]["instances"] == 1
        assert "ttft_p90_s" in c["evaluations"][0]["summary"]
    assert data["configurations"][0]["host_dram_gb_per_instance"] == 0
    assert data["configurations"][2]["host_dram_gb_per_instance"] > 0
    csv = (out / "plan.csv").read_text().splitlines()
    assert len(csv) == 4 and csv[0].startswith("configuration,variant,router,instances")
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "plan.html").read_text()
    assert "<svg" in page and "Capacity plan" in page and "ttft_p90" in page


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target", "ttft_p90"], "--target 'ttft_p90': expected NAME<=VALUE"),
        (["--target", "goodput>=0.9"], "--target goodput: needs --slo"),
        (["--target", "ttft_p90=1s", "--gpu-hour-usd", "-1"], "--gpu-hour-usd: expected"),
        (["--target", "nope=2s"], "unknown summary key 'nope'; choose from"),
        (["--target", "ttft_p90=1s", "--variant", "x"], "--variant 'x': expected NAME:"),
        (["--target", "ttft_p90=1s", "--variant", "x:cache.nope=1"], "--variant 'x'"),
        (["--target", "ttft_p90=1s", "--router", "best"], "--router: unknown router 'best'"),
        (["--target", "ttft_p90=1s", "--set", "cluster.instances=2"], "what the plan searches"),
    ],
)
def test_cli_errors_are_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan"
    assert main(["plan", str(TRACE), *TINY, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()  # nothing written, nothing run


def test_a_variant_whose_host_pools_overfill_a_server_is_not_proposed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Qwen3-32B TP2 on H200 (0.5.14 sizes by ratio): 4 instances per DGX H200, host x4 =
    4 x 2 ranks x 407.7 GB > 2 TB of DRAM: the plan refuses that variant with the figures
    and evaluates the others."""
    from hicache.config import load_config
    from studies.plan import build_configs, run_plan
    from traces.io import read_trace

    trace = read_trace(TRACE)
    base = load_config(None, ["model.name=qwen3-32b", "model.tp=2", "gpu.name=h200",
                              "sglang.version=0.5.14", "workload.max_requests=10"])  # fmt: skip
    configs = build_configs(base, trace)
    assert [bool(c.refused) for c in configs] == [False, False, True]
    assert "host pools need 3,272 GB on one dgx-h200 server (4 instances x 2 ranks" in (
        configs[2].refused
    )
    plan = run_plan(configs, trace, [Target("ttft_p90_s", 600.0)], 1, jobs=1, progress=False)
    assert [c.instances for c in plan.configs] == [1, 1, None]
    assert plan.configs[2].evaluations == []
    assert any("host x4 / cache_aware: not evaluated" in n for n in plan.notes())
    (line,) = plan_savings = savings_lines(plan)
    assert "host x2" in line and plan_savings == [line]
