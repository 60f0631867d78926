"""Decode-side L3 at pre-allocation (sim.pd.decode_l3): a PD decode server with HiCache and a
store finds a prompt's pages in L3, promises them to the prefill side (which sends only the
rest), prefetches and loads them back before the first token; a restore that falls short
aborts the request, as SGLang 0.5.23's decode side does.

The scenario: a decode server of 8,192 device tokens and 16,384 host tokens (write_through)
shares one Mooncake store with the prefill server. Turn 1 (A, 6,144 tokens) is backed up to
host and store; two unrelated 6,400-token requests push it out of the decode device and host;
turn 2 (A's blocks + 512 tokens) finds nothing on the decode device or host and 96 stored
pages (6,144 tokens) in L3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.pd_summary import format_pd_summary
from hicache.config import load_config
from hicache.models import kv_bytes_per_token
from sim.engine import run_simulation
from sim.pd.run import build_pd_engine
from tests.test_pd import BASE, _trace

REQS = [(0, 6144, 64, 0), (100_000, 6400, 64, 100), (150_000, 6400, 64, 200),
        (200_000, 6656, 64, 0)]  # fmt: skip
DECODE = (
    "pd.decode_set=gpu.device_tokens=8192;cache.write_policy=write_through;cache.hicache_ratio=2"
)
STORE = ["sglang.version=0.5.23", "storage.backend=mooncake"]
RADIX = ["pd.decode_radix_cache=true", DECODE]
#: REQS with A's first 2,048 tokens alone in place of turn 2 (restored from L3 into the decode
#: device), then turn 2 (device prefix 2,048, L3 4,096 past it), then an unrelated request
REQS_L1 = [*REQS[:3], (200_000, 2048, 64, 0), (250_000, 6656, 64, 0), (400_000, 4096, 64, 300)]


def _run(trace: Any, extra: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    cfg = load_config(None, [*BASE, "pd.enabled=true", *STORE, *extra])
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    return cfg, frames, s


@pytest.mark.parametrize("policy", ["timeout", "wait_complete"])
def test_l3_prefix_is_promised_prefetched_and_restored(tmp_path: Path, policy: str) -> None:
    trace = _trace(tmp_path, REQS)
    cfg, off, _ = _run(trace, [f"storage.prefetch_policy={policy}"])
    cfg_on, on, s = _run(trace, [f"storage.prefetch_policy={policy}", *RADIX])
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    a, b = off["requests"], on["requests"]
    assert list(a["decode_storage_hit_tokens"]) == [0, 0, 0, 0]
    assert list(b["decode_storage_hit_tokens"]) == [0, 0, 0, 6144]
    assert list(b["decode_device_hit_tokens"]) == [0, 0, 0, 0]
    assert list(b["decode_host_hit_tokens"]) == [0, 0, 0, 0]
    assert not b["decode_restore_failed"].any()
    # the prefill side sends the 8 pages past the promise instead of 104
    assert a["transfer_bytes"].iloc[3] == 6656 * bpt
    assert b["transfer_bytes"].iloc[3] == 512 * bpt
    assert b["transfer_bytes_saved"].iloc[3] == 6144 * bpt
    # the promised pages come back over the decode server's PCIe in one load, after the
    # prefetch, and the first token waits for both the transfer and that load
    loads = on["decode"]["transfers"]
    loads = loads[loads["direction"] == "h2d"]
    assert list(loads["bytes"]) == [6144 * bpt]
    third = b.iloc[3]
    load_start, load_end = float(loads["start_s"].iloc[0]), float(loads["end_s"].iloc[0])
    assert load_start > third["prealloc_s"]  # the prefetch's read came first
    assert third["first_token_s"] == max(load_end, third["transfer_end_s"])
    assert third["finish_s"] > third["first_token_s"]
    dec = s["roles"]["decode"]
    assert dec["storage_hit_rate"] == pytest.approx(6144 / sum(r[1] for r in REQS), rel=1e-12)
    assert dec["restore_failed_requests"] == 0
    assert dec["decode_prefix_tokens"] == 6144
    assert dec["storage"]["read_busy_s"] > 0
    assert s["rejected_requests"] == 0
    _assert_nothing_held(cfg_on, tmp_path)


def test_best_effort_aborts_the_promised_request(tmp_path: Path) -> None:
    """best_effort ends a prefetch at its first poll (``_can_terminate_prefetch``), which on
    the decode side comes in the same iteration as the promise, before anything was read: the
    restore falls short of the promise and SGLang aborts the request (status 500). Its pages
    and locks are released: a later request runs, and no lock is left at the end."""
    trace = _trace(tmp_path, [*REQS, REQS_L1[-1]])
    cfg, frames, s = _run(trace, ["storage.prefetch_policy=best_effort", *RADIX])
    req = frames["requests"]
    assert list(req["decode_restore_failed"]) == [False, False, False, True, False]
    assert req["finish_s"].iloc[3] == -1 and req["first_token_s"].iloc[3] == -1
    assert req["finish_s"].iloc[4] > 0
    assert s["rejected_requests"] == 1
    assert s["roles"]["decode"]["restore_failed_requests"] == 1
    assert "fell short: 1 requests aborted" in format_pd_summary(s)
    _assert_nothing_held(cfg, tmp_path)


def _assert_nothing_held(cfg: Any, tmp_path: Path) -> None:
    """Run :data:`REQS_L1`: at the end the decode tree holds only the last request's 4,096
    tokens locked (0.5.23 under write_through keeps a finished request's pages locked until
    its backup ack, which the end of the run does not wait for), every page of the pool is
    free, cached or that lock's, and no prefetch is left: whatever a promise, a restore or an
    abort took was given back."""
    engine, _ = build_pd_engine(cfg, _trace(tmp_path, REQS_L1))
    engine.run()
    role = engine.decode[0]
    cache = role.cache
    assert cache.protected_size() == 4096
    free = cache.controller.device.available_size() + cache.evictable_size()
    assert free + cache.protected_size() == role.inst.device.capacity_tokens
    assert not cache.storage.ongoing_prefetch
    assert not role.transfer


def test_a_device_prefix_continued_in_l3(tmp_path: Path) -> None:
    """A prompt whose first 2,048 tokens are on the decode device and whose next 4,096 are
    only in the store: ``l1`` 2,048 + ``l3`` 4,096 promised; the restore's lock replaces the
    pre-allocation's on the device prefix. A 2,048-token prompt found whole in L3 is promised
    whole: the prefill side sends nothing (the decode side matches without the
    ``input_len - 1`` limit)."""
    cfg, frames, _ = _run(_trace(tmp_path, REQS_L1), RADIX)
    req = frames["requests"]
    assert list(req["decode_device_hit_tokens"]) == [0, 0, 0, 0, 2048, 0]
    assert list(req["decode_storage_hit_tokens"]) == [0, 0, 0, 2048, 4096, 0]
    assert req["transfer_bytes"].iloc[3] == 0
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    assert req["transfer_bytes"].iloc[4] == 512 * bpt
    assert (req["finish_s"] > 0).all()
    _assert_nothing_held(cfg, tmp_path)


def test_a_slow_store_past_the_timeout_aborts(tmp_path: Path) -> None:
    """The default timeout policy: 1 s + 0.25 s per 1,024 requested tokens (2.5 s for 6,144)
    from the first blocked poll. A store read at 0.1 GB/s needs 8 s for the 805 MB: the
    deadline ends the prefetch with part of it read, the restore falls short, the request is
    aborted then (not before the deadline)."""
    trace = _trace(tmp_path, REQS)
    cfg, frames, s = _run(trace, ["storage.read_gbps_override=0.1", *RADIX])
    third = frames["requests"].iloc[3]
    assert third["decode_restore_failed"]
    _assert_nothing_held(cfg, tmp_path)
    assert third["first_token_s"] == -1
    assert s["roles"]["decode"]["restore_failed_requests"] == 1
    # with wait_complete the same request waits for the whole read instead, and runs
    _, frames, _ = _run(trace, ["storage.read_gbps_override=0.1",
                                "storage.prefetch_policy=wait_complete", *RADIX])  # fmt: skip
    third = frames["requests"].iloc[3]
    assert not third["decode_restore_failed"]
    assert third["first_token_s"] - third["prealloc_s"] > 2.5


def test_no_promise_below_the_prefetch_threshold(tmp_path: Path) -> None:
    """A span shorter than ``prefetch_threshold`` is not queried: nothing is promised, the
    whole prompt is sent, exactly as without a store on the decode side."""
    trace = _trace(tmp_path, REQS)
    cfg, frames, s = _run(trace, ["storage.prefetch_threshold=8192", *RADIX])
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    req = frames["requests"]
    assert list(req["decode_storage_hit_tokens"]) == [0, 0, 0, 0]
    assert req["transfer_bytes"].iloc[3] == 6656 * bpt
    assert s["roles"]["decode"]["storage_hit_rate"] == 0.0


def record_holds(role: Any) -> list[float]:
    """The seconds each ``ctrl.hold`` of ``role``'s decode server blocks its scheduler, in
    order (the holds still take effect)."""
    held: list[float] = []
    hold = role.inst.ctrl.hold

    def record(seconds: float) -> None:
        held.append(seconds)
        hold(seconds)

    role.inst.ctrl.hold = record
    return held


def test_the_query_is_charged_to_the_decode_scheduler(tmp_path: Path) -> None:
    """Each pre-allocation's query is one synchronous ``batch_exists`` on the decode
    scheduler's thread: the backend's per-call and per-page time for the pages asked
    (Mooncake checks them all, hit or not), held against that scheduler."""
    trace = _trace(tmp_path, REQS)
    engine, _ = build_pd_engine(load_config(None, [*BASE, "pd.enabled=true", *STORE, *RADIX]),
                                trace)  # fmt: skip
    role = engine.decode[0]
    held = record_holds(role)
    engine.run()
    l3 = role.l3
    assert l3 is not None and l3.queries == 4
    assert not any(r.restore_failed for r in engine.records)
    spec, page_bytes = l3.storage.spec, l3.storage.page_bytes
    assert not spec.query_stops_at_miss and spec.query_call_s > 0
    pages = [n // 64 for _, n, _, _ in REQS]  # 96, 100, 100, 104: each prompt from the root
    assert held == [spec.query_call_s + p * spec.query_page_s for p in pages]
    assert held == [spec.stage_seconds("query", p, page_bytes) for p in pages]


def test_the_promised_gap_is_held_back_from_the_next_request(tmp_path: Path) -> None:
    """Turn 2 and an unrelated 2,048-token request arrive together. Turn 2's promised 6,144
    tokens get their pages only at its restore, so they are held back from the next request's
    budget (``_hicache_pending_restore_tokens``): the second request waits for turn 2 to
    finish. Without that reservation it would take the room, turn 2's restore could not
    allocate the gap and turn 2 would be aborted."""
    trace = _trace(tmp_path, [*REQS, (200_000, 2048, 64, 400)])
    _, frames, _ = _run(trace, RADIX)
    req = frames["requests"]
    turn2, other = req.iloc[3], req.iloc[4]
    assert turn2["prealloc_s"] == 200.0 and turn2["decode_storage_hit_tokens"] == 6144
    assert not turn2["decode_restore_failed"] and turn2["finish_s"] > 0
    assert other["prealloc_s"] > turn2["first_token_s"]


def test_no_restore_while_three_loads_are_in_flight(tmp_path: Path) -> None:
    """``has_free_load_back_slot``: with three load-backs unacknowledged on the decode server,
    turn 2's restore is not queued (its prefetch not even polled); it goes at the first poll
    after one of them is acknowledged."""
    from hicache.policy.controller import LoadBatch

    trace = _trace(tmp_path, REQS)
    cfg = load_config(None, [*BASE, "pd.enabled=true", *STORE, *RADIX])
    free_at = 200.5
    ends: dict[str, float] = {}
    for blocked in (False, True):
        engine, _ = build_pd_engine(cfg, trace)
        role = engine.decode[0]
        ctrl = role.cache.controller
        if blocked:
            held = [LoadBatch(-1 - i, []) for i in range(3)]

            def occupy(_e: Any, held: list[LoadBatch] = held, ctrl: Any = ctrl) -> None:
                ctrl.load_queue.extend(held)

            def release(_e: Any, held: list[LoadBatch] = held, role: Any = role) -> None:
                held[0].done = True
                role.poke()

            engine.env.timeout(199.0).callbacks.append(occupy)
            engine.env.timeout(free_at).callbacks.append(release)
        engine.run()
        loads = [row for row in role.inst.recorder.frames()["transfers"].itertuples()
                 if row.direction == "h2d"]  # fmt: skip
        assert len(loads) == 1
        ends[str(blocked)] = loads[0].start_s
    assert ends["False"] < 200.1
    assert ends["True"] >= free_at


def test_host_hits_load_after_the_pass_as_sglang(tmp_path: Path) -> None:
    """A promised host hit is loaded back in the transfer queue, after the pre-allocation pass
    (SGLang's ``pop_preallocated`` then ``pop_transferred``): no load is issued inside the pass,
    so every request of a pass is matched before any of them loads; the restore follows at
    once, in the same iteration."""
    reqs = [(0, 6144, 64, 0), (100_000, 6400, 64, 100), (200_000, 6656, 64, 0)]
    small = "pd.decode_set=gpu.device_tokens=8192;cache.write_policy=write_through"
    cfg = load_config(None, [*BASE, "pd.enabled=true", "sglang.version=0.5.23",
                             "pd.decode_radix_cache=true", small])  # fmt: skip
    engine, _ = build_pd_engine(cfg, _trace(tmp_path, reqs))
    role = engine.decode[0]
    ctrl = role.cache.controller
    seen: list[tuple[float, int, int, bool]] = []
    prealloc = role._pop_preallocated

    def watched() -> None:
        before = len(ctrl.load_queue)
        prealloc()
        pending = [r for r in role.transfer if r.restore is not None and not r.restore.started]
        if pending:
            seen.append((engine.env.now, len(ctrl.load_queue) - before, len(ctrl.pending_loads),
                         pending[0].restore.registered))  # fmt: skip

    role._pop_preallocated = watched  # type: ignore[method-assign]
    engine.run()
    assert seen == [(200.0, 0, 0, False)]  # one host-hit restore, nothing loaded in the pass
    third = engine.records[2]
    assert third.decode_host_hit == 6144 and third.restore is not None
    assert third.restore.started and third.restore_end_s > 200.0
