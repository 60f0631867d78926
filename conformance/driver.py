"""The side-independent driver: what a scheduler does around the cache, written once.

A :class:`Side` adapts one implementation (ours, or SGLang's) to a handful of primitives --
cache calls with plain-data arguments (page ids, token lists, node handles), pool and
controller access, and read-only introspection. :class:`Driver` turns each :class:`~conformance
.ops.Op` into primitive calls in exactly the same order on both sides, so any difference in
results or state comes from the caches themselves.

Extending to another tier: add ops to :mod:`conformance.ops`, a handler here (registered in
``Driver.handlers``), the primitives it needs on :class:`Side`, and, for state, a section in
:func:`snapshot` (or a side's :meth:`Side.extra_state`). The L3 storage tier is done that way:
requests (``arrive`` -> the scheduler's arrival-time match and ``_prefetch_kvcache``; ``check``,
``check_admit``, ``pop``, ``abort``), a logical clock in seconds (``tick``), the storage stages
stepped one backend call at a time (``query``, ``read``, ``backup``, ``stages``) and ``drain``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from conformance.ops import Config, Op, run_length

Node = Any
State = dict[str, Any]
Result = dict[str, Any]


@dataclass
class MatchView:
    """A side's ``match_prefix`` result in common terms (page ids, node handles)."""

    device_pages: list[int]
    host_hit: int
    last_device: Node
    last_host: Node
    best: Node
    raw: Any = None
    """The side's own match result (our side's prefetch needs it)."""


