"""Microbenchmarks on CPU tensors: every sweep produces well-formed rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from replay.bench import (
    COLUMNS,
    BenchConfig,
    bench_table,
    fragmented_pages,
    run_bench,
    write_bench,
)
from replay.calibrate import calibrate, load_bench
from replay.pools import count_runs
from replay.runtime import CpuRuntime

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
    return BenchConfig.quick(
        plain_sizes=(4 * KiB, 256 * KiB),
        bidir_sizes=(256 * KiB,),
        op_layers=(1, 2),
        op_pages=(1, 4, 16),
        run_pages=(0, 1, 4),
        repeats=2,
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


def test_bench_outputs_and_table(bench_df: pd.DataFrame, tmp_path: Path) -> None:
    rt = CpuRuntime()
    meta = write_bench(bench_df, tiny_config(), rt, tmp_path, 1.0, model="llama-3-8b")
    assert meta["machine"]["device"] == "cpu" and meta["rows"] == len(bench_df)
    df, meta2 = load_bench(tmp_path)
    assert len(df) == len(bench_df) and meta2["config"]["repeats"] == 2
    assert (tmp_path / "bench.csv").is_file()
    text = bench_table(df)
    assert "plain copies" in text and "both directions" in text and "kernel" in text
    # the real (CPU) table calibrates: a pipeline check, not a GPU figure
    cal = calibrate(df, meta2, gpu="h100-sxm", link="pcie5-x16")
    assert cal.profile.measured is False


def test_config_validation_and_presets() -> None:
    with pytest.raises(ValueError):
        BenchConfig(repeats=0)
    with pytest.raises(ValueError):
        BenchConfig(plain_sizes=(12,))
    cfg = BenchConfig.for_model("qwen3-8b", page_size=32)
    assert (cfg.token_layer_bytes, cfg.op_layers, cfg.page_size) == (4096, (1, 36), 32)
    assert BenchConfig.for_model("deepseek-v3").parts == 1
