"""The sweep package's parts: the one local executor (both job kinds), the hit-rate grid as a
sweep job, and the job-directory commit that leaves nothing behind when it fails."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import studies.sweep.jobs as jobs_mod
from sim.hitrate import HitRateConfig, replay, requests_for
from studies.sweep.executors import map_local, run_local
from studies.sweep.hitrate import run_hitrate_grid
from studies.sweep.jobs import JobSpec, commit
from traces.io import read_trace

TRACE = Path(__file__).resolve().parent.parent / "traces" / "data" / "synthetic" / "multiturn.jsonl"


def square(x: int) -> int:
    return x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise RuntimeError("three")
    return x


@pytest.mark.parametrize("jobs", [1, 2])
def test_map_local_keeps_the_task_order(jobs: int) -> None:
    done: list[None] = []
    assert map_local(square, list(range(7)), jobs, lambda: done.append(None)) == [
        x * x for x in range(7)
    ]
    assert len(done) == 7


@pytest.mark.parametrize("jobs", [1, 2])
def test_task_errors_propagate_or_become_results(jobs: int) -> None:
    with pytest.raises(RuntimeError, match="three"):
        map_local(fail_on_three, [1, 2, 3, 4], jobs)
    got: dict[int, int] = {}
    if jobs == 1:  # in-process: the job function's own exception is not a worker failure
        return
    run_local(
        fail_on_three,
        [1, 2, 3, 4],
        jobs,
        got.__setitem__,
        on_worker_error=lambda i, e: -1,
    )
    assert got == {0: 1, 1: 2, 2: -1, 3: 4}


def test_hitrate_grid_rows_are_the_replay_of_each_config() -> None:
    trace = read_trace(TRACE)
    configs = [
        HitRateConfig(dev, host, page, ev, "write_through")
        for page in (16, 64)
        for dev in (4096, 16384)
        for host in (0, 65536)
        for ev in ("lru", "oracle")
    ]
    expected = []
    for cfg in configs:
        res = replay(requests_for(trace, cfg.page_size), cfg)
        expected.append({**asdict(cfg), **res.as_dict()})
    for jobs in (1, 3):
        rows = run_hitrate_grid(trace, configs, jobs=jobs, progress=False)
        assert rows == expected
        assert [list(r) for r in rows] == [list(r) for r in expected]  # key order too
    with pytest.raises(ValueError, match="multiple of the page"):
        run_hitrate_grid(trace, [HitRateConfig(1000, 0, 64)], progress=False)


def spec(name: str = "job-0123456789") -> JobSpec:
    return JobSpec(name, (), {}, "t.jsonl", "0" * 64, "0123456789")


def test_commit_writes_a_whole_directory(tmp_path: Path) -> None:
    commit(tmp_path, spec(), {"a.json": b"1", "b.json": b"2"})
    commit(tmp_path, spec(), {"c.json": b"3"})  # replaces what was there
    assert [p.name for p in tmp_path.iterdir()] == ["job-0123456789"]
    assert {p.name for p in (tmp_path / "job-0123456789").iterdir()} == {"c.json"}


def test_a_failed_commit_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit(tmp_path, spec(), {"old.json": b"0"})
    calls = 0

    def flaky(data: bytes, path: Any) -> Path:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(28, "No space left on device")
        return Path(path)

    monkeypatch.setattr(jobs_mod, "write_bytes_atomic", flaky)
    with pytest.raises(OSError, match="No space"):
        commit(tmp_path, spec(), {"a.json": b"1", "b.json": b"2"})
    monkeypatch.undo()
    real_replace = os.replace

    def no_rename_into_place(src: Any, dst: Any) -> None:
        if Path(dst).name == "job-0123456789" and Path(src).name.startswith(".tmp-"):
            raise OSError(18, "Invalid cross-device link")
        real_replace(src, dst)

    monkeypatch.setattr(jobs_mod.os, "replace", no_rename_into_place)
    with pytest.raises(OSError, match="cross-device"):
        commit(tmp_path, spec(), {"new.json": b"1"})
    monkeypatch.undo()
    # the earlier job directory is still there, whole; no hidden leftovers
    assert [p.name for p in tmp_path.iterdir()] == ["job-0123456789"]
    assert (tmp_path / "job-0123456789" / "old.json").read_bytes() == b"0"
    assert {p.name for p in (tmp_path / "job-0123456789").iterdir()} == {"old.json"}
