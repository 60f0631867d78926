"""Clusters (issue 16): several servers in one simulation behind a router. One server is the
single-server run; a router that sends everything to one instance leaves the others idle and
changes nothing for it; per-instance metrics add up; routers see real tiers read-only."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pytest

from hicache.config import load_config
from hicache.lifecycle import PagedRequest
from hicache.policy import PageKey
from sim.engine import Engine, run_simulation
from sim.instance import Instance
from tests.sim.harness import costs, req
from traces.io import read_trace

DATA = Path(__file__).resolve().parent.parent.parent / "traces" / "data"
MULTI = DATA / "synthetic" / "multiturn.jsonl"


class AllToOne:
    name = "all_to_one"

    def __init__(self, target: int) -> None:
        self.target = target
        self.seen: list[tuple[int, float]] = []

    def route(self, r: PagedRequest, views: Sequence[Instance], now: float) -> int:
        self.seen.append((r.rid, now))
        return self.target


def _reqs() -> list:  # type: ignore[type-arg]
    shared = tuple(range(40))
    out = []
    for i in range(30):
        sym = shared[: 8 + (i % 5) * 6] + tuple(range(1000 + 100 * i, 1000 + 100 * i + 20))
        out.append(req(i, prompt=len(sym) * 16, outputs=8 + i % 7, arrival=0.05 * i,
                       symbols=sym))  # fmt: skip
    return out


def _engine(instances: int = 1, router: object = None) -> Engine:
    from sim.scheduler import SchedulerParams

    return Engine(_reqs(), device_tokens=2048, host_tokens=8192, page_size=16,
                  write_policy="write_through", eviction="lru", costs=costs(),
                  sched=SchedulerParams(page_size=16), closed_loop=False, progress=False,
                  instances=instances, router=router)  # type: ignore[arg-type]  # fmt: skip


def test_a_router_that_picks_one_instance_leaves_its_run_unchanged() -> None:
    """Three instances, everything routed to instance 1: instance 1's requests are exactly the
    one-server run's (same times, hits, retractions), the others see nothing."""
    one = _engine()
    one.run()
    alone = one.frames()["requests"].drop(columns="instance")
    router = AllToOne(1)
    three = _engine(3, router)
    three.run()
    got = three.frames()["requests"]
    assert set(got["instance"]) == {1}
    pd.testing.assert_frame_equal(got.drop(columns="instance"), alone)
    assert [i.routed for i in three.instances] == [0, 30, 0]
    assert [rid for rid, _ in router.seen] == list(range(30))  # routed at arrival, in order
    assert [t for _, t in router.seen] == pytest.approx([0.05 * i for i in range(30)])


def test_a_cluster_needs_a_router_and_one_instance_uses_none() -> None:
    with pytest.raises(ValueError, match=r"needs a router"):
        _engine(2)
    with pytest.raises(ValueError, match=r"instances must be >= 1"):
        _engine(0)
    e = _engine()
    assert e.router is None and e.cache is e.instances[0].cache


def test_peek_prefix_is_match_prefix_without_side_effects() -> None:
    """What a tier-aware router reads of an instance equals what admission would match, and
    reading it changes nothing (no touch, no split, no statistics)."""
    e = _engine()
    e.run()
    cache = e.cache
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randrange(0, 70)
        key = PageKey(tuple(rng.randrange(0, 45) if rng.random() < 0.8 else 10**6 + j
                            for j in range(n)))  # fmt: skip
        limit = rng.choice([None, rng.randrange(0, 16 * 70)])
        before = (cache.now(), cache.stats.match_calls, len(cache.iter_nodes()))
        dev, host = cache.peek_prefix(key, limit)
        assert (cache.now(), cache.stats.match_calls, len(cache.iter_nodes())) == before
        m = cache.match_prefix(key, limit=limit)
        assert (dev, host) == (m.device_hit_length, m.host_hit_length), (key, limit)


def test_instance_views_count_what_the_router_needs() -> None:
    e = _engine(2, AllToOne(0))
    inst = e.instances[0]
    r = _reqs()[0]
    assert (inst.in_flight(), inst.waiting_tokens(), inst.running_tokens()) == (0, 0, 0)
    inst.admit(r)
    assert inst.in_flight() == 1 and inst.waiting_tokens() == r.input_length
    assert inst.cached_prefix(r.req) == (0, 0)


def test_cluster_run_directory_and_fleet_summary(tmp_path: Path) -> None:
    trace = read_trace(MULTI)
    cfg = load_config(None, ["gpu.device_tokens=16384", "cluster.instances=3",
                             "router.policy=session_affinity"])  # fmt: skip
    s = run_simulation(cfg, trace, tmp_path / "c", progress=False)
    assert (s["instances"], s["router"]) == (3, "session_affinity")
    per = s["per_instance"]
    assert [p["instance"] for p in per] == [0, 1, 2]
    assert sum(p["requests"] for p in per) == s["requests"] == len(trace)
    assert sum(p["prompt_tokens"] for p in per) == s["prompt_tokens"]
    assert s["imbalance_requests"] == pytest.approx(
        max(p["requests"] for p in per) * 3 / len(trace)
    )
    req = pd.read_parquet(tmp_path / "c" / "requests.parquet")
    assert list(req["rid"]) == list(range(len(trace)))
    # session affinity: every turn of a conversation on one instance
    sessions = {r.session_id for r in trace}
    by_session = {sid: set() for sid in sessions}  # type: ignore[var-annotated]
    for r, inst in zip(trace, req["instance"], strict=True):
        by_session[r.session_id].add(int(inst))
    assert all(len(v) == 1 for v in by_session.values())
    assert len({next(iter(v)) for v in by_session.values()}) == 3  # spread over all three
    tl = pd.read_parquet(tmp_path / "c" / "timeline.parquet")
    assert set(tl["instance"]) == {0, 1, 2}


