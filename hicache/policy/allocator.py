"""Page allocators for the device (HBM) and host (DRAM) KV pools.

Both of SGLang's pools hand out slots from a free list: allocation takes the first ``n`` free
entries, freeing appends at the tail (FIFO). We allocate whole pages and identify them by a page
id; a page covers ``page_size`` consecutive token slots (``page_id * page_size + offset``), which is
what SGLang's paged allocator returns. Which ids are handed out never changes a policy decision;
it only matters to the replay, where contiguous runs of pages become single copies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

#: The initial free list is held in chunks of at most this many pages (see ``PageAllocator``).
_INIT_CHUNK = 4096


def _initial_chunks(num_pages: int, ids: list[int] | None) -> deque[list[int]]:
    if ids is None:
        return deque(
            list(range(i, min(i + _INIT_CHUNK, num_pages)))
            for i in range(0, num_pages, _INIT_CHUNK)
        )
    return deque(ids[i : min(i + _INIT_CHUNK, num_pages)] for i in range(0, num_pages, _INIT_CHUNK))


class PageAllocator:
    """A FIFO free list of ``num_pages`` page ids (``0 .. num_pages-1``).

    Sizes in the public API are in **tokens** (always multiples of ``page_size``), like SGLang's
    ``available_size()``; the ids handed out are page ids.

    The free list is stored as a queue of non-empty lists whose concatenation (the first one
    read from ``_pos``) is the free list in order; ``free`` in FIFO mode appends the caller's
    list itself, so returning pages costs nothing per page. No stored list is ever modified:
    allocation copies out of them.
    """

    __slots__ = (
        "_chunks",
        "_count",
        "_front",
        "_ids",
        "_pos",
        "name",
        "num_pages",
        "page_size",
        "reuse",
    )

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        name: str = "pool",
        reuse: str = "fifo",
        ids: list[int] | None = None,
    ) -> None:
        """``reuse``: ``"fifo"`` appends freed pages at the tail (SGLang's host pool and its
        page-size-1 device allocator); ``"front"`` puts each freed batch, sorted and de-duplicated,
        at the head so it is reused first (SGLang's paged device allocator).

        ``ids``: ``list(range(k))`` with ``k >= num_pages`` (:func:`page_ids`) to take the page-id
        int objects from, so that pools built from one list share them (same values, fewer
        objects to touch: faster at page size 1). It changes no page id."""
        if reuse not in ("fifo", "front"):
            raise ValueError(f"{name}: reuse must be 'fifo' or 'front', got {reuse!r}")
        self.reuse = reuse
        self._front = reuse == "front"
        if page_size < 1:
            raise ValueError(f"{name}: page_size must be >= 1, got {page_size}")
        if num_pages < 0:
            raise ValueError(f"{name}: num_pages must be >= 0, got {num_pages}")
        self.name = name
        self.num_pages = num_pages
        self.page_size = page_size
        if ids is not None and (len(ids) < num_pages or ids[:num_pages] != list(range(num_pages))):
            raise ValueError(f"{name}: ids must start with 0 .. {num_pages - 1} in order")
        self._ids = ids
        self._chunks = _initial_chunks(num_pages, ids)
        self._pos = 0
        self._count = num_pages

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        """Free capacity in tokens (side-effect free)."""
        return self._count * self.page_size

    def free_page_count(self) -> int:
        return self._count

    def alloc(self, num_tokens: int) -> list[int] | None:
        """Take ``num_tokens / page_size`` pages from the head of the free list.

        ``num_tokens`` must be a multiple of the page size. Returns ``None`` (and changes nothing)
        when not enough pages are free, as SGLang's allocators do.
        """
        if num_tokens % self.page_size:
            raise ValueError(
                f"{self.name}: allocation of {num_tokens} tokens is not a multiple of "
                f"page_size {self.page_size}"
            )
        return self.alloc_pages(num_tokens // self.page_size)

    def alloc_pages(self, n: int) -> list[int] | None:
        """The first ``n`` free pages (a new list), or ``None`` when fewer are free."""
        if n > self._count:
            return None
        first = self._chunks[0] if n > 0 else None
        pos = self._pos
        if first is not None and pos + n < len(first):  # within the head list: one slice
            self._pos = pos + n
            self._count -= n
            return first[pos : pos + n]
        out: list[int] = []
        self.alloc_into(out, n)
        return out

    def alloc_into(self, dest: list[int], n: int) -> bool:
        """Append the first ``n`` free pages to ``dest`` (what ``dest += alloc_pages(n)`` does,
        without the intermediate list); ``False`` (nothing changed) when fewer are free."""
        count = self._count
        if n > count:
            return False
        if n <= 0:
            return True
        self._count = count - n
        chunks = self._chunks
        pos = self._pos
        need = n
        while True:
            c = chunks[0]
            k = len(c) - pos
            if k > need:
                dest += c[pos : pos + need]
                self._pos = pos + need
                return True
            dest += c[pos:] if pos else c
            chunks.popleft()
            pos = 0
            need -= k
            if not need:
                self._pos = 0
                return True

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the free list (tail, or sorted at the head in ``"front"`` mode).

        In FIFO mode a ``list`` is kept as it is, not copied: the caller must not modify it
        afterwards (the policy core frees node values it drops, and fresh slices).
        """
        if self._front:
            self.free_distinct(sorted(set(pages)))  # SGLang's de-duplication (torch.unique)
        else:
            self.free_distinct(pages if type(pages) is list else list(pages))

    def free_distinct(self, pages: list[int]) -> None:
        """:meth:`free` for a list that holds no page twice (what the policy core and the
        lifecycle free: node values and slices of one request's pages, distinct by
        construction). It skips the de-duplication, which in SGLang exists because freed token
        slots are converted to pages; the order the free list ends in is the same. A page freed
        twice here would stay in the free list twice (the invariant checker reports that)."""
        if not self._front:
            if type(pages) is not list:
                pages = list(pages)
            if pages:
                self._chunks.append(pages)
                self._count += len(pages)
            return
        if not pages:
            return
        new = sorted(pages)
        chunks = self._chunks
        if self._pos:
            chunks[0] = chunks[0][self._pos :]
            self._pos = 0
        chunks.appendleft(new)
        self._count += len(new)

    def clear(self) -> None:
        """Every page free again, in id order (SGLang's ``clear()`` on flush)."""
        self._chunks = _initial_chunks(self.num_pages, self._ids)
        self._pos = 0
        self._count = self.num_pages

    def free_pages_snapshot(self) -> list[int]:
        """The free list in order (for invariant checks and tests)."""
        out: list[int] = []
        for i, c in enumerate(self._chunks):
            out += c[self._pos :] if i == 0 else c
        return out


def count_runs(device_pages: Sequence[int], host_pages: Sequence[int]) -> int:
    """Contiguous runs of a paired page copy: a new run starts wherever either side is not the
    previous page + 1 (one ``cudaMemcpyAsync`` per run and layer for ``direct`` IO). This is
    the ``runs`` that :func:`hicache.latency.op_charges` charges ``gamma`` for. Here, in the
    compiled core's modules, because every copy op counts them page by page."""
    n = len(device_pages)
    if n != len(host_pages):
        raise ValueError(f"page lists differ in length: {n} device vs {len(host_pages)} host")
    if not n:
        return 0
    runs = 1
    for i in range(1, n):
        if device_pages[i] != device_pages[i - 1] + 1 or host_pages[i] != host_pages[i - 1] + 1:
            runs += 1
    return runs


def page_ids(num_pages: int) -> list[int]:
    """``list(range(num_pages))``: page-id objects for pools to share (``PageAllocator(ids=)``)."""
    return list(range(num_pages))


def device_pool(num_pages: int, page_size: int, ids: list[int] | None = None) -> PageAllocator:
    """A device allocator that reuses pages in SGLang's order for this page size."""
    return PageAllocator(
        num_pages, page_size, "device", reuse="front" if page_size > 1 else "fifo", ids=ids
    )


def host_pool_tokens(
    device_tokens: int,
    page_size: int,
    *,
    hicache_ratio: float = 2.0,
    hicache_size_gb: float = 0.0,
    bytes_per_token: int | None = None,
    must_exceed_device: bool = True,
) -> int:
    """Host pool size in tokens, as SGLang 0.5.14's ``HostKVCache`` sizes it.

    ``hicache_size_gb > 0`` (GB = 1e9 bytes, per rank) overrides the ratio and needs
    ``bytes_per_token``. The page count always gets one extra page. Raises ``ValueError`` when the
    host pool would not be larger than the device pool (SGLang 0.5.14 asserts this at start-up;
    0.5.23 only warns, pool_host/base.py:232-241: ``must_exceed_device=False``).
    """
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if device_tokens <= 0:
        raise ValueError(f"device_tokens must be > 0, got {device_tokens}")
    if hicache_size_gb > 0:
        if not bytes_per_token or bytes_per_token <= 0:
            raise ValueError("hicache_size_gb needs a positive bytes_per_token")
        size = int(hicache_size_gb * 1e9 // bytes_per_token)
    else:
        if hicache_ratio <= 0:
            raise ValueError(f"hicache_ratio must be > 0, got {hicache_ratio}")
        tokens = device_tokens * hicache_ratio
        if tokens == float("inf"):
            raise ValueError(f"hicache_ratio {hicache_ratio:g} gives a host pool too large to hold")
        size = int(tokens)
    page_num = size // page_size + 1
    size = page_num * page_size
    if size <= device_tokens and must_exceed_device:
        raise ValueError(
            f"host pool ({size} tokens) must be larger than the device pool ({device_tokens} "
            "tokens); SGLang refuses to start otherwise (raise hicache_ratio above 1 or "
            "hicache_size)"
        )
    return size
