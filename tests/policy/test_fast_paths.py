"""The speed-ups of the policy core decide exactly what the plain code would.

Each test sets a fast path against a slow reference: ``match_len`` against a scan, the chunked
free list against a flat list, the key memo against the same workload with the memo off.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Hashable
from typing import Any

import pytest

from hicache.lifecycle import KVLifecycle
from hicache.policy import HiRadixCache, ManualController, PageAllocator, PageKey
from hicache.policy.allocator import page_ids
from hicache.policy.radix import ExtendedPageKey, key_source, match_len


def _scan(node_key: tuple[int, ...], key: tuple[int, ...], off: int, end: int | None) -> int:
    seg = key[off : off + len(node_key) if end is None else min(off + len(node_key), end)]
    i = 0
    while i < len(seg) and seg[i] == node_key[i]:
        i += 1
    return i


def test_match_len_equals_a_scan() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        n = rng.randint(0, 80)
        node_key = tuple(rng.choice((1, 2)) if rng.random() < 0.05 else 0 for _ in range(n))
        length = rng.randint(0, 100)
        key = tuple(rng.choice((1, 2)) if rng.random() < 0.05 else 0 for _ in range(length))
        off = rng.randint(0, length)
        end = None if rng.random() < 0.5 else rng.randint(off, length + 3)
        assert match_len(node_key, key, off, end) == _scan(node_key, key, off, end)


class _FlatFreeList:
    """The free list as one Python list (what PageAllocator did before it kept chunks)."""

    def __init__(self, num_pages: int, front: bool) -> None:
        self.free_list = list(range(num_pages))
        self.front = front

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free_list):
            return None
        out, self.free_list = self.free_list[:n], self.free_list[n:]
        return out

    def free(self, pages: list[int]) -> None:
        if self.front:
            self.free_list = sorted(set(pages)) + self.free_list
        else:
            self.free_list += pages


@pytest.mark.parametrize("reuse", ["fifo", "front"])
@pytest.mark.parametrize("shared_ids", [False, True])
def test_chunked_free_list_hands_out_what_a_flat_list_does(reuse: str, shared_ids: bool) -> None:
    rng = random.Random(11)
    num = 10_000  # more than two initial chunks
    pool = PageAllocator(num, 1, reuse=reuse, ids=page_ids(num + 5) if shared_ids else None)
    model = _FlatFreeList(num, front=reuse == "front")
    held: list[list[int]] = []
    for step in range(3_000):
        op = rng.random()
        if op < 0.45:
            n = rng.choice((0, 1, 2, rng.randint(1, 5_000)))
            if rng.random() < 0.5:
                got = pool.alloc_pages(n)
            else:
                dest = [-1]
                got = dest[1:] if pool.alloc_into(dest, n) else None
                if got is not None:
                    assert dest[0] == -1
            assert got == model.alloc(n), step
            if got:
                held.append(got)
        elif op < 0.9 and held:
            pages = held.pop(rng.randrange(len(held)))
            part = pages[: rng.randint(0, len(pages))]
            if part != pages:
                held.append(pages[len(part) :])
            kept = list(part)
            pool.free(part if rng.random() < 0.7 else tuple(part))
            model.free(part)
            assert part == kept  # the pool never modifies a list it keeps
        elif op < 0.91:
            pool.clear()
            model = _FlatFreeList(num, front=reuse == "front")
            held.clear()
        assert pool.free_pages_snapshot() == model.free_list, step
        assert pool.free_page_count() == len(model.free_list)


def test_shared_ids_must_be_the_page_ids() -> None:
    with pytest.raises(ValueError, match="ids must start"):
        PageAllocator(4, 1, ids=[0, 1, 3, 2])
    with pytest.raises(ValueError, match="ids must start"):
        PageAllocator(4, 1, ids=[0, 1])


def test_extended_page_key_is_its_concatenation() -> None:
    base = PageKey((1, 2, 3))
    k = ExtendedPageKey(base, [-1, -2])
    assert k == (1, 2, 3, -1, -2) and isinstance(k, PageKey) and k.base is base
    assert key_source(k) is base and key_source(base) is base and key_source((1, 2)) is None
    assert k[1:4] == (2, 3, -1) and type(k[1:4]) is tuple
    back = pickle.loads(pickle.dumps(k))
    assert back == k and type(back) is PageKey
    assert ExtendedPageKey((5,), ()) == (5,)  # a plain base is taken as a PageKey


def test_extend_key_numbers_output_symbols_in_order() -> None:
    ctrl = ManualController(PageAllocator(100, 1), None)
    life = KVLifecycle(HiRadixCache(ctrl))
    prompt = PageKey((10, 11))
    out: list[Hashable] = []
    assert life.extend_key(prompt, out, 4) == (10, 11, -1, -2)
    assert life.extend_key(prompt, out, 3) == (10, 11, -1)  # a retraction re-uses them
    assert life.extend_key(prompt, out, 5) == (10, 11, -1, -2, -3)
    other: list[Hashable] = []
    assert life.extend_key(PageKey((7,)), other, 3) == (7, -4, -5)
    assert out == [-1, -2, -3] and other == [-4, -5]
    assert life.extend_key(prompt, out, 2) is prompt


def _tree_state(cache: HiRadixCache) -> list[tuple[object, ...]]:
    return [
        (
            n.id,
            tuple(n.key),
            n.value,
            n.host_value,
            n.lock_ref,
            n.hit_count,
            n.last_access_time,
            n.parent.id if n.parent else None,
        )
        for n in cache.iter_nodes()
    ]


def test_key_memo_decides_exactly_as_comparing_keys() -> None:
    """Page size 1: a PageKey (memo on) and the same symbols as a plain tuple (taken as token
    ids, memo off) must give the same results and trees, step by step."""
    rng = random.Random(3)
    caches = []
    for _ in range(2):
        ctrl = ManualController(PageAllocator(400, 1), PageAllocator(900, 1, "host"))
        caches.append(HiRadixCache(ctrl))
    prompts = [PageKey(rng.choice((1, 2, 3)) for _ in range(rng.randint(2, 40)))]
    for _ in range(60):
        base = rng.choice(prompts)
        cut = rng.randint(0, len(base))
        prompts.append(PageKey((*base[:cut], *(rng.randint(1, 9) for _ in range(15)))))
    for step in range(400):
        k = rng.choice(prompts)
        if rng.random() < 0.3:
            k = ExtendedPageKey(k, [-step - 1] * rng.randint(1, 3))
        limit = rng.choice((None, rng.randint(0, len(k))))
        outs = []
        for i, cache in enumerate(caches):
            r = random.Random(step)  # the same choices for both caches
            key: tuple[Hashable, ...] = k if i == 0 else tuple(k)
            m = cache.match_prefix(key, limit=limit)
            res: tuple[object, ...] = (m.device_indices, m.host_hit_length, m.last_device_node.id)
            if r.random() < 0.5:
                cache.evict(r.randint(1, 60))
            dev = cache.controller.device
            if dev.free_page_count() < len(key):
                cache.evict(len(key))
            pages = dev.alloc_pages(len(key))
            if pages is not None:
                prefix = cache.insert(key, pages)
                dev.free(pages[:prefix])  # the caller's duplicates of the device prefix
                res += (prefix,)
            if r.random() < 0.2:
                cache.evict_host(r.randint(1, 40))
            ctrl = cache.controller
            assert isinstance(ctrl, ManualController)
            ctrl.complete_all()
            cache.writing_check()
            cache.loading_check()
            cache.check_invariants()
            outs.append((res, _tree_state(cache), dev.free_pages_snapshot()))
        assert outs[0] == outs[1], step


def _lock_state(cache: HiRadixCache) -> tuple[object, ...]:
    return (
        tuple((n.id, n.lock_ref) for n in cache.iter_nodes()),
        cache.evictable_size(),
        cache.protected_size(),
        sorted(n.id for n in cache.evictable_leaves),
        sorted(n.id for n in cache.evictable_host_leaves),
    )


def test_move_lock_ref_equals_dec_then_inc() -> None:
    """A request prefilled in chunks moves its lock from the last node of one chunk to the
    last node of the next: one walk must leave exactly the state of dec_lock_ref(old) then
    inc_lock_ref(new), for descendants, the same node, and unrelated nodes (the fallback);
    and the evictions that follow pick the same nodes."""
    rng = random.Random(11)
    caches = [HiRadixCache(ManualController(PageAllocator(900, 1), PageAllocator(2000, 1, "host")))
              for _ in range(2)]  # fmt: skip
    locked: list[list[Any]] = [[], []]
    for step in range(300):
        shared = rng.randint(1, 30)
        tail = [rng.randint(100, 140) for _ in range(rng.randint(0, 30))]
        key = PageKey((*range(shared), *tail))
        cut = rng.randint(1, len(key))
        unrelated, evict_n = rng.random() < 0.1, rng.randint(1, 50)
        states = []
        for i, cache in enumerate(caches):
            dev = cache.controller.device
            if dev.free_page_count() < len(key):
                cache.evict(len(key))
            pages = dev.alloc_pages(len(key))
            if pages is None:  # both caches alike: the locks hold too much
                states.append(None)
                continue
            first = PageKey(key[:cut])
            dev.free(pages[: cache.insert(first, pages[:cut])])  # the first chunk
            old = cache.match_prefix(first).last_device_node
            cache.inc_lock_ref(old)
            again = cache.insert(key, pages)  # the whole key: its first chunk is on device
            if again > cut:
                dev.free(pages[cut:again])
            if step % 2:  # finish the write-throughs: their locks go, new nodes are unlocked
                ctrl = cache.controller
                assert isinstance(ctrl, ManualController)
                ctrl.complete_all()
                cache.writing_check()
            new = cache.match_prefix(key).last_device_node
            if unrelated:  # a node off old's path: the two-walk fallback
                new = cache.match_prefix(PageKey(range(shared))).last_device_node
            if i == 0:
                cache.move_lock_ref(old, new)
            else:
                cache.dec_lock_ref(old)
                cache.inc_lock_ref(new)
            locked[i].append(new)
            if len(locked[i]) > 8:
                cache.dec_lock_ref(locked[i].pop(0))
            cache.evict(evict_n)
            cache.check_invariants()
            states.append((_lock_state(cache), _tree_state(cache)))
        assert states[0] == states[1], step


def _chunk_state(cache: HiRadixCache) -> tuple[object, ...]:
    return (
        _tree_state(cache),
        tuple(n.priority for n in cache.iter_nodes()),
        cache.now(),
        cache.stats.insert_calls,
        cache.stats.match_calls,
        sorted(n.id for n in cache.evictable_leaves),
        sorted(n.id for n in cache.evictable_host_leaves),
        sorted(n.id for n in cache._dirty),
        sorted(n.id for n in cache._host_dirty),
        cache.evictable_size(),
        cache.protected_size(),
        cache.controller.device.free_pages_snapshot(),
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chunked_prefill_shortcut_decides_as_the_plain_walk(seed: int) -> None:
    """Chunked requests prefilled a few pages at a time among others that match, insert, split
    their paths, evict and finish. One cache takes the chunk shortcut (``locked_path``,
    ``insert_locked``, ``rematch_locked``, keys as ``PrefixKey``s that hit the key memo); the
    other the plain insert and match_prefix with fresh keys. Trees, clocks, locks, leaf sets,
    statistics and free lists must agree after every step."""
    from hicache.lifecycle import ReqKV, cache_finished_req, cache_unfinished_req
    from hicache.policy.radix import PrefixKey

    rng = random.Random(seed)
    caches = [HiRadixCache(ManualController(PageAllocator(700, 1), PageAllocator(1600, 1, "host")))
              for _ in range(2)]  # fmt: skip
    plain = caches[1]
    plain.locked_path = lambda *_args: None  # type: ignore[method-assignment]
    lives = [KVLifecycle(c) for c in caches]
    stems = [PageKey(rng.randint(1, 4) for _ in range(rng.randint(5, 40))) for _ in range(6)]
    live: list[list[tuple[ReqKV, PageKey, int]]] = [[], []]
    shortcut_taken = 0
    for step in range(700):
        op = rng.random()
        if op < 0.25 or not live[0]:  # a new request: a shared stem and its own tail
            stem = rng.choice(stems)
            base = PageKey((*stem[: rng.randint(0, len(stem))],
                            *(rng.randint(1, 30) for _ in range(rng.randint(1, 60)))))  # fmt: skip
            for life, reqs in zip(lives, live, strict=True):
                got = life.admit(base, len(base))
                reqs.append((got.kv, base, got.kv.protected_pages))
        elif op < 0.75:  # the next chunk of a live request (maybe its last)
            i = rng.randrange(len(live[0]))
            chunk = rng.randint(1, 9)
            for c, (cache, reqs) in enumerate(zip(caches, live, strict=True)):
                kv, base, done = reqs[i]
                full = min(len(base), done + chunk)
                dev = cache.controller.device
                if dev.free_page_count() < full - len(kv.kv):
                    cache.evict(full - len(kv.kv))
                pages = dev.alloc_pages(full - len(kv.kv))
                if pages is None:
                    continue  # both caches alike (the states agree)
                kv.kv += pages
                kv.key = PrefixKey(base, full) if c == 0 else PageKey(tuple(base[:full]))
                if c == 0 and cache.locked_path(kv.last_node, kv.protected_pages, kv.key):
                    shortcut_taken += 1
                cache_unfinished_req(cache, kv, chunked=True)
                if full == len(base):  # prefilled: the request finishes
                    kv.key = base
                    cache_finished_req(cache, kv)
                    reqs.pop(i)
                else:
                    reqs[i] = (kv, base, full)
        elif op < 0.8:  # retract one: it starts over from its first chunk, the same base
            i = rng.randrange(len(live[0]))
            fill = rng.randint(1, len(live[0][i][1]))
            for life, reqs in zip(lives, live, strict=True):
                kv, base, _ = reqs[i]
                cache_finished_req(life.cache, kv, insert=False)
                got = life.admit(base, fill)
                reqs[i] = (got.kv, base, got.kv.protected_pages)
        elif op < 0.83:  # a low-priority insert over the stems (lowers no priority: raises)
            stem = rng.choice(stems)
            key = PageKey((*stem, *(rng.randint(1, 30) for _ in range(rng.randint(0, 5)))))
            for cache in caches:
                dev = cache.controller.device
                if dev.free_page_count() < len(key):
                    cache.evict(len(key))
                pages = dev.alloc_pages(len(key))
                if pages is not None:
                    dev.free(pages[: cache.insert(key, pages, priority=-1)])
        elif op < 0.88:
            n = rng.randint(1, 80)
            for cache in caches:
                cache.evict(n)
        elif op < 0.92:
            n = rng.randint(1, 80)
            for cache in caches:
                cache.evict_host(n)
        else:
            for cache in caches:
                ctrl = cache.controller
                assert isinstance(ctrl, ManualController)
                ctrl.complete_all()
                cache.writing_check()
                cache.loading_check()
        for cache in caches:
            cache.check_invariants()
        assert _chunk_state(caches[0]) == _chunk_state(caches[1]), step
    assert shortcut_taken > 100  # the shortcut was exercised, not skipped
