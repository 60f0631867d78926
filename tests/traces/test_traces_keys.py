"""Token mapping and page keys (`traces.keys`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.keys import check_page_size, page_symbols, token_ids_of, token_of
from traces.schema import Request

BLOCK_SIZES = [1, 2, 4, 8, 16]


def test_token_mapping() -> None:
    assert token_of(3, 5, 512) == 3 * 512 + 5
    r = Request(0, 10, 1, hash_ids=[7, 0, 2])
    assert token_ids_of(r, 4) == [28, 29, 30, 31, 0, 1, 2, 3, 8, 9]
    assert token_ids_of(Request(0, 3, 1, token_ids=[5, 5, 6])) == [5, 5, 6]


def test_page_symbols_hash_ids() -> None:
    r = Request(0, 10, 1, hash_ids=[7, 0, 2])
    # block_size 4, page 2: 2 pages per block; the partial block (2 tokens) has 1 full page
    assert page_symbols(r, 2, 4) == [14, 15, 0, 1, 4]
    # page 1: symbols are the token ids
    assert page_symbols(r, 1, 4) == token_ids_of(r, 4)
    # page = block: one symbol per full block; the partial block has no full page
    assert page_symbols(r, 4, 4) == [7, 0]
    r11 = Request(0, 11, 1, hash_ids=[7, 0, 2])
    assert page_symbols(r11, 2, 4) == [14, 15, 0, 1, 4]  # unaligned tail token: no symbol
    short = Request(0, 1, 1, hash_ids=[5])
    assert page_symbols(short, 2, 4) == []
    assert page_symbols(short, 1, 4) == [20]


def test_page_symbols_token_ids() -> None:
    r = Request(0, 5, 1, token_ids=[1, 2, 3, 4, 5])
    assert page_symbols(r, 1) == [1, 2, 3, 4, 5]
    assert page_symbols(r, 2) == [(1, 2), (3, 4)]
    assert page_symbols(r, 3, block_size=512) == [(1, 2, 3)]  # any page size works
    assert page_symbols(r, 8) == []


def test_page_size_must_divide_block_size() -> None:
    r = Request(0, 1024, 1, hash_ids=[0, 1])
    with pytest.raises(ValueError, match="page_size 48 does not divide the trace's block_size"):
        page_symbols(r, 48, 512)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        page_symbols(r, 0, 512)
    assert check_page_size(64, 512) == 8
    with pytest.raises(ValueError):
        page_symbols(Request(0, 1, 1), 1)


def test_symbols_are_fresh_lists() -> None:
    r = Request(0, 8, 1, hash_ids=[1, 2])
    symbols: list[Any] = page_symbols(r, 4, 4)
    symbols.append(99)
    assert r.hash_ids == [1, 2]
    t = Request(0, 2, 1, token_ids=[1, 2])
    token_symbols: list[Any] = page_symbols(t, 1)
    token_symbols.append(3)
    token_ids_of(t).append(3)
    assert t.token_ids == [1, 2]


@st.composite
def hash_pair(draw: st.DrawFn) -> tuple[Request, Request, int, int]:
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    page_size = draw(st.sampled_from([p for p in BLOCK_SIZES if block_size % p == 0]))
    reqs = []
    shared = draw(st.lists(st.integers(0, 3), max_size=4))
    for _ in range(2):
        own = draw(st.lists(st.integers(0, 3), max_size=4))
        ids = (shared + own) or [0]
        last = draw(st.integers(1, block_size))
        reqs.append(Request(0, (len(ids) - 1) * block_size + last, 1, hash_ids=ids))
    return reqs[0], reqs[1], page_size, block_size


@settings(max_examples=300, deadline=None)
@given(hash_pair())
def test_equal_symbol_prefix_iff_equal_token_prefix(
    case: tuple[Request, Request, int, int],
) -> None:
    a, b, page_size, block_size = case
    sa, sb = page_symbols(a, page_size, block_size), page_symbols(b, page_size, block_size)
    ta, tb = token_ids_of(a, block_size), token_ids_of(b, block_size)
    assert len(sa) == a.input_length // page_size
    assert all(isinstance(s, int) and s >= 0 for s in sa)
    for k in range(min(len(sa), len(sb)) + 1):
        assert (sa[:k] == sb[:k]) == (ta[: k * page_size] == tb[: k * page_size])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=1, max_size=12),
    st.lists(st.integers(0, 2), min_size=1, max_size=12),
    st.integers(1, 5),
)
def test_token_trace_symbols(ta: list[int], tb: list[int], page_size: int) -> None:
    a = Request(0, len(ta), 1, token_ids=ta)
    b = Request(0, len(tb), 1, token_ids=tb)
    sa, sb = page_symbols(a, page_size), page_symbols(b, page_size)
    assert len(sa) == len(ta) // page_size
    for k in range(min(len(sa), len(sb)) + 1):
        assert (sa[:k] == sb[:k]) == (ta[: k * page_size] == tb[: k * page_size])
