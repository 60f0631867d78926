"""The device check runs end to end on CPU tensors (on a CUDA machine: ``make device-check``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.device_check import main
from replay.runtime import cuda_available


def test_device_check_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dc"
    assert main(["--out", str(out), "--device", "cpu", "--max-requests", "40"]) == 0
    for name in (
        "bench/bench.parquet",
        "bench/meta.json",
        "profile.json",
        "summary.json",
        "summary.md",
        "replay-direct/ops.parquet",
        "replay-kernel/summary.json",
    ):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text())
    assert s["device"] == "cpu" and s["targets_apply"] is False and s["profile_measured"] is False
    assert set(s["targets"]) == {
        "bench_median_err",
        "replay_median_err",
        "large_op_fraction_of_peak",
    }
    assert not (out / "h100-sxm-measured.json").exists()  # only CUDA writes a measured profile
    text = capsys.readouterr().out
    assert "CPU run: these are GPU targets" in text
    # a second run replaces a previous device check; an unrelated folder needs --force
    assert main(["--out", str(out), "--device", "cpu", "--max-requests", "10"]) == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    assert main(["--out", str(other), "--device", "cpu"]) == 2
    assert (other / "keep.txt").is_file()


@pytest.mark.skipif(cuda_available(), reason="checks the no-CUDA error path")
def test_device_check_needs_cuda_when_asked(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path / "x"), "--device", "cuda"]) == 2
