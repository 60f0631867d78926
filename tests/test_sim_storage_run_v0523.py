"""Timed runs with an L3 tier under SGLang 0.5.23 (``sglang.version = "0.5.23"``): the same
trace slice as ``test_sim_storage_run`` (the first 400 requests of the bundled conversation
trace, a small device pool, a quarter of the rate), through 0.5.23's prefetch path
(``hicache.policy.v0523.l3``, ``sim.scheduler_v0523``)."""

from __future__ import annotations

from typing import Any

import pytest

from hicache.config import load_config
from sim.engine import Engine, run_simulation
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace

BASE = ["workload.max_requests=400", "gpu.device_tokens=262144", "workload.rate_scale=0.25",
        "sglang.version=0.5.23"]  # fmt: skip


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


def test_a_store_adds_l3_hits_and_cuts_ttft(l2: dict[str, Any], l3: dict[str, Any]) -> None:
    st = l3["storage"]
    assert st["sglang_version"] == "0.5.23"
    assert l3["storage_hit_rate"] > 0.05
    assert l3["hit_rate"] == pytest.approx(
        l3["device_hit_rate"] + l3["host_hit_rate"] + l3["storage_hit_rate"]
    )
    assert l3["hit_rate"] > l2["hit_rate"] + 0.05
    assert l3["ttft_mean_s"] < l2["ttft_mean_s"]
    assert st["storage_hit_tokens"] <= st["prefetched_tokens"]
    # 0.5.23 inserts a fetch when its completion ack is drained, mostly before admission
    assert st["prefetch_inserted_early"] > 0
    assert st["bytes_read"] > 0 and st["bytes_written"] > 0
    assert set(l3["sglang_defects"]) == {"B6"}


def test_timeout_on_a_slow_store_gives_up_and_wait_complete_waits(trace: Any) -> None:
    slow = ("storage.backend=file", "storage.read_gbps_override=0.05")
    timeout = run(trace, *slow)
    waited = run(trace, *slow, "storage.prefetch_policy=wait_complete")
    assert timeout["storage"]["prefetch_deadline_expired"] > 0
    assert waited["storage"]["prefetch_deadline_expired"] == 0
    assert waited["storage_hit_rate"] > timeout["storage_hit_rate"]
    assert waited["prefetch_wait_mean_s"] > 2 * timeout["prefetch_wait_mean_s"]


def test_best_effort_never_holds_a_request_back(trace: Any, l3: dict[str, Any]) -> None:
    be = run(trace, "storage.backend=mooncake", "storage.prefetch_policy=best_effort")
    assert be["prefetch_wait_mean_s"] == 0.0
    assert be["storage_hit_rate"] < l3["storage_hit_rate"]
    # an unanswered query is ended at the first poll and re-issued by the retry pass
    assert be["storage"]["prefetch_retries_armed"] > 0


def test_write_back_meets_the_open_defect(trace: Any) -> None:
    wb = run(trace, "storage.backend=mooncake", "cache.write_policy=write_back")
    assert wb["sglang_defects"]["B6"]["count"] > 0


def test_the_0514_timeout_cap_is_ignored_with_a_note(tmp_path: Any) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "run", str(MOONCAKE_CONVERSATION), "--out",
         str(tmp_path / "r"), "--set", "workload.max_requests=20", "--set",
         "storage.backend=file", "--set", "storage.prefetch_timeout_max=10"],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (
        "prefetch_timeout_max ignored: SGLang 0.5.23 caps no prefetch timeout"
        in out.stdout + out.stderr
    )


def test_state_is_consistent_after_a_run(trace: Any) -> None:
    from dataclasses import asdict

    from hicache.config import resolve_pools
    from hicache.lifecycle import paged_requests
    from hicache.policy.v0523 import UnifiedRadixCache
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
               progress=False, storage=setup, sglang_version="0.5.23")  # fmt: skip
    e.run()
    cache = e.cache
    assert isinstance(cache, UnifiedRadixCache)
    st = cache.storage
    while st.ctrl.busy():  # the stages' last calls, then their acks
        st.ctrl.run_all()
    cache.check_hicache_events()
    cache.check_hicache_events()
    assert not st.ongoing_prefetch and not st.ongoing_backup
    assert st.ctrl.prefetch_tokens_occupied == 0
    assert sum(r.storage_hit for r in reqs) > 0
    # every host page is free or held by exactly one tree node
    held = [p for n in cache.tree.nodes.values() if n.host_value for p in n.host_value]
    assert len(held) == len(set(held))
    host_pool = cache.controller.host
    assert host_pool is not None
    assert len(held) + host_pool.free_page_count() == host_pool.num_pages
