"""Trace replay end to end on CPU tensors: same decisions as the cache-only replay, real bytes
moved correctly (verified), per-op records with predictions, output files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from hicache.config import load_config
from hicache.latency import load_profile
from hicache.policy import PageAllocator
from hicache.policy.allocator import device_pool
from replay.controller import TorchController
from replay.driver import TraceReplayer, trace_requests
from replay.pools import KVPools, PoolSpec
from replay.run import ReplaySettings, format_summary, run_replay, settings_from_config
from replay.runtime import CpuRuntime
from replay.transfer import Transfer
from sim.hitrate import HitRateConfig, replay, requests_for
from traces.bundled import synthetic_path
from traces.io import read_trace
from traces.schema import Trace

PAGE = 64
DEVICE_TOKENS = 128 * PAGE
HOST_TOKENS = 384 * PAGE


@pytest.fixture(scope="module")
def trace() -> Trace:
    return read_trace(synthetic_path("shared-prefix"))


def _replayer(
    layout: str,
    backend: str,
    policy: str = "write_through",
    verify: bool = True,
    version: str = "0.5.14",
) -> TraceReplayer:
    spec = PoolSpec(
        num_layers=2,
        token_layer_bytes=16,
        page_size=PAGE,
        device_pages=DEVICE_TOKENS // PAGE,
        host_pages=HOST_TOKENS // PAGE,
        layout=layout,
    )
    rt = CpuRuntime()
    pools = KVPools(spec, rt)
    ctrl = TorchController(
        device_pool(spec.device_pages, PAGE),
        PageAllocator(spec.host_pages, PAGE, "host"),
        pools,
        rt,
        backend=backend,
    )
    return TraceReplayer(ctrl, write_policy=policy, verify=verify, sglang_version=version)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_one_request_per_batch_decides_exactly_as_the_cache_only_replay(
    trace: Trace, policy: str, version: str
) -> None:
    n = 150
    ref = replay(
        requests_for(trace, PAGE)[:n],
        HitRateConfig(DEVICE_TOKENS, HOST_TOKENS, PAGE, "lru", policy, sglang_version=version),
    )
    rp = _replayer("layer_first", "direct", policy, version=version)
    got = rp.run(trace_requests(trace, PAGE, n), max_tokens=0, max_requests=1)
    for f in (
        "requests",
        "prompt_tokens",
        "device_hit_tokens",
        "host_hit_tokens",
        "tokens_written",
        "tokens_loaded",
        "device_evicted_tokens",
        "host_evicted_tokens",
        "host_alloc_failures",
        "load_back_failures",
        "oom_requests",
    ):
        assert getattr(got, f) == getattr(ref, f), f
    assert got.host_hit_tokens > 0 and got.tokens_loaded > 0  # the test exercises loads
    recs = rp.ctrl.records
    assert sum(r.pages for r in recs if r.kind == "write") * PAGE == got.tokens_written
    assert sum(r.pages for r in recs if r.kind == "load") * PAGE == got.tokens_loaded


@pytest.mark.parametrize(
    ("layout", "backend"),
    [("layer_first", "direct"), ("layer_first", "kernel"), ("page_first", "kernel")],
)
def test_batched_replay_moves_the_right_bytes(trace: Trace, layout: str, backend: str) -> None:
    rp = _replayer(layout, backend)
    res = rp.run(trace_requests(trace, PAGE, 120), max_tokens=8192, max_requests=4)
    assert res.batches < res.requests  # batches formed
    assert res.verified_pages > 0 and res.host_hit_tokens > 0
    loads = [r for r in rp.ctrl.records if r.kind == "load"]
    assert loads and max(r.nodes for r in loads) >= 1
    rp.cache.check_invariants()


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_batched_replay_under_0523_moves_the_right_bytes_in_merged_writes(
    trace: Trace, policy: str
) -> None:
    rp = _replayer("page_first", "kernel", policy, version="0.5.23")
    res = rp.run(trace_requests(trace, PAGE, 120), max_tokens=8192, max_requests=4)
    assert res.batches < res.requests
    assert res.verified_pages > 0 and res.host_hit_tokens > 0
    writes = [r for r in rp.ctrl.records if r.kind == "write"]
    assert writes
    if policy == "write_through":
        # one merged copy per batch result (prefill, then finish): at most two per batch
        assert len(writes) <= 2 * res.batches < res.requests
    # (write_back backs up one eviction victim at a time, each its own blocking copy)


def test_a_forward_pass_stand_in_runs_before_each_batch_s_loads_and_writes(trace: Trace) -> None:
    """The replay does not run the model; ``forward`` stands in for its effect on the caches
    (ReplaySettings.flush_bytes). It must run before a batch's loads and again before each
    group of its writes, or the ops are timed with the previous op's buffers still cached."""
    rp = _replayer("layer_first", "direct")
    events: list[str] = []
    rp._forward = lambda: events.append("forward")
    eng = rp.ctrl.engine
    assert eng is not None
    for name in ("d2h", "h2d"):
        real = getattr(eng, name)

        def issue(dev: Sequence[int], host: Sequence[int], real=real, name=name) -> Transfer:  # type: ignore[no-untyped-def]
            events.append(name)
            return real(dev, host)

        setattr(eng, name, issue)
    res = rp.run(trace_requests(trace, PAGE, 60), max_tokens=8192, max_requests=4)
    # before the loads, before the prefill writes, before the finish writes (the decode)
    assert res.oom_requests == 0 and events.count("forward") == 3 * res.batches
    assert "h2d" in events and "d2h" in events
    # every op follows a forward, with only ops of the same direction in between: loads run
    # between the first forward of a batch and the second, writes after the others
    last = None
    for e in events:
        if e == "forward":
            last = None
        else:
            assert last in (None, e), f"a {e} op followed a {last} op with no forward pass between"
            last = e


