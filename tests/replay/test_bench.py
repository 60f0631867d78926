"""Microbenchmarks on CPU tensors: every sweep produces well-formed rows."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest

import replay.bench as bench_mod
from replay.bench import (
    COLUMNS,
    BenchConfig,
    bench_table,
    compute_rows,
    fragmented_pages,
    model_gemm_shapes,
    op_pool_pages,
    op_rows,
    rotated,
    run_bench,
    write_bench,
)
from replay.calibrate import calibrate, gemm_rate, load_bench
from replay.pools import count_runs
from replay.runtime import CpuRuntime
from replay.transfer import CopyEngine
from tests.replay.conftest import CudaLikeRuntime

KiB = 1024


@pytest.mark.parametrize("n", [1, 2, 7, 16, 64])
@pytest.mark.parametrize("run", [0, 1, 4, 16, 64])
def test_fragmented_pages_have_the_asked_runs(n: int, run: int) -> None:
    dev, host = fragmented_pages(n, run)
    assert len(dev) == len(host) == n == len(set(dev)) == len(set(host))
    want = 1 if run == 0 or run >= n else -(-n // run)
    assert count_runs(dev, host) == want
    assert max(dev + host) < 2 * n + max(run, 1)


def tiny_config() -> BenchConfig:
    # no cache flush: after one, this VM's first small copy costs 30-100 us of cold start, more
    # than these ops' byte-dependent time, and the fit could not tell a bandwidth apart (the
    # flush itself is tested below)
    return BenchConfig.quick(
        plain_sizes=(4 * KiB, 256 * KiB),
        bidir_sizes=(256 * KiB,),
        op_layers=(1, 2),
        op_pages=(1, 4, 16),
        run_pages=(0, 1, 4),
        repeats=2,
        flush_bytes=0,
    )


@pytest.fixture(scope="module")
def bench_df() -> pd.DataFrame:
    return run_bench(tiny_config(), CpuRuntime())


def test_bench_rows(bench_df: pd.DataFrame) -> None:
    df = bench_df
    assert list(df.columns) == list(COLUMNS)
    assert (df.duration_s > 0).all()
    assert set(df.kind) == {"plain", "bidir", "op"}  # no GEMM without CUDA
    assert set(df.host_memory) == {"pageable"}  # a CPU cannot pin
    ops = df[df.kind == "op"]
    assert set(zip(ops.backend, ops.layout, strict=True)) == {
        ("direct", "layer_first"),
        ("kernel", "layer_first"),
        ("kernel", "page_first"),
    }
    # model bookkeeping: loads pay alpha per layer, gamma per run and layer
    loads = ops[ops.direction == "h2d"]
    assert (loads.n_alpha == loads.layers).all()
    assert (ops.n_gamma == ops.runs * ops.layers).all()
    frag = ops[(ops.backend == "direct") & (ops.run_pages == 1) & (ops.pages == 16)]
    assert set(frag.runs) == {16} and set(frag.calls) == {16 * 2 * n for n in frag.layers}
    assert len(df[df.kind == "plain"]) == 2 * 2 * 2  # sizes x directions x repeats


def test_bench_outputs_and_table(
    bench_df: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = CpuRuntime()
    # a GPU machine gets the tree without .git: the commit comes from the environment
    monkeypatch.setenv("HICACHE_COMMIT", "abc1234")
    meta = write_bench(bench_df, tiny_config(), rt, tmp_path, 1.0, model="llama-3-8b")
    assert meta["code_commit"] == "abc1234"
    assert meta["machine"]["device"] == "cpu" and meta["rows"] == len(bench_df)
    df, meta2 = load_bench(tmp_path)
    assert len(df) == len(bench_df) and meta2["config"]["repeats"] == 2
    assert (tmp_path / "bench.csv").is_file()
    text = bench_table(df)
    assert "plain copies" in text and "both directions" in text and "kernel" in text
    # the real (CPU) table calibrates: a pipeline check, not a GPU figure
    cal = calibrate(df, meta2, gpu="h100-sxm", link="pcie5-x16")
    assert cal.profile.measured is False
    assert cal.profile.provenance["code_commit"] == "abc1234"


def test_config_validation_and_presets() -> None:
    with pytest.raises(ValueError):
        BenchConfig(repeats=0)
    with pytest.raises(ValueError):
        BenchConfig(plain_sizes=(12,))
    cfg = BenchConfig.for_model("qwen3-8b", page_size=32)
    assert (cfg.token_layer_bytes, cfg.op_layers, cfg.page_size) == (4096, (1, 36), 32)
    assert BenchConfig.for_model("deepseek-v3").parts == 1


@pytest.mark.parametrize(("span", "pool"), [(3, 3), (3, 10), (8, 64), (80, 64)])
def test_rotated_windows_are_disjoint_and_inside_the_pool(span: int, pool: int) -> None:
    pages = list(range(span))
    pool = max(pool, span)  # op_pool_pages never gives less than the span
    windows = pool // span
    seen: list[set[int]] = []
    for i in range(2 * windows + 1):
        got = rotated(pages, span, pool, i)
        assert sorted(got) == got and got[-1] - got[0] == span - 1  # a shifted copy
        assert min(got) >= 0 and max(got) < pool
        seen.append(set(got))
    # consecutive repeats share no page while the pool holds two windows; then round robin
    for a, b in itertools.pairwise(seen):
        assert (a == b) if windows == 1 else not (a & b)
    assert seen[windows] == seen[0]


def test_op_pool_pages_spans_the_asked_bytes() -> None:
    cfg = BenchConfig.quick(op_pool_bytes=1 << 20, page_size=16, token_layer_bytes=1024)
    page = 16 * 1024 * 4  # bytes of one page at 4 layers, one side
    assert op_pool_pages(cfg, 4, 3) == (1 << 20) // page
    assert op_pool_pages(cfg, 4, 1000) == 1000  # never less than the largest op's span
    assert op_pool_pages(BenchConfig.quick(op_pool_bytes=0), 4, 7) == 7


def test_op_repeats_touch_fresh_pages_after_a_cache_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op (warm-up included) follows a flush, and repeats of one shape use disjoint pages:
    a repeat timed on the pages the previous one left in the caches would be too fast."""
    events: list[tuple[str, tuple[int, ...]]] = []
    real_flusher = bench_mod.cache_flusher

    def counting_flusher(rt: CpuRuntime, nbytes: int) -> object:
        assert nbytes == cfg.flush_bytes
        inner = real_flusher(rt, nbytes)

        def flush() -> None:
            events.append(("flush", ()))
            inner()

        return flush

    def spy(name: str) -> object:
        real = getattr(CopyEngine, name)

        def issue(self: CopyEngine, dev: list[int], host: list[int]) -> object:
            events.append((name, tuple(dev)))
            return real(self, dev, host)

        return issue

    cfg = BenchConfig.quick(
        backends=("direct",),
        op_layers=(1,),
        op_pages=(4,),
        run_pages=(0, 1),
        repeats=3,
        op_pool_bytes=1 << 20,
        flush_bytes=1 << 16,
    )
    monkeypatch.setattr(bench_mod, "cache_flusher", counting_flusher)
    monkeypatch.setattr(CopyEngine, "d2h", spy("d2h"))
    monkeypatch.setattr(CopyEngine, "h2d", spy("h2d"))
    rows = bench_mod._Rows()
    op_rows(cfg, CpuRuntime(), rows, lambda _m: None)
    ops = [e for e in events if e[0] != "flush"]
    assert len(ops) == 2 * 2 * (cfg.warmup + cfg.repeats)  # 2 shapes x 2 directions
    for i, e in enumerate(events):
        if e[0] != "flush":
            assert events[i - 1][0] == "flush", f"op {i} was not preceded by a flush"
    per_shape = cfg.warmup + cfg.repeats
    for k in range(0, len(ops), per_shape):
        pages = [set(p) for _, p in ops[k : k + per_shape]]
        for a, b in itertools.pairwise(pages):
            assert not (a & b)


