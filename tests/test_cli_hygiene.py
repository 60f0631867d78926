"""The command line's hygiene (issue 26, item 6): outputs are never overwritten without
--force, --storage-tokens 0 is no store, --max-requests and --lenient wherever a trace is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "data" / "synthetic" / "multiturn.jsonl"


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["trace", "gen", "shared-prefix", "--requests", "4", "--out", "{f}.jsonl"], "trace"),
        (["trace", "convert", str(TRACE), "{f}.jsonl"], "trace"),
        (["hitrate", str(TRACE), "--device-tokens", "4096", "--csv", "{f}.csv"], "CSV table"),
        (["report", "{run}", "--out", "{f}.html"], "HTML report"),
    ],
)
def test_an_existing_output_is_refused_without_force(
    argv: list[str], what: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    if "{run}" in argv:
        assert main(["run", str(TRACE), "--out", str(run), "--max-requests", "10"]) == 0
    argv = [a.replace("{f}", str(tmp_path / "out")).replace("{run}", str(run)) for a in argv]
    target = next(Path(a) for a in argv if a.startswith(str(tmp_path / "out")))
    target.write_text("keep me")
    capsys.readouterr()
    assert main(argv) == 2
    err = _err(capsys)
    assert f"{what} exists (use --force to overwrite" in err and err.count("\n") == 1
    assert target.read_text() == "keep me"
    assert main([*argv, "--force"]) == 0
    assert target.read_text() != "keep me"


def test_plan_and_demo_folders_need_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan"
    out.mkdir()
    (out / "plan.json").write_text("{}")
    argv = ["plan", str(TRACE), "--target", "ttft_p90=10min", "--max-requests", "20",
            "--max-instances", "1", "--jobs", "1", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2 and "use --force" in _err(capsys)
    assert main(["demo", "--out", str(out), "--max-requests", "5"]) == 2
    assert "demo folder exists and is not empty" in _err(capsys)


def test_storage_tokens_zero_is_no_store(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["hitrate", str(TRACE), "--device-tokens", "4096", "--json",
            "--storage-tokens", "0,unlimited"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["storage"] for r in rows] == [False, True]
    assert rows[0]["storage_hit_rate"] == 0 < rows[1]["storage_hit_rate"]
    assert main([*argv[:-1], "100"]) == 2
    assert "100 is not a multiple of the page size 64 (0 = no store" in _err(capsys)


def test_max_requests_and_lenient(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = TRACE.read_text().splitlines()
    bad.write_text("\n".join([*lines[:30], '{"timestamp": "soon"}', *lines[30:60]]) + "\n")
    hit = ["hitrate", str(bad), "--device-tokens", "4096", "--json"]
    assert main(hit) == 2 and "bad.jsonl:" in _err(capsys)  # strict: the bad line
    assert main([*hit, "--lenient", "--max-requests", "25"]) == 0
    out, err = capsys.readouterr()
    assert "skipped 1 bad line" in err
    assert json.loads(out)["rows"][0]["requests"] == 25
    run = ["run", str(bad), "--out", str(tmp_path / "r"), "--max-requests", "12", "--lenient"]
    assert main(run) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["requests"] == 12


def test_a_timed_run_far_from_the_cache_only_replay_says_why() -> None:
    """Agents at 4x their session rate on a 16k-token pool: ~11 requests in flight share the
    pool, so the timed hit rate is far below the one-at-a-time replay's; the run says so."""
    from cli.run import cache_only_note
    from hicache.config import load_config
    from sim.engine import run_simulation
    from traces.io import read_trace

    trace = read_trace(ROOT / "traces" / "data" / "synthetic" / "agentic.jsonl")
    cfg = load_config(None, ["gpu.device_tokens=16384", "workload.rate_scale=4",
                             "cache.enable_host=false"])  # fmt: skip
    summary = run_simulation(cfg, trace, None, False)
    note = cache_only_note(cfg, trace, summary)
    assert note is not None and f"against this run's {summary['hit_rate']:.1%}" in note
    assert "requests were in flight on average" in note
    roomy = load_config(None, ["gpu.device_tokens=1048576", "cache.enable_host=false"])
    assert cache_only_note(roomy, trace, run_simulation(roomy, trace, None, False)) is None


