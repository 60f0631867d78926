"""The duplex link (sim/link.py) on hand-computed scenarios: FIFO order per direction, the
duplex coupling (a job runs at rate eta while the opposite direction is busy, at rate 1
otherwise), drain_time and complete_all_now (the blocking write_back wait), and the scheduler
stall it causes in the engine (with eta)."""

from __future__ import annotations

from collections.abc import Generator

import pytest
import simpy

from sim.link import DuplexLink, Job
from tests.sim.harness import costs, engine, req


def timed(jobs: list[tuple[float, Job]], eta_d2h: float = 1.0, eta_h2d: float = 1.0) -> DuplexLink:
    """Submit each job at its time on a fresh link and run to the end."""
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": eta_d2h, "h2d": eta_h2d})

    def at(t: float, job: Job):  # type: ignore[no-untyped-def]
        yield env.timeout(t)
        link.submit(job)

    for t, job in jobs:
        env.process(at(t, job))
    env.run()
    return link


def test_each_direction_is_a_fifo_and_directions_are_independent() -> None:
    # d2h: a (1.0 s of work) at 0, b (0.5) at 0.2, c (0.25) at 0.3 -> a 0-1, b 1-1.5, c
    # 1.5-1.75, each starting when the previous ends. h2d: d (0.3) at 0.1 -> 0.1-0.4, unaffected
    # (eta 1).
    a, b, c = Job("d2h", 1.0, 0), Job("d2h", 0.5, 0), Job("d2h", 0.25, 0)
    d = Job("h2d", 0.3, 0)
    link = timed([(0.0, a), (0.2, b), (0.3, c), (0.1, d)])
    assert [(j.enqueued, j.start, j.end) for j in (a, b, c)] == [
        pytest.approx((0.0, 0.0, 1.0)),
        pytest.approx((0.2, 1.0, 1.5)),
        pytest.approx((0.3, 1.5, 1.75)),
    ]
    assert (d.start, d.end) == pytest.approx((0.1, 0.4))
    assert link.busy_time("d2h") == pytest.approx(1.75)
    assert link.busy_time("h2d") == pytest.approx(0.3)


def test_coupling_is_per_direction_and_only_while_the_other_is_busy() -> None:
    # eta d2h 0.5, h2d 0.8. d2h job of 1.0 s at 0; h2d job of 0.4 s at 0.2.
    # 0-0.2: d2h alone at rate 1 -> 0.2 done.
    # from 0.2 both busy: h2d at 0.8 -> ends 0.2 + 0.4 / 0.8 = 0.7; d2h at 0.5 -> 0.25 more.
    # from 0.7: d2h alone again at rate 1: 1 - 0.45 = 0.55 left -> ends 1.25.
    up, down = Job("d2h", 1.0, 0), Job("h2d", 0.4, 0)
    link = timed([(0.0, up), (0.2, down)], eta_d2h=0.5, eta_h2d=0.8)
    assert down.end == pytest.approx(0.7)
    assert up.end == pytest.approx(1.25)
    # timers armed: d2h at 0, h2d at 0.2 and d2h re-armed at eta, d2h re-armed at 1 at 0.7
    assert link.events == 4


def test_back_to_back_jobs_keep_the_other_direction_coupled() -> None:
    # eta 0.5 both ways. h2d: two jobs of 0.25 s at 0 (busy until their end); d2h: one job of
    # 1.0 s at 0. While both are busy each runs at 0.5: the h2d jobs end at 0.5 and 1.0, and
    # the d2h job has done 0.5 by 1.0; its last 0.5 alone -> 1.5.
    h1, h2, up = Job("h2d", 0.25, 0), Job("h2d", 0.25, 0), Job("d2h", 1.0, 0)
    timed([(0.0, h1), (0.0, h2), (0.0, up)], eta_d2h=0.5, eta_h2d=0.5)
    assert (h1.end, h2.start, h2.end) == pytest.approx((0.5, 0.5, 1.0))
    assert up.end == pytest.approx(1.5)


def test_drain_time_uses_the_coupled_rate_and_the_progress_so_far() -> None:
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": 0.5, "h2d": 0.5})
    assert link.drain_time("d2h") == 0.0  # idle: now
    link.submit(Job("h2d", 10.0, 0))
    link.submit(Job("d2h", 1.0, 0))
    link.submit(Job("d2h", 0.5, 0))
    assert link.busy("d2h") and link.busy("h2d")
    # h2d busy: 1.5 s of work at rate 0.5 -> 3.0
    assert link.drain_time("d2h") == pytest.approx(3.0)
    env.run(until=0.4)
    # 0.4 s at rate 0.5 did 0.2: 0.8 + 0.5 left at 0.5 -> 0.4 + 2.6 = 3.0
    assert link.drain_time("d2h") == pytest.approx(3.0)
    assert link.busy_time("d2h") == pytest.approx(0.4)
    # h2d: 9.9 left... its own drain at 0.5 while d2h is busy: 0.4 + 9.8 / 0.5 = 20.0
    assert link.drain_time("h2d") == pytest.approx(0.4 + (10.0 - 0.2) / 0.5)


