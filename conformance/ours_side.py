"""Our side: ``hicache.policy.HiRadixCache`` with a ``ManualController`` and ``PageAllocator`` s.

Built the way ``tests/policy/harness.py`` builds it: the device pool reuses pages in SGLang's
order for the page size (``device_pool``), the host pool is FIFO. On an L3 configuration a
:class:`~hicache.policy.storage.StorageController` (with an unbounded ``PageStore``) is attached
the way ``tests/policy/test_storage_tier.py`` does; its stages are stepped by the driver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from conformance.driver import MatchView, Node, Side, State, node_label
from conformance.ops import Config, run_length
from hicache.policy import HiRadixCache, ManualController, PageAllocator, to_page_key
from hicache.policy.allocator import device_pool
from hicache.policy.eviction import get_strategy
from hicache.policy.radix import TreeNode, child_key
from hicache.policy.storage import BackupOp, PageHasher, PageStore, PrefetchOp, StorageController


class RecordingHasher(PageHasher):
    """Our page keys, remembering the (extra key, tokens) prefix each key stands for, so that
    L3 content and storage operations can be compared with SGLang's as token prefixes (the key
    functions differ on purpose: KD-L3-KEYS)."""

    def __init__(self, page_size: int) -> None:
        super().__init__()
        self.page_size = page_size
        self.prefix: dict[int, tuple[str | None, tuple[int, ...]]] = {0: (None, ())}

    def seed(self, extra_key: str | None) -> int:
        s = super().seed(extra_key)
        self.prefix.setdefault(s, (extra_key, ()))
        return s

    def chain(self, last: int, symbols: Sequence[Hashable]) -> list[int]:
        out = super().chain(last, symbols)
        ns, tokens = self.prefix[last]
        for key, sym in zip(out, symbols, strict=True):
            page: tuple[Any, ...] = tuple(sym) if self.page_size > 1 else (sym,)  # type: ignore[arg-type]
            tokens = tokens + page
            self.prefix.setdefault(key, (ns, tokens))
        return out

    find = chain

    def tokens(self, key: int) -> tuple[int, ...]:
        return self.prefix[key][1]


def _flatten(key: tuple[Any, ...], page_size: int) -> list[int]:
    if page_size == 1:
        return list(key)
    return [t for page in key for t in page]


class OursSide(Side):
    """Adapts our policy core to the driver's primitives (page ids are used as they are)."""

    name = "ours"
    cache: HiRadixCache

    def __init__(self, cfg: Config) -> None:
        super().__init__(cfg)
        self.device = device_pool(cfg.device_pages, cfg.page_size)
        self.host = PageAllocator(cfg.host_pages, cfg.page_size, "host")
        self.ctrl = ManualController(self.device, self.host)
        self.cache = HiRadixCache(
            self.ctrl, write_policy=cfg.write_policy, eviction_policy=cfg.strategy
        )
        self._key = get_strategy(cfg.strategy)
        self.hasher = RecordingHasher(cfg.page_size)
        self.store = PageStore()
        self.storage: StorageController | None = None
        self.cov: Counter[str] = Counter()
        """Driver-level L3 counters (coverage)."""
        if cfg.l3:
            ps = cfg.page_size
            self.storage = StorageController(
                self.host,
                self.store,
                device_tokens=cfg.device_pages * ps,
                threshold=cfg.threshold_pages * ps,
                hasher=self.hasher,
                batch_pages=cfg.batch_pages,
            )
            assert cfg.prefetch_policy is not None
            self.cache.attach_storage(
                self.storage,
                prefetch_policy=cfg.prefetch_policy,
                prefetch_threshold=cfg.threshold_pages * ps,
                timeout_base=cfg.timeout_base,
                timeout_per_ki_token=cfg.timeout_per_ki_token,
                timeout_max=cfg.timeout_max,
            )

    # -- cache calls ---------------------------------------------------------------------------
    def match(self, tokens: list[int], extra_key: str | None, limit: int | None) -> MatchView:
        m = self.cache.match_prefix(tokens, extra_key=extra_key, limit=limit)
        return MatchView(
            list(m.device_indices),
            m.host_hit_length,
            m.last_device_node,
            m.last_host_node,
            m.best_match_node,
            m,
        )

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        chunked: bool,
        priority: int,
        extra_key: str | None,
    ) -> int:
        return self.cache.insert(
            tokens, list(pages), chunked=chunked, priority=priority, extra_key=extra_key
        )

    def inc_lock(self, node: Node) -> int:
        return self.cache.inc_lock_ref(node)

    def dec_lock(self, node: Node) -> int:
        return self.cache.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens)

    def evict_host(self, num_tokens: int) -> None:
        self.cache.evict_host(num_tokens)

    def init_load_back(self, node: Node, host_hit: int) -> tuple[list[int], Node]:
        pages, last = self.cache.init_load_back(node, host_hit)
        return list(pages), last

    def ready_to_load(self) -> int:
        return self.cache.ready_to_load_host_cache()

    # -- pools and controller -----------------------------------------------------------------
    def alloc_device(self, num_pages: int) -> list[int] | None:
        return self.device.alloc_pages(num_pages)

    def free_device(self, pages: list[int]) -> None:
        self.device.free(list(pages))

    def clear_device(self) -> None:
        self.device.clear()

    def device_free_list(self) -> list[int]:
        return self.device.free_pages_snapshot()

    def host_free_list(self) -> list[int]:
        return self.host.free_pages_snapshot()

    def finish_writes(self, count: int | None) -> int:
        return self.ctrl.complete_writes(count)

    def finish_loads(self, count: int | None) -> int:
        return self.ctrl.complete_loads(count)

    # -- introspection -------------------------------------------------------------------------
    def root(self) -> Node:
        return self.cache.root

    def node_tokens(self, node: Node) -> list[int]:
        return _flatten(node.key, self.page_size)

    def node_extra_key(self, node: Node) -> str | None:
        extra: str | None = node.extra_key
        return extra

    def node_fields(self, node: Node) -> dict[str, Any]:
        n: TreeNode = node
        return {
            "value": None if n.value is None else list(n.value),
            "host_value": None if n.host_value is None else list(n.host_value),
            "lock_ref": n.lock_ref,
            "host_ref": n.host_ref_counter,
            "hit_count": n.hit_count,
            # the root's priority, inherited by a node fetched under it (KD-ROOT)
            "priority": "root" if n.priority == self.cache.root.priority else n.priority,
            "pending_write": n.write_through_pending_id,
            "last_access": n.last_access_time,
            "creation": n.creation_time,
        }

    def is_evicted(self, node: Node) -> bool:
        return node.value is None

    def in_tree(self, node: Node) -> bool:
        root = self.cache.root
        while node is not root:
            if not self.cache.is_in_tree(node):
                return False
            node = node.parent
        return True

    def device_prefix(self, tokens: list[int], extra_key: str | None) -> list[int]:
        key = to_page_key(tokens, self.page_size)
        node, off, pages = self.cache.root, 0, []
        while off < len(key):
            child = node.children.get(child_key(key, off, extra_key))
            if child is None or child.value is None:
                break
            if tuple(key[off : off + len(child.key)]) != tuple(child.key):
                break
            pages += child.value
            node, off = child, off + len(child.key)
        return pages

    def evictable_leaves(self) -> Iterable[Node]:
        return self.cache.evictable_leaves

    def evictable_host_leaves(self) -> Iterable[Node]:
        return self.cache.evictable_host_leaves

    def eviction_key(self, node: Node) -> Any:
        return self._key(node)

    def sizes(self) -> tuple[int, int]:
        return self.cache.evictable_size(), self.cache.protected_size()

    def write_records(self) -> list[tuple[int, Node, int, list[Node]]]:
        ps = self.page_size
        return [
            (ack, rec.lock_node, rec.backup_len * ps, list(rec.publish_nodes))
            for ack, rec in self.cache.ongoing_write_through.items()
        ]

    def load_records(self) -> list[tuple[int, Node]]:
        return list(self.cache.ongoing_load_back.items())

    def write_acks(self) -> list[tuple[list[int], bool]]:
        return [([op.node_id], op.done) for op in self.ctrl.write_queue]

    def load_acks(self) -> list[tuple[list[int], bool]]:
        return [(list(b.node_ids), b.done) for b in self.ctrl.load_queue]

    def queued_loads(self) -> list[int]:
        return [op.node_id for op in self.ctrl.pending_loads]

    # -- L3 storage tier -----------------------------------------------------------------------
    def _st(self) -> StorageController:
        assert self.storage is not None, "not an L3 configuration"
        return self.storage

    def prefetch(
        self, rid: str, tokens: list[int], extra_key: str | None, m: MatchView, now: float
    ) -> bool:
        ps = self.page_size
        key = to_page_key(tokens, ps)
        return self.cache.prefetch_kvcache(
            rid, key, m.raw, max(len(tokens) - 1, 0) // ps, now, extra_key
        )

    def check_prefetch(self, rid: str, now: float) -> bool:
        entry = self.cache.ongoing_prefetch.get(rid)
        done = self.cache.check_prefetch_progress(rid, now)
        if entry is not None:
            op = entry.op
            if not done:
                self.cov["check_pending"] += 1
            elif op.hit_pages < 0 or op.completed_tokens < op.hit_pages * self.page_size:
                self.cov["check_stopped_early"] += 1  # best_effort, or a timeout
            else:
                self.cov["check_complete"] += 1
        return done

    def pop_credit(self, rid: str) -> int:
        credit = self.cache.pop_prefetch_loaded_tokens(rid)
        self.cov["credit_positive"] += credit > 0
        return credit

    def abort(self, rid: str) -> None:
        self.cov["abort_in_flight"] += rid in self.cache.ongoing_prefetch
        self.cache.release_aborted_request(rid)

    def drain(self) -> None:
        self.cache.drain_storage_control_queues()

    def query_step(self) -> bool:
        return self._st().run_query()

    def read_step(self) -> bool:
        return self._st().run_read()

    def backup_step(self) -> bool:
        return self._st().run_write()

    def coverage(self) -> dict[str, int]:
        """What this sequence exercised: the cache's and the storage controller's L3 counters
        and the 0.5.14 defects (``DEFECTS``) it reached."""
        if self.storage is None:
            return {}
        out = dict(self.cache.storage_stats.as_dict())
        out.update({f"ctrl_{k}": v for k, v in vars(self.storage.stats).items()})
        out.update({f"defect_{k}": v for k, v in self.cache.defects.items()})
        out["host_evict_calls"] = self.cache.stats.evict_host_calls
        out["load_back_calls"] = self.cache.stats.load_back_calls
        out.update(self.cov)
        return out

    def l3_put(self, tokens: list[int]) -> None:
        self.store.set(
            self.hasher.chain(self.hasher.seed(None), to_page_key(tokens, self.page_size))
        )

    def _label_keys(self, keys: Sequence[int]) -> str:
        """The token prefix a page-key list ends with (its last page's key)."""
        return run_length(self.hasher.tokens(keys[-1])) if keys else ""

    def _prefetch_op(self, op: PrefetchOp) -> list[Any]:
        """(completed tokens, terminated, hit pages known to the tree): the hit list of an op
        counts once its query has finished and it was not revoked (SGLang's ``hash_value``)."""
        hit = len(op.hit_keys) if op.hit_pages >= 0 else 0
        return [op.completed_tokens, op.terminated, hit]

    def extra_state(self) -> State:
        st = self.storage
        if st is None:
            return {}
        cache = self.cache
        prefetch: dict[str, Any] = {}
        stale: dict[str, Any] = {}
        for rid, entry in cache.ongoing_prefetch.items():
            view = [
                node_label(self, entry.anchor),
                entry.tokens,
                list(entry.host_pages),
                *self._prefetch_op(entry.op),
            ]
            (prefetch if self.in_tree(entry.anchor) else stale)[str(rid)] = view
        backups: list[str] = []
        stale_backups: list[str] = []
        for node in cache.ongoing_backup.values():
            (backups if self.in_tree(node) else stale_backups).append(node_label(self, node))
        release: list[int] = []
        for pages in st.host_mem_release_queue:
            release += pages
        l3 = sorted({run_length(self.hasher.tokens(k)) for k in self.store._pages})

        def backup_view(op: BackupOp) -> list[Any]:
            return [self._label_keys(op.hash_value), len(op.hash_value), op.done_pages]

        return {
            "l3_prefetch": prefetch,
            "l3_backups": sorted(backups),
            "l3_occupied": st.prefetch_tokens_occupied,
            "l3_credits": {str(k): v for k, v in cache.prefetch_loaded_tokens_by_reqid.items()},
            "l3_root_host_ref": cache.root.host_ref_counter,
            "l3_queues": {
                "revoke": [str(rid) for rid, _ in st.prefetch_revoke_queue],
                "release": release,
                "backup_acks": [
                    [self._label_keys(op.hash_value), op.completed_tokens]
                    for op in st.ack_backup_queue
                ],
            },
            "l3_stages": {
                "query": [
                    [str(op.rid), op.queried_pages, len(op.symbols)] for op in st.prefetch_queue
                ],
                "read": [[str(op.rid), op.read_pages, op.hit_pages] for op in st.prefetch_buffer],
                "backup": [backup_view(op) for op in st.backup_queue],
            },
            "l3_content": l3,
            "stale": {"l3_prefetch": stale, "l3_backups": sorted(stale_backups)},
        }
