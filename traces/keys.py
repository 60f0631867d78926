"""Prompt tokens and page keys for the policy core.

Token mapping (hash-id traces). Block ``i`` of a request with hash id ``h`` holds the
tokens ``token(h, k) = h * block_size + k`` for ``k = 0 .. block_size - 1``. Hash ids are
non-negative, so every mapped token is a non-negative int; two different (id, position)
pairs never give the same token, and equal ids give equal tokens. Negative ints are
reserved for callers that need tokens that never match anything (e.g. generated output
tokens in a simulator).

Partial last block. A prompt of ``input_length`` tokens has ``ceil(input_length /
block_size)`` blocks; the last one holds only the first ``input_length % block_size`` tokens
of its block (when that is non-zero). Pages are cut from the start of the prompt: only
*full* pages get a key, so the unaligned tail (``input_length % page_size`` tokens) is never
cacheable, exactly as SGLang's page-aligned radix cache never stores a partial page.

Page keys. `page_symbols(req, page_size)` gives one hashable symbol per full page, such
that two requests' symbol lists agree on their first ``k`` entries iff their prompts agree
on their first ``k * page_size`` tokens.
"""

from __future__ import annotations

from traces.schema import DEFAULT_BLOCK_SIZE, Request, TraceParamError


def token_of(hash_id: int, position: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """The token id at `position` (0-based, < block_size) of the block with `hash_id`."""
    return hash_id * block_size + position


def check_page_size(page_size: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Return the number of pages per block; raise ValueError unless page_size divides
    block_size (both positive)."""
    if page_size < 1:
        raise TraceParamError(f"page_size must be >= 1, got {page_size}")
    if block_size < 1:
        raise TraceParamError(f"block_size must be >= 1, got {block_size}")
    if block_size % page_size:
        raise TraceParamError(
            f"page_size {page_size} does not divide the trace's block_size {block_size}: a "
            "hash-id trace only knows which whole blocks are equal, so pages must not straddle "
            "blocks (use a page size that divides the block size)"
        )
    return block_size // page_size


def page_symbols(
    req: Request, page_size: int, block_size: int = DEFAULT_BLOCK_SIZE
) -> list[int] | list[tuple[int, ...]]:
    """One symbol per full page of the prompt (``input_length // page_size`` symbols).

    Hash-id requests: `page_size` must divide `block_size` (ValueError otherwise); page ``j``
    (0-based within its block) of a block with hash id ``h`` has the non-negative int symbol
    ``h * (block_size // page_size) + j``, so at page_size 1 the symbols are the token ids of
    the mapping ``h * block_size + k``. Token-id requests: at page_size 1 the token ids
    themselves, otherwise tuples of `page_size` consecutive token ids. The returned list is
    new (the caller may modify it).
    """
    hash_ids = req.hash_ids
    if hash_ids is not None:
        per_block = check_page_size(page_size, block_size)
        n_pages = req.input_length // page_size
        if per_block == 1:
            return hash_ids[:n_pages]
        out: list[int] = []
        extend = out.extend
        # One C-level range per block: no per-token Python work even at page_size 1.
        for h in hash_ids[: -(-n_pages // per_block)]:
            base = h * per_block
            extend(range(base, base + per_block))
        del out[n_pages:]
        return out
    token_ids = req.token_ids
    if token_ids is None:
        raise ValueError("request has neither hash_ids nor token_ids")
    if page_size < 1:
        raise TraceParamError(f"page_size must be >= 1, got {page_size}")
    n_pages = req.input_length // page_size
    if page_size == 1:
        return token_ids[:n_pages]
    return [tuple(token_ids[i : i + page_size]) for i in range(0, n_pages * page_size, page_size)]


def token_ids_of(req: Request, block_size: int = DEFAULT_BLOCK_SIZE) -> list[int]:
    """The full prompt as token ids (length ``input_length``), new list.

    Hash-id requests use the mapping ``token(h, k) = h * block_size + k``; the partial last
    block contributes only its first ``input_length - (blocks - 1) * block_size`` tokens.
    """
    if req.token_ids is not None:
        return req.token_ids[: req.input_length]
    if req.hash_ids is None:
        raise ValueError("request has neither hash_ids nor token_ids")
    out: list[int] = []
    extend = out.extend
    for h in req.hash_ids:
        base = h * block_size
        extend(range(base, base + block_size))
    del out[req.input_length :]
    return out
