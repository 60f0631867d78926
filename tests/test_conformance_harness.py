"""The conformance harness (conformance/) without SGLang: our core on both sides.

Proves both directions of the comparison: identical sides report no mismatch over random
sequences of every kind of op, and a side that differs by one lock_ref, one host copy, one
clock tick, one free-list order or one wrong return value is caught at that very step. The same
for the L3 tier: identical sides agree over random L3 sequences, and one extra host pin, one
altered credit, one token of prefetch occupancy, one page of L3 content or one wrong check
result is caught at that step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import import_stubs
from conformance.driver import Driver, Side, snapshot
from conformance.engine import minimise, run_sequence, sequence_rng
from conformance.known_differences import KNOWN_DIFFERENCES, by_id, explain
from conformance.ops import (
    L1L2_OPS,
    L3_OPS,
    PREFETCH_POLICIES,
    STRATEGIES,
    Config,
    Op,
    generate,
    make_config,
    make_l3_config,
)
from conformance.ours_side import OursSide
from conformance.run import main

NAMES = ("a", "b")
COMBOS = [
    ("write_through", 1, "lru"),
    ("write_through", 64, "mru"),
    ("write_through_selective", 4, "lfu"),
    ("write_through_selective", 1, "slru"),
    ("write_back", 64, "fifo"),
    ("write_back", 4, "priority"),
    ("write_back", 1, "filo"),
]


def _sequence(combo: tuple[str, int, str], index: int, steps: int = 80) -> tuple[Config, list[Op]]:
    rng = sequence_rng(1, "/".join(map(str, combo)), index)
    cfg = make_config(rng, *combo)
    return cfg, generate(rng, cfg, steps)


@pytest.mark.parametrize("combo", COMBOS)
def test_identical_sides_never_mismatch(combo: tuple[str, int, str]) -> None:
    for index in range(3):
        cfg, ops = _sequence(combo, index)
        out = run_sequence(cfg, ops, OursSide, OursSide, NAMES)
        assert out.mismatch is None, out.mismatch
        assert out.steps == len(ops) and not out.agreed_errors and not out.b_flags


def test_sequences_exercise_every_op_kind() -> None:
    kinds = {op.kind for combo in COMBOS for i in range(3) for op in _sequence(combo, i)[1]}
    assert kinds == {spec.kind for spec in L1L2_OPS}


def _first(side: Side, pred: Any) -> Any:
    stack = list(side.children(side.root()))
    while stack:
        n = stack.pop(0)
        if pred(n):
            return n
        stack += side.children(n)
    return None


def _tampered_run(combo: tuple[str, int, str], tamper: Any) -> Any:
    """Run sequences until ``tamper(side_b)`` manages to change something; that run's mismatch."""
    for index in range(10):
        cfg, ops = _sequence(combo, index)
        done: list[int] = []

        def hook(step: int, side: Side, done: list[int] = done) -> None:
            if not done and tamper(side):
                done.append(step)

        out = run_sequence(cfg, ops, OursSide, OursSide, NAMES, tamper=hook)
        if done:
            assert out.mismatch is not None and out.mismatch.step == done[0]
            return out.mismatch
    raise AssertionError("the tamper never applied")


def _extra_lock(side: Side) -> bool:
    node = _first(side, lambda n: True)
    if node is None:
        return False
    node.lock_ref += 1
    return True


def _drop_host_value(side: Side) -> bool:
    node = _first(side, lambda n: n.host_value is not None and n.value is not None)
    if node is None:
        return False
    node.host_value = None
    return True


def _clock_skew(side: Side) -> bool:
    node = _first(side, lambda n: True)
    if node is None:
        return False
    node.last_access_time += 1
    return True


def _swap_free_pages(side: Side) -> bool:
    """Take the two pages at the head of the device free list and give them back reversed."""
    assert isinstance(side, OursSide)
    pages = side.device.alloc_pages(2)
    if pages is None:
        return False
    side.device.free([pages[1], pages[0]])
    return True


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (_extra_lock, "lock_ref"),
        (_drop_host_value, "host_value"),
        (_clock_skew, "last_access"),
        (_swap_free_pages, "device_free"),
    ],
)
def test_a_tampered_side_is_caught_at_that_step(tamper: Any, field: str) -> None:
    mismatch = _tampered_run(("write_through", 1, "lru"), tamper)
    assert any(field in line for line in mismatch.diffs), mismatch.diffs
    assert mismatch.explained_by is None


class _EvictOffByOne(OursSide):
    """A side whose evict reports one token too many."""

    def evict(self, num_tokens: int) -> int:
        return super().evict(num_tokens) + 1