class Side:
    """Primitives every side provides. Sizes are in tokens, page lists are page ids."""

    name = "side"
    cache: Any  # the side's HiRadixCache (ours or SGLang's): same method names

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.flags: list[str] = []
        """Anomalies seen on this side during the current step (see known_differences)."""

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def take_flags(self) -> list[str]:
        out, self.flags = self.flags, []
        return out

    def close(self) -> None:
        """Release what the side holds outside the process (the SGLang side's L3 directory)."""

    def coverage(self) -> dict[str, int]:
        """Counters of what a sequence exercised (our side on L3: prefetches issued, truncated,
        revoked, ...); summed over a run and reported."""
        return {}

    # -- cache calls ---------------------------------------------------------------------------
    def match(self, tokens: list[int], extra_key: str | None, limit: int | None) -> MatchView:
        raise NotImplementedError

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        chunked: bool,
        priority: int,
        extra_key: str | None,
    ) -> int:
        raise NotImplementedError

    def inc_lock(self, node: Node) -> int:
        raise NotImplementedError

    def dec_lock(self, node: Node) -> int:
        raise NotImplementedError

    def evict(self, num_tokens: int) -> int:
        raise NotImplementedError

    def evict_host(self, num_tokens: int) -> None:
        raise NotImplementedError

    def init_load_back(self, node: Node, host_hit: int) -> tuple[list[int], Node]:
        raise NotImplementedError

    def ready_to_load(self) -> int:
        raise NotImplementedError

    # the same-named calls on either cache (SGLang's names are ours), written once
    def writing_check(self, write_back: bool = False) -> None:
        self.cache.writing_check(write_back=write_back)

    def loading_check(self) -> None:
        self.cache.loading_check()

    def check_events(self) -> None:
        self.cache.check_hicache_events()

    def protect_host(self, node: Node) -> None:
        node.protect_host()

    def release_host(self, node: Node) -> None:
        node.release_host()

    def reset(self) -> None:
        self.cache.reset()

    # -- pools and controller -----------------------------------------------------------------
    def alloc_device(self, num_pages: int) -> list[int] | None:
        raise NotImplementedError

    def free_device(self, pages: list[int]) -> None:
        raise NotImplementedError

    def clear_device(self) -> None:
        raise NotImplementedError

    def device_free_list(self) -> list[int]:
        raise NotImplementedError

    def host_free_list(self) -> list[int]:
        raise NotImplementedError

    def finish_writes(self, count: int | None) -> int:
        raise NotImplementedError

    def finish_loads(self, count: int | None) -> int:
        raise NotImplementedError

    # -- introspection (never mutates) --------------------------------------------------------
    def root(self) -> Node:
        raise NotImplementedError

    def children(self, node: Node) -> list[Node]:
        return list(node.children.values())

    def parent(self, node: Node) -> Node | None:
        return node.parent

    def node_id(self, node: Node) -> int:
        return int(node.id)

    def node_tokens(self, node: Node) -> list[int]:
        raise NotImplementedError

    def node_extra_key(self, node: Node) -> str | None:
        raise NotImplementedError

    def node_fields(self, node: Node) -> dict[str, Any]:
        """value / host_value (page ids or None), lock_ref, host_ref, hit_count, priority,
        pending_write, last_access, creation."""
        raise NotImplementedError

    def is_evicted(self, node: Node) -> bool:
        raise NotImplementedError

    def in_tree(self, node: Node) -> bool:
        raise NotImplementedError

    def device_prefix(self, tokens: list[int], extra_key: str | None) -> list[int]:
        """Device pages of the whole nodes ``tokens`` runs through, found without touching."""
        raise NotImplementedError

    def evictable_leaves(self) -> Iterable[Node]:
        raise NotImplementedError

    def evictable_host_leaves(self) -> Iterable[Node]:
        raise NotImplementedError

    def eviction_key(self, node: Node) -> Any:
        raise NotImplementedError

    def sizes(self) -> tuple[int, int]:
        """(evictable, protected) tokens."""
        raise NotImplementedError

    def write_records(self) -> list[tuple[int, Node, int, list[Node]]]:
        """Pending device->host writes: (ack id, lock node, backup tokens, publish nodes)."""
        raise NotImplementedError

    def load_records(self) -> list[tuple[int, Node]]:
        """Pending host->device loads: (ack id, lock node)."""
        raise NotImplementedError

    def write_acks(self) -> list[tuple[list[int], bool]]:
        """The controller's write-ack FIFO: (node ids, finished)."""
        raise NotImplementedError

    def load_acks(self) -> list[tuple[list[int], bool]]:
        raise NotImplementedError

    def queued_loads(self) -> list[int]:
        """Node ids of loads reserved but not yet started (``start_loading`` merges them)."""
        raise NotImplementedError

    def extra_state(self) -> State:
        """Tier-specific state sections (none for L1/L2). A ``stale`` entry is merged into the
        snapshot's ``stale`` section (not compared)."""
        return {}

    # -- L3 storage tier (only called on an L3 configuration) ----------------------------------
    def prefetch(
        self, rid: str, tokens: list[int], extra_key: str | None, m: MatchView, now: float
    ) -> bool:
        """The scheduler's ``_prefetch_kvcache`` after its arrival-time match ``m`` (limit
        input - 1): prefetch the tokens after the matched ones, anchored at ``m.last_host``.
        True if a prefetch was registered."""
        raise NotImplementedError

    def check_prefetch(self, rid: str, now: float) -> bool:
        raise NotImplementedError

    def pop_credit(self, rid: str) -> int:
        raise NotImplementedError

    def abort(self, rid: str) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def query_step(self) -> bool:
        """One ``batch_exists`` call of the query stage, if it has work; True if one ran."""
        raise NotImplementedError

    def read_step(self) -> bool:
        """One ``batch_get`` call of the prefetch IO stage."""
        raise NotImplementedError

    def backup_step(self) -> bool:
        """One ``batch_set`` call of the backup stage."""
        raise NotImplementedError

    def l3_put(self, tokens: list[int]) -> None:
        """Write the pages of ``tokens`` (from the root, no extra key) straight into the
        storage backend, as another engine sharing it would."""
        raise NotImplementedError


# ------------------------------------------------------------------------------- snapshots --
def node_label(side: Side, node: Node) -> str:
    """A node named by its path's tokens (run-length) and extra key: the same on both sides."""
    return _label(side, node)


