"""The device check runs end to end on CPU tensors (on a CUDA machine: ``make device-check``)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from replay.device_check import ARCHIVE, export, main
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


def test_the_cache_flush_can_be_turned_off_for_bench_and_replays(tmp_path: Path) -> None:
    out = tmp_path / "dc"
    assert main(["--out", str(out), "--device", "cpu", "--flush-mib", "-1"]) == 2
    assert not out.exists()
    rc = main(["--out", str(out), "--device", "cpu", "--max-requests", "10", "--flush-mib", "0"])
    assert rc == 0
    assert json.loads((out / "summary.json").read_text())["flush_bytes"] == 0
    assert json.loads((out / "bench" / "meta.json").read_text())["config"]["flush_bytes"] == 0
    for b in ("direct", "kernel"):
        cfg = json.loads((out / f"replay-{b}" / "config.json").read_text())
        assert cfg["flush_bytes"] == 0


@pytest.mark.skipif(cuda_available(), reason="checks the no-CUDA error path")
def test_device_check_needs_cuda_when_asked(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path / "x"), "--device", "cuda"]) == 2


ROOT = Path(__file__).resolve().parents[2]
#: what a lent GPU machine's result folder hands back: flat file names of these characters
RETURNABLE = re.compile(r"^[A-Za-z0-9._-]+$")


def test_export_fits_what_a_gpu_machine_hands_back(tmp_path: Path) -> None:
    out, ex = tmp_path / "dc", tmp_path / "export"
    assert main(["--out", str(out), "--device", "cpu", "--max-requests", "20"]) == 0
    # exporting into the check's own folder would archive the archive
    assert main(["--out", str(out), "--device", "cpu", "--export", str(out / "x")]) == 2
    assert (out / "bench" / "meta.json").is_file()  # refused before touching the old check
    files = export(out, ex)
    names = sorted(p.name for p in ex.iterdir())
    assert names == sorted(f.name for f in files) == [ARCHIVE, "summary.json", "summary.md"]
    assert all(RETURNABLE.match(n) and (ex / n).is_file() for n in names)
    with tarfile.open(ex / ARCHIVE) as tar:
        members = set(tar.getnames())
    for name in ("bench/bench.parquet", "profile.json", "replay-kernel/ops.parquet"):
        assert f"dc/{name}" in members, name
    assert (ex / "summary.md").read_text() == (out / "summary.md").read_text()


def test_a_failing_stage_does_not_cost_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a GPU lent for minutes, one broken stage must leave every other stage's results."""
    import replay.run

    real = replay.run.run_replay

    def flaky(trace: Any, settings: Any, *a: Any, **kw: Any) -> Any:
        if settings.backend == "kernel":
            raise RuntimeError("boom in the kernel replay")
        return real(trace, settings, *a, **kw)

    monkeypatch.setattr(replay.run, "run_replay", flaky)
    out, ex = tmp_path / "dc", tmp_path / "export"
    rc = main(["--out", str(out), "--device", "cpu", "--max-requests", "20", "--export", str(ex)])
    assert rc == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["errors"] == {"replay-kernel": "RuntimeError: boom in the kernel replay"}
    assert set(s["replay"]) == {"direct"} and (out / "replay-direct/ops.parquet").is_file()
    assert s["bench_rows"] > 0 and (out / "profile.json").is_file()
    # the missing backend counts as a missed target, not as a pass
    t = s["targets"]["replay_median_err"]
    assert t["met"] is False and math.isnan(t["value"])
    assert set(s["stage_s"]) == {"bench", "calibrate", "replay-direct", "replay-kernel"}
    assert "FAILED stages" in (ex / "summary.md").read_text()
    assert "boom in the kernel replay" in capsys.readouterr().err  # the traceback