def test_a_wrong_return_value_is_caught_and_minimised() -> None:
    cfg, ops = _sequence(("write_back", 4, "lru"), 0)
    out = run_sequence(cfg, ops, OursSide, _EvictOffByOne, NAMES)
    assert out.mismatch is not None
    assert any(line.startswith("result.") for line in out.mismatch.diffs)
    small = minimise(cfg, ops, OursSide, _EvictOffByOne, NAMES, budget_s=5)
    assert len(small) < len(ops) and small[-1].kind in ("evict", "serve")
    assert run_sequence(cfg, small, OursSide, _EvictOffByOne, NAMES).mismatch is not None


def test_known_differences_explain_only_through_their_flags() -> None:
    assert explain([]) is None and explain(["host_double_free"]) is None
    kd = explain(["load_back_chain_detached", "device_double_free"])
    assert kd is not None and kd.id == "KD-LOADBACK-PIN"
    assert by_id("KD-WB-DEMOTE-DETACHED").triggers == ("device_double_free",)
    ids = [kd.id for kd in KNOWN_DIFFERENCES]
    assert len(ids) == len(set(ids)) and all(
        kd.what and kd.why and kd.treatment for kd in KNOWN_DIFFERENCES
    )


def test_cli_self_test_writes_a_report(tmp_path: Path) -> None:
    argv = ["--self-test", "--sequences", "1", "--steps", "15", "--jobs", "1"]
    argv += ["--tiers", "l1l2", "--policies", "write_back", "--out", str(tmp_path)]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "conformance.json").read_text())
    assert doc["totals"]["sequences"] == 3 * len(STRATEGIES)
    assert doc["totals"]["mismatches"] == 0 and doc["known_differences"]
    assert list(doc["totals_by_tier"]) == ["l1l2"]


def test_cli_self_test_runs_the_l3_tier(tmp_path: Path) -> None:
    argv = ["--self-test", "--sequences", "1", "--steps", "10", "--jobs", "1", "--out"]
    argv += [str(tmp_path), "--l3-sequences", "2", "--l3-steps", "40"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "conformance.json").read_text())
    l3 = doc["totals_by_tier"]["l3"]
    assert l3["sequences"] == 2 * 3 * 2 * len(PREFETCH_POLICIES) and l3["mismatches"] == 0
    assert l3["coverage"]["prefetch_issued"] > 0 and l3["coverage"]["backup_ops"] > 0
    assert doc["totals"]["sequences"] == l3["sequences"] + 3 * 3 * len(STRATEGIES)
    assert any(kd["id"].startswith("KD-L3-") for kd in doc["known_differences"])


def test_import_stand_ins_are_inert() -> None:
    module = import_stubs.StubModule("fake")
    cls = module.SomeController
    assert isinstance(cls, type) and not isinstance(object(), cls)
    assert module.SomeController is cls  # stable: isinstance checks keep working

    def f() -> int:
        return 1

    assert module.jit(f) is f  # a decorator leaves the function alone
    assert not module.anything and list(module.anything) == []


# ------------------------------------------------------------------------------- L3 tier --
L3_COMBOS = [
    ("write_through", 1, "best_effort"),
    ("write_through", 4, "timeout"),
    ("write_through_selective", 1, "wait_complete"),
    ("write_through_selective", 4, "best_effort"),
    ("write_back", 1, "timeout"),
    ("write_back", 4, "wait_complete"),
]


def _l3_sequence(
    combo: tuple[str, int, str], index: int, steps: int = 100
) -> tuple[Config, list[Op]]:
    rng = sequence_rng(1, "L3/" + "/".join(map(str, combo)), index)
    cfg = make_l3_config(rng, *combo)
    return cfg, generate(rng, cfg, steps)


@pytest.mark.parametrize("combo", L3_COMBOS)
def test_l3_identical_sides_never_mismatch(combo: tuple[str, int, str]) -> None:
    issued = 0
    for index in range(4):
        cfg, ops = _l3_sequence(combo, index)
        assert cfg.l3 and cfg.prefetch_policy == combo[2]
        out = run_sequence(cfg, ops, OursSide, OursSide, NAMES)
        assert out.mismatch is None, out.mismatch
        assert out.steps == len(ops) and not out.agreed_errors and not out.b_flags
        issued += out.coverage["prefetch_issued"]
    assert issued > 0


def test_l3_sequences_exercise_every_op_kind() -> None:
    kinds = {op.kind for combo in L3_COMBOS for i in range(4) for op in _l3_sequence(combo, i)[1]}
    assert kinds == {spec.kind for spec in L3_OPS}


