"""Eviction strategies (SGLang ``evict_policy.py``): the heap key of a node; smallest goes first.

The same strategy orders device eviction (``evict``) and host eviction (``evict_host``). When two
keys tie, SGLang compares the nodes, i.e. their ``last_access_time``; our logical clock gives every
touch a distinct tick, so every key below already includes a unique component and no tie is ever
left to heap-insertion order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hicache.policy.radix import TreeNode

KeyFn = Callable[[TreeNode], Any]

#: SLRU: nodes hit at least this often are in the protected segment (fixed in SGLang).
SLRU_PROTECTED_HITS = 2


def _lru(n: TreeNode) -> Any:
    return n.last_access_time


def _lfu(n: TreeNode) -> Any:
    return (n.hit_count, n.last_access_time)


def _fifo(n: TreeNode) -> Any:
    return n.creation_time


def _mru(n: TreeNode) -> Any:
    return -n.last_access_time


def _filo(n: TreeNode) -> Any:
    return -n.creation_time


def _priority(n: TreeNode) -> Any:
    return (n.priority, n.last_access_time)


def _slru(n: TreeNode) -> Any:
    return (1 if n.hit_count >= SLRU_PROTECTED_HITS else 0, n.last_access_time)


STRATEGIES: dict[str, KeyFn] = {
    "lru": _lru,
    "lfu": _lfu,
    "fifo": _fifo,
    "mru": _mru,
    "filo": _filo,
    "priority": _priority,
    "slru": _slru,
}


def get_strategy(name: str) -> KeyFn:
    """The key function of strategy ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown eviction strategy {name!r}; choose one of {', '.join(STRATEGIES)}"
        ) from None
