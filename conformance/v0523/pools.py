"""Page pools shared by both sides of the 0.5.23 conformance check.

Page ids only (a page is ``page_size`` token slots: slot ``p * page_size + i``). ``alloc`` takes
from the front of the free list and ``free`` appends to its end, so both sides hand out the same
ids when they make the same calls in the same order. Standard library only.
"""

from __future__ import annotations

from collections import deque


class FifoPages:
    """A FIFO free list of page ids ``0 .. num_pages-1``; double frees raise."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free: deque[int] = deque(range(num_pages))
        self._used: set[int] = set()

    def available(self) -> int:
        """Free pages."""
        return len(self._free)

    def alloc(self, num_pages: int) -> list[int] | None:
        """``num_pages`` pages from the front, or None (nothing taken) when short."""
        if num_pages > len(self._free):
            return None
        out = [self._free.popleft() for _ in range(num_pages)]
        self._used.update(out)
        return out

    def free(self, pages: list[int]) -> None:
        """Return ``pages`` to the end of the free list, in the order given."""
        for p in pages:
            if p not in self._used:
                raise RuntimeError(f"double free of page {p}")
            self._used.remove(p)
            self._free.append(p)

    def free_list(self) -> list[int]:
        return list(self._free)

    def clear(self) -> None:
        self._free = deque(range(self.num_pages))
        self._used.clear()