def test_a_failing_bench_still_writes_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import replay.bench

    def broken(*_a: Any, **_kw: Any) -> Any:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(replay.bench, "run_bench", broken)
    out = tmp_path / "dc"
    assert main(["--out", str(out), "--device", "cpu"]) == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["errors"] == {"bench": "RuntimeError: CUDA error: out of memory"}
    assert s["replay"] == {} and not any(c["met"] for c in s["targets"].values())


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_prepared_gpu_run_script_on_cpu_without_simpy_tqdm_or_ray(tmp_path: Path) -> None:
    """``bench/device_check.sh`` is the one command a lent GPU machine runs. That machine has
    torch, numpy, pandas, pyarrow, pytest and hypothesis but no simpy, tqdm or ray, and no
    registry to install them: the script must work with them blocked, and hand back only
    flat files the machine can return."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('simpy', 'tqdm', 'ray'):\n"
        "            raise ImportError(f'{name} is not on the GPU image')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "PY": sys.executable,
        "DEVICE": "cpu",
        "WORK": str(tmp_path / "work"),
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "bench" / "device_check.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [ARCHIVE, "cuda-tests.log", "device-check.log", "env.txt", "summary.json", "summary.md"]
    )
    assert len(names) <= 8 and all(RETURNABLE.match(n) and (out / n).is_file() for n in names)
    env_txt = (out / "env.txt").read_text()
    assert "cuda tests: exit 0" in env_txt and "device check: exit 0" in env_txt
    assert "skipped" in (out / "cuda-tests.log").read_text()  # no CUDA here: skipped, not failed
    assert json.loads((out / "summary.json").read_text())["errors"] == {}


def test_an_interrupt_still_writes_and_exports_what_finished(tmp_path: Path) -> None:
    """`bench/device_check.sh` stops the check with SIGINT at its time limit: the stage running
    then is marked interrupted, later ones skipped, and the summary and the export still come
    out (a SIGTERM would have lost everything on a GPU lent for minutes)."""
    out, ex = tmp_path / "dc", tmp_path / "export"
    cmd = [sys.executable, "-u", "-m", "replay.device_check", "--device", "cpu"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out), "--export", str(ex)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # wait until the calibration stage has begun
        seen.append(line)
        if line.startswith("[bench:"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 1, "".join(seen) + rest
    s = json.loads((out / "summary.json").read_text())
    assert "bench" not in s["errors"] and s["bench_rows"] > 0
    # the signal came as the bench finished: whatever ran then (the bench's last line, the
    # calibration or the first replay) is the last thing that ran; the rest is skipped
    assert s["errors"], "the interruption is recorded"
    for k, v in s["errors"].items():
        assert k in ("calibrate", "replay-direct", "replay-kernel")
        assert v.startswith(("interrupted", "skipped")), v
    assert sum(v.startswith("interrupted") for v in s["errors"].values()) <= 1
    assert s["replay"] == {} and "replay-kernel" not in s["stage_s"]
    assert {p.name for p in ex.iterdir()} >= {ARCHIVE, "summary.json", "summary.md"}


def test_stages_after_an_interrupted_one_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import replay.run

    def interrupted(*_a: Any, **_kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(replay.run, "run_replay", interrupted)
    out = tmp_path / "dc"
    assert main(["--out", str(out), "--device", "cpu", "--max-requests", "10"]) == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["errors"] == {
        "replay-direct": "interrupted (SIGINT / time limit)",
        "replay-kernel": "skipped: an earlier stage was interrupted",
    }
    assert (out / "profile.json").is_file() and s["bench_rows"] > 0


def test_the_cuda_path_of_the_check_on_cuda_like_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The branch a GPU runs (preset detection, a measured profile named for the GPU and
    exported, the commit line, targets that apply), with the CPU plan's small geometry on
    deferred CPU streams that report CUDA: the parts of the GPU run that need no GPU are
    checked before the one attempt on a lent machine."""
    import replay.device_check as dc
    import replay.runtime
    from tests.replay.conftest import CudaLikeRuntime

    cpu_plan = dc.check_plan(False, "llama-3-8b")
    monkeypatch.setattr(dc, "check_plan", lambda cuda, model: cpu_plan)
    monkeypatch.setattr(replay.runtime, "make_runtime", lambda device: CudaLikeRuntime())
    out, ex = tmp_path / "dc", tmp_path / "export"
    rc = main(["--out", str(out), "--max-requests", "30", "--export", str(ex)])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 0, s["errors"]
    assert s["device"] == "cuda" and s["targets_apply"] is True and s["gpu_preset"] == "h200"
    assert s["profile_measured"] is True and set(s["replay"]) == {"direct", "kernel"}
    assert {p.name for p in ex.iterdir()} == {
        ARCHIVE,
        "summary.json",
        "summary.md",
        "h200-measured.json",
    }
    prof = json.loads((ex / "h200-measured.json").read_text())
    assert prof["measured"] is True and prof["gpu"] == "h200" and prof["link"] == "pcie5-x16"
    md = (ex / "summary.md").read_text()
    assert "CPU run" not in md and "hicache/profiles/h200-measured.json" in md