def test_verification_catches_a_wrong_copy(trace: Trace) -> None:
    rp = _replayer("page_first", "kernel")
    reqs = trace_requests(trace, PAGE, 120)
    eng = rp.ctrl.engine
    assert eng is not None
    real = eng.h2d

    def broken(dev: Sequence[int], host: Sequence[int]) -> Transfer:
        return real(dev, list(reversed(host)))  # loads the pages in the wrong order

    eng.h2d = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(AssertionError, match="wrong bytes"):
        rp.run(reqs, max_tokens=0, max_requests=1)


def test_settings_from_config() -> None:
    cfg = load_config(None, ["gpu.device_tokens=8192", "cache.page_size=64"])
    s = settings_from_config(cfg, max_requests=10, device_budget_bytes=1 << 30)
    assert (s.backend, s.layout, s.page_size, s.device_tokens) == ("kernel", "page_first", 64, 8192)
    assert s.host_tokens == 2 * 8192 + 64 and s.max_requests == 10
    d = settings_from_config(load_config(None, ["link.io_backend=direct"]))
    assert d.layout == "layer_first" and "page_first_direct" in d.notes[0]
    k = settings_from_config(cfg, backend="direct")
    assert k.layout == "layer_first" and k.notes


def test_run_replay_writes_ops_and_summary(trace: Trace, tmp_path: Path) -> None:
    settings = ReplaySettings(
        page_size=PAGE,
        device_tokens=DEVICE_TOKENS,
        host_tokens=HOST_TOKENS,
        backend="direct",
        layout="layer_first",
        max_requests=80,
        num_layers=2,
        token_layer_bytes=64,
        verify=True,
        device_budget_bytes=1 << 30,
        host_budget_bytes=1 << 30,
        peak_bytes=1 << 20,
        large_op_bytes=1 << 16,
    )
    prof = load_profile(None, "h100-sxm", "pcie5-x16")
    s = run_replay(trace, settings, CpuRuntime(), prof, out=tmp_path)
    for name in ("ops.parquet", "ops.csv", "summary.json", "config.json"):
        assert (tmp_path / name).is_file(), name
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["requests"] == 80 and on_disk["device"] == "cpu"
    assert s["error"]["all"]["n"] == s["ops"] > 0
    assert set(s["large_ops"]) == {"d2h", "h2d"}
    assert s["pools"]["layout"] == "layer_first" and s["profile"]["measured"] is False
    assert any("layers overridden" in n for n in s["notes"])
    import pandas as pd

    ops = pd.read_parquet(tmp_path / "ops.parquet")
    assert {"predicted_s", "rel_err", "issue_s", "duration_s", "runs", "nbytes"} <= set(ops.columns)
    assert (ops.predicted_s > 0).all() and ops.op_id.is_monotonic_increasing
    assert "prediction" in format_summary(s)
    # on CPU tensors the copies run inside the issuing call: every op is issue-bound
    assert (ops.issue_cpu_s >= ops.duration_s - ops.host_s).all()
    assert s["issue_share"]["issue_bound_fraction"] == 1.0
    assert "issue-bound" in format_summary(s)
    assert on_disk["settings"]["flush_bytes"] == 64 << 20


def test_a_replay_needs_a_host_tier() -> None:
    with pytest.raises(ValueError, match="host tier"):
        ReplaySettings(device_tokens=6400, host_tokens=0).pools()
