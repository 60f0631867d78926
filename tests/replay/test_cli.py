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
    # `hicache-sim run --profile` reads it: the engine's costs use the calibrated constants,
    # once allowed (a CPU-measured profile for a GPU preset is refused by default)
    from hicache.config import ConfigError, load_config
    from sim.costs import build_costs

    assert p.provenance["measured_on"] == "cpu"
    with pytest.raises(ConfigError, match=r"measured on CPU tensors.*--allow-profile-mismatch"):
        load_config(None, [f"run.profile={prof}"])
    cfg = load_config(None, [f"run.profile={prof}", "run.allow_profile_mismatch=true"])
    costs = build_costs(cfg)
    link = p.link("kernel", "d2h")
    pages = (1 << 20) // costs.bytes_per_page  # kernel + page_first: one batched copy per page
    assert costs.op_time("write", pages * costs.bytes_per_page, 1) == pytest.approx(
        link.alpha_s + 2 * pages * link.gamma_s + pages * costs.bytes_per_page / link.beta_Bps
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
    # an L3 tier: simulated only
    run_l3 = ["run", str(TRACE), "--device", "cpu", "--out", str(tmp_path / "r3")]
    assert main([*run_l3, "--set", "storage.backend=file"]) == 2
    assert "the L3 tier is simulated by `hicache-sim run`" in capsys.readouterr().err


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


def _big_trace(path: Path, n: int = 8, tokens: int = 200_000) -> Path:
    """Requests far larger than a CPU replay's default device budget allows."""
    lines = [
        json.dumps({"timestamp": i, "input_length": tokens, "output_length": 8,
                    "hash_ids": list(range(i * 400, i * 400 + -(-tokens // 512)))})
        for i in range(n)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_default_budget_refuses_a_trace_that_cannot_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default budget is sized from the trace; when the machine's share cannot hold most
    requests, the run is refused with what to do (not a near-zero hit rate)."""
    trace = _big_trace(tmp_path / "big.jsonl")
    out = tmp_path / "r"
    assert main(["run", str(trace), "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "8 of 8 requests would not fit" in err
    assert "--layers" in err and "--device-mem-gb" in err
    assert not out.exists()


def test_default_budget_grows_to_fit_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from hicache.config import load_config
    from replay.run import fit_budgets, settings_from_config
    from traces.io import read_trace

    trace = read_trace(_big_trace(tmp_path / "big.jsonl", n=3, tokens=4000))
    cfg = load_config(None, ["cache.page_size=16"])
    settings = replace(
        settings_from_config(cfg, num_layers=2, token_layer_bytes=1024),
        device_budget_bytes=1 << 20,
        host_budget_bytes=2 << 20,
    )
    dev, host, note = fit_budgets(trace, settings, 64 << 20, 128 << 20)
    # 2 x (4000 + 8 + 16) tokens of 2 KiB, and the host keeps the config's 2:1 ratio
    assert dev >= 2 * 4024 * 2048 and host >= 2 * dev
    assert note is not None and "100% of its requests fit" in note
    sized = replace(settings, device_budget_bytes=dev, host_budget_bytes=host).pools()
    assert sized.device_tokens >= 4024


def test_replay_refuses_a_profile_measured_on_another_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hicache.latency import PROFILE_DIR

    data = json.loads((PROFILE_DIR / "h100-sxm-pcie5-x16-default.json").read_text())
    data["provenance"] = {"source": "test", "measured_on": "h100-sxm"}
    prof = tmp_path / "gpu.json"
    prof.write_text(json.dumps(data))
    base = ["run", str(TRACE), "--device", "cpu", "--profile", str(prof), "--max-requests", "4",
            "--layers", "2", "--token-layer-bytes", "1024", "--set", "cache.page_size=16",
            "--device-mem-gb", "0.01", "--host-mem-gb", "0.02"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured on h100-sxm, not on cpu" in err
    assert not (tmp_path / "a").exists()
    assert main([*base, "--out", str(tmp_path / "b"), "--allow-profile-mismatch"]) == 0
    assert "used anyway" in capsys.readouterr().err
