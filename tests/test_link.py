"""The duplex PCIe model: closed-form timings and a bounded number of events per copy."""

from __future__ import annotations

import pytest
import simpy

from sim.link import DuplexLink, Job


def _run(jobs: list[tuple[float, str, float]], eta: float = 1.0) -> list[Job]:
    """jobs: (submit time, direction, work seconds) -> the finished Jobs, in input order."""
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": eta, "h2d": eta})
    out = [Job(direction, work, nbytes=0) for _, direction, work in jobs]

    def submit_at(t: float, job: Job):  # type: ignore[no-untyped-def]
        yield env.timeout(t)
        link.submit(job)

    for (t, _, _), job in zip(jobs, out, strict=True):
        env.process(submit_at(t, job))
    env.run()
    assert link.events <= 3 * len(jobs) + 2  # a bounded number of timers per copy
    return out


def test_one_copy_takes_its_service_time() -> None:
    (j,) = _run([(0.0, "d2h", 2.5e-3)])
    assert (j.start, j.end) == (0.0, pytest.approx(2.5e-3))


def test_same_direction_serialises() -> None:
    a, b = _run([(0.0, "h2d", 1.0), (0.0, "h2d", 1.0)])
    assert a.end == pytest.approx(1.0) and b.start == pytest.approx(1.0)
    assert b.end == pytest.approx(2.0)


def test_opposite_directions_overlap_without_coupling() -> None:
    a, b = _run([(0.0, "h2d", 1.0), (0.0, "d2h", 1.0)], eta=1.0)
    assert a.end == pytest.approx(1.0) and b.end == pytest.approx(1.0)


def test_opposite_directions_slow_each_other_by_eta() -> None:
    a, b = _run([(0.0, "h2d", 1.0), (0.0, "d2h", 1.0)], eta=0.5)
    assert a.end == pytest.approx(2.0) and b.end == pytest.approx(2.0)


def test_coupling_only_while_both_busy() -> None:
    # h2d 1 s of work alone from 0; d2h 0.2 s of work arrives at 0.5 and both run at 0.5 rate:
    # d2h ends at 0.9; h2d did 0.5 + 0.2 by then, its last 0.3 s alone -> ends at 1.2
    a, b = _run([(0.0, "h2d", 1.0), (0.5, "d2h", 0.2)], eta=0.5)
    assert b.end == pytest.approx(0.9)
    assert a.end == pytest.approx(1.2)


def test_drain_completes_queue_at_projected_times() -> None:
    env = simpy.Environment()
    link = DuplexLink(env)
    done: list[float] = []
    jobs = [Job("d2h", 1.0, 0, on_done=lambda j: done.append(j.end)) for _ in range(3)]
    for j in jobs:
        link.submit(j)
    assert link.drain_time("d2h") == pytest.approx(3.0)
    t = link.complete_all_now("d2h")
    assert t == pytest.approx(3.0) and done == pytest.approx([1.0, 2.0, 3.0])
    late = link.submit(Job("d2h", 1.0, 0))
    env.run()
    assert late.start == pytest.approx(3.0) and late.end == pytest.approx(4.0)
