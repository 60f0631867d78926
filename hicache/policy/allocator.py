"""Page allocators for the device (HBM) and host (DRAM) KV pools.

Both of SGLang's pools hand out slots from a free list: allocation takes the first ``n`` free
entries, freeing appends at the tail (FIFO). We allocate whole pages and identify them by a page
id; a page covers ``page_size`` consecutive token slots (``page_id * page_size + offset``), which is
what SGLang's paged allocator returns. Which ids are handed out never changes a policy decision;
it only matters to the replay, where contiguous runs of pages become single copies.
"""

from __future__ import annotations

from collections.abc import Iterable


class PageAllocator:
    """A FIFO free list of ``num_pages`` page ids (``0 .. num_pages-1``).

    Sizes in the public API are in **tokens** (always multiples of ``page_size``), like SGLang's
    ``available_size()``; the ids handed out are page ids.
    """

    __slots__ = ("_free", "_head", "name", "num_pages", "page_size", "reuse")

    def __init__(
        self, num_pages: int, page_size: int, name: str = "pool", reuse: str = "fifo"
    ) -> None:
        """``reuse``: ``"fifo"`` appends freed pages at the tail (SGLang's host pool and its
        page-size-1 device allocator); ``"front"`` puts each freed batch, sorted and de-duplicated,
        at the head so it is reused first (SGLang's paged device allocator)."""
        if reuse not in ("fifo", "front"):
            raise ValueError(f"{name}: reuse must be 'fifo' or 'front', got {reuse!r}")
        self.reuse = reuse
        if page_size < 1:
            raise ValueError(f"{name}: page_size must be >= 1, got {page_size}")
        if num_pages < 0:
            raise ValueError(f"{name}: num_pages must be >= 0, got {num_pages}")
        self.name = name
        self.num_pages = num_pages
        self.page_size = page_size
        # FIFO as a list plus a head index: allocation and freeing are C-level slices, so a
        # page-size-1 pool handing out thousands of pages per request stays cheap
        self._free: list[int] = list(range(num_pages))
        self._head = 0

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    def available_size(self) -> int:
        """Free capacity in tokens (side-effect free)."""
        return (len(self._free) - self._head) * self.page_size

    def free_page_count(self) -> int:
        return len(self._free) - self._head

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
        head = self._head
        end = head + n
        free = self._free
        if end > len(free):
            return None
        out = free[head:end]
        if end * 2 > len(free) + 4096:
            del free[:end]  # compact: drop the consumed prefix
            self._head = 0
        else:
            self._head = end
        return out

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the free list (tail, or sorted at the head in ``"front"`` mode)."""
        if self.reuse == "fifo":
            self._free.extend(pages)
            return
        new = sorted(set(pages))
        k, head = len(new), self._head
        if k <= head:
            self._free[head - k : head] = new
            self._head = head - k
        else:
            self._free[head:head] = new

    def clear(self) -> None:
        """Every page free again, in id order (SGLang's ``clear()`` on flush)."""
        self._free = list(range(self.num_pages))
        self._head = 0

    def free_pages_snapshot(self) -> list[int]:
        """The free list in order (for invariant checks and tests)."""
        return self._free[self._head :]


def device_pool(num_pages: int, page_size: int) -> PageAllocator:
    """A device allocator that reuses pages in SGLang's order for this page size."""
    return PageAllocator(num_pages, page_size, "device", reuse="front" if page_size > 1 else "fifo")


def host_pool_tokens(
    device_tokens: int,
    page_size: int,
    *,
    hicache_ratio: float = 2.0,
    hicache_size_gb: float = 0.0,
    bytes_per_token: int | None = None,
) -> int:
    """Host pool size in tokens, as SGLang 0.5.14's ``HostKVCache`` sizes it.

    ``hicache_size_gb > 0`` (GB = 1e9 bytes, per rank) overrides the ratio and needs
    ``bytes_per_token``. The page count always gets one extra page. Raises ``ValueError`` when the
    host pool would not be larger than the device pool (SGLang asserts this at start-up).
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
        size = int(device_tokens * hicache_ratio)
    page_num = size // page_size + 1
    size = page_num * page_size
    if size <= device_tokens:
        raise ValueError(
            f"host pool ({size} tokens) must be larger than the device pool ({device_tokens} "
            "tokens); SGLang refuses to start otherwise (raise hicache_ratio above 1 or "
            "hicache_size)"
        )
    return size