def test_drain_time_at_rate_one_when_the_other_direction_is_idle() -> None:
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": 0.5, "h2d": 0.5})
    link.submit(Job("d2h", 1.0, 0))
    link.submit(Job("d2h", 0.5, 0))
    assert link.drain_time("d2h") == pytest.approx(1.5)


def test_complete_all_now_drains_at_the_coupled_rate() -> None:
    # eta 0.5 both ways. At 0: h2d job of 1.0 s; d2h jobs of 0.3 and 0.2 s. The blocking wait
    # finishes the d2h jobs at their projected times with h2d busy (rate 0.5): 0.6 and 1.0.
    # The direction stays busy until 1.0 (the h2d job, coupled meanwhile, has done 0.5 by
    # then). A d2h job submitted after the wait starts at 1.0 and, coupled with h2d again
    # (rate 0.5), ends at 1.0 + 0.2 / 0.5 = 1.4; h2d does 0.2 more by 1.4, then its last 0.3 at
    # rate 1 -> 1.7.
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": 0.5, "h2d": 0.5})
    down = link.submit(Job("h2d", 1.0, 0))
    done: list[tuple[float, float]] = []
    w1 = link.submit(Job("d2h", 0.3, 0, on_done=lambda j: done.append((env.now, j.end))))
    w2 = link.submit(Job("d2h", 0.2, 0, on_done=lambda j: done.append((env.now, j.end))))
    assert link.complete_all_now("d2h") == pytest.approx(1.0)
    # callbacks ran now, at t = 0, with the projected ends
    assert [t for t, _ in done] == [0.0, 0.0]
    assert [end for _, end in done] == pytest.approx([0.6, 1.0])
    assert (w1.start, w1.end, w2.start, w2.end) == pytest.approx((0.0, 0.6, 0.6, 1.0))
    late = link.submit(Job("d2h", 0.2, 0))
    env.run()
    assert (late.start, late.end) == pytest.approx((1.0, 1.4))
    assert down.end == pytest.approx(1.7)


def test_complete_all_now_at_rate_one_when_the_other_direction_is_idle() -> None:
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": 0.5, "h2d": 0.5})
    assert link.complete_all_now("d2h") == 0.0  # nothing queued: now
    link.submit(Job("d2h", 0.3, 0))
    link.submit(Job("d2h", 0.2, 0))
    assert link.complete_all_now("d2h") == pytest.approx(0.5)


def test_complete_all_now_keeps_the_direction_busy_until_the_drain_time() -> None:
    # eta 0.5. h2d job of 0.25 s; d2h jobs of 1.0 s in all, drained at 0 with h2d busy:
    # projected drain 1.0 / 0.5 = 2.0. The h2d job ends at 0.5 (coupled), after which the
    # placeholder runs at rate 1 and ends at 1.25: a copy queued after the wait starts at 1.25,
    # before the drained copies' recorded end (2.0).
    env = simpy.Environment()
    link = DuplexLink(env, eta={"d2h": 0.5, "h2d": 0.5})
    link.submit(Job("h2d", 0.25, 0))
    w = link.submit(Job("d2h", 1.0, 0))
    t = link.complete_all_now("d2h")
    assert t == pytest.approx(2.0) and w.end == pytest.approx(2.0)
    late = link.submit(Job("d2h", 0.1, 0))
    env.run()
    assert late.start >= w.end - 1e-9


def test_busy_time_counts_from_the_start_of_service() -> None:
    # one d2h job of 2 s submitted at 1: busy 1-3
    env = simpy.Environment()
    link = DuplexLink(env)

    def later() -> Generator[simpy.Event, None, None]:
        yield env.timeout(1.0)
        link.submit(Job("d2h", 2.0, 0))

    env.process(later())
    env.run(until=2.0)
    assert link.busy_time("d2h") == pytest.approx(1.0) and link.busy("d2h")
    env.run()
    assert link.busy_time("d2h") == pytest.approx(2.0) and not link.busy("d2h")
    assert link.busy_time("h2d") == 0.0


