"""The memos of ``sim.costs.Costs``: a remembered prefill pass or copy op costs exactly what
computing it again gives, and the memos stay bounded."""

from __future__ import annotations

import pytest

import sim.costs
from hicache.config import load_config
from sim.costs import build_costs


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_remembered_copy_ops_cost_what_computing_them_gives(layout: str) -> None:
    backend = "direct" if layout == "layer_first" else "kernel"
    costs = build_costs(load_config(None, [f"link.io_backend={backend}",
                                           f"link.mem_layout={layout}"]))  # fmt: skip
    page = costs.bytes_per_page
    cases = [(kind, pages * page, runs) for kind in ("write", "load")
             for pages in (1, 3, 64, 200) for runs in (1, 2, pages)]  # fmt: skip
    first = [costs.op_time(*c) for c in cases]
    again = [costs.op_time(*c) for c in reversed(cases)][::-1]  # all from the memo now
    assert first == again == [costs._op_time(*c) for c in cases]
    # the key tells the two directions apart, and (direct IO) the run counts
    assert costs.op_time("write", 64 * page, 1) != costs.op_time("load", 64 * page, 1)
    if backend == "direct":
        assert costs.op_time("write", 64 * page, 1) < costs.op_time("write", 64 * page, 64)


def test_the_memos_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim.costs, "PREFILL_MEMO_MAX", 4)
    costs = build_costs(load_config(None, []))
    page = costs.bytes_per_page
    for n in range(1, 30):
        assert costs.op_time("write", n * page, 1) == costs._op_time("write", n * page, 1)
        assert costs.prefill_time([(512, 512 * n)]) == costs.prefill_fn([(512, 512 * n)])
        assert len(costs._op_memo) <= 4 and len(costs._prefill_memo) <= 4
