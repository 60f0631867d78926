"""The 0.5.23 tree node and eviction strategies (``unified_tree_core.py:UnifiedTreeNode``,
``evict_policy.py``), dense (FULL-only) path.

A node holds one component (FULL): ``value`` (device page ids, None once evicted) and
``host_value`` (host page ids, None when not backed up), with device and host lock counts.
Times come from the owning tree's logical counter (``get_and_increase_time_counter``: a float
that grows by 1.0 per read; a new node reads it twice, last access then creation).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any


class UNode:
    """One node of the 0.5.23 radix tree (FULL component only)."""

    __slots__ = (
        "children",
        "creation_time",
        "hash_value",
        "heap_seq",
        "hit_count",
        "host_heap_seq",
        "host_leaf_since",
        "host_lock_ref",
        "host_uuid",
        "host_value",
        "id",
        "key",
        "last_access_time",
        "leaf_since",
        "load_back_pending_id",
        "lock_ref",
        "parent",
        "priority",
        "tlru_cached_prefix_len",
        "tlru_history_len",
        "value",
        "write_through_pending_id",
    )

    def __init__(self, node_id: int, last_access: float, created: float, priority: int) -> None:
        self.id = node_id
        self.children: dict[Hashable, UNode] = {}
        self.parent: UNode | None = None
        self.key: tuple[Hashable, ...] = ()
        self.value: list[int] | None = None
        self.host_value: list[int] | None = None
        self.lock_ref = 0
        self.host_lock_ref = 0
        self.host_uuid: int | None = None
        """The boundary tag of the host-lock segment that ends at this node (``metadata``)."""
        self.hit_count = 0
        self.last_access_time = last_access
        self.creation_time = created
        self.priority = priority
        self.write_through_pending_id: int | None = None
        self.load_back_pending_id: int | None = None
        self.tlru_cached_prefix_len = 0
        self.tlru_history_len = 0
        self.hash_value: list[int] | None = None
        self.leaf_since = 0
        """The eviction call during which the node last became a device leaf (victims.py)."""
        self.host_leaf_since = 0
        self.heap_seq = -1
        """The seq of the node's live entry in the persistent device heap, -1: none
        (victims.py); ``host_heap_seq`` the same on the host heap."""
        self.host_heap_seq = -1

    @property
    def evicted(self) -> bool:
        """Non-root and without a device value (SGLang's tree-level ``evicted``)."""
        return self.parent is not None and self.value is None

    @property
    def backuped(self) -> bool:
        return self.host_value is not None

    def __repr__(self) -> str:
        state = ("D" if self.value is not None else "") + ("H" if self.host_value else "")
        return f"UNode(id={self.id}, pages={len(self.key)}, {state or '-'}, lock={self.lock_ref})"


StrategyFn = Callable[[UNode], Any]

#: SLRU's protected segment starts at this hit count (``SLRUStrategy`` default, 0.5.23).
SLRU_PROTECTED_THRESHOLD = 2


def make_strategy(name: str, config: dict[str, Any] | None, page_size: int) -> StrategyFn:
    """The eviction key of ``name`` (smallest evicted first), with
    ``--radix-eviction-policy-config`` parameters (slru ``protected_threshold``; tlru
    ``threshold`` and ``next_prompt_estimate``, in tokens)."""
    cfg = dict(config or {})
    name = name.lower()
    if name == "lru":
        return lambda n: n.last_access_time
    if name == "lfu":
        return lambda n: (n.hit_count, n.last_access_time)
    if name == "fifo":
        return lambda n: n.creation_time
    if name == "mru":
        return lambda n: -n.last_access_time
    if name == "filo":
        return lambda n: -n.creation_time
    if name == "priority":
        return lambda n: (n.priority, n.last_access_time)
    if name == "slru":
        thr = int(cfg.get("protected_threshold", SLRU_PROTECTED_THRESHOLD))
        return lambda n: (1 if n.hit_count >= thr else 0, n.last_access_time)
    if name == "tlru":
        threshold = int(cfg.get("threshold", 0))
        estimate = int(cfg.get("next_prompt_estimate", 0))

        def tlru(n: UNode) -> Any:
            budget = max(n.tlru_history_len + estimate - threshold, 0)
            tel_safe = n.tlru_cached_prefix_len - len(n.key) * page_size >= budget
            return (-1 if tel_safe else 0, n.last_access_time)

        return tlru
    raise ValueError(f"unknown eviction strategy {name!r}; choose one of {', '.join(STRATEGIES)}")


STRATEGIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