def test_l3_state_has_every_section() -> None:
    cfg, ops = _l3_sequence(("write_through", 4, "timeout"), 0)
    side = OursSide(cfg)
    driver = Driver(side)
    for op in ops:
        driver.step(op)
    state = snapshot(side)
    for section in ("l3_prefetch", "l3_backups", "l3_occupied", "l3_credits", "l3_queues"):
        assert section in state
    assert {"l3_root_host_ref", "l3_stages", "l3_content"} <= set(state)
    assert {"l3_prefetch", "l3_backups"} <= set(state["stale"])
    assert state["l3_content"], "the sequence wrote nothing to L3"


def _tampered_l3_run(tamper: Any) -> Any:
    """Run L3 sequences until ``tamper(side_b)`` changes something; that run's mismatch."""
    for combo in L3_COMBOS:
        for index in range(6):
            cfg, ops = _l3_sequence(combo, index)
            done: list[int] = []

            def hook(step: int, side: Side, done: list[int] = done) -> None:
                if not done and tamper(side):
                    done.append(step)

            out = run_sequence(cfg, ops, OursSide, OursSide, NAMES, tamper=hook)
            if done:
                assert out.mismatch is not None and out.mismatch.step == done[0]
                return out.mismatch
    raise AssertionError("the tamper never applied")


def _extra_anchor_pin(side: Side) -> bool:
    """One more host pin on the anchor of an ongoing prefetch (the root, or a node)."""
    assert isinstance(side, OursSide)
    for entry in side.cache.ongoing_prefetch.values():
        entry.anchor.protect_host()
        return True
    return False


def _altered_credit(side: Side) -> bool:
    assert isinstance(side, OursSide)
    credits = side.cache.prefetch_loaded_tokens_by_reqid
    for rid in credits:
        credits[rid] += side.page_size
        return True
    return False


def _altered_occupancy(side: Side) -> bool:
    assert isinstance(side, OursSide) and side.storage is not None
    if not side.cache.ongoing_prefetch:
        return False
    side.storage.prefetch_tokens_occupied += 1
    return True


def _extra_l3_page(side: Side) -> bool:
    """A page in L3 that nobody wrote (keyed after an existing one)."""
    assert isinstance(side, OursSide)
    stored = list(side.store._pages)
    if not stored:
        return False
    side.store.set(side.hasher.chain(stored[0], (99,) if side.page_size == 1 else ((99,) * 4,)))
    return True


def _dropped_release(side: Side) -> bool:
    """Host slots queued for release that vanish from the queue."""
    assert isinstance(side, OursSide) and side.storage is not None
    queue = side.storage.host_mem_release_queue
    if not queue:
        return False
    queue.pop()
    return True


@pytest.mark.parametrize(
    ("tamper", "field"),
    [
        (_extra_anchor_pin, "host_ref"),
        (_altered_credit, "l3_credits"),
        (_altered_occupancy, "l3_occupied"),
        (_extra_l3_page, "l3_content"),
        (_dropped_release, "l3_queues.release"),
    ],
)
def test_a_tampered_l3_side_is_caught_at_that_step(tamper: Any, field: str) -> None:
    mismatch = _tampered_l3_run(tamper)
    assert any(field in line for line in mismatch.diffs), mismatch.diffs
    assert mismatch.explained_by is None


class _NoWait(OursSide):
    """A side whose wait_complete policy lets a prefetch go at the first check (best_effort's
    rule): a stop-policy change to be caught."""

    def check_prefetch(self, rid: str, now: float) -> bool:
        entry = self.cache.ongoing_prefetch.get(rid)
        if entry is not None:
            entry.op.mark_terminate()
        return super().check_prefetch(rid, now)


def test_a_wrong_l3_decision_is_caught() -> None:
    for index in range(20):
        cfg, ops = _l3_sequence(("write_through", 1, "wait_complete"), index)
        out = run_sequence(cfg, ops, OursSide, _NoWait, NAMES)
        if out.mismatch is not None:
            assert out.mismatch.op.kind in ("check", "check_admit")
            assert any(line.startswith("result.done") for line in out.mismatch.diffs)
            return
    raise AssertionError("the changed stop policy was never caught")


def test_l3_known_differences_explain_only_through_their_flags() -> None:
    for flag, kd_id in [
        ("fetched_under_device_only", "KD-L3-D1"),
        ("l3_cross_namespace_hit", "KD-L3-EXTRA-KEY"),
        ("l3_extra_key_dropped", "KD-L3-EXTRA-KEY"),
        ("reset_backup_in_progress", "KD-L3-RESET-BACKUP"),
    ]:
        kd = explain([flag])
        assert kd is not None and kd.id == kd_id
    for kd_id in ("KD-L3-KEYS", "KD-L3-QUEUES", "KD-L3-RESET-IO", "KD-L3-RESET-STALE"):
        assert by_id(kd_id).triggers == ()