def test_idle_instances_are_counted_and_named() -> None:
    """One conversation behind session affinity on 4 instances: the router uses one; the
    summary still has all 4 (3 idle, named) and the imbalance is against 4, not 1."""
    from traces.schema import Trace

    full = read_trace(MULTI)
    first = full.requests[0].session_id
    trace = Trace([r for r in full if r.session_id == first], full.header, full.path)
    cfg = load_config(None, ["gpu.device_tokens=16384", "cluster.instances=4",
                             "router.policy=session_affinity"])  # fmt: skip
    s = run_simulation(cfg, trace, None, progress=False)
    assert s["instances"] == 4 and len(s["per_instance"]) == 4
    busy = [p["instance"] for p in s["per_instance"] if p["requests"]]
    assert len(busy) == 1
    assert s["idle_instances"] == sorted(set(range(4)) - set(busy))
    assert s["imbalance_requests"] == pytest.approx(4.0)
    from cli.run_output import fleet_line

    line = fleet_line(s)
    assert "3 of 4 instances got no request" in line and "router used 1" in line


def test_one_instance_summary_has_no_fleet_keys(tmp_path: Path) -> None:
    trace = read_trace(MULTI)
    s = run_simulation(load_config(None, ["gpu.device_tokens=16384"]), trace, None, False)
    assert "per_instance" not in s and "instances" not in s


def test_the_report_averages_a_cluster_over_its_instances(tmp_path: Path) -> None:
    """Occupancy and link busy fractions of a cluster are per-instance means, so they stay in
    [0, 1] however many instances there are."""
    from studies.report.derive import occupancy, pcie_totals
    from studies.report.load import load_runs

    trace = read_trace(MULTI)
    base = ["gpu.device_tokens=16384"]
    run_simulation(load_config(None, base), trace, tmp_path / "one", progress=False)
    run_simulation(load_config(None, [*base, "cluster.instances=4", "router.policy=least_load"]),
                   trace, tmp_path / "four", progress=False)  # fmt: skip
    data = load_runs([tmp_path / "one", tmp_path / "four"])
    one, four = sorted(data.runs, key=lambda r: r.instances)
    assert (one.instances, four.instances) == (1, 4)
    for run in (one, four):
        occ = occupancy(run)
        for key in ("requests", "locked", "evictable", "host"):
            assert all(v is None or 0.0 <= v <= 1.0 for v in occ[key]), key
        tot = pcie_totals(run)
        assert 0.0 <= tot["d2h_busy"] <= 1.0
    # four instances share the same work: less of each instance's pool and link is busy
    assert pcie_totals(four)["d2h_busy"] < pcie_totals(one)["d2h_busy"]


class Scripted:
    """Routes request ``rid`` to ``plan[rid]``."""

    name = "scripted"

    def __init__(self, plan: dict[int, int]) -> None:
        self.plan = plan

    def route(self, r: PagedRequest, views: Sequence[Instance], now: float) -> int:
        return self.plan[r.rid]


def test_tier_aware_credits_a_real_host_copy_over_recomputing() -> None:
    """A prefix that instance 0 served and then evicted to host (write_through backed it up):
    the tier-aware router reads it from the real cache and prefers instance 0 to an idle
    instance 1 that would recompute; with no host credit the two cost the same."""
    from hicache.config import RouterConfig
    from sim.routers import TierAwareRouter
    from sim.scheduler import SchedulerParams

    prefix = tuple(range(40))  # 40 pages of 16 tokens
    first = req(0, prompt=640, outputs=4, arrival=0.0, symbols=prefix)
    fillers = [req(i, prompt=640, outputs=4, arrival=0.1 * i,
                   symbols=range(10_000 * i, 10_000 * i + 40)) for i in range(1, 6)]  # fmt: skip
    e = Engine([first, *fillers], device_tokens=2048, host_tokens=16384, page_size=16,
               write_policy="write_through", eviction="lru", costs=costs(),
               sched=SchedulerParams(page_size=16), closed_loop=False, progress=False,
               instances=2, router=Scripted({i: 0 for i in range(6)}))  # fmt: skip
    e.run()
    follow = req(
        9, prompt=800, outputs=4, arrival=1.0, symbols=(*prefix, *range(50_000, 50_010))
    ).req
    dev0, host0 = e.instances[0].cached_prefix(follow)
    assert host0 > 0 and dev0 + host0 == 640  # the prefix is cached, partly or all on host
    assert e.instances[1].cached_prefix(follow) == (0, 0)
    tier = TierAwareRouter(RouterConfig(policy="tier_aware"), 16)
    assert tier.cost(follow, e.instances[0]) < tier.cost(follow, e.instances[1])
    assert tier.route(follow, e.instances, 1.0) == 0
    blind = TierAwareRouter(RouterConfig(policy="tier_aware", host_weight=0.0), 16)
    gap = blind.cost(follow, e.instances[1]) - blind.cost(follow, e.instances[0])
    assert gap == pytest.approx(dev0 / 16)  # only the device part still counts
