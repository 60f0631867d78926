"""Routers of a cluster: which of ``N`` identical instances serves the next request.

The cluster engine calls :meth:`Router.route` once per request, at its arrival time, in
arrival order, with one :class:`InstanceView` per instance. A router is pure, deterministic
logic (its only randomness is a ``random.Random(seed)`` it owns) and must be cheap: a call costs
O(prompt pages + instances), never work proportional to everything routed so far.

Policies (:data:`hicache.config.ROUTER_POLICIES`) and where their behaviour comes from; the
SGLang model gateway is repo ``sgl-project/sglang``, NVIDIA Dynamo is ``ai-dynamo/dynamo``:

- ``round_robin``: a counter modulo N (gateway ``sgl-model-gateway/src/policies/round_robin.rs``
  @ 1d2cb3c17d0eecbf40f6e7ce02299a27e6437e90).
- ``random``: uniform (gateway ``sgl-model-gateway/src/policies/random.rs``
  @ 2d1fce315bea3a202f98e4e136e2ee4b58ce5603).
- ``least_load``: fewest in-flight requests, the gateway's notion of load.
- ``power_of_two``: the better of two distinct random draws (gateway
  ``sgl-model-gateway/src/policies/power_of_two.rs`` @ 065f331fc8a7df2c27dd749f324c54d6924c0d7e).
- ``session_affinity``: sticky sessions; not a gateway policy.
- ``cache_aware``: the gateway's approximate prefix tree plus load-balance check
  (:class:`CacheAwareRouter`).
- ``tier_aware``: Dynamo's KV-router cost with the instances' real device and host prefixes
  (:class:`TierAwareRouter`).

Load everywhere is the router's own count of requests routed to an instance and not finished
(:meth:`InstanceView.in_flight`): the gateway's ``Worker::load()``, incremented at dispatch and
decremented when the response ends (``sgl-model-gateway/src/core/worker.rs``
@ 022e03e5fa566ab164c575323a03ae93175c65ac), not the engine's queue length.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Hashable, Sequence
from typing import Protocol

from hicache.config import ROUTER_POLICIES, RouterConfig
from hicache.lifecycle import PagedRequest

__all__ = [
    "CacheAwareRouter",
    "InstanceView",
    "LeastLoadRouter",
    "PowerOfTwoRouter",
    "PrefixTree",
    "RandomRouter",
    "RoundRobinRouter",
    "Router",
    "SessionAffinityRouter",
    "TierAwareRouter",
    "build_router",
]


class InstanceView(Protocol):
    """What a router may read of one instance, at the moment of routing. All read-only."""

    index: int

    def in_flight(self) -> int:
        """Requests routed to this instance and not finished yet (the router's own count)."""
        ...

    def waiting_tokens(self) -> int:
        """Prompt tokens queued on this instance and not yet prefilled."""
        ...

    def running_tokens(self) -> int:
        """KV tokens held by this instance's running requests."""
        ...

    def cached_prefix(self, req: PagedRequest) -> tuple[int, int]:
        """(device tokens, host-only tokens) of ``req``'s prompt prefix in this instance's real
        cache; must not change the cache (no hit counts, no LRU refresh)."""
        ...


class Router(Protocol):
    """Picks an instance for each request. ``route`` is called once per request, at its
    arrival time ``now`` (seconds), in arrival order; it returns an index into ``views``
    (``views[i].index == i``) and may update the router's own state."""

    name: str

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int: ...


def _least_loaded(loads: Sequence[int]) -> int:
    """Index of the smallest load, ties to the lowest index (Rust's ``min_by_key`` keeps the
    first minimum, which is what the gateway uses for its shortest-queue picks)."""
    return min(range(len(loads)), key=loads.__getitem__)


def _loads(views: Sequence[InstanceView]) -> list[int]:
    return [v.in_flight() for v in views]


# --------------------------------------------------------------------------- simple --


class RoundRobinRouter:
    """``count % N`` with the count incremented per call (gateway ``round_robin.rs``)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._count = 0

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        pick = self._count % len(views)
        self._count += 1
        return pick


class RandomRouter:
    """Uniform over the instances (gateway ``random.rs``), from a generator seeded by
    ``router.seed`` so a run is reproducible."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        return self._rng.randrange(len(views))


class LeastLoadRouter:
    """Fewest in-flight requests, ties to the lowest index."""

    name = "least_load"

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        return _least_loaded(_loads(views))


class PowerOfTwoRouter:
    """Two distinct instances drawn uniformly; the lower load wins, a tie goes to the first
    draw (gateway ``power_of_two.rs``: ``load1 <= load2``). One instance is returned as is.

    The gateway compares token loads when an external load monitor has reported both workers
    and falls back to its in-flight request counts otherwise; there is no monitor here, so this
    always compares request counts.
    """

    name = "power_of_two"

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        if len(views) == 1:
            return 0
        first, second = self._rng.sample(range(len(views)), 2)
        return first if views[first].in_flight() <= views[second].in_flight() else second


class SessionAffinityRouter:
    """A session's first request goes to the least-loaded instance and every later request of
    that session follows it, whatever the loads are then; requests without a session go to
    the least-loaded instance.

    Not a gateway policy: it is the "sticky session" baseline that keeps a conversation's KV
    on one instance without any prefix tracking. The session map is never pruned (one entry
    per session of the trace).
    """

    name = "session_affinity"

    def __init__(self) -> None:
        self._home: dict[Hashable, int] = {}

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        if req.session is None:
            return _least_loaded(_loads(views))
        home = self._home.get(req.session)
        if home is None:
            home = self._home[req.session] = _least_loaded(_loads(views))
        return home


# ------------------------------------------------------------------------ cache_aware --


class _Node:
    """One page of the prefix tree. ``tenants`` maps an instance to the time it last touched
    this node; ``child_tenants`` counts, per instance, the children that carry it, so "is this
    node a leaf for instance i" is one dict lookup."""

    __slots__ = ("child_tenants", "children", "parent", "serial", "symbol", "tenants")

    def __init__(self, symbol: Hashable, parent: _Node | None, serial: int) -> None:
        self.symbol = symbol
        self.parent = parent
        self.serial = serial  # creation order: a deterministic tie-break in the eviction heaps
        self.children: dict[Hashable, _Node] = {}
        self.tenants: dict[int, float] = {}
        self.child_tenants: dict[int, int] = {}

    def is_leaf_for(self, instance: int) -> bool:
        return self.child_tenants.get(instance, 0) == 0


# (last access time, node serial, node): one eviction candidate of one instance
_Candidate = tuple[float, int, _Node]


class PrefixTree:
    """The SGLang gateway's multi-tenant approximate radix tree, keyed by page symbols.

    Source: ``sgl-project/sglang`` ``sgl-model-gateway/src/policies/tree.rs``
    @ 24ce7f6c91a1b0fc65534cedf959e22423920b75. One tree for all instances; each node records
    which instances ("tenants") were routed a request through it and when each last did.

    Mapping to the gateway: the gateway keys nodes by characters of the request text, so that
    it need not tokenize; here a key is a :class:`~hicache.lifecycle.PagedRequest`'s page
    symbols (one per full prompt page, each identifying its page and everything before it),
    one node per page, and every node is worth ``page_size`` tokens where the gateway counts
    characters. A prompt's partial last page is never inserted (it has no symbol), and a match
    stops at a page boundary where the gateway can stop mid-node.

    Sizes are tokens per instance (the gateway's ``tenant_char_count``). The tree is
    prefix-closed per instance (an instance on a node is on all its ancestors), and times only
    grow towards the root (every refresh covers a whole path from the root, at a clock that
    never goes back), which :meth:`check_integrity` verifies.

    Eviction candidates: where the gateway collects every leaf into a fresh heap at each
    eviction, this keeps one heap per instance between evictions, pushing a node whenever it
    becomes or is refreshed as a leaf of that instance (at most one push per insert or match,
    since only the deepest node of a path can be a leaf), and skipping stale entries (time
    changed, no longer a leaf, node gone) when popped. Same order, same result (given times
    that never go back, as arrival order guarantees), no scan of the tree; a heap with more
    entries than twice its instance's nodes is compacted.
    """

    #: stale heap entries tolerated beyond twice an instance's nodes before compaction (a test
    #: sets 0 to compact at every chance)
    compact_slack = 64

    def __init__(self, instances: int, page_size: int) -> None:
        self.page_size = page_size
        self.root = _Node(None, None, 0)
        self._serial = 0
        self.sizes = [0] * instances  # tokens per instance
        self._leaves: list[list[_Candidate]] = [[] for _ in range(instances)]

    def match(self, symbols: Sequence[Hashable]) -> list[_Node]:
        """The nodes of the longest prefix of ``symbols`` in the tree, root excluded, top down.
        One dict lookup per page; changes nothing."""
        path: list[_Node] = []
        node = self.root
        for symbol in symbols:
            child = node.children.get(symbol)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def touch(self, path: Sequence[_Node], instance: int, now: float) -> None:
        """Refresh ``instance``'s last-access time on every node of ``path``, a path from the
        root that the instance holds (the gateway's ``prefix_match`` does this for the tenant
        it returns, from the match point to the root)."""
        for node in path:
            node.tenants[instance] = now
        if path:
            self._candidate(path[-1], instance)

    def insert(self, symbols: Sequence[Hashable], instance: int, now: float) -> None:
        """Add ``instance`` with time ``now`` to every node of ``symbols``' path, creating
        missing nodes; its size grows by ``page_size`` per node it newly joins."""
        node = self.root
        for symbol in symbols:
            child = node.children.get(symbol)
            if child is None:
                self._serial += 1
                child = node.children[symbol] = _Node(symbol, node, self._serial)
            if instance not in child.tenants:
                self.sizes[instance] += self.page_size
                node.child_tenants[instance] = node.child_tenants.get(instance, 0) + 1
            child.tenants[instance] = now
            node = child
        if node is not self.root:
            self._candidate(node, instance)

    def evict(self, max_tokens: int) -> None:
        """Shrink every instance holding more than ``max_tokens`` tokens to at most that, by
        removing its least-recently-accessed leaves (the gateway's ``evict_tenant_by_size``).

        A (node, instance) pair is a candidate when no child of the node carries the instance;
        the oldest goes first (ties: the older node). The instance leaves the node, a node left
        with no instance is deleted, and a parent that has become a leaf for the instance is a
        candidate in turn. Instances within the limit are not touched. O(log heap) a removal.
        """
        for instance, heap in enumerate(self._leaves):
            while self.sizes[instance] > max_tokens and heap:
                stamp, _, node = heapq.heappop(heap)
                if not self._valid(stamp, node, instance):
                    continue
                parent = self._remove_tenant(node, instance)
                if parent is not self.root:
                    self._candidate(parent, instance)

    def _valid(self, stamp: float, node: _Node, instance: int) -> bool:
        """Whether a heap entry still describes a leaf of ``instance`` at its current time (a
        deleted node has no tenants left, so it fails the first test)."""
        return node.tenants.get(instance) == stamp and node.is_leaf_for(instance)

    def _candidate(self, node: _Node, instance: int) -> None:
        """Push ``node`` as an eviction candidate of ``instance`` if it is one of its leaves;
        compact the heap once stale entries outnumber the instance's nodes."""
        if not node.is_leaf_for(instance):
            return
        heap = self._leaves[instance]
        heapq.heappush(heap, (node.tenants[instance], node.serial, node))
        if len(heap) > 2 * (self.sizes[instance] // self.page_size) + self.compact_slack:
            self._compact(instance)

    def _compact(self, instance: int) -> None:
        """Drop stale and duplicate entries of ``instance``'s heap: at most one per node stays,
        so compaction costs O(1) amortised per push."""
        seen: set[int] = set()
        kept: list[_Candidate] = []
        for entry in self._leaves[instance]:
            stamp, serial, node = entry
            if serial not in seen and self._valid(stamp, node, instance):
                seen.add(serial)
                kept.append(entry)
        heapq.heapify(kept)
        self._leaves[instance] = kept

    def _remove_tenant(self, node: _Node, instance: int) -> _Node:
        """Take ``instance`` off ``node`` (a leaf for it); delete the node if no instance is
        left on it. Returns the node's parent."""
        parent = node.parent
        assert parent is not None  # the root carries no tenant and is never a candidate
        del node.tenants[instance]
        self.sizes[instance] -= self.page_size
        left = parent.child_tenants[instance] - 1
        if left:
            parent.child_tenants[instance] = left
        else:
            del parent.child_tenants[instance]
        if not node.tenants:
            # no instance left means no child either: a child's instance is also on its parent
            del parent.children[node.symbol]
            node.parent = None
        return parent

    def held_tokens(self, symbols: Sequence[Hashable], instance: int) -> int:
        """Tokens of the prefix ``symbols`` the tree holds for ``instance`` (inspection; does
        not refresh anything)."""
        held = 0
        for node in self.match(symbols):
            if instance not in node.tenants:
                break
            held += self.page_size
        return held

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless the tree is consistent: every non-root node has an
        instance, each instance on a node is on its parent with a time at least as recent,
        ``child_tenants`` counts match the children, ``sizes`` equal ``page_size`` times the
        nodes per instance, and every leaf of an instance has a live entry in its heap."""
        counted = [0] * len(self.sizes)
        leaves: set[tuple[int, int]] = set()
        stack = [self.root]
        while stack:
            node = stack.pop()
            expected: dict[int, int] = {}
            for symbol, child in node.children.items():
                assert child.symbol == symbol and child.parent is node
                assert child.tenants, "a node with no instance must be deleted"
                for instance, stamp in child.tenants.items():
                    if node is not self.root:
                        assert node.tenants.get(instance, -1.0) >= stamp, "not prefix-closed"
                    expected[instance] = expected.get(instance, 0) + 1
                    counted[instance] += self.page_size
                    if child.is_leaf_for(instance):
                        leaves.add((instance, child.serial))
                stack.append(child)
            assert node.child_tenants == expected, "child_tenants out of date"
        assert counted == self.sizes, f"sizes {self.sizes} != counted {counted}"
        queued = {
            (instance, node.serial)
            for instance, heap in enumerate(self._leaves)
            for stamp, _, node in heap
            if self._valid(stamp, node, instance)
        }
        assert leaves == queued, "eviction heaps out of date"


class CacheAwareRouter:
    """The SGLang model gateway's ``cache_aware`` policy.

    Source: ``sgl-project/sglang`` ``sgl-model-gateway/src/policies/cache_aware.rs``
    @ b93974f140de1e545d9134d87e77f0bd1fbf3014 (the older ``sgl-router/src/policies/
    cache_aware.rs`` @ 026f853ba7ae08a457a2e127b85a26256a29e300 has the same logic but for the
    fallback noted below). Per request:

    1. Loads = in-flight requests of every instance. Imbalanced iff
       ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold * min``; then
       the least-loaded instance gets the request (ties to the lowest index).
    2. Otherwise the request's page symbols are matched in the :class:`PrefixTree` of what
       was *routed* (not what the instances really cache). Match rate = matched tokens /
       ``input_length`` (0 for an empty prompt). If the rate is strictly above
       ``cache_threshold`` the instance on the deepest matched node wins; otherwise the
       least-loaded one (the newer gateway; the older router took the instance with the
       smallest tree instead). The matched instance's times along the path are refreshed
       either way, as the gateway's ``prefix_match`` does.
    3. Both paths insert the request's symbols for the chosen instance at time ``now``.

    The tree's nodes are blocks of ``router.tree_block_tokens`` (whole pages; default 512):
    **[model]** coarser than the gateway's characters, exact for traces that share prefixes in
    512-token blocks (Mooncake's format), and 8x fewer nodes than one per 64-token page.

    When several instances share the deepest matched node the gateway returns the first in
    its hash map's iteration order (arbitrary); here the lowest index, so runs are
    reproducible. The gateway's eviction is a background thread waking every
    ``eviction_interval_secs``; here it runs lazily, at the first routing call at or after each
    interval boundary of simulated time, before that request is routed.
    """

    name = "cache_aware"

    def __init__(self, cfg: RouterConfig, instances: int, page_size: int) -> None:
        self.cache_threshold = cfg.cache_threshold
        self.balance_abs = cfg.balance_abs_threshold
        self.balance_rel = cfg.balance_rel_threshold
        self.interval_s = cfg.eviction_interval_s
        self.max_tree_tokens = cfg.max_tree_tokens
        # a node per `pages` pages (router.tree_block_tokens): every pages-th page symbol
        # identifies its block and everything before it, so it keys the block
        self.pages = max(1, cfg.tree_block_tokens // page_size)
        self.tree = PrefixTree(instances, self.pages * page_size)
        self._next_eviction_s = cfg.eviction_interval_s

    def keys(self, req: PagedRequest) -> Sequence[Hashable]:
        """The tree key of ``req``: one symbol per whole block of the prompt."""
        k = self.pages
        return req.symbols if k == 1 else req.symbols[k - 1 :: k]

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        self._maybe_evict(now)
        loads = _loads(views)
        balanced = not self._imbalanced(loads)
        key = self.keys(req)
        pick = self._by_prefix(req, key, loads, now) if balanced else _least_loaded(loads)
        self.tree.insert(key, pick, now)
        return pick

    def _imbalanced(self, loads: Sequence[int]) -> bool:
        lo, hi = min(loads), max(loads)
        return hi - lo > self.balance_abs and hi > self.balance_rel * lo

    def _by_prefix(
        self, req: PagedRequest, key: Sequence[Hashable], loads: Sequence[int], now: float
    ) -> int:
        path = self.tree.match(key)
        if not path:
            return _least_loaded(loads)
        matched = min(path[-1].tenants)
        self.tree.touch(path, matched, now)
        rate = len(path) * self.tree.page_size / req.input_length if req.input_length else 0.0
        return matched if rate > self.cache_threshold else _least_loaded(loads)

    def _maybe_evict(self, now: float) -> None:
        if now < self._next_eviction_s:
            return
        self.tree.evict(self.max_tree_tokens)
        # the next boundary strictly after now: intervals with no request evict nothing new
        self._next_eviction_s = (now // self.interval_s + 1) * self.interval_s


# ------------------------------------------------------------------------- tier_aware --


class TierAwareRouter:
    """NVIDIA Dynamo's KV-router cost, fed with each instance's real device and host prefix.

    Sources (``ai-dynamo/dynamo``): ``lib/kv-router/src/scheduling/selector/default.rs``
    @ 07a6c9ce3bb096cfaf353fe69ee578e105c6a512, ``docs/components/router/router-concepts.md``
    @ 03037af0f6eacf8114806cfa10dd823d120b3ce8 and ``docs/components/router/
    router-offloading.md`` @ 07742b7836e1b87b333ff2367fc89160c5531ae4 (host tier credit for
    SGLang HiCache). With blocks = pages of ``page_size`` tokens, per instance::

        credit  = (device_weight * device_tokens + host_weight * host_tokens) / page_size
        prefill = max(waiting_tokens / page_size + input_length / page_size - credit, 0)
        cost    = prefill + running_tokens / page_size

    and the lowest cost wins. This is Dynamo's default configuration (``prefill_load_scale``
    1, ``overlap_score_credit_decay`` 0, ``decode_active_request_weight`` 0, temperature 0,
    no disk or shared-pool term). Dynamo's decode term also counts the request's own projected
    blocks, the same on every instance, so leaving it out changes no choice. Dynamo breaks
    ties uniformly at random; here the lowest index wins, so runs are reproducible.

    Unlike the gateway's tree, the prefixes are what each instance really holds at ``now``,
    per tier: a prefix in instance A's host pool earns A ``host_weight`` per page, so A beats
    an idle B that must recompute unless A's queue costs more than the credit saves.
    """

    name = "tier_aware"

    def __init__(self, cfg: RouterConfig, page_size: int) -> None:
        self.device_weight = cfg.device_weight
        self.host_weight = cfg.host_weight
        self.page_size = page_size

    def cost(self, req: PagedRequest, view: InstanceView) -> float:
        """The cost of sending ``req`` to ``view``'s instance, in blocks (pages)."""
        ps = self.page_size
        device, host = view.cached_prefix(req)
        credit = (self.device_weight * device + self.host_weight * host) / ps
        prefill = max(view.waiting_tokens() / ps + req.input_length / ps - credit, 0.0)
        return prefill + view.running_tokens() / ps

    def route(self, req: PagedRequest, views: Sequence[InstanceView], now: float) -> int:
        costs = [self.cost(req, v) for v in views]
        return min(range(len(costs)), key=costs.__getitem__)


# ---------------------------------------------------------------------------- factory --


def build_router(cfg: RouterConfig, instances: int, page_size: int) -> Router:
    """The router ``cfg.policy`` names, for ``instances`` instances of page size
    ``page_size``. Raises ``ValueError`` naming the choices for an unknown policy (a
    ``RouterConfig`` already rejects one; this guards a hand-built or replaced config)."""
    if instances < 1 or page_size < 1:
        raise ValueError(f"instances ({instances}) and page_size ({page_size}) must be >= 1")
    policy = cfg.policy
    if policy == "round_robin":
        return RoundRobinRouter()
    if policy == "random":
        return RandomRouter(cfg.seed)
    if policy == "least_load":
        return LeastLoadRouter()
    if policy == "power_of_two":
        return PowerOfTwoRouter(cfg.seed)
    if policy == "session_affinity":
        return SessionAffinityRouter()
    if policy == "cache_aware":
        return CacheAwareRouter(cfg, instances, page_size)
    if policy == "tier_aware":
        return TierAwareRouter(cfg, page_size)
    raise ValueError(
        f"router.policy: unknown {policy!r}; choose one of {', '.join(ROUTER_POLICIES)}"
    )
