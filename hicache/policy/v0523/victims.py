"""The order in which eviction visits leaves: SGLang's per-call heap, and a fast path.

Device eviction is described below; host eviction (``drive_host_eviction``: a heap over the host
leaves, the evicted leaf's parent pushed when it became one) has the same shape and uses the
same two classes over the host leaf set.

SGLang 0.5.23 (``components/full.py``: ``_evict_device_start`` / ``_evict_device_next_node``)
builds, at the start of every eviction walk, a heap of ``(strategy key, node)`` over all
evictable device leaves, pops the smallest valid one per step, and pushes the last victim's
parent when it just became a leaf. :class:`PlainVictims` is exactly that. It costs a pass over
every leaf per call, a quarter of a cache-only replay's time.

:class:`PersistentVictims` keeps one heap across calls and pops the same nodes in the same
order, for strategies whose key never decreases while a node lives: recency stamps only grow,
hit counts and priorities only rise, creation times never change. Not ``mru`` (its key is minus
the recency) nor ``tlru`` (a split shortens the suffix node, so the tokens above it grow and it
can turn TEL-safe: its key falls); those keep the per-call heap. Why the order is the same:

* every device leaf has an entry whose stored key is at most its current key: one is pushed
  when the node enters the leaf set (``on_add``), a popped entry whose key went stale is pushed
  again with the current key, and a node popped but left in place (a write_back drop declined)
  gets a fresh entry when the call ends;
* keys do not change during one call (eviction touches no node), so the first popped entry
  whose stored key equals its node's current key is the minimum over the call's candidates;
  no two candidates share a key (each key ends in a unique recency stamp, or is a creation
  time shared only by a split parent and child, which are never both device leaves);
* a call's candidates are SGLang's: the leaves at its start plus the parents it pushes; a node
  that became a leaf during the call otherwise (``leaf_since`` is the call) waits for the next.

``tests/policy/test_v0523_victims.py`` runs random workloads through both and compares the whole
state after every step.
"""

from __future__ import annotations

import heapq
from typing import Any

from hicache.policy.v0523.node import StrategyFn, UNode

#: strategies whose key never decreases while a node lives (see the module docstring)
MONOTONE = ("lru", "lfu", "fifo", "filo", "priority", "slru")


class PlainVictims:
    """SGLang's per-call heap. Its entries are ``(key, node)``, and on equal keys SGLang
    compares the nodes, i.e. their ``last_access_time`` (``UnifiedTreeNode.__lt__``); here the
    recency stands in the entry, then a counter, so no two entries ever compare nodes."""

    def __init__(self, key_fn: StrategyFn, leaves: set[UNode], host: bool = False) -> None:
        self.key_fn = key_fn
        self.leaves = leaves
        self._heap: list[tuple[Any, float, int, UNode]] = []
        self._seq = 0

    def on_add(self, node: UNode) -> None:
        """``node`` just entered the leaf set (nothing to do: the heap is built per call)."""

    def _entry(self, n: UNode) -> tuple[Any, float, int, UNode]:
        self._seq += 1
        return (self.key_fn(n), n.last_access_time, self._seq, n)

    def begin(self) -> None:
        self._heap = [self._entry(n) for n in self.leaves]
        heapq.heapify(self._heap)

    def push_parent(self, node: UNode) -> None:
        heapq.heappush(self._heap, self._entry(node))

    def pop(self) -> UNode | None:
        heap, leaves = self._heap, self.leaves
        while heap:
            x = heapq.heappop(heap)[3]
            if x in leaves:
                return x
        return None

    def end(self) -> None:
        self._heap = []


class PersistentVictims:
    """One heap kept across calls (see the module docstring)."""

    def __init__(self, key_fn: StrategyFn, leaves: set[UNode], host: bool = False) -> None:
        """``host``: the host leaves (``drive_host_eviction``'s heap; the same argument)."""
        self.key_fn = key_fn
        self.leaves = leaves
        self._host = host  # which stamp: host_leaf_since or leaf_since (no getattr by name)
        self._heap: list[tuple[Any, int, UNode]] = []
        self._seq = 0
        self._call = 0
        self._seen: set[UNode] = set()
        self._parents: set[UNode] = set()
        self._waiting: list[UNode] = []

    def _push(self, node: UNode) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self.key_fn(node), self._seq, node))

    def on_add(self, node: UNode) -> None:
        if self._host:
            node.host_leaf_since = self._call
        else:
            node.leaf_since = self._call
        self._push(node)

    def begin(self) -> None:
        self._call += 1
        if len(self._heap) > 4 * len(self.leaves) + 64:  # stale entries: rebuild
            self._heap = []
            for n in self.leaves:
                self._seq += 1
                self._heap.append((self.key_fn(n), self._seq, n))
            heapq.heapify(self._heap)

    def push_parent(self, node: UNode) -> None:
        self._parents.add(node)

    def pop(self) -> UNode | None:
        heap, leaves, seen, call, host = self._heap, self.leaves, self._seen, self._call, self._host
        while heap:
            key, _, x = heapq.heappop(heap)
            if x not in leaves or x in seen:
                continue
            since = x.host_leaf_since if host else x.leaf_since
            if since >= call and x not in self._parents:
                self._waiting.append(x)  # became a leaf during this call: the next one
                continue
            now = self.key_fn(x)
            if now != key:
                self._seq += 1
                heapq.heappush(heap, (now, self._seq, x))
                continue
            seen.add(x)
            return x
        return None

    def end(self) -> None:
        leaves = self.leaves
        for x in (*self._seen, *self._waiting):
            if x in leaves:
                self._push(x)
        self._seen.clear()
        self._parents.clear()
        self._waiting.clear()