def test_the_sweep_summary_has_p90_and_long_times_in_minutes(tmp_path: Path) -> None:
    import pandas as pd

    from cli.sweep import format_results

    df = pd.DataFrame({
        "job": ["a", "b"], "status": ["ok", "ok"], "error": ["", ""],
        "cache.write_policy": ["write_through", "write_back"], "device_tokens": [1, 1],
        "hit_rate": [0.5, 0.25], "ttft_p50_s": [0.05, 2.0], "ttft_p90_s": [0.5, 700.0],
        "ttft_p99_s": [0.9, 9000.0], "overloaded": [False, True],
    })  # fmt: skip
    text = format_results(df, 1.0, tmp_path)
    assert "TTFT p90" in text and "500.0 ms" in text and "11.7 min" in text and "2.5 h" in text
    row = next(line for line in text.splitlines() if "write_back" in line)
    assert row.rstrip().endswith("yes")


def test_the_hitrate_plot_puts_host_sizes_on_the_x_axis() -> None:
    """One device pool, several host pools: the host pool is the x axis (the points no longer
    pile onto one device value); no host tier is a level line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from studies.report.figures_hitrate import draw_hitrate_study, study_labels, x_key

    def row(host: int, hit: float) -> dict[str, object]:
        return {"device_tokens": 1000, "host_tokens": host, "hit_rate": hit,
                "device_hit_rate": 0.05, "host_hit_rate": hit - 0.05, "eviction": "lru",
                "write_policy": "write_through", "page_size": 64, "outputs": "cache"}  # fmt: skip

    rows = [row(0, 0.05), row(2000, 0.1), row(4000, 0.2), row(8000, 0.3)]
    assert x_key(rows) == "host_tokens"
    assert x_key([rows[1], {**rows[2], "device_tokens": 2000}]) == "device_tokens"
    assert study_labels(rows[1:], host_axis=True) == ["write_through"] * 3
    fig = Figure()
    draw_hitrate_study(fig, rows, "t")
    (ax,) = fig.axes
    assert ax.get_xlabel().startswith("host (DRAM) KV pool")
    solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert sorted(solid[0].get_xdata()) == pytest.approx([2000, 4000, 8000], rel=0.05)


def test_host_pools_beyond_the_servers_dram_are_refused_with_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5,000 GB per rank on a DGX H100 (2 TiB): refused with what it needs and has; with
    --allow-host-overcommit it runs with a warning. 0.5.23's default host pool is sized to
    fit, so the default config is never refused."""
    from hicache.config import HostMemoryError, host_memory, load_config

    out = tmp_path / "r"
    argv = ["run", str(TRACE), "--out", str(out), "--max-requests", "5",
            "--set", "cache.hicache_size_gb=5000"]  # fmt: skip
    assert main(argv) == 2
    err = _err(capsys)
    assert (
        "host pools need 5,011 GB on one dgx-h100 server (1 instance x 1 rank x 5,000.0 GB" in err
        and "more than its 2,199 GB" in err
        and "--allow-host-overcommit" in err
    )
    assert main([*argv, "--allow-host-overcommit"]) == 0
    assert "warning: host pools need 5,011 GB" in _err(capsys)
    with pytest.raises(HostMemoryError):
        load_config(None, ["cache.hicache_size_gb=1000", "model.tp=2", "cluster.instances=2"])
    # two TP2 instances on one 8-GPU server: 4 ranks x 400 GB + 10 GiB fits 2 TiB
    ok = host_memory(load_config(None, ["cache.hicache_size_gb=400", "model.tp=2",
                                        "cluster.instances=2"]))  # fmt: skip
    assert ok is not None and ok.ranks == 4 and not ok.over
    for version in ("0.5.23",):
        for tp in (1, 2, 4, 8):
            cfg = load_config(None, [f"sglang.version={version}", f"model.tp={tp}",
                                     "cluster.instances=8"])  # fmt: skip
            got = host_memory(cfg)
            assert got is not None and not got.over, (tp, got)


def test_a_config_json_given_as_config_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = ROOT / "hicache" / "model_configs" / "llama-2-70b.json"
    argv = ["run", str(TRACE), "--out", str(tmp_path / "r"), "--config", str(hf)]
    assert main(argv) == 2
    err = _err(capsys)
    assert "Hugging Face config.json, not a hicache-sim config" in err
    assert "--set model.config=FILE" in err and err.count("\n") == 1
    cmd = tmp_path / "cmd.toml"
    cmd.write_text("python -m sglang.launch_server --model-path Qwen/Qwen3-8B\n")
    assert main([*argv[:-1], str(cmd)]) == 2
    assert "an SGLang launch command, not a config: pass it as --sglang-args" in _err(capsys)


def test_every_positional_argument_has_help() -> None:
    import argparse

    from cli.main import build_parser

    missing = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{path} {name}")
            elif not a.option_strings and not a.help:
                missing.append(f"{path} {a.dest}")

    walk(build_parser(), "hicache-sim")
    assert missing == []
