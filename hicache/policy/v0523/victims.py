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

* at every call's start each device leaf has an entry whose stored key is at most its current
  key: a node entering the leaf set (``on_add``) is pushed when the next call begins if it is
  still a leaf and has no live entry, a popped entry whose key went stale is pushed again with
  the current key, and a node popped but left in place (a write_back drop declined) gets a
  fresh entry when the call ends; a node has at most one live entry (``UNode.heap_seq``), the
  others are skipped unread;
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

from heapq import heapify, heappop, heappush
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
        heapify(self._heap)

    def push_parent(self, node: UNode) -> None:
        heappush(self._heap, self._entry(node))

    def pop(self) -> UNode | None:
        heap, leaves = self._heap, self.leaves
        while heap:
            x = heappop(heap)[3]
            if x in leaves:
                return x
        return None

    def end(self) -> None:
        self._heap = []


class PersistentVictims:
    """One heap kept across calls (see the module docstring).

    A node has at most one live entry: the entry whose ``seq`` is the node's ``heap_seq``
    (``host_heap_seq`` on the host heap; -1: none). A node entering the leaf set waits in
    ``_pending`` until the next call begins and is pushed then, if it is still a leaf and has no
    live entry (most leaves a checkpoint adds are locked again before any eviction: they never
    reach the heap). The invariant of the module docstring holds at every call's start all the
    same: each leaf has a live entry whose key is at most its current key."""

    def __init__(self, key_fn: StrategyFn, leaves: set[UNode], host: bool = False) -> None:
        """``host``: the host leaves (``drive_host_eviction``'s heap; the same argument)."""
        self.key_fn = key_fn
        self.leaves = leaves
        self._host = host  # which stamps: host_leaf_since / host_heap_seq or the device ones
        self._heap: list[tuple[Any, int, UNode]] = []
        self._seq = 0
        self._call = 0
        self._seen: set[UNode] = set()
        self._parents: set[UNode] = set()
        self._waiting: list[UNode] = []
        self._pending: list[UNode] = []

    def _push(self, node: UNode) -> None:
        self._seq += 1
        if self._host:
            node.host_heap_seq = self._seq
        else:
            node.heap_seq = self._seq
        heappush(self._heap, (self.key_fn(node), self._seq, node))

    def _push_if_none(self, node: UNode) -> None:
        """Push ``node`` unless it has a live entry (whose key is at most its current one)."""
        if (node.host_heap_seq if self._host else node.heap_seq) < 0:
            self._push(node)

    def on_add(self, node: UNode) -> None:
        if self._host:
            node.host_leaf_since = self._call
        else:
            node.leaf_since = self._call
        pending = self._pending
        pending.append(node)
        if len(pending) > 2 * len(self.leaves) + 256:
            self._flush()  # bounded: pushing early keeps the invariant (keys only rise)

    def _flush(self) -> None:
        leaves = self.leaves
        for n in self._pending:
            if n in leaves:
                self._push_if_none(n)
        self._pending.clear()

    def begin(self) -> None:
        self._call += 1
        self._flush()
        if len(self._heap) > 4 * len(self.leaves) + 64:  # stale entries: rebuild
            host = self._host
            for _, _, n in self._heap:
                if host:
                    n.host_heap_seq = -1
                else:
                    n.heap_seq = -1
            self._heap = []
            for n in self.leaves:
                self._seq += 1
                if host:
                    n.host_heap_seq = self._seq
                else:
                    n.heap_seq = self._seq
                self._heap.append((self.key_fn(n), self._seq, n))
            heapify(self._heap)

    def push_parent(self, node: UNode) -> None:
        """``node`` just became a leaf (in this call): a candidate of this call."""
        self._parents.add(node)
        self._push_if_none(node)

    def pop(self) -> UNode | None:
        heap, leaves, seen, call, host = self._heap, self.leaves, self._seen, self._call, self._host
        while heap:
            key, seq, x = heappop(heap)
            if host:
                if x.host_heap_seq != seq:
                    continue  # superseded
                x.host_heap_seq = -1
                since = x.host_leaf_since
            else:
                if x.heap_seq != seq:
                    continue
                x.heap_seq = -1
                since = x.leaf_since
            if x not in leaves or x in seen:
                continue
            if since >= call and x not in self._parents:
                self._waiting.append(x)  # became a leaf during this call: the next one
                continue
            now = self.key_fn(x)
            if now != key:
                self._seq += 1
                if host:
                    x.host_heap_seq = self._seq
                else:
                    x.heap_seq = self._seq
                heappush(heap, (now, self._seq, x))
                continue
            seen.add(x)
            return x
        return None

    def end(self) -> None:
        leaves = self.leaves
        for x in self._seen:
            if x in leaves:
                self._push_if_none(x)
        for x in self._waiting:
            if x in leaves:
                self._push_if_none(x)
        self._seen.clear()
        self._parents.clear()
        self._waiting.clear()
