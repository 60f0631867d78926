"""Sweeps: grid parsing and its errors, the 24-job example grid on 2 workers, resuming after
an interrupt, failed jobs, the Ray executor against the local one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cli.sweep import main
from hicache.config import ConfigError
from studies.sweep import expand, flatten_summary, load_grid, parse_grid, run_sweep

REPO = Path(__file__).resolve().parent.parent
QUICK = REPO / "examples" / "quick.toml"
MULTITURN = REPO / "traces" / "data" / "synthetic" / "multiturn.jsonl"
RUN_FILES = {"config.json", "summary.json", "requests.parquet", "timeline.parquet",
             "transfers.parquet", "metrics.prom", "job.json"}  # fmt: skip
NAME = re.compile(r"^[A-Za-z0-9._=+-]+-[0-9a-f]{10}$")


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """Results without the one nondeterministic field (the simulator's own wall time)."""
    return df.drop(columns=["wall_time_s"]).reset_index(drop=True)


def write_grid(tmp_path: Path, text: str, name: str = "grid.toml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("MULTITURN", str(MULTITURN)))
    return path


@pytest.fixture(scope="module")
def quick_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """The 24-job example grid run once through the CLI with 2 workers (the reference)."""
    out = tmp_path_factory.mktemp("quick")
    assert main([str(QUICK), "--out", str(out), "--jobs", "2"]) == 0
    return out, pd.read_parquet(out / "results.parquet")


# --- the example grid ------------------------------------------------------------------------


def test_quick_grid_runs_24_jobs_with_two_workers(quick_sweep: tuple[Path, pd.DataFrame]) -> None:
    out, df = quick_sweep
    axes = ["cache.write_policy", "cache.eviction", "cache.hicache_ratio", "gpu.device_tokens"]
    assert len(df) == 24
    assert (df["status"] == "ok").all(), df[["job", "error"]]
    assert df["job"].is_unique and all(NAME.match(j) for j in df["job"])
    first = json.loads((out / df["run_dir"][0] / "summary.json").read_text())
    summary_keys = flatten_summary(first).keys()
    assert list(df.columns[:3]) == ["job", "status", "error"]
    assert list(df.columns[3:7]) == axes
    assert set(summary_keys) <= set(df.columns)
    assert {"device_tokens", "host_tokens", "run_dir"} <= set(df.columns)
    for _, row in df.iterrows():
        run = out / row["run_dir"]
        assert {p.name for p in run.iterdir()} == RUN_FILES
        conf = json.loads((run / "config.json").read_text())
        # the axis columns say what the job really ran
        assert conf["config"]["cache"]["write_policy"] == row["cache.write_policy"]
        assert conf["config"]["cache"]["eviction"] == row["cache.eviction"]
        assert conf["config"]["cache"]["hicache_ratio"] == row["cache.hicache_ratio"]
        assert conf["config"]["gpu"]["device_tokens"] == row["gpu.device_tokens"]
        assert conf["host_tokens"] == row["host_tokens"]
        summary = flatten_summary(json.loads((run / "summary.json").read_text()))
        assert all(row[k] == pytest.approx(v, nan_ok=True) for k, v in summary.items())
    # every cross-product combination exactly once
    assert len(df.drop_duplicates(subset=axes)) == 24
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(df.columns)
    assert (csv["hit_rate"] == df["hit_rate"]).all()
    assert not list((out / "runs").glob(".*"))


def test_rerun_skips_every_finished_job(quick_sweep: tuple[Path, pd.DataFrame]) -> None:
    out, df = quick_sweep
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/summary.json")}
    again = run_sweep(QUICK, out, jobs=2, progress=False)
    assert again.attrs["ran"] == 0 and again.attrs["reused"] == 24
    assert {p: p.stat().st_mtime_ns for p in before} == before
    pd.testing.assert_frame_equal(again, df)


def test_interrupted_sweep_resumes(quick_sweep: tuple[Path, pd.DataFrame], tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) stops the CLI with every
    finished job committed and nothing half-written; the rerun runs only the rest."""
    _, reference = quick_sweep
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "cli.sweep", str(QUICK), "--out", str(out), "--jobs", "2"]

    # SIGINT as a terminal's foreground job has it: a suite started in the background
    # (`cmd &` in a script) passes it on ignored, and the sweep would then run to its end
    def foreground() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=foreground)  # fmt: skip
    runs = out / "runs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if runs.is_dir() and sum(not p.name.startswith(".") for p in runs.iterdir()) >= 3:
            break
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stderr, stdout[-2000:])
    assert "interrupted" in stderr
    done = [p for p in runs.iterdir() if not p.name.startswith(".")]
    assert 3 <= len(done) < 24
    for d in done:  # committed directories are complete
        assert {p.name for p in d.iterdir()} == RUN_FILES
    stamps = {d.name: (d / "summary.json").stat() for d in done}

    resumed = run_sweep(QUICK, out, jobs=2, progress=False)
    assert resumed.attrs["reused"] == len(done)
    assert resumed.attrs["ran"] == 24 - len(done)
    for name, st in stamps.items():  # finished jobs were not run again
        now = (runs / name / "summary.json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert not list(runs.glob(".*"))
    pd.testing.assert_frame_equal(comparable(resumed), comparable(reference))


def test_ray_executor_gives_the_local_results(
    quick_sweep: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (extra 'cluster')")
    out_local, reference = quick_sweep
    try:
        df = run_sweep(QUICK, tmp_path / "ray", jobs=2, executor="ray", progress=False)
    except ValueError as e:
        if "cannot start Ray" in str(e):
            pytest.skip(f"a local Ray runtime cannot start here: {e}")
        raise
    pd.testing.assert_frame_equal(comparable(df), comparable(reference))
    # the run directories are the same files, whichever executor wrote them (config.json
    # names the trace relative to its own folder: the same file, resolved)
    for rel in reference["run_dir"]:
        for name in RUN_FILES - {"summary.json", "config.json"}:
            assert (tmp_path / "ray" / rel / name).read_bytes() == (
                out_local / rel / name
            ).read_bytes()
        confs = []
        for run in (tmp_path / "ray" / rel, out_local / rel):
            conf = json.loads((run / "config.json").read_text())
            conf["trace"] = str((run / conf["trace"]).resolve())
            confs.append(conf)
        assert confs[0] == confs[1]
        assert confs[0]["trace"] == str(MULTITURN.resolve())


# --- failures --------------------------------------------------------------------------------


def test_failing_jobs_are_recorded_and_the_others_finish(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')  # no output_length, no ids
    grid = write_grid(
        tmp_path,
        f"""
[base]
set = ["cache.page_size=32", "workload.max_requests=20"]
[axes]
trace = ["MULTITURN", "{bad}"]
"cache.page_size" = [32, 64]
"gpu.device_tokens" = [8192, 8224]   # 8224 is a multiple of 32, not of 64
""",
    )
    df = run_sweep(grid, tmp_path / "out", jobs=1, progress=False)
    assert len(df) == 8
    good = df["trace"] == str(MULTITURN)
    invalid = (df["cache.page_size"] == 64) & (df["gpu.device_tokens"] == 8224)
    assert (df.loc[good & ~invalid, "status"] == "ok").all()
    assert (df.loc[~good | invalid, "status"] == "failed").all()
    assert df.loc[invalid, "error"].str.contains("gpu.device_tokens").all()
    assert df.loc[~good & ~invalid, "error"].str.contains("bad.jsonl").all()
    assert df.loc[df["status"] == "failed", "error"].map(lambda e: "\n" not in e).all()
    for job in df.loc[~good & ~invalid, "job"]:
        err = json.loads((tmp_path / "out" / "runs" / job / "error.json").read_text())
        assert "Traceback" in err["traceback"]
    again = run_sweep(grid, tmp_path / "out", jobs=1, progress=False)
    assert again.attrs["ran"] == int((~good & ~invalid).sum())  # failed runs are retried
    assert again.attrs["reused"] == int((good & ~invalid).sum())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bogus = 1", "bogus: unknown key; a grid has"),
        ("[base]\ntrace = 'MULTITURN'\nconfg = 'x'", "base.confg: unknown key"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.write_polcy' = ['write_back']",
         "cache.write_polcy: unknown key; cache has: page_size"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cach.eviction' = ['lru']", "unknown section"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.eviction' = []", "at least one value"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.eviction' = ['lru', 'lru']", "duplicate"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.eviction' = ['lru', 'bogus']",
         "axes.cache.eviction = 'bogus': cache.eviction: 'bogus' is not one of"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.page_size' = ['big']", "expected an integer"),
        ("[base]\ntrace = 'MULTITURN'\nset = ['cache.page_sze=32']", "cache.page_sze: unknown key"),
        ("[axes]\n'cache.eviction' = ['lru']", "base.trace: no trace"),
        ("[base]\ntrace = 'missing.jsonl'", "missing.jsonl: no such file"),
        ("[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.eviction' = ['lru']\n"
         "[axes.mix]\na = {'cache.eviction' = 'lfu'}", "set by two axes"),
        ("[base]\ntrace = 'MULTITURN'\n[axes.status]\na = {'cache.eviction' = 'lfu'}",
         "may not be called"),
        ("[base]\ntrace = 'MULTITURN'\n[axes.mix]\na = {'cache.eviction' = 'lfu'}\n"
         "[[include]]\nmix = 'b'", "no value 'b'"),
        ("[base\n", "invalid TOML"),
    ],
)  # fmt: skip
def test_grid_errors_are_one_line_naming_the_key(tmp_path: Path, text: str, expected: str) -> None:
    grid = write_grid(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        run_sweep(grid, tmp_path / "out", progress=False)
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert message.startswith(str(grid))
    assert not (tmp_path / "out").exists()  # nothing runs before the grid is checked


def test_cli_user_error_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_grid(tmp_path, "[base]\ntrace = 'MULTITURN'\n[axes]\n'cache.nope' = [1]")
    assert main([str(grid), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hicache-sim: ") and err.count("\n") == 1 and "cache.nope" in err
    assert main([str(grid), "--out", str(tmp_path / "o"), "--address", "auto"]) == 2
    assert "ray executor" in capsys.readouterr().err


# --- the grid format -------------------------------------------------------------------------


def test_grid_forms_named_axes_and_includes(tmp_path: Path) -> None:
    grid = load_grid(
        write_grid(
            tmp_path,
            """
name = "forms"
[base]
trace = "MULTITURN"
set = { "gpu.device_tokens" = 8192, "workload.max_requests" = 10 }
[axes]
cache.eviction = ["lru", "lfu"]             # unquoted dotted key: the same as quoted
[axes.host]
small = { "cache.hicache_ratio" = 2.0 }
big = { "cache.hicache_ratio" = 4.0, "cache.write_policy" = "write_back" }
[[include]]
"cache.enable_host" = false
[[include]]
host = "big"
"cache.eviction" = "fifo"
""",
        )
    )
    assert [a.name for a in grid.axes] == ["cache.eviction", "host"] and grid.size == 6
    specs = expand(grid)
    assert specs == expand(grid)  # deterministic
    assert len({s.name for s in specs}) == 6 and all(NAME.match(s.name) for s in specs)
    rows = [dict(s.axes) for s in specs]
    assert rows[0] == {"cache.eviction": "lru", "host": "small", "cache.enable_host": True}
    assert rows[4] == {"cache.eviction": "lru", "host": None, "cache.enable_host": False}
    assert rows[5] == {"cache.eviction": "fifo", "host": "big", "cache.enable_host": True}
    big = specs[1].config
    assert big is not None and big["cache"]["write_policy"] == "write_back"
    assert big["cache"]["hicache_ratio"] == 4.0 and big["gpu"]["device_tokens"] == 8192
    assert specs[4].name.startswith("enable_host=false-")
    # the Grid API shrinks a study (the notebooks' small mode)
    small = grid.with_set(["workload.max_requests=5"]).select("host", ["big"])
    assert small.size == 4
    assert all(s.config and s.config["workload"]["max_requests"] == 5 for s in expand(small))
    with pytest.raises(ConfigError, match="no value 'huge'"):
        grid.select("host", ["huge"])


def test_readme_grid_example_is_valid() -> None:
    text = (REPO / "examples" / "README.md").read_text()
    block = text.split("## Grid format", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    grid = parse_grid(tomllib.loads(block), REPO / "examples", "README")
    specs = expand(grid)
    assert len(specs) == grid.size == 3 * 3 * 2 * 2 + 1
    assert all(s.config is not None for s in specs)


def test_example_grids_are_valid() -> None:
    for path in sorted((REPO / "examples").glob("*.toml")):
        specs = expand(load_grid(path))
        assert specs and all(s.config is not None for s in specs), path


def test_a_finished_run_is_found_again_after_the_axes_change(tmp_path: Path) -> None:
    base = (
        "[base]\ntrace = 'MULTITURN'\n"
        "set = ['gpu.device_tokens=8192', 'workload.max_requests=10']\n"
    )
    first = run_sweep(write_grid(tmp_path, base + "[axes]\n'cache.eviction' = ['lru']"),
                      tmp_path / "out", progress=False)  # fmt: skip
    # an extra axis with the default value: a new name, the same resolved config
    grid = write_grid(
        tmp_path, base + "[axes]\n'cache.eviction' = ['lru']\n'cache.page_size' = [64]"
    )
    second = run_sweep(grid, tmp_path / "out", progress=False)
    assert second.attrs["reused"] == 1 and second.attrs["ran"] == 0
    assert first["job"][0] != second["job"][0]
    assert first["job"][0].rsplit("-", 1)[1] == second["job"][0].rsplit("-", 1)[1]
    job = json.loads((tmp_path / "out" / second["run_dir"][0] / "job.json").read_text())
    assert job["axes"] == {"cache.eviction": "lru", "cache.page_size": 64}
    assert [p.name for p in (tmp_path / "out" / "runs").iterdir()] == [second["job"][0]]


def test_one_sweep_per_directory(tmp_path: Path) -> None:
    fcntl: Any = pytest.importorskip("fcntl")
    grid = write_grid(tmp_path, "[base]\ntrace = 'MULTITURN'\nset = ['workload.max_requests=5']")
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".sweep.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another sweep"):
            run_sweep(grid, out, progress=False)
