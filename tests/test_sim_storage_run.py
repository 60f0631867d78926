"""Timed runs with an L3 tier: what the stop policies, a slow store and a shared store do to
hit rates and TTFT, and what a run reports. The first 400 requests of the bundled conversation
trace on a small device pool (so L1/L2 lose what L3 keeps), at a quarter of the trace's rate."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.config import load_config
from sim.engine import Engine, run_simulation
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace

BASE = [
    "sglang.version=0.5.14",
    "workload.max_requests=400",
    "gpu.device_tokens=262144",
    "workload.rate_scale=0.25",
]


@pytest.fixture(scope="module")
def trace() -> Any:
    return read_trace(MOONCAKE_CONVERSATION)


def run(trace: Any, *extra: str) -> dict[str, Any]:
    return run_simulation(load_config(None, [*BASE, *extra]), trace, None, progress=False)


@pytest.fixture(scope="module")
def l2(trace: Any) -> dict[str, Any]:
    return run(trace)


@pytest.fixture(scope="module")
def l3(trace: Any) -> dict[str, Any]:
    return run(trace, "storage.backend=mooncake")


def test_without_a_store_nothing_changes_in_kind(l2: dict[str, Any]) -> None:
    assert "storage" not in l2 and l2["storage_hit_rate"] == 0.0
    assert set(l2["sglang_defects"]) == {"L2LB"}
    assert l2["hit_rate"] == pytest.approx(l2["device_hit_rate"] + l2["host_hit_rate"])


def test_a_store_adds_l3_hits_and_cuts_ttft(l2: dict[str, Any], l3: dict[str, Any]) -> None:
    st = l3["storage"]
    assert l3["storage_hit_rate"] > 0.05
    assert l3["hit_rate"] == pytest.approx(
        l3["device_hit_rate"] + l3["host_hit_rate"] + l3["storage_hit_rate"]
    )
    assert l3["hit_rate"] > l2["hit_rate"] + 0.05
    assert l3["ttft_mean_s"] < l2["ttft_mean_s"]
    assert st["prefetches_issued"] == st["prefetches_terminated"] + st["prefetches_revoked"]
    assert st["storage_hit_tokens"] <= st["prefetched_tokens"]
    assert st["bytes_read"] > 0 and st["bytes_written"] > 0
    assert st["store_written_tokens"] == st["store_tokens"]  # unbounded: nothing evicted
    assert set(l3["sglang_defects"]) >= {f"D{i}" for i in range(1, 11)}


def test_timeout_on_a_slow_store_gives_up_and_wait_complete_waits(trace: Any) -> None:
    """At 0.05 GB/s a 128-page read batch takes many seconds: under the 2 s timeout no batch
    lands in time (the reads are discarded), under wait_complete they land and TTFT pays."""
    slow = ("storage.backend=file", "storage.read_gbps_override=0.05")
    timeout = run(trace, *slow)
    waited = run(trace, *slow, "storage.prefetch_policy=wait_complete")
    assert timeout["storage_hit_rate"] == 0.0 and timeout["storage"]["pages_discarded"] > 0
    assert waited["storage_hit_rate"] > 0.02 and waited["storage"]["pages_discarded"] == 0
    assert waited["prefetch_wait_mean_s"] > 5 * timeout["prefetch_wait_mean_s"]
    assert waited["ttft_mean_s"] > timeout["ttft_mean_s"]
    # held back at most the timeout plus one scheduler pass (prefills here last < 2 s)
    assert timeout["storage"]["prefetch_wait_p90_s"] < 2.0 + 0.1 * 128 + 2.0


def test_best_effort_never_holds_a_request_back(trace: Any, l3: dict[str, Any]) -> None:
    be = run(trace, "storage.backend=mooncake", "storage.prefetch_policy=best_effort")
    assert be["prefetch_wait_mean_s"] == 0.0
    assert 0 < be["storage_hit_rate"] < l3["storage_hit_rate"]  # only what queueing allowed


def test_a_shared_store_serves_other_instances(trace: Any) -> None:
    two = ("storage.backend=mooncake", "cluster.instances=2", "router.policy=round_robin")
    shared = run(trace, *two)
    apart = run(trace, *two, "storage.shared=no")
    assert shared["storage"]["shared"] and not apart["storage"]["shared"]
    assert shared["storage_hit_rate"] > 1.5 * apart["storage_hit_rate"]


def test_state_is_consistent_after_a_run(trace: Any) -> None:
    from dataclasses import asdict

    from hicache.config import resolve_pools
    from hicache.lifecycle import paged_requests
    from sim.costs import build_costs
    from sim.scheduler import SchedulerParams, SimReq
    from sim.storage_setup import StorageSetup

    cfg = load_config(None, [*BASE, "storage.backend=file"])
    dev, host, _ = resolve_pools(cfg)
    costs = build_costs(cfg)
    reqs = [SimReq(r) for r in paged_requests(trace, 64, rate_scale=0.25, limit=400)]
    setup = StorageSetup.from_config(cfg, costs.bytes_per_page)
    e = Engine(reqs, device_tokens=dev, host_tokens=host, page_size=64,
               write_policy="write_through", eviction="lru", costs=costs,
               sched=SchedulerParams(page_size=64, **asdict(cfg.scheduler)), closed_loop=True,
               progress=False, storage=setup)  # fmt: skip
    e.run()
    cache = e.cache
    cache.check_hicache_events()
    cache.check_invariants(device_pages_outside=[])
    assert not cache.ongoing_prefetch
    st = cache.storage
    assert st is not None and st.prefetch_tokens_occupied == 0


def test_a_store_with_little_total_bandwidth_is_shared_by_its_instances(trace: Any) -> None:
    """Four instances on a slow shared file store: unlimited total bandwidth (each instance at
    its own rate) against a store that serves them all at one instance's read rate."""
    four = ("storage.backend=file", "cluster.instances=4", "router.policy=round_robin",
            "storage.shared=yes", "storage.read_gbps_override=1",
            "storage.write_gbps_override=0.5")  # fmt: skip
    wide = run(trace, *four)
    narrow = run(trace, *four, "storage.store_gbps=1")
    assert narrow["storage"]["write_busy_s"] > 1.2 * wide["storage"]["write_busy_s"]
    assert narrow["storage_hit_rate"] < wide["storage_hit_rate"]


def test_an_expired_timeout_does_not_spin_the_idle_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request whose prefetch timed out but which admission cannot reach (the head waits
    for memory) must not make the idle loop wake every nanosecond until something else
    happens: scheduler passes stay proportional to the requests (events, not seconds)."""
    from sim import engine as engine_mod
    from traces.bundled import synthetic_path

    limit, passes = 200 * 60, 0

    def count() -> None:
        nonlocal passes
        passes += 1
        if passes > limit:  # fail at once instead of spinning for many minutes
            raise AssertionError(f"more than {limit} scheduler passes for 60 requests")

    real = engine_mod.Engine.__init__

    def init(self: Engine, *a: Any, **kw: Any) -> None:
        real(self, *a, **kw)
        for inst in self.instances:
            inst.sched.sample = count  # type: ignore[method-assign]

    monkeypatch.setattr(engine_mod.Engine, "__init__", init)
    trace = read_trace(synthetic_path("shared-prefix"))
    cfg = load_config(None, ["storage.backend=mooncake", "gpu.device_tokens=4096",
                             "workload.max_requests=60"])  # fmt: skip
    s = run_simulation(cfg, trace, None, progress=False)
    assert s["finished_requests"] == 60 and passes > 60
