"""`RequestColumns`: a trace held column by column reads back exactly as the requests put in."""

from __future__ import annotations

import sys

import pytest

from tests.traces.trace_helpers import HEADER, WriteLines, req
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import iter_requests, read_trace
from traces.schema import Request
from traces.store import RequestColumns

BIG = 2**63 // 512 - 1  # the largest hash id the validator accepts at block size 512

REQUESTS = [
    Request(0.0, 10, 2, hash_ids=[1, 2, BIG]),
    Request(1.5, 3, 1, hash_ids=[]),
    Request(2.0, 4, 7, token_ids=[9, 8, 7, 6], session_id="s1", turn=0),
    Request(2.0, 600, 1, hash_ids=[5, 6], session_id="s1", turn=1, think_time_ms=250.5),
    Request(3.25, 5, 3, hash_ids=[7], priority=-2, rid="r-4"),
    Request(4.0, 1, 1, token_ids=[0]),
]


def test_reads_back_every_field() -> None:
    cols = RequestColumns(REQUESTS)
    assert len(cols) == len(REQUESTS)
    assert list(cols) == REQUESTS
    assert [cols[i] for i in range(len(REQUESTS))] == REQUESTS
    assert cols == REQUESTS and REQUESTS == cols  # noqa: SIM300 (the reflected comparison)
    assert cols[-1] == REQUESTS[-1] and cols[-len(REQUESTS)] == REQUESTS[0]
    assert cols[1:4] == REQUESTS[1:4] and cols[::-2] == REQUESTS[::-2]
    # a field set late (session, priority) reads None for the requests before it
    assert cols[0].session_id is None and cols[3].session_id == "s1"
    assert cols[3].think_time_ms == 250.5 and cols[4].priority == -2 and cols[4].rid == "r-4"
    # exactly one id kind per request, as read
    assert cols[1].hash_ids == [] and cols[1].token_ids is None
    assert cols[2].hash_ids is None and cols[2].token_ids == [9, 8, 7, 6]


def test_index_errors_and_inequality() -> None:
    cols = RequestColumns(REQUESTS)
    for bad in (len(REQUESTS), -len(REQUESTS) - 1):
        with pytest.raises(IndexError):
            cols[bad]
    assert cols != REQUESTS[:-1]
    changed = list(REQUESTS)
    changed[2] = Request(2.0, 4, 7, token_ids=[9, 8, 7, 5], session_id="s1", turn=0)
    assert cols != changed
    assert RequestColumns() == [] and len(RequestColumns()) == 0


def test_a_read_request_is_a_copy() -> None:
    cols = RequestColumns(REQUESTS)
    r = cols[0]
    assert r.hash_ids is not None
    r.hash_ids.append(99)
    r.input_length = 1
    assert cols[0] == REQUESTS[0]


def test_session_ids_are_shared_between_turns() -> None:
    a, b = "".join(["sess", "ion"]), "".join(["sessi", "on"])
    assert a is not b
    cols = RequestColumns([Request(0.0, 1, 1, hash_ids=[0], session_id=s) for s in (a, b)])
    assert cols[0].session_id is cols[1].session_id


def test_read_trace_holds_columns(write_lines: WriteLines) -> None:
    rows = [
        req(0, 8, 2, hash_ids=[0, 1]),
        req(5, 4, 1, hash_ids=[2], session_id="a", turn=0, think_time_ms=3),
        req(6, 4, 1, hash_ids=[2], session_id="a", turn=1),
    ]
    path = write_lines(HEADER, *rows)
    trace = read_trace(path)
    assert isinstance(trace.requests, RequestColumns)
    assert list(trace) == list(iter_requests(path))
    assert trace[0:2] == list(iter_requests(path))[0:2]


def test_smaller_than_request_objects() -> None:
    """The point of the class: the bundled trace in columns takes well under half the memory of
    its `Request` objects (each with its list of ids)."""
    objects = list(iter_requests(MOONCAKE_CONVERSATION))
    cols = RequestColumns(objects)
    as_objects = sum(
        sys.getsizeof(r) + sys.getsizeof(r.hash_ids) + sum(map(sys.getsizeof, r.hash_ids or ()))
        for r in objects
    )
    assert cols.nbytes() < as_objects / 3
    assert cols == objects
