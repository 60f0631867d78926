"""The 0.5.23 core's insert hint (``TreeCore.insert(hint=...)``: a checkpoint's walk follows the
request's locked path without comparing keys) decides exactly what the plain walk from the root
does: the same requests, tree clock, match count, free lists and node states, on random timed
workloads with chunked prefill, retraction, write_back and L3 (``sim/differential.py``'s cases,
run under 0.5.23)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hicache.config import load_config
from sim.differential import random_case
from sim.engine import Engine, run_simulation
from tests.sim.harness import observe_run


def _tree(e: Engine) -> list[Any]:
    out = []
    for inst in e.instances:
        tree = inst.cache.tree  # type: ignore[union-attr]
        nodes = []
        stack = [tree.root]
        while stack:
            n = stack.pop()
            nodes.append((n.id, tuple(n.key), n.value, n.host_value, n.lock_ref, n.hit_count,
                          n.priority, n.last_access_time))  # fmt: skip
            stack.extend(n.children.values())
        out.append((sorted(nodes, key=lambda x: x[0]), tree.evictable_size,
                    tree.protected_size))  # fmt: skip
    return out


def _run(seed: int, hints: bool, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    case = random_case(seed)
    sets = [s for s in case.sets if not s.startswith(("sglang.version", "scheduler.chunked"))]
    sets += ["sglang.version=0.5.23", "scheduler.chunked_prefill_size=512"]
    got: dict[str, Any] = {}
    with mp.context() as m:
        init = Engine.__init__

        def switch(self: Engine, *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            for inst in self.instances:
                inst.sched.life.hints = hints  # type: ignore[union-attr]
            got["engine"] = self

        m.setattr(Engine, "__init__", switch)
        observe_run(m, got)
        got["summary"] = run_simulation(load_config(None, sets), case.trace, None,
                                        progress=False)  # fmt: skip
    got["summary"].pop("wall_time_s", None)
    got["tree"] = _tree(got.pop("engine"))
    return got


@pytest.mark.parametrize("seed", [2, 3, 10, 22, 32, 47, 54, 81])
def test_the_insert_hint_decides_as_the_plain_walk(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_same_run(_run(seed, False, monkeypatch), _run(seed, True, monkeypatch))


def assert_same_run(plain: dict[str, Any], fast: dict[str, Any]) -> None:
    """Two observed timed runs (a fast path off and on) decided alike: the summary, the
    clocks and matches seen, the free lists, the trees and every request column."""
    assert json.dumps(fast["summary"], sort_keys=True) == json.dumps(
        plain["summary"], sort_keys=True
    )
    assert fast["clocks"] == plain["clocks"] and fast["matches"] == plain["matches"]
    assert fast["free"] == plain["free"]
    assert fast["tree"] == plain["tree"]
    a, b = plain["requests"], fast["requests"]
    for col in a.columns:
        assert a[col].equals(b[col]), col