def test_on_change_fires_once_per_finished_job() -> None:
    env = simpy.Environment()
    calls: list[float] = []
    link = DuplexLink(env, on_change=lambda: calls.append(env.now))
    link.submit(Job("d2h", 1.0, 0))
    link.submit(Job("h2d", 0.5, 0))
    env.run()
    assert calls == pytest.approx([0.5, 1.0])


# ------------------------------------------------------ the write_back stall, in the engine --


def test_write_back_stall_drains_at_eta_while_a_load_runs() -> None:
    """Page 1, 250 device tokens, write_back; copies 1 ms per page each way; eta d2h 0.5
    (h2d 1.0); prefill 0.1 ms per token; 4 layers.

    * A (150 tokens) at 0 and B (100) at 1 fill the pool (no eviction: B's 100 fit exactly).
    * C (50) at 2: allocation evicts A (LRU) under write_back: 150 pages written, h2d idle so
      at rate 1: the scheduler stalls 0.15 s; C's prefill (5 ms) ends at 2.155.
    * D at 3 = A's first 100 tokens + 60 new: host hit 100, loaded into the 100 free pages.
      Its prefill launches the load (h2d, 0.1 s, 3.0-3.1) and then allocates 60 pages: none
      free, so it evicts B (LRU, 100 pages, not backed up) under write_back. The h2d load is
      running, so the write drains at eta 0.5: 0.1 / 0.5 -> the scheduler stalls until 3.2.
      The prefill (6 ms) starts at 3.2 and the layer pipeline (load done at 3.1) does not
      delay it: first token at 3.206.
    """
    reqs = [
        req(0, 0.0, 150, 1, symbols=range(150)),
        req(1, 1.0, 100, 1),
        req(2, 2.0, 50, 1),
        req(3, 3.0, 160, 1, symbols=(*range(100), *range(5000, 5060))),
    ]
    e = engine(reqs, page_size=1, device_tokens=250, host_tokens=1000, write_policy="write_back",
               costs=costs(write_s_per_page=1e-3, load_s_per_page=1e-3, eta_d2h=0.5))  # fmt: skip
    e.run()
    a, b, c, d = reqs
    assert a.first_token == pytest.approx(0.015)
    assert b.first_token == pytest.approx(1.01)
    assert c.first_token == pytest.approx(2.155)
    assert (d.device_hit, d.host_hit) == (0, 100)
    assert d.first_token == pytest.approx(3.206)
    assert d.load_stall_s == pytest.approx(0.0)
    rows = e.recorder.transfers
    assert [(t.direction, t.kind, t.pages) for t in rows] == [
        ("d2h", "write", 150),
        ("d2h", "write", 100),
        ("h2d", "load", 100),
    ]
    assert [(t.start_s, t.end_s) for t in rows] == [
        pytest.approx((2.0, 2.15)),
        pytest.approx((3.0, 3.2)),
        pytest.approx((3.0, 3.1)),
    ]


def test_a_load_launched_after_an_admission_stall_starts_after_it() -> None:
    """As the eta scenario, but D = A's first 120 tokens + 10 new, eta 1 both ways.

    At 3.0 D's host hit (120 tokens) does not fit the 100 free pages: load_back evicts the
    load's length, 120 tokens (0.5.14 ``evict(len(host_indices))``), in LRU order: B (100
    pages) and then C (50), neither backed up, under write_back: 150 pages written (one copy
    per node), and the scheduler blocks until they drain, 3.0 + 0.15 = 3.15. Only then is the
    batch finalized and the load (120 pages, 0.12 s) launched: 3.15-3.27. D's 10-token
    prefill (1 ms, 0.25 ms per layer) then ends one layer after the load: 3.27025."""
    reqs = [
        req(0, 0.0, 150, 1, symbols=range(150)),
        req(1, 1.0, 100, 1),
        req(2, 2.0, 50, 1),
        req(3, 3.0, 130, 1, symbols=(*range(120), *range(5000, 5010))),
    ]
    e = engine(reqs, page_size=1, device_tokens=250, host_tokens=1000, write_policy="write_back",
               costs=costs(write_s_per_page=1e-3, load_s_per_page=1e-3))  # fmt: skip
    e.run()
    d = reqs[3]
    assert (d.device_hit, d.host_hit) == (0, 120)
    writes = [(t.start_s, t.end_s, t.pages) for t in e.recorder.transfers if t.kind == "write"]
    assert writes == [pytest.approx((2.0, 2.15, 150)), pytest.approx((3.0, 3.1, 100)),
                      pytest.approx((3.1, 3.15, 50))]  # fmt: skip
    (load,) = [t for t in e.recorder.transfers if t.kind == "load"]
    assert (load.start_s, load.end_s) == pytest.approx((3.15, 3.27))
    assert d.first_token == pytest.approx(3.27025)
