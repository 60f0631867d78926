"""STORAGE_TIER.md Appendix A, scenarios T1-T10, with the numbers observed on SGLang 0.5.14.

Set-up (as there): page size 4, device pool 64 tokens, host pool 128 tokens, LRU, prefetch
threshold 8 tokens (capacity limit int(0.8 x (128 - 64)) = 51). Stages run when a step says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hicache.policy import HiRadixCache, PageKey
from hicache.policy.storage import PageStore, StorageController
from tests.policy.harness import Harness

P = 4


class L3:
    """A harness with an L3 tier attached; ``self.c`` is the storage controller."""

    def __init__(
        self,
        *,
        write_policy: str = "write_through",
        policy: str = "wait_complete",
        device: int = 64,
        host: int = 128,
        batch_pages: int = 128,
    ) -> None:
        self.h = Harness(
            device_tokens=device, host_tokens=host, page_size=P, write_policy=write_policy
        )
        assert self.h.host is not None
        self.store = PageStore()
        self.c = StorageController(
            self.h.host, self.store, device_tokens=device, threshold=8, batch_pages=batch_pages
        )
        self.cache: HiRadixCache = self.h.cache
        self.cache.attach_storage(self.c, prefetch_policy=policy, prefetch_threshold=8)

    def hold(self, tokens: Sequence[int]) -> None:
        """Put the pages of ``tokens`` (a prefix from the root) into L3."""
        self.store.set(self.c.hasher.chain(0, self.h.key(tokens)))

    def arrive(self, rid: str, tokens: Sequence[int], now: float = 0.0) -> bool:
        """A request arrives: the arrival-time match, then ``_prefetch_kvcache``."""
        key = PageKey(self.h.key(tokens))
        limit = (len(tokens) - 1) // P
        m = self.cache.match_prefix(key, limit=limit * P)
        return self.cache.prefetch_kvcache(rid, key, m, limit, now)

    def host_free(self) -> int:
        assert self.h.host is not None
        return self.h.host.available_size()

    def drain(self) -> None:
        self.cache.check_hicache_events()

    def admit(self, tokens: Sequence[int]) -> tuple[int, int, int]:
        """Match and load back as an admitted request: (device hit, host hit, loaded tokens)."""
        key = PageKey(self.h.key(tokens))
        m = self.cache.match_prefix(key, limit=(len(tokens) - 1) // P * P)
        dev, host = m.device_hit_length, m.host_hit_length
        loaded = 0
        if host:
            pages, _ = self.cache.init_load_back(m.best_match_node, host)
            loaded = len(pages) * P
            self.cache.ready_to_load_host_cache()
            self.h.ack_loads()
        return dev, host, loaded

    def check(self) -> None:
        self.h.check()

    def find(self, tokens: Sequence[int]) -> object:
        """The node ending exactly after ``tokens``, or None."""
        try:
            return self.h.node(tokens)
        except (KeyError, AssertionError):
            return None


def seq(a: int, b: int) -> list[int]:
    """Tokens a..b inclusive."""
    return list(range(a, b + 1))


def test_t1_backup_after_the_write_ack() -> None:
    s = L3()
    s.h.insert(seq(0, 11))
    n1 = s.h.node(seq(0, 11))
    assert n1.lock_ref == 1 and n1.host_value is not None and s.host_free() == 116
    assert not s.c.backup_queue
    s.h.ack_writes()
    assert n1.lock_ref == 0 and n1.host_ref_counter == 1
    assert len(s.c.backup_queue) == 1 and len(s.c.backup_queue[0].hash_value) == 3
    assert s.c.run_write() and s.store.pages_written == 3 and n1.host_ref_counter == 1
    s.drain()
    assert n1.host_ref_counter == 0 and not s.cache.ongoing_backup
    s.h.insert(seq(0, 19))
    assert n1.hit_count == 2
    s.h.ack_writes()
    assert [len(op.hash_value) for op in s.c.backup_queue] == [2]
    s.c.run_all()
    s.drain()
    assert s.store.pages_written == 5
    s.cache.flush()
    s.h.insert(seq(0, 19))
    s.h.ack_writes()
    assert [len(op.hash_value) for op in s.c.backup_queue] == [5]
    s.c.run_all()
    assert s.store.pages_written == 5 and s.store.pages_skipped == 5 and len(s.store) == 5
    s.drain()
    s.check()


def test_t2_split_before_the_ack_then_write_back() -> None:
    s = L3()
    s.h.insert(seq(0, 11))
    s.cache.match_prefix([0, 1, 2, 3, 99, 98, 97, 96])
    upper, lower = s.h.node(seq(0, 3)), s.h.node(seq(0, 11))
    assert upper is not lower and upper.lock_ref == 1 and lower.lock_ref == 1
    assert upper.write_through_pending_id is not None
    s.h.ack_writes()
    assert upper.lock_ref == 0 and lower.lock_ref == 0
    assert [len(op.hash_value) for op in s.c.backup_queue] == [3]
    assert upper.host_ref_counter == 0 and lower.host_ref_counter == 1
    s.c.run_all()
    s.drain()
    assert s.store.pages_written == 3 and lower.host_ref_counter == 0
    s.check()

    wb = L3(write_policy="write_back")
    wb.h.insert(seq(0, 11))
    node = wb.h.node(seq(0, 11))
    assert node.host_value is None and not wb.c.backup_queue
    wb.cache.evict(12)
    assert node.value is None and node.host_value is not None and node.host_ref_counter == 1
    assert [len(op.hash_value) for op in wb.c.backup_queue] == [3]
    wb.c.run_all()
    assert wb.store.pages_written == 3
    wb.drain()
    assert node.host_ref_counter == 0
    wb.check()


def test_t3_full_hit_wait_complete() -> None:
    s = L3()
    s.hold(seq(0, 23))
    assert s.arrive("r1", seq(0, 25))
    entry = s.cache.ongoing_prefetch["r1"]
    assert entry.anchor is s.cache.root and entry.tokens == 24
    assert s.host_free() == 104 and s.cache.root.host_ref_counter == 1
    assert s.c.prefetch_tokens_occupied == 24
    assert not s.cache.check_prefetch_progress("r1", 0.0)
    assert s.c.run_query() and s.c.stats.pages_queried == 6 and entry.op.hit_pages == 6
    assert not s.cache.check_prefetch_progress("r1", 0.0)
    assert s.c.run_read() and entry.op.completed_tokens == 24
    s.check()
    assert s.cache.check_prefetch_progress("r1", 0.0)
    node = s.h.node(seq(0, 23))
    assert node.value is None and node.host_value == entry.host_pages and s.host_free() == 104
    assert s.cache.root.host_ref_counter == 0 and s.c.prefetch_tokens_occupied == 0
    assert s.cache.pop_prefetch_loaded_tokens("r1") == 24
    assert s.admit(seq(0, 25)) == (0, 24, 24)
    assert node.value is not None and s.h.device.available_size() == 40
    assert s.cache.check_prefetch_progress("r1", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("r1") == 0
    s.check()


def test_t4a_partial_hit_releases_unused_slots_at_the_next_drain() -> None:
    s = L3()
    s.hold(seq(0, 11))
    assert s.arrive("r1", seq(0, 24)) and s.host_free() == 104
    s.c.run_query()
    assert s.host_free() == 104 and s.c.prefetch_tokens_occupied == 24
    s.drain()
    assert s.host_free() == 116 and s.c.prefetch_tokens_occupied == 24
    s.c.run_all()
    s.check()
    assert s.cache.check_prefetch_progress("r1", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("r1") == 12
    assert s.admit(seq(0, 24))[2] == 12
    s.check()


def test_t4b_short_hit_is_revoked() -> None:
    s = L3()
    s.hold(seq(100, 103))
    assert s.arrive("r2", seq(0, 20)) and s.host_free() == 108
    s.c.run_query()
    assert not s.cache.check_prefetch_progress("r2", 0.0)
    s.check()
    s.drain()
    assert s.cache.check_prefetch_progress("r2", 0.0)
    assert s.cache.root.host_ref_counter == 0 and s.c.prefetch_tokens_occupied == 0
    assert s.host_free() == 128 and s.cache.pop_prefetch_loaded_tokens("r2") == 0
    s.check()


def test_t4cd_issue_guards() -> None:
    s = L3()
    s.hold(seq(0, 63))
    assert not s.arrive("c", seq(0, 7))  # 7 usable tokens round down to 4 < 8
    assert s.cache.storage_stats.prefetch_below_threshold == 1
    s.c.prefetch_tokens_occupied = 51  # = the limit
    assert s.c.prefetch_capacity_limit == 51
    assert not s.arrive("d", seq(0, 39))
    assert s.cache.storage_stats.prefetch_rate_limited == 1 and s.host_free() == 128


@pytest.mark.parametrize("policy", ["best_effort", "timeout"])
def test_t5_best_effort_and_timeout(policy: str) -> None:
    s = L3(policy=policy, batch_pages=2)
    s.hold(seq(0, 23))
    assert s.arrive("r", seq(0, 24), now=0.0)
    while s.c.prefetch_queue:
        s.c.run_query()
    assert s.c.stats.query_calls == 3
    if policy == "best_effort":
        assert s.cache.check_prefetch_progress("r", 0.0)  # first read still held
        assert s.cache.pop_prefetch_loaded_tokens("r") == 0
        assert s.c.prefetch_tokens_occupied == 0 and s.cache.root.host_ref_counter == 0
        assert s.host_free() == 104 and s.find(seq(0, 7)) is None
        s.check()
        assert s.c.run_read() and s.c.stats.pages_read == 2 and not s.c.prefetch_buffer
        s.drain()
        assert s.host_free() == 128
        s.check()
        return
    limit = 2.0 + 0.1 * 24 / 1024
    assert not s.cache.check_prefetch_progress("r", 0.01)
    s.c.run_read()
    op = s.cache.ongoing_prefetch["r"].op
    assert op.completed_tokens == 8
    assert not s.cache.check_prefetch_progress("r", 0.5)
    call = s.c.read_begin()  # the second batch is in flight
    assert call is not None
    assert not s.cache.check_prefetch_progress("r", limit - 0.001)
    assert s.cache.check_prefetch_progress("r", limit + 0.001)
    node = s.h.node(seq(0, 7))
    assert node is not None and node.value is None
    assert s.cache.pop_prefetch_loaded_tokens("r") == 8
    assert s.admit(seq(0, 24)) == (0, 8, 0)  # 8 < 10: not loaded
    assert s.host_free() == 104
    s.check()
    s.c.read_end(call)
    s.drain()
    assert s.host_free() == 120
    s.check()


def test_t6_overlapping_prefetches() -> None:
    s = L3()
    s.hold(seq(0, 31))
    assert s.arrive("a", seq(0, 16)) and s.arrive("b", seq(0, 32))
    s.c.run_all()
    assert s.host_free() == 80 and s.c.prefetch_tokens_occupied == 48
    assert s.cache.root.host_ref_counter == 2
    assert s.cache.check_prefetch_progress("a", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("a") == 16
    assert s.admit(seq(0, 16))[2] == 16
    assert s.cache.check_prefetch_progress("b", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("b") == 16
    assert s.admit(seq(0, 32)) == (16, 16, 16)
    assert s.host_free() == 96 and s.c.prefetch_tokens_occupied == 0
    s.check()


def test_t7_host_full_at_issue() -> None:
    for x_on_device in (False, True):
        s = L3(device=32, host=40)
        s.hold(seq(100, 123))
        s.h.insert(seq(0, 23))
        s.h.ack_writes()
        s.c.run_all()
        s.drain()
        if not x_on_device:
            s.cache.evict(24)
        assert s.host_free() == 16
        assert s.arrive("r", seq(100, 124))
        entry = s.cache.ongoing_prefetch["r"]
        if x_on_device:  # unevictable from the host: the key shrinks to the free 16 tokens
            assert entry.tokens == 16 and s.host_free() == 0
            assert s.c.prefetch_tokens_occupied == 16
        else:  # evict_host(24) removed all of X although 8 were short
            assert entry.tokens == 24 and s.host_free() == 16
            assert s.find(seq(0, 23)) is None
        s.check()


def test_t8_prefix_on_device_and_host() -> None:
    s = L3()
    s.hold(seq(0, 31))
    s.h.insert(seq(0, 7))
    s.h.insert(seq(0, 15))
    s.h.ack_writes()
    s.c.run_all()
    s.drain()
    s.cache.evict(8)
    upper, anchor = s.h.node(seq(0, 7)), s.h.node(seq(0, 15))
    assert upper.value is not None and anchor.value is None
    assert s.arrive("r", seq(0, 32))
    entry = s.cache.ongoing_prefetch["r"]
    assert entry.anchor is anchor and entry.tokens == 16 and anchor.host_ref_counter == 1
    assert entry.op.last_hash == s.cache.node_hash_values(anchor)[-1]
    assert s.cache.evict_host(100) == 0
    s.c.run_all()
    assert s.cache.check_prefetch_progress("r", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("r") == 16
    assert s.cache.controller.load_batches == 0
    assert s.admit(seq(0, 32)) == (8, 24, 24)
    assert s.cache.controller.load_batches == 1
    assert all(n.value is not None and n.host_value is not None for n in s.cache.iter_nodes())
    s.check()


def test_t9_abort_during_the_transfer() -> None:
    s = L3(batch_pages=2)
    s.hold(seq(0, 23))
    assert s.arrive("r", seq(0, 24))
    while s.c.prefetch_queue:
        s.c.run_query()
    s.c.run_read()
    call = s.c.read_begin()
    assert call is not None
    s.cache.release_aborted_request("r")
    assert "r" not in s.cache.ongoing_prefetch and s.cache.root.host_ref_counter == 0
    assert s.c.prefetch_tokens_occupied == 0 and s.host_free() == 104
    assert s.find(seq(0, 7)) is None
    s.check()
    s.c.read_end(call)
    s.drain()
    assert s.host_free() == 128
    s.check()


def test_t10_misaligned_anchor_misses_and_is_counted() -> None:
    s = L3(write_policy="write_through_selective")
    s.hold(seq(0, 31))
    s.h.insert(seq(0, 7))
    node = s.h.node(seq(0, 7))
    assert node.host_value is None and node.hit_count == 1
    assert s.arrive("r", seq(0, 32))
    entry = s.cache.ongoing_prefetch["r"]
    assert entry.anchor is s.cache.root and entry.tokens == 24
    s.c.run_query()
    assert s.c.stats.query_calls == 1 and entry.op.hit_pages == 0
    s.drain()
    assert s.cache.check_prefetch_progress("r", 0.0)
    assert s.cache.pop_prefetch_loaded_tokens("r") == 0
    assert s.cache.defects["D7"] == 1 and s.cache.defect_tokens["D7"] == 24
    s.check()


def test_d1_fetched_pages_under_a_device_only_node_are_dropped() -> None:
    """STORAGE_TIER.md §8 D1 set-up: selective, a 24-token prefetch in flight, a shorter
    request computes tokens 0-7 (device-only); SGLang hangs 8-23 under it and crashes later."""
    s = L3(write_policy="write_through_selective")
    s.hold(seq(0, 23))
    assert s.arrive("r", seq(0, 24))
    s.c.run_all()
    s.h.insert(seq(0, 7))
    assert s.cache.check_prefetch_progress("r", 0.0)
    assert s.cache.defects["D1"] == 1 and s.cache.defect_tokens["D1"] == 16
    assert s.cache.pop_prefetch_loaded_tokens("r") == 0
    assert s.find(seq(0, 23)) is None
    s.cache.evict(8)  # SGLang: AssertionError here
    s.check()
    assert s.host_free() == 128 - 0


def test_a_revoked_prefetch_times_out_on_the_base_alone() -> None:
    """SGLang keeps a revoked operation's hit list empty, so until the revoke is drained the
    timeout is the base alone (2 s), not base + 0.1 s per 1,024 of the short hit; and the
    reserved slots, all queued for release, are not also held by the prefetch."""
    s = L3(policy="timeout")
    s.hold(seq(0, 3))  # one page: below the 8-token threshold
    assert s.arrive("r", seq(0, 12), now=0.0)
    s.c.run_query()
    s.check()
    assert not s.cache.check_prefetch_progress("r", 2.0)
    assert s.cache.check_prefetch_progress("r", 2.0002)  # > 2.0; the short hit adds nothing
    s.drain()
    assert s.host_free() == 128
    s.check()
