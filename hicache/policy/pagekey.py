"""Paged key types: a tuple with one symbol per page, and two variants that remember the key
they were cut from (see :mod:`hicache.policy.radix`).

Kept apart from the radix-tree module because they subclass ``tuple``: the optional compiled
policy core (:mod:`hicache.policy.native`) compiles the tree modules, and compiled classes cannot
subclass built-in types, so these stay interpreted in both builds.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any


class PageKey(tuple[Hashable, ...]):
    """A key that is already paged: one symbol per page. Anything else is taken as token ids."""

    __slots__ = ()


class ExtendedPageKey(PageKey):
    """``base + more`` as one :class:`PageKey` that remembers its leading part ``base``.

    What :meth:`hicache.lifecycle.KVLifecycle.extend_key` returns (prompt + output symbols). It
    compares, hashes and slices as the plain tuple it is; the tree only uses ``base`` to know,
    without comparing them, that nodes cut from ``base`` match this key's first pages. Pickles
    as a plain :class:`PageKey`.
    """

    base: PageKey

    def __new__(cls, base: PageKey, more: Iterable[Hashable]) -> ExtendedPageKey:
        if not isinstance(base, PageKey):
            base = PageKey(base)
        self = super().__new__(cls, base + tuple(more))
        self.base = base
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PageKey, (tuple(self),))


class PrefixKey(PageKey):
    """The first ``n`` pages of ``base`` as one :class:`PageKey` that remembers ``base``.

    What a chunked request's key is after each chunk: nodes cut from one chunk's key are
    recorded against ``base`` (:func:`key_source`), so the next chunk's key, a longer prefix of
    the same ``base``, is known to match them without comparing. Pickles as a plain
    :class:`PageKey`.
    """

    base: PageKey

    def __new__(cls, base: PageKey, n: int) -> PrefixKey:
        self = super().__new__(cls, base[:n])
        self.base = base
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (PageKey, (tuple(self),))
