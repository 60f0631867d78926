"""The copy cost rule by IO backend and host layout (issue 13 item 5): what SGLang 0.5.14 issues
for one op, counted by hand for small cases (README "Copy cost by backend and layout")."""

from __future__ import annotations

import pytest

from hicache.latency import LAYOUTS_BY_BACKEND, STAGING_CHUNK_PAGES, OpCharges, op_charges

L = 4  # layers


@pytest.mark.parametrize(
    ("kind", "backend", "layout", "runs", "pages", "kv", "want"),
    [
        # kernel: one gather per layer (load) / one kernel for all layers (write), any runs
        ("load", "kernel", "page_first", 3, 10, 2, (L, 0)),
        ("load", "kernel", "layer_first", 10, 10, 2, (L, 0)),
        ("load", "kernel", "page_head", 10, 10, 2, (L, 0)),
        ("write", "kernel", "layer_first", 10, 10, 2, (1, 0)),
        ("write", "kernel", "page_head", 10, 10, 1, (1, 0)),
        # page_first write-back: a relayout per 64-page chunk, one descriptor per page and K/V
        ("write", "kernel", "page_first", 1, 10, 2, (1, 20)),
        ("write", "kernel", "page_first", 1, 64, 2, (1, 128)),
        ("write", "kernel", "page_first", 1, 65, 2, (2, 130)),
        ("write", "kernel", "page_first", 1, 200, 1, (4, 200)),
        # direct + layer_first: a cudaMemcpyAsync per run, layer and K/V
        ("load", "direct", "layer_first", 3, 10, 2, (L, 2 * 3 * L)),
        ("write", "direct", "layer_first", 3, 10, 2, (1, 2 * 3 * L)),
        ("write", "direct", "layer_first", 3, 10, 1, (1, 3 * L)),  # MLA: one buffer
        # direct + page_first_direct: a copy per page, layer and K/V, never merged
        ("load", "direct", "page_first_direct", 1, 10, 2, (L, 2 * 10 * L)),
        ("write", "direct", "page_first_direct", 1, 10, 1, (1, 10 * L)),
    ],
)
def test_charges_by_backend_and_layout(
    kind: str, backend: str, layout: str, runs: int, pages: int, kv: int, want: tuple[int, int]
) -> None:
    got = op_charges(kind, 1000, runs, L, backend=backend, layout=layout, pages=pages, kv_parts=kv)
    assert got == OpCharges(*want, 1000)


def test_defaults_are_the_replay_structure() -> None:
    """The replay's emulated copies (direct, layer_first, one buffer) keep their charges."""
    assert op_charges("write", 7, 3, L) == OpCharges(1, 3 * L, 7)
    assert op_charges("load", 7, 3, L) == OpCharges(L, 3 * L, 7)


def test_sglang_combinations_only() -> None:
    assert STAGING_CHUNK_PAGES == 64
    assert set(LAYOUTS_BY_BACKEND) == {"kernel", "direct"}
    with pytest.raises(ValueError, match=r"does not run layout 'page_head' with the direct"):
        op_charges("load", 1, 1, L, backend="direct", layout="page_head")
    with pytest.raises(
        ValueError, match=r"does not run layout 'page_first_direct' with the kernel"
    ):
        op_charges("load", 1, 1, L, backend="kernel", layout="page_first_direct")
    with pytest.raises(ValueError, match=r"unknown io backend 'rdma'"):
        op_charges("load", 1, 1, L, backend="rdma")
    with pytest.raises(ValueError, match=r"unknown op kind"):
        op_charges("copy", 1, 1, L)


def test_layout_changes_simulated_copy_times() -> None:
    """`link.mem_layout` and `link.io_backend` reach the simulator's copy times: fragmentation
    costs kernel IO nothing, direct layer_first a copy per run, page_first_direct a copy per
    page whatever the runs; a contiguous direct load is cheaper than a kernel one (C5: direct
    is efficient for large contiguous copies)."""
    from hicache.config import load_config
    from sim.costs import build_costs

    def load_s(backend: str, layout: str, runs: int) -> float:
        cfg = load_config(None, [f"link.io_backend={backend}", f"link.mem_layout={layout}"])
        c = build_costs(cfg)
        return c.op_time("load", 32 * c.bytes_per_page, runs)

    kernel = load_s("kernel", "page_first", 32)
    assert kernel == load_s("kernel", "layer_first", 32) == load_s("kernel", "page_head", 32)
    lf_merged, lf_frag = load_s("direct", "layer_first", 1), load_s("direct", "layer_first", 32)
    pfd = load_s("direct", "page_first_direct", 1)
    assert lf_merged < kernel < lf_frag == pytest.approx(pfd)
    # 32 layers x 2 (K, V) x 31 extra runs x 2.5 us per cudaMemcpyAsync
    assert lf_frag - lf_merged == pytest.approx(32 * 2 * 31 * 2.5e-6)


def test_the_config_refuses_what_sglang_cannot_run() -> None:
    from hicache.config import ConfigError, load_config

    assert load_config(None, ["link.io_backend=direct"]).link.mem_layout == "page_first_direct"
    with pytest.raises(ConfigError, match=r"link.mem_layout.*page_head needs io_backend=kernel"):
        load_config(None, ["link.io_backend=direct", "link.mem_layout=page_head"])
    with pytest.raises(ConfigError, match=r"page_first_direct needs io_backend=direct"):
        load_config(None, ["link.mem_layout=page_first_direct"])
    with pytest.raises(ConfigError, match=r"deepseek-v3 has an MLA KV cache.*no page_head"):
        load_config(None, ["model.name=deepseek-v3", "model.tp=8", "gpu.name=h200",
                           "link.mem_layout=page_head"])  # fmt: skip


def test_pages_default_to_none() -> None:
    """Without ``pages`` an op has no pages: a page_first write-back still pays one relayout
    (``max(1, 0 chunks)``) but no per-page descriptor, and page_first_direct no copies."""
    assert op_charges("write", 5, 1, L, backend="kernel", layout="page_first") == OpCharges(1, 0, 5)
    assert op_charges("load", 5, 1, L, layout="page_first_direct") == OpCharges(L, 0, 5)


def test_a_bad_layout_lists_what_the_backend_runs() -> None:
    with pytest.raises(ValueError, match=r"\(it runs: layer_first, page_first, page_head\)$"):
        op_charges("load", 1, 1, L, backend="kernel", layout="page_first_direct")
    with pytest.raises(ValueError, match=r"\(it runs: layer_first, page_first_direct\)$"):
        op_charges("load", 1, 1, L, backend="direct", layout="page_first")
