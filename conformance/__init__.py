"""Conformance: our policy core side by side with the real SGLang ``HiRadixCache``.

Opt-in (``make conformance``), never part of ``make test``. Random operation sequences are
played on two *sides* at once -- :mod:`conformance.ours_side` (``hicache.policy``) and
:mod:`conformance.sglang_side` (the installed ``sglang`` wheel, on CPU, with stub pools and a
manual copy controller) -- and after every step the return values and the full cache state are
compared (:mod:`conformance.compare`). Deliberate differences are listed in one place,
:mod:`conformance.known_differences`.

The request-level logic (what a scheduler does around the cache) lives once, in
:class:`conformance.driver.Driver`; a side only adapts primitives and extracts state. The L3
storage tier plugs in the same way: its operation specs (:data:`conformance.ops.L3_OPS`), driver
handlers (request arrival with prefetch, checks at a logical time, credits, aborts, the storage
stages stepped one backend call at a time, drains) and, on the SGLang side, a stub of
``HiCacheController``'s storage half over the real ``HiCacheFile`` backend.
"""
