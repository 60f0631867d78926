"""``hicache-sim replay`` steps through ``cli.replay.main``, and ``hicache-sim run --profile``
with a calibrated profile."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cli.replay import main, register
from hicache.latency import load_profile
from replay.runtime import cuda_available
from traces.bundled import synthetic_path

TRACE = synthetic_path("shared-prefix")


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    assert (
        main(
            [
                "bench",
                "--device",
                "cpu",
                "--quick",
                "--repeats",
                "2",
                "--force",
                "--max-size-mib",
                "1",
                "--flush-mib",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def test_bench_writes_its_table(bench_dir: Path) -> None:
    for name in ("bench.parquet", "bench.csv", "meta.json"):
        assert (bench_dir / name).is_file()
    meta = json.loads((bench_dir / "meta.json").read_text())
    assert meta["machine"]["device"] == "cpu" and meta["config"]["repeats"] == 2
    assert max(meta["config"]["plain_sizes"]) <= 1 << 20
    assert meta["config"]["flush_bytes"] == 1 << 20
    assert meta["machine"]["torch_threads"] == "1"  # the default: one issuing thread


def test_calibrate_then_run_with_the_profile(
    bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = tmp_path / "cpu-profile.json"
    assert main(["calibrate", str(bench_dir), "--out", str(prof)]) == 0
    p = load_profile(prof, "h100-sxm", "pcie5-x16")
    assert p.measured is False and "calibrate" in p.provenance["source"]
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            str(TRACE),
            "--device",
            "cpu",
            "--profile",
            str(prof),
            "--out",
            str(out),
            "--max-requests",
            "40",
            "--layers",
            "4",
            "--token-layer-bytes",
            "1024",
            "--set",
            "cache.page_size=16",
            "--device-mem-gb",
            "0.01",
            "--host-mem-gb",
            "0.02",
            "--verify",
        ]
    )
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["profile"]["path"] == str(prof) and s["cache"]["verified_pages"] > 0
    # the replay's ops feed a second calibration
    prof2 = tmp_path / "with-replay.json"
    assert main(["calibrate", str(bench_dir), str(out), "--out", str(prof2)]) == 0
    assert int(load_profile(prof2, "h100-sxm", "pcie5-x16").provenance["replay_ops"]) > 0
    # `hicache-sim run --profile` reads it: the engine's costs use the calibrated constants
    from hicache.config import load_config
    from sim.costs import build_costs

    cfg = load_config(None, [f"run.profile={prof}"])
    costs = build_costs(cfg)
    link = p.link("kernel", "d2h")
    assert costs.op_time("write", 1 << 20, 1) == pytest.approx(
        link.alpha_s + 32 * link.gamma_s + (1 << 20) / link.beta_Bps
    )
    assert "prediction" in capsys.readouterr().out


@pytest.mark.skipif(cuda_available(), reason="checks the no-CUDA error path")
def test_cuda_without_cuda_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--device", "cuda", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CUDA is not available" in err


def test_user_errors_exit_2(
    tmp_path: Path, bench_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a non-empty output folder
    assert main(["bench", "--device", "cpu", "--quick", "--out", str(bench_dir)]) == 2
    # a missing bench folder
    assert main(["calibrate", str(tmp_path / "nope"), "--out", str(tmp_path / "p.json")]) == 2
    # a bad config key
    assert (
        main(
            [
                "run",
                str(TRACE),
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "r"),
                "--set",
                "cache.nope=1",
            ]
        )
        == 2
    )
    # a missing trace
    assert (
        main(
            [
                "run",
                str(tmp_path / "none.jsonl"),
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "r2"),
                "--set",
                "gpu.device_tokens=6400",
            ]
        )
        == 2
    )
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 4 and all(e.startswith("hicache-sim replay: ") for e in errs)


def test_bad_threads_and_flush_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["bench", "--device", "cpu", "--quick"]
    assert main([*base, "--threads", "0", "--out", str(tmp_path / "a")]) == 2
    assert main([*base, "--flush-mib", "-1", "--out", str(tmp_path / "b")]) == 2
    errs = capsys.readouterr().err.strip().splitlines()
    assert errs == [
        "hicache-sim replay: --threads must be >= 1, got 0",
        "hicache-sim replay: --flush-mib must be >= 0, got -1",
    ]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_register_adds_the_replay_command() -> None:
    parser = argparse.ArgumentParser(prog="hicache-sim")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["replay", "calibrate", "b", "r1", "r2", "--out", "p.json"])
    assert args.replay_step == "calibrate" and [str(p) for p in args.replay_dirs] == ["r1", "r2"]
    assert callable(args.func)