def _label(side: Side, node: Node) -> str:
    parts: list[list[int]] = []
    n: Node | None = node
    root = side.root()
    while n is not None and n is not root:
        parts.append(side.node_tokens(n))
        n = side.parent(n)
    tokens = [t for p in reversed(parts) for t in p]
    extra = side.node_extra_key(node)
    return (f"[{extra}]" if extra else "") + run_length(tokens)


def _walk(side: Side) -> list[Node]:
    out: list[Node] = []
    stack = [side.root()]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(side.children(n))
    return out[1:]


def _ids_in_order(side: Side, nodes: Iterable[Node]) -> list[int]:
    return [
        side.node_id(n)
        for n in sorted(nodes, key=lambda n: (side.eviction_key(n), side.node_id(n)))
    ]


def snapshot(side: Side) -> State:
    """The full comparable state of ``side``: tree, sizes, pools, eviction orders, in-flight
    copies. Records whose lock node has left the tree are listed apart (``stale``), since SGLang
    keeps them after ``reset`` (known difference KD-RESET-STALE)."""
    nodes = _walk(side)
    in_tree = set(map(id, nodes))
    leaves = list(side.evictable_leaves())
    host_leaves = list(side.evictable_host_leaves())
    leaf_ids = {id(n) for n in leaves}
    host_leaf_ids = {id(n) for n in host_leaves}
    tree: dict[str, Any] = {}
    for n in nodes:
        view = {"id": side.node_id(n), "tokens": len(side.node_tokens(n))}
        view.update(side.node_fields(n))
        view["leaf"] = id(n) in leaf_ids
        view["host_leaf"] = id(n) in host_leaf_ids
        tree[_label(side, n)] = view
    evictable, protected = side.sizes()
    writes: list[list[Any]] = []
    stale_writes: list[list[Any]] = []
    for ack, lock, backup, publish in side.write_records():
        rec = [ack, side.node_id(lock), backup, sorted(side.node_id(p) for p in publish)]
        (writes if id(lock) in in_tree else stale_writes).append(rec)
    loads: list[list[int]] = []
    stale_loads: list[list[int]] = []
    for ack, node in side.load_records():
        (loads if id(node) in in_tree else stale_loads).append([ack, side.node_id(node)])
    root = side.root()
    state: State = {
        "root": {"last_access": side.node_fields(root)["last_access"]},
        "tree": tree,
        "sizes": {"evictable": evictable, "protected": protected},
        "device_free": side.device_free_list(),
        "host_free": side.host_free_list(),
        "lru": _ids_in_order(side, (n for n in leaves if id(n) in in_tree)),
        "host_lru": _ids_in_order(side, (n for n in host_leaves if id(n) in in_tree)),
        "stray_leaves": sorted(side.node_id(n) for n in leaves if id(n) not in in_tree),
        "stray_host_leaves": sorted(side.node_id(n) for n in host_leaves if id(n) not in in_tree),
        "writes": sorted(writes),
        "loads": sorted(loads),
        "write_acks": [[ids, done] for ids, done in side.write_acks()],
        "load_acks": [[ids, done] for ids, done in side.load_acks()],
        "queued_loads": side.queued_loads(),
        "stale": {"writes": sorted(stale_writes), "loads": sorted(stale_loads)},
    }
    extra = side.extra_state()
    state["stale"].update(extra.pop("stale", {}))
    state.update(extra)
    return state


# ---------------------------------------------------------------------------------- driver --
@dataclass
class Request:
    """A request in the waiting queue (L3 sequences): what the scheduler keeps for it."""

    rid: str
    tokens: list[int]
    extra_key: str | None


