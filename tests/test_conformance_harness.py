"""The conformance harness (conformance/) without SGLang: our core on both sides.

Proves both directions of the comparison: identical sides report no mismatch over random
sequences of every kind of op, and a side that differs by one lock_ref, one host copy, one
clock tick, one free-list order or one wrong return value is caught at that very step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import import_stubs
from conformance.driver import Side
from conformance.engine import minimise, run_sequence, sequence_rng
from conformance.known_differences import KNOWN_DIFFERENCES, by_id, explain
from conformance.ops import L1L2_OPS, STRATEGIES, Config, Op, generate, make_config
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
    assert main([*argv, "--policies", "write_back", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "conformance.json").read_text())
    assert doc["totals"]["sequences"] == 3 * len(STRATEGIES)
    assert doc["totals"]["mismatches"] == 0 and doc["known_differences"]


def test_import_stand_ins_are_inert() -> None:
    module = import_stubs.StubModule("fake")
    cls = module.SomeController
    assert isinstance(cls, type) and not isinstance(object(), cls)
    assert module.SomeController is cls  # stable: isinstance checks keep working

    def f() -> int:
        return 1

    assert module.jit(f) is f  # a decorator leaves the function alone
    assert not module.anything and list(module.anything) == []
