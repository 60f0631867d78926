"""The one cost rule of a HiCache copy op (hicache/latency.py: op_charges, op_time, count_runs)
and the layer pipeline, pinned on hand-computed ops; the simulator's link jobs
(sim/controller.py) charged exactly by it; and the compute roofline (prefill / decode time) on a
toy model whose every term is computable by hand."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from hicache.latency import (
    LinkParams,
    OpCharges,
    charged_time,
    count_runs,
    layer_pipeline_end,
    op_charges,
    op_time,
    transfer_time,
)
from hicache.policy import PageAllocator
from hicache.policy.allocator import device_pool
from hicache.policy.controller import LoadBatch, WriteOp
from sim.controller import SimController
from sim.link import DuplexLink
from sim.metrics import Recorder
from sim.scheduler import SimReq
from tests.sim.harness import PAGE_BYTES, costs, engine, record_calls, req

# alpha 10 us, gamma 2 us, 1 GB/s
LINK = LinkParams(alpha_s=1e-5, beta_Bps=1e9, gamma_s=2e-6, eta=0.5)


# --------------------------------------------------------------------------- the rule --


def test_write_pays_alpha_once_and_gamma_per_run_per_layer() -> None:
    assert op_charges("write", 1_000_000, 3, 4) == OpCharges(1, 12, 1_000_000)
    # 10 us + 12 * 2 us + 1 MB / 1 GB/s = 10 + 24 + 1000 us
    assert op_time(LINK, op_charges("write", 1_000_000, 3, 4)) == pytest.approx(1.034e-3)


def test_load_pays_alpha_and_gamma_per_layer() -> None:
    assert op_charges("load", 1_000_000, 3, 4) == OpCharges(4, 12, 1_000_000)
    # 4 * 10 us + 12 * 2 us + 1000 us
    assert op_time(LINK, op_charges("load", 1_000_000, 3, 4)) == pytest.approx(1.064e-3)
    # one layer: a load costs what a write costs
    assert op_charges("load", 5, 2, 1) == op_charges("write", 5, 2, 1) == OpCharges(1, 2, 5)


def test_op_time_ignores_eta_and_unknown_kinds_fail() -> None:
    # the uncoupled time: the link integrates eta itself
    assert op_time(LINK, OpCharges(0, 0, 1000)) == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="unknown op kind 'read'; expected one of write, load"):
        op_charges("read", 1, 1, 1)


def test_charged_time_is_elementwise_for_a_fit() -> None:
    got = charged_time(np.array([1e-3, 2e-3]), 5e-4, 1e6, OpCharges(2, 3, 1000))
    # 2 * alpha + 3 * 0.5 ms + 1 ms
    assert got == pytest.approx([0.0045, 0.0065])


def test_transfer_time_couples_the_bandwidth_only() -> None:
    # 10 us + 3 * 2 us + 1 MB at 0.5 GB/s
    assert transfer_time(LINK, 1_000_000, 3, coupled=True) == pytest.approx(2.016e-3)
    assert transfer_time(LINK, 1_000_000, 3) == pytest.approx(1.016e-3)


@pytest.mark.parametrize(
    ("device", "host", "runs"),
    [
        ([], [], 0),
        ([4], [9], 1),
        ([5, 6, 7], [1, 2, 3], 1),
        ([0, 1, 2, 5, 6], [0, 1, 2, 3, 4], 2),  # device jumps 2 -> 5
        ([0, 1, 2], [10, 11, 13], 2),  # host jumps 11 -> 13
        ([3, 2, 1], [0, 1, 2], 3),  # descending pages are separate runs
        ([0, 1, 2, 3], [5, 6, 0, 1], 2),
        ([0, 2, 4], [0, 2, 4], 3),
    ],
)
def test_count_runs(device: list[int], host: list[int], runs: int) -> None:
    assert count_runs(device, host) == runs


def test_count_runs_needs_paired_lists() -> None:
    with pytest.raises(ValueError, match="2 device vs 1 host"):
        count_runs([1, 2], [1])


# ----------------------------------------------------------------------- layer pipeline --


def loop_reference(start: float, total: float, layers: int, ls: float, le: float) -> float:
    c, f = total / layers, start
    for i in range(1, layers + 1):
        f = max(f, ls + i * (le - ls) / layers) + c
    return f


@pytest.mark.parametrize(
    ("args", "end"),
    [
        # compute-bound: the load (0-1) is done before the batch even starts -> 10 + 4
        ((10.0, 4.0, 4, 0.0, 1.0), 14.0),
        # the first layer waits: load 0-2 (0.5 per layer), compute 4 (1 per layer) from 0:
        # layer 1 starts at 0.5, the rest never waits -> 0.5 + 4
        ((0.0, 4.0, 4, 0.0, 2.0), 4.5),
        # load-bound: load 0-40 (10 per layer), compute 1 per layer: the last layer starts when
        # the load ends -> 40 + 1
        ((0.0, 4.0, 4, 0.0, 40.0), 41.0),
        # the load started before the batch: 2-6 with the batch at 5, compute 2 (0.5/layer):
        # layer 4 loaded at 6 -> 6.5 (the batch alone would end at 7) -> 7
        ((5.0, 2.0, 4, 2.0, 6.0), 7.0),
        ((5.0, 0.4, 4, 2.0, 6.0), 6.1),
    ],
)
def test_layer_pipeline_end_by_hand(
    args: tuple[float, float, int, float, float], end: float
) -> None:
    assert layer_pipeline_end(*args) == pytest.approx(end)
    assert loop_reference(*args) == pytest.approx(end)


def test_layer_pipeline_end_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        layer_pipeline_end(0.0, 1.0, 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="compute_total must be >= 0"):
        layer_pipeline_end(0.0, -1.0, 4, 0.0, 1.0)
    with pytest.raises(ValueError, match="before load_start"):
        layer_pipeline_end(0.0, 1.0, 4, 1.0, 0.5)
    assert layer_pipeline_end(0.0, 0.0, 1, 0.0, 0.0) == 0.0  # the edges are allowed


# ------------------------------------------------------------ Costs and the controller --


def test_costs_pick_the_link_by_kind_and_the_layers_from_the_model() -> None:
    # write: d2h (alpha 1 ms, gamma 0.1 ms, 1 ms/page); load: h2d (alpha 2 ms, gamma 0.2 ms,
    # 1 ms/page); 4 layers. 5 pages in 2 runs:
    #   write: 1 + 2 * 4 * 0.1 + 5 = 6.8 ms;  load: 4 * 2 + 2 * 4 * 0.2 + 5 = 14.6 ms
    c = costs(alpha_d2h=1e-3, gamma_d2h=1e-4, alpha_h2d=2e-3, gamma_h2d=2e-4)
    assert c.op_time("write", 5 * PAGE_BYTES, 2) == pytest.approx(6.8e-3)
    assert c.op_time("load", 5 * PAGE_BYTES, 2) == pytest.approx(14.6e-3)


def test_costs_decode_coefficients() -> None:
    c = costs(decode_step=0.01, decode_per_kv_token=1e-5)
    assert c.decode_coeffs(8) == pytest.approx((0.01, 1e-5))
    assert c.prefill_time([(100, 50), (20, 0)]) == pytest.approx(120 * 1e-4)


def controller(c_alpha: float = 1e-3) -> tuple[simpy.Environment, SimController, Recorder]:
    env = simpy.Environment()
    dev = device_pool(64, 1)
    host = PageAllocator(64, 1, "host")
    c = costs(alpha_d2h=c_alpha, gamma_d2h=1e-4, alpha_h2d=2e-3, gamma_h2d=2e-4)
    rec = Recorder()
    link = DuplexLink(env, eta={"d2h": c.eta_d2h, "h2d": c.eta_h2d})
    return env, SimController(env, dev, host, link, c, rec), rec


def test_controller_charges_a_write_by_the_rule() -> None:
    # device pages 0-2, 5-6 to fresh host pages 0-4: 2 runs, 5 pages
    # -> 1 ms + 2 * 4 * 0.1 ms + 5 ms = 6.8 ms
    env, ctrl, rec = controller()
    assert ctrl.write([0, 1, 2, 5, 6], node_id=7) == [0, 1, 2, 3, 4]
    env.run()
    (row,) = rec.transfers
    assert (row.direction, row.kind, row.bytes, row.pages, row.runs) == (
        "d2h", "write", 5000, 5, 2)  # fmt: skip
    assert (row.start_s, row.end_s) == pytest.approx((0.0, 6.8e-3))
    assert ctrl.pop_completed_writes() == [7]


def test_controller_merges_a_batch_of_loads_into_one_layerwise_job() -> None:
    # loads of host pages [10, 11] and [13] get device pages 0-1 and 2: merged 3 pages, host
    # jumps 11 -> 13: 2 runs -> 4 * 2 ms + 2 * 4 * 0.2 ms + 3 ms = 12.6 ms
    env, ctrl, rec = controller()
    assert ctrl.launch_loads() is None  # nothing queued
    assert ctrl.load([10, 11], node_id=1) == [0, 1]
    assert ctrl.load([13], node_id=2) == [2]
    job = ctrl.launch_loads()
    assert job is not None and job.work_s == pytest.approx(12.6e-3)
    assert (job.pages, job.runs, job.nbytes) == (3, 2, 3000)
    env.run()
    assert job.end == pytest.approx(12.6e-3)
    assert [(r.kind, r.runs) for r in rec.transfers] == [("load", 2)]
    assert ctrl.pop_completed_loads() == [[1, 2]]


def test_controller_stall_is_taken_once() -> None:
    # a blocking wait on two 1-page writes (1 ms + 1 run * 4 layers * 0.1 ms + 1 ms = 2.4 ms
    # each, one after the other) holds the scheduler until 4.8 ms, and is taken once
    _, ctrl, _ = controller()
    ctrl.write([0], 1)
    ctrl.write([9], 2)
    assert ctrl.wait_writes() == [1, 2]
    assert ctrl.take_stall() == pytest.approx(4.8e-3)
    assert ctrl.take_stall() == 0.0


def test_engine_link_jobs_are_charged_exactly_the_rule() -> None:
    """A tiny run with every copy kind (the layer-pipeline scenario: A written through, pushed
    to host by B, reloaded by C), with alpha and gamma on both directions and eta 1 so a job's
    duration is its uncoupled time. Each recorded transfer lasts op_time of its own pages, with
    runs recomputed from the page ids the controller was given."""
    c = costs(alpha_d2h=1e-4, gamma_d2h=1e-5, alpha_h2d=2e-4, gamma_h2d=2e-5)
    a = list(range(64))
    reqs: list[SimReq] = [
        req(0, 0.0, 64, 1, symbols=a),
        req(1, 0.5, 150, 1),
        req(2, 1.0, 100, 1, symbols=(*a, *range(2000, 2036))),
    ]
    e = engine(reqs, page_size=1, device_tokens=200, host_tokens=800, costs=c)
    writes: list[WriteOp] = record_calls(e.ctrl, "_issue_write")
    loads: list[LoadBatch] = record_calls(e.ctrl, "_issue_load")
    e.run()
    e.env.run()  # let the copies issued by the last finish complete too
    # A's first write by hand: 64 pages, 1 run -> 0.1 ms + 4 * 0.01 ms + 64 ms
    assert writes[0].device_pages == list(range(64))
    first = e.recorder.transfers[0]
    assert first.end_s - first.start_s == pytest.approx(0.06414)
    assert len(loads) == 1 and len(writes) >= 3
    expected: dict[str, list[tuple[int, int, float]]] = {"d2h": [], "h2d": []}
    for op in writes:
        runs = count_runs(op.device_pages, op.host_pages)
        n = len(op.device_pages)
        t = 1e-4 + runs * 4 * 1e-5 + n * PAGE_BYTES / 1e6
        expected["d2h"].append((n, runs, t))
    for batch in loads:
        dev = [p for op in batch.ops for p in op.device_pages]
        host = [p for op in batch.ops for p in op.host_pages]
        runs = count_runs(dev, host)
        t = 4 * 2e-4 + runs * 4 * 2e-5 + len(dev) * PAGE_BYTES / 1e6
        expected["h2d"].append((len(dev), runs, t))
    for direction in ("d2h", "h2d"):
        got = [
            (t.pages, t.runs, t.end_s - t.start_s)
            for t in e.recorder.transfers
            if t.direction == direction
        ]
        want = [(n, r, pytest.approx(t)) for n, r, t in expected[direction]]
        assert got == want  # type: ignore[comparison-overlap]