class Driver:
    """Plays ops on one side, holding what a scheduler would hold (request locks, host pins,
    waiting requests and the clock in seconds on an L3 configuration)."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.ps = side.page_size
        self.locks: list[Node] = []
        self.pins: list[Node] = []
        self.waiting: list[Request] = []
        self.rids: list[str] = []
        """Every request id issued so far (``pop`` picks among them)."""
        self.now = 0.0
        self.handlers: dict[str, Callable[..., Result]] = {
            "serve": self.serve,
            "insert": self.insert,
            "match": self.match,
            "lock": self.lock,
            "unlock": self.unlock,
            "admit": self.admit,
            "admit_host": self.admit_host,
            "start_loading": self.start_loading,
            "finish_writes": self.finish_writes,
            "finish_loads": self.finish_loads,
            "writing_check": self.writing_check,
            "loading_check": self.loading_check,
            "events": self.events,
            "evict": self.evict,
            "evict_host": self.evict_host,
            "protect_host": self.protect_host,
            "release_host": self.release_host,
            "write_back_wait": self.write_back_wait,
            "flush": self.flush,
            # L3
            "arrive": self.arrive,
            "tick": self.tick,
            "query": self.query,
            "read": self.read,
            "backup": self.backup,
            "stages": self.stages,
            "settle": self.settle,
            "check": self.check,
            "check_admit": self.check_admit,
            "pop": self.pop,
            "abort": self.abort,
            "drain": self.drain,
            "l3_put": self.l3_put,
        }

    def step(self, op: Op) -> Result:
        return self.handlers[op.kind](**op.args)

    def _id(self, node: Node) -> int:
        return self.side.node_id(node)

    def _match_result(self, m: MatchView) -> Result:
        return {
            "device_pages": m.device_pages,
            "host_hit": m.host_hit,
            "last_device": self._id(m.last_device),
            "last_host": self._id(m.last_host),
            "best": self._id(m.best),
        }

    # -- requests ------------------------------------------------------------------------------
    def serve(
        self,
        tokens: list[int],
        extra_key: str | None = None,
        chunked: bool = False,
        priority: int = 0,
    ) -> Result:
        """One request without load-back: match (and lock the device prefix), allocate the rest
        (evicting the full need when short, as the scheduler does), insert, free duplicates,
        unlock. Host hits are recomputed, so insert re-attaches them (adoption)."""
        s, ps = self.side, self.ps
        m = s.match(tokens, extra_key, None)
        s.inc_lock(m.last_device)
        need = len(tokens) // ps - len(m.device_pages)
        out = self._match_result(m)
        if need > 0 and len(s.device_free_list()) < need:
            out["evicted"] = s.evict(need * ps)
        fresh = s.alloc_device(need) if need > 0 else []
        if fresh is None:
            s.dec_lock(m.last_device)
            out["skipped"] = True
            return out
        prefix_len = s.insert(tokens, m.device_pages + fresh, chunked, priority, extra_key)
        dup = prefix_len // ps - len(m.device_pages)
        if dup > 0:
            s.free_device(fresh[:dup])
        s.dec_lock(m.last_device)
        out.update(fresh=fresh, prefix_len=prefix_len)
        return out

    def insert(
        self,
        tokens: list[int],
        extra_key: str | None = None,
        chunked: bool = False,
        priority: int = 0,
    ) -> Result:
        """A bare insert (tests' harness style): the shared device prefix found without touching,
        fresh pages for the rest (skipped when the pool is short), duplicates freed."""
        s, ps = self.side, self.ps
        shared = s.device_prefix(tokens, extra_key)
        fresh = s.alloc_device(len(tokens) // ps - len(shared))
        if fresh is None:
            return {"skipped": True}
        prefix_len = s.insert(tokens, shared + fresh, chunked, priority, extra_key)
        dup = prefix_len // ps - len(shared)
        if dup > 0:
            s.free_device(fresh[:dup])
        return {"shared": shared, "fresh": fresh, "prefix_len": prefix_len}

    def match(
        self, tokens: list[int], extra_key: str | None = None, limit: int | None = None
    ) -> Result:
        return self._match_result(self.side.match(tokens, extra_key, limit))

    def lock(self, tokens: list[int], extra_key: str | None = None) -> Result:
        """Match and hold a lock on the device prefix (a request waiting to run)."""
        m = self.side.match(tokens, extra_key, None)
        delta = self.side.inc_lock(m.last_device)
        self.locks.append(m.last_device)
        return {"node": self._id(m.last_device), "delta": delta}

    def unlock(self, slot: int) -> Result:
        if not self.locks:
            return {"noop": True}
        node = self.locks.pop(slot % len(self.locks))
        return {"node": self._id(node), "delta": self.side.dec_lock(node)}

    def admit(
        self, tokens: list[int], extra_key: str | None = None, limit: int | None = None
    ) -> Result:
        """PrefillAdder's path: match, load the host hit back (``init_load_back``), lock the
        returned node. Flags ``load_back_chain_detached`` when a node of the chain being loaded
        left the tree during the call (KD-LOADBACK-PIN)."""
        s = self.side
        m = s.match(tokens, extra_key, limit)
        chain = []
        n = m.best
        while s.is_evicted(n):
            chain.append(n)
            n = s.parent(n)
        if m.host_hit > 0:
            pages, node = s.init_load_back(m.best, m.host_hit)
        else:
            pages, node = [], m.last_device
        if any(not s.in_tree(c) for c in chain):
            s.flag("load_back_chain_detached")
        delta = s.inc_lock(node)
        self.locks.append(node)
        out = self._match_result(m)
        out.update(loaded=pages, node=self._id(node), delta=delta)
        return out

    def admit_host(self, slot: int) -> Result:
        """A returning request for a host-only prefix: :meth:`admit` on the full key of a
        host-only node (leaves preferred, so the chain is long), picked by ``slot`` among them
        in id order. The pick reads the state, which both sides agree on up to this step."""
        s = self.side
        evicted = [n for n in _walk(s) if s.is_evicted(n)]
        leaves = [n for n in evicted if not s.children(n)] or evicted
        if not leaves:
            return {"noop": True}
        node = sorted(leaves, key=s.node_id)[slot % len(leaves)]
        tokens: list[int] = []
        n: Node | None = node
        while n is not None and n is not s.root():
            tokens[:0] = s.node_tokens(n)
            n = s.parent(n)
        return {"target": s.node_id(node)} | self.admit(tokens, s.node_extra_key(node))

    # -- copies and acks -----------------------------------------------------------------------
    def start_loading(self) -> Result:
        return {"started": self.side.ready_to_load() != -1}

    def finish_writes(self, count: int | None) -> Result:
        return {"finished": self.side.finish_writes(count)}

    def finish_loads(self, count: int | None) -> Result:
        return {"finished": self.side.finish_loads(count)}

    def writing_check(self) -> Result:
        self.side.writing_check()
        return {}

    def loading_check(self) -> Result:
        self.side.loading_check()
        return {}

    def events(self) -> Result:
        self.side.check_events()
        return {}

    def write_back_wait(self) -> Result:
        self.side.writing_check(write_back=True)
        return {}

    # -- eviction and pins ---------------------------------------------------------------------
    def evict(self, num_tokens: int) -> Result:
        return {"evicted": self.side.evict(num_tokens)}

    def evict_host(self, num_tokens: int) -> Result:
        """SGLang's ``evict_host`` returns nothing: compare the host tokens it freed."""
        before = len(self.side.host_free_list())
        self.side.evict_host(num_tokens)
        return {"host_freed": (len(self.side.host_free_list()) - before) * self.ps}

    def protect_host(self, tokens: list[int], extra_key: str | None = None) -> Result:
        m = self.side.match(tokens, extra_key, None)
        if m.last_host is self.side.root():
            return {"noop": True}
        self.side.protect_host(m.last_host)
        self.pins.append(m.last_host)
        return {"node": self._id(m.last_host)}

    def release_host(self, slot: int) -> Result:
        if not self.pins:
            return {"noop": True}
        node = self.pins.pop(slot % len(self.pins))
        self.side.release_host(node)
        return {"node": self._id(node)}

    def flush(self, settle: bool = False) -> Result:
        """``/flush_cache`` on an idle engine: requests gone, cache reset, device pool cleared.
        (Waiting requests are dropped without an abort: their prefetch entries are what SGLang's
        reset leaves behind, D10.) With ``settle`` (L3), :meth:`settle` first: the storage
        stages are idle at the reset."""
        out = self.settle() if settle else {}
        self.locks.clear()
        self.pins.clear()
        self.waiting.clear()
        self.side.reset()
        self.side.clear_device()
        return out

    # -- L3: requests ----------------------------------------------------------------------------
    @staticmethod
    def _limit(tokens: list[int]) -> int:
        """``Req._compute_max_prefix_len``: at most input - 1 tokens are matched."""
        return max(len(tokens) - 1, 0)

    def arrive(self, tokens: list[int], extra_key: str | None = None) -> Result:
        """``_add_request_to_queue``: the arrival-time match (limit input - 1, with all its side
        effects), then ``_prefetch_kvcache``; the request joins the waiting queue."""
        s = self.side
        rid = f"r{len(self.rids)}"
        self.rids.append(rid)
        m = s.match(tokens, extra_key, self._limit(tokens))
        out = self._match_result(m)
        out["rid"] = rid
        out["issued"] = s.prefetch(rid, tokens, extra_key, m, self.now)
        self.waiting.append(Request(rid, tokens, extra_key))
        return out

    def _waiting(self, slot: int) -> Request | None:
        return self.waiting[slot % len(self.waiting)] if self.waiting else None

    def check(self, slot: int) -> Result:
        """A scheduling pass reaches the request: ``check_prefetch_progress`` at the current
        time; the request stays queued either way (e.g. the batch is full after the check)."""
        req = self._waiting(slot)
        if req is None:
            return {"noop": True}
        return {"rid": req.rid, "done": self.side.check_prefetch(req.rid, self.now)}

    def check_admit(self, slot: int) -> Result:
        """The scheduler's pass for one request: check; when True, pop the credit, match again
        (limit input - 1) and admit (load back the host hit, lock); it leaves the queue."""
        req = self._waiting(slot)
        if req is None:
            return {"noop": True}
        s = self.side
        if not s.check_prefetch(req.rid, self.now):
            return {"rid": req.rid, "done": False}
        credit = s.pop_credit(req.rid)
        self.waiting.remove(req)
        out = {"rid": req.rid, "done": True, "credit": credit}
        return out | self.admit(req.tokens, req.extra_key, self._limit(req.tokens))

    def pop(self, slot: int) -> Result:
        """``pop_prefetch_loaded_tokens`` for any request seen so far (0 when none is kept)."""
        if not self.rids:
            return {"noop": True}
        rid = self.rids[slot % len(self.rids)]
        return {"rid": rid, "credit": self.side.pop_credit(rid)}

    def abort(self, slot: int) -> Result:
        """A waiting request is aborted: ``release_aborted_request``; it leaves the queue."""
        req = self._waiting(slot)
        if req is None:
            return {"noop": True}
        self.waiting.remove(req)
        self.side.abort(req.rid)
        return {"rid": req.rid}

    def tick(self, dt: float) -> Result:
        self.now += dt
        return {"now": self.now}

    # -- L3: storage stages and queues -----------------------------------------------------------
    def _steps(self, step: Callable[[], bool], count: int) -> Result:
        return {"ran": sum(1 for _ in range(count) if step())}

    def query(self, count: int) -> Result:
        return self._steps(self.side.query_step, count)

    def read(self, count: int) -> Result:
        return self._steps(self.side.read_step, count)

    def backup(self, count: int) -> Result:
        return self._steps(self.side.backup_step, count)

    def stages(self) -> Result:
        """Every stage until idle, one call at a time: a query if one is pending, else a read,
        else a backup (the order matters: a backup can add pages a later query finds)."""
        s = self.side
        n = 0
        while s.query_step() or s.read_step() or s.backup_step():
            n += 1
        return {"ran": n}

    def settle(self) -> Result:
        """A while later with nothing new arriving: every device->host write finishes, the
        acks are processed (``check_hicache_events``: L3 backups start), every storage stage
        runs until idle, and the control queues are drained."""
        s = self.side
        out = {"finished": s.finish_writes(None)}
        s.check_events()
        out |= self.stages()
        s.check_events()
        return out

    def drain(self) -> Result:
        self.side.drain()
        return {}

    def l3_put(self, tokens: list[int]) -> Result:
        self.side.l3_put(tokens)
        return {}