@pytest.mark.parametrize(
    ("model", "width"),
    # the MLP widths of the models' HF configs, which the presets do not store
    [("llama-3-8b", 14336), ("llama-3-70b", 28672), ("qwen3-8b", 12288), ("qwen3-32b", 25600)],
)
def test_model_gemm_shapes_recover_the_real_layer(model: str, width: int) -> None:
    from hicache.hardware import get_model

    m = get_model(model)
    shapes = dict((name, (k, n)) for name, k, n in model_gemm_shapes(model))
    h = m.hidden_size
    assert shapes["gate_up"] == (h, 2 * width) and shapes["down"] == (width, h)
    assert shapes["qkv"] == (h, (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim)
    assert shapes["o"] == (m.num_attention_heads * m.head_dim, h)
    # one token through these GEMMs does what hicache.latency charges per token and layer
    weights = sum(k * n for k, n in shapes.values())
    assert weights == pytest.approx(m.body_active_params / m.num_layers, rel=0.01)
    # tensor parallel: column-parallel GEMMs split n, row-parallel ones k
    tp = dict((name, (k, n)) for name, k, n in model_gemm_shapes(model, 8))
    assert tp["qkv"] == (h, shapes["qkv"][1] // 8) and tp["gate_up"] == (h, 2 * width // 8)
    assert tp["o"] == (shapes["o"][0] // 8, h) and tp["down"] == (width // 8, h)
    assert BenchConfig.for_model(model).gemm_shapes == model_gemm_shapes(model)


def test_compute_rows_time_each_gemm_and_the_rate_weighs_them_as_a_layer() -> None:
    cfg = BenchConfig.quick(
        gemm_tokens=8, gemm_shapes=(("a", 16, 32), ("b", 32, 16)), hbm_bytes=64 * KiB, repeats=2
    )
    rows = bench_mod._Rows()
    compute_rows(cfg, CpuRuntime(), rows)
    df = pd.DataFrame(rows.rows, columns=list(COLUMNS))
    g = df[df.kind == "gemm"]
    assert list(g.layout) == ["a 8x16x32", "a 8x16x32", "b 8x32x16", "b 8x32x16"]
    assert set(g.flops) == {2.0 * 8 * 16 * 32}
    assert (df[df.kind == "hbm"]["bytes"] == 2 * 64 * KiB).all()
    # the rate is FLOPs over summed median times, not a median of per-GEMM rates
    fake = pd.DataFrame(
        {
            "kind": ["gemm"] * 4,
            "layout": ["big", "big", "small", "small"],
            "flops": [9e12, 9e12, 1e12, 1e12],
            "duration_s": [0.010, 0.012, 0.004, 0.004],
        }
    )
    assert gemm_rate(fake) == pytest.approx(10e12 / (0.011 + 0.004))
    assert "gemm (one layer's linear GEMMs)" in bench_table(df)


def test_plain_copies_can_run_on_the_pools_own_memory() -> None:
    """The replay's peak is measured between its pools (registered host memory may copy at
    another rate than a fresh buffer): the copies must move the first bytes of those tensors."""
    import torch

    from replay.bench import plain_copy_times

    rt = CpuRuntime()
    dev = torch.arange(32, dtype=torch.int64).view(4, 8)
    host = torch.zeros(4, 8, dtype=torch.int64)
    times = plain_copy_times(rt, 64, "d2h", False, repeats=2, warmup=0, buffers=(dev, host))
    assert len(times) == 2 and all(t >= 0 for t in times)
    assert host.view(-1)[:8].tolist() == list(range(8)) and not host.view(-1)[8:].any()
    with pytest.raises(ValueError, match="cannot hold"):
        plain_copy_times(rt, 1024, "h2d", False, repeats=1, buffers=(dev, host))
    with pytest.raises(ValueError, match="contiguous"):
        plain_copy_times(rt, 8, "h2d", False, repeats=1, buffers=(dev.t(), host))


def test_clearing_the_cuda_error_needs_a_loaded_cuda_runtime() -> None:
    import torch

    from replay.runtime import _clear_cuda_error

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the runtime is loaded once CUDA is initialized
        assert _clear_cuda_error() is True
    elif torch.version.cuda is None:  # the CPU build maps no libcudart
        assert _clear_cuda_error() is False
    else:
        pytest.skip("a CUDA build of torch without a device: libcudart may or may not be mapped")


def test_the_cuda_branches_of_the_bench_run_on_cuda_like_streams() -> None:
    cfg = BenchConfig.quick(
        plain_sizes=(4 * KiB, 64 * KiB),
        bidir_sizes=(64 * KiB,),
        op_layers=(1,),
        op_pages=(1, 4),
        run_pages=(0, 1),
        repeats=2,
        gemm=True,
        gemm_tokens=8,
        gemm_shapes=(("qkv", 16, 24), ("down", 32, 16)),
        hbm_bytes=64 * KiB,
        op_pool_bytes=1 << 20,
        flush_bytes=1 << 16,
    )
    rt = CudaLikeRuntime()
    df = run_bench(cfg, rt)
    assert set(df.kind) == {"plain", "bidir", "op", "gemm", "hbm"}
    assert set(df[df.kind == "plain"].host_memory) == {"pinned", "pageable"}
    bid = df[df.kind == "bidir"]
    assert sorted(bid.direction.unique()) == ["d2h", "h2d"] and len(bid) == 2 * cfg.repeats
    assert (df.duration_s >= 0).all()
    assert all(rt.pending(s) == 0 for s in ("d2h", "h2d"))  # nothing left queued
