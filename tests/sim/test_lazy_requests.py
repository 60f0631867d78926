"""Requests built when they arrive and let go when they finish: the same run as a list of
requests built up front, with only the live requests in memory."""

from __future__ import annotations

import gc
from itertools import islice
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from hicache.config import load_config
from hicache.lifecycle import PagedTrace, page_keys, paged_requests
from sim.engine import Engine, SimReqSource, run_simulation
from sim.scheduler import SimReq
from tests.sim.harness import engine
from tests.sim.harness import req as harness_req
from traces.bundled import MOONCAKE_CONVERSATION
from traces.io import read_trace
from traces.schema import Request, Trace

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"


def _conversation(n: int) -> Trace:
    trace = read_trace(MOONCAKE_CONVERSATION)
    return Trace(list(islice(trace, n)), trace.header)


@pytest.mark.parametrize("rate, limit", [(1.0, 0), (2.5, 7), (0.25, 10_000)])
def test_paged_trace_reads_as_paged_requests(rate: float, limit: int) -> None:
    trace = read_trace(DATA / "synthetic" / "multiturn.jsonl")
    want = paged_requests(trace, 16, rate_scale=rate, limit=limit, keys=False)
    got = PagedTrace(trace, 16, rate_scale=rate, limit=limit)
    assert len(got) == len(want) and list(got) == want
    assert list(got.arrivals) == [r.arrival_s for r in want]
    assert got[-1] == want[-1] and got[1:4] == want[1:4]
    with pytest.raises(IndexError):
        got[len(want)]


def _frames(e: Engine) -> dict[str, Any]:
    e.run()
    return e.frames()


def _pair(trace: Trace, page: int, device: int, rate: float) -> tuple[Any, Any]:
    """The frames of one run over requests built up front and one over requests built on
    arrival (a host pool eight times the device pool)."""
    keys = page_keys(trace, page)
    kw: dict[str, Any] = dict(page_size=page, device_tokens=device, host_tokens=8 * device)
    eager = [SimReq(r, keys=keys) for r in paged_requests(trace, page, rate_scale=rate, keys=False)]
    lazy = SimReqSource(PagedTrace(trace, page, rate_scale=rate), keys)
    return _frames(engine(eager, **kw)), _frames(engine(lazy, **kw))


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])


def test_requests_built_on_arrival_run_as_a_list() -> None:
    a, b = _pair(read_trace(DATA / "synthetic" / "multiturn.jsonl"), 16, 4000, 1.0)
    req = a["requests"]
    assert len(req) == 160 and (req["finish_s"] >= 0).all()
    # the pools are tight: pages are written and loaded back
    assert set(a["transfers"]["direction"]) == {"d2h", "h2d"} and req["host_hit_tokens"].sum() > 0
    _assert_same(a, b)


def test_arrivals_out_of_file_order() -> None:
    """A trace built in code need not be sorted: arrivals still come in (time, rid) order, ties
    in rid order, as the list's sort gives."""
    base = list(_conversation(60))
    stamps = [float((7 * i) % 13) * 400.0 for i in range(len(base))]  # shuffled, with ties
    reqs = [
        Request(t, r.input_length, r.output_length, hash_ids=r.hash_ids)
        for t, r in zip(stamps, base, strict=True)
    ]
    trace = Trace(reqs, read_trace(MOONCAKE_CONVERSATION).header)
    a, b = _pair(trace, 64, 64 * 1500, 4.0)
    assert not a["requests"]["arrival_s"].is_monotonic_increasing
    _assert_same(a, b)


def test_frames_can_take_the_rows() -> None:
    keys = page_keys(_conversation(80), 64)
    src = SimReqSource(PagedTrace(_conversation(80), 64, rate_scale=4), keys)
    e = engine(src, page_size=64)
    e.run()
    kept = e.frames()
    taken = e.frames(take=True)
    _assert_same(kept, taken)
    assert len(e.recorder.requests) == 0 and len(e.recorder.transfers) == 0
    assert len(kept["requests"]) == 80


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_a_run_holds_no_finished_request(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Memory follows the live requests: when the tables are built, no request of the run is
    still in memory (none held by the caller's setup, the arrival plan or the scheduler; nor
    by an engine built before, which a reference leaked in compiled code once kept)."""
    engine([harness_req(0, 0.0, 64, 4)])  # an engine dropped unrun: it must go
    alive: list[int] = []
    frames = Engine.frames

    def count_then_build(self: Engine, **kw: Any) -> dict[str, Any]:
        gc.collect()
        alive.append(sum(1 for o in gc.get_objects() if type(o) is SimReq))
        return frames(self, **kw)

    monkeypatch.setattr(Engine, "frames", count_then_build)
    cfg = load_config(
        None, ["workload.max_requests=200", "workload.rate_scale=4", f"sglang.version={version}"]
    )
    summary = run_simulation(cfg, read_trace(MOONCAKE_CONVERSATION), None, progress=False)
    assert summary["requests"] == 200
    assert alive == [0]


@pytest.mark.parametrize(
    "sets",
    [[], ["sglang.version=0.5.14"], ["storage.backend=mooncake"], ["cluster.instances=2"],
     ["pd.enabled=true"]],
)  # fmt: skip
def test_no_engine_outlives_its_run(sets: list[str]) -> None:
    """A finished run leaves nothing behind: its engine, instances and caches go (compiled,
    a scheduler loop left suspended and the schedulers' and links' callbacks once kept every
    run's engine alive for ever, and with it every PD run's requests)."""
    from sim.instance import Instance

    def alive() -> tuple[int, int, int]:
        # counted against what was alive before (engines other tests built by hand and
        # never ran may still be about in this process)
        gc.collect()
        objs = gc.get_objects()
        return (sum(type(o) is Engine for o in objs), sum(type(o) is Instance for o in objs),
                sum(type(o) is SimReq for o in objs))  # fmt: skip

    cfg = load_config(None, ["workload.max_requests=40", *sets])
    trace = read_trace(MOONCAKE_CONVERSATION)
    before = alive()
    for _ in range(2):
        run_simulation(cfg, trace, None, progress=False)
    assert alive() == before
