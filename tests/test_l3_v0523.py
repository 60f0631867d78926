"""SGLang 0.5.23's L3 decisions, one at a time (SGLANG_0523.md §2.10), on our cache through the
conformance adapter (page size 1, pools in pages)."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.v0523.ours_side import OursUnifiedCache


def _cache(
    policy: str = "wait_complete", host: int = 64, threshold: int = 2, **kw: Any
) -> OursUnifiedCache:
    l3 = {"prefetch_policy": policy, "threshold": threshold, "batch_pages": 2,
          "timeout_base": 1.0, "timeout_per_ki_token": 256.0}  # fmt: skip
    return OursUnifiedCache(page_size=1, device_pages=32, host_pages=host,
                            write_policy=kw.get("write_policy", "write_through"),
                            eviction_policy="lru", l3=l3)  # fmt: skip


PROMPT = [1, 2, 3, 2, 1, 3, 3, 2, 1]


def _l3(c: OursUnifiedCache) -> Any:
    assert c.l3 is not None
    return c.l3


def test_the_hit_is_allocated_after_the_query_and_sized_to_it() -> None:
    c = _cache()
    c.l3_put(PROMPT[:5])  # 5 of the 8 prefetchable tokens are stored
    host_free = c.host.available_size()  # type: ignore[union-attr]
    c.prefetch("a", PROMPT, len(PROMPT) - 1, 0.0, None)
    st = c.l3_state()
    assert st["occupied"] == 8  # the requested span is reserved ...
    assert c.host.available_size() == host_free  # type: ignore[union-attr]  # ... no host memory
    assert c.query_step()
    assert c.l3_state()["hit_queue"] == [("a", 5)]
    c.check_hicache_events()  # the scheduler drains the hit: 5 host pages, not 8
    assert c.host.available_size() == host_free - 5  # type: ignore[union-attr]
    assert [o[3] is not None and len(o[3]) for o in c.l3_state()["ongoing_prefetch"]] == [5]


def test_the_completion_ack_inserts_before_admission() -> None:
    c = _cache()
    c.l3_put(PROMPT[:6])
    c.prefetch("a", PROMPT, len(PROMPT) - 1, 0.0, None)
    c.query_step()
    c.check_hicache_events()
    while c.read_step():
        pass
    assert c.match(PROMPT, 8)["host_hit"] == 0
    c.check_hicache_events()  # progress acks, then the completion ack: insert_host now
    assert c.l3_state()["ongoing_prefetch"] == []
    assert c.match(PROMPT, 8)["host_hit"] == 6
    assert c.check_prefetch("a", 0.0)  # nothing left to wait for
    assert c.pop_span("a") == (6, 0)


def test_the_rate_limit_is_half_the_host_pool_and_arms_a_retry() -> None:
    c = _cache(host=16)  # limit: 8 tokens
    c.prefetch("a", PROMPT, 8, 0.0, None)  # reserves 8
    assert _l3(c).ctrl.prefetch_rate_limited()
    c.prefetch("b", [3, *PROMPT], 9, 0.0, None)
    st = c.l3_state()
    assert [o[0] for o in st["ongoing_prefetch"]] == ["a"]
    assert st["retries"] == [("b", False, None, None)]


def test_the_timeout_starts_at_the_first_blocked_poll() -> None:
    c = _cache(policy="timeout")
    c.l3_put(PROMPT)
    c.prefetch("a", PROMPT, 8, 0.0, None)
    # no poll for 100 s: the timer has not started
    assert not c.check_prefetch("a", 100.0)
    wait = c.l3_state()["waits"]
    # 1 s + 1/4 s per token per 1,024 ... x 1,024 here: 8 requested tokens -> 3 s
    assert wait == [("a", 100.0, 3.0, False)]
    assert not c.check_prefetch("a", 103.0)  # strictly after the deadline only
    assert c.check_prefetch("a", 103.125)
    assert c.l3_state()["ongoing_prefetch"] == []
    assert c.l3_state()["retries"] == []  # a deadline is final: no retry


def test_best_effort_ends_an_unanswered_query_and_retries_it() -> None:
    c = _cache(policy="best_effort")
    c.prefetch("a", PROMPT, 8, 0.0, None)
    assert c.check_prefetch("a", 0.0)
    st = c.l3_state()
    assert st["ongoing_prefetch"] == [] and st["occupied"] == 0
    assert st["retries"] == [("a", False, None, None)]


def test_backups_go_out_per_published_fragment() -> None:
    c = _cache()
    d = c.alloc_device(6)
    assert d is not None
    c.insert(PROMPT[:6], d, prev_prefix_len=0, inserted_len=0, priority=0)
    c.flush_pending_backups()
    c.match(PROMPT[:3])  # splits the pending node: two fragments to publish
    c.finish_writes(None)
    c.check_hicache_events()
    assert [b[0] for b in c.l3_state()["backup_queue"]] == [3, 3]
    while c.backup_step():
        pass
    c.check_hicache_events()
    assert c.l3_state()["store_pages"] == 6 and c.l3_state()["ongoing_backup"] == []


@pytest.mark.parametrize("policy,expect_l3", [("wait_complete", True), ("best_effort", False)])
def test_cache_only_replay_reads_l3_under_0_5_23(policy: str, expect_l3: bool) -> None:
    from hicache.lifecycle import PagedRequest
    from sim.hitrate import HitRateConfig, replay

    stems = [tuple(range(1000 * k, 1000 * k + 40)) for k in range(4)]
    reqs = [PagedRequest(rid=i, symbols=stems[i % 4] + (100 + i,), input_length=41,
                         output_length=1) for i in range(12)]  # fmt: skip
    # four stems in turn; the device holds one, the host about two: the oldest only L3 keeps
    # (the host needs room beside its copies of device-resident pages for a fetched hit)
    cfg = HitRateConfig(device_tokens=48, host_tokens=96, page_size=1, storage=True,
                        prefetch_policy=policy, prefetch_threshold=8,
                        sglang_version="0.5.23")  # fmt: skip
    res = replay(reqs, cfg)
    assert res.prefetches_issued > 0
    assert (res.storage_hit_tokens > 0) is expect_l3
