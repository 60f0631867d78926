"""``--hicache-host-memory-mode buffer_only`` (SGLang 0.5.19+, modelled as 0.5.23 runs it):
the config key and its checks, the launch-flag mapping, the policy core on a small trace (no
host hits, L3 hits), and a timed run."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from hicache.config import ConfigError, load_config, resolve_pools
from hicache.lifecycle import PagedRequest
from hicache.policy import ManualController, PageAllocator
from hicache.policy.storage import PageStore
from hicache.policy.v0523 import UnifiedRadixCache
from hicache.policy.v0523.buffer_l3 import BufferStorageAttachment
from hicache.policy.v0523.l3_controller import StorageController0523
from hicache.sglang_args import parse_sglang_args
from sim.hitrate import HitRateConfig, replay

ROOT = Path(__file__).resolve().parents[1]


# -- config ------------------------------------------------------------------------------------
def test_buffer_only_needs_a_storage_backend() -> None:
    with pytest.raises(ConfigError, match="requires an L3 storage tier"):
        load_config(None, ["cache.host_memory_mode=buffer_only"])


def test_buffer_only_needs_0523() -> None:
    with pytest.raises(ConfigError, match=r"since 0\.5\.19"):
        load_config(
            None,
            ["sglang.version=0.5.14", "cache.host_memory_mode=buffer_only", "storage.backend=file"],
        )


def test_buffer_only_needs_the_host_tier() -> None:
    with pytest.raises(ConfigError, match="enable_host"):
        load_config(
            None,
            ["cache.host_memory_mode=buffer_only", "storage.backend=file",
             "cache.enable_host=false"],
        )  # fmt: skip


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="host_memory_mode"):
        load_config(None, ["cache.host_memory_mode=l2"])


def test_write_back_resolves_to_write_through() -> None:
    cfg = load_config(
        None,
        ["cache.host_memory_mode=buffer_only", "storage.backend=file",
         "cache.write_policy=write_back"],
    )  # fmt: skip
    assert cfg.cache.write_policy == "write_through"
    cache = UnifiedRadixCache(
        ManualController(PageAllocator(8, 1), PageAllocator(8, 1)),
        write_policy="write_back",
        host_memory_mode="buffer_only",
    )
    assert cache.write_policy == "write_through" and not cache.tree.is_write_back


def test_default_ratio_is_1_2_in_buffer_only() -> None:
    base = ["gpu.device_tokens=100032", "cache.page_size=64", "gpu.host_memory_gb=100000"]
    _, host_cache, _ = resolve_pools(load_config(None, [*base, "storage.backend=file"]))
    _, host_buf, _ = resolve_pools(
        load_config(None, [*base, "storage.backend=file", "cache.host_memory_mode=buffer_only"])
    )
    assert host_cache == 2 * 100032 + 64
    assert host_buf == int(100032 * 1.2) // 64 * 64 + 64
    _, given, _ = resolve_pools(
        load_config(
            None,
            [
                *base,
                "storage.backend=file",
                "cache.host_memory_mode=buffer_only",
                "cache.hicache_ratio=3",
            ],
        )
    )
    assert given == 3 * 100032 + 64


def test_sglang_args_map_the_mode() -> None:
    got = parse_sglang_args(
        "--enable-hierarchical-cache --hicache-host-memory-mode buffer_only "
        "--hicache-storage-backend file",
        version="0.5.23",
    )
    assert "cache.host_memory_mode=buffer_only" in got.overrides
    got = parse_sglang_args("--hicache-host-memory-mode cache", version="0.5.23")
    assert "cache.host_memory_mode=cache" in got.overrides
    with pytest.raises(ValueError, match=r"not a flag of SGLang 0\.5\.14"):
        parse_sglang_args("--hicache-host-memory-mode buffer_only", version="0.5.14")


def test_the_key_is_documented() -> None:
    from hicache.config.keys import key_docs

    docs = key_docs()
    assert any("host_memory_mode" in str(k) for k in docs)


# -- the policy core ---------------------------------------------------------------------------
def _trace(ps: int, n: int = 200) -> list[PagedRequest]:
    rng = random.Random(3)
    stems = [[rng.randrange(1000) for _ in range(ps * 30)] for _ in range(5)]
    out = []
    for i in range(n):
        toks = rng.choice(stems) + [rng.randrange(1000) for _ in range(ps * rng.randrange(1, 8))]
        out.append(PagedRequest(toks, len(toks), 8, rid=i))
    return out


@pytest.mark.parametrize("policy", ["wait_complete", "timeout"])
def test_hit_rates_have_no_host_hits_and_l3_hits(policy: str) -> None:
    ps = 4
    kw: dict[str, Any] = dict(
        device_tokens=ps * 100, host_tokens=ps * 120, page_size=ps, storage=True,
        prefetch_threshold=2 * ps, prefetch_policy=policy, sglang_version="0.5.23",
    )  # fmt: skip
    buf = replay(_trace(ps), HitRateConfig(**kw, host_memory_mode="buffer_only"))
    cache = replay(_trace(ps), HitRateConfig(**kw))
    assert buf.host_hit_tokens == 0 and buf.storage_hit_tokens > 0
    assert cache.host_hit_tokens > 0
    assert buf.device_hit_tokens > 0
    wb = replay(
        _trace(ps),
        HitRateConfig(**kw, host_memory_mode="buffer_only", write_policy="write_back"),
    )
    assert wb.storage_hit_tokens == buf.storage_hit_tokens  # resolved to write_through


def test_hitrate_config_checks() -> None:
    with pytest.raises(ValueError, match="requires an L3"):
        replay([], HitRateConfig(64, 128, 64, host_memory_mode="buffer_only",
                                 sglang_version="0.5.23"))  # fmt: skip


def test_staging_is_freed_and_nothing_is_host_backed() -> None:
    ps = 1
    dev, host = PageAllocator(40, ps), PageAllocator(48, ps)
    ctrl = ManualController(dev, host)
    cache = UnifiedRadixCache(ctrl, host_memory_mode="buffer_only")
    sc = StorageController0523(host, PageStore(), threshold=2, immediate=True)
    att = BufferStorageAttachment(cache, sc, device_tokens=40, prefetch_threshold=2)
    cache.storage = att
    key = tuple(range(1, 13))
    pages = dev.alloc_pages(len(key))
    assert pages is not None
    cache.insert(key, pages)
    assert len(att.pipeline.pending) == 1
    cache.check_hicache_events()  # flush: staged
    assert att.pipeline.write_staged_tokens == 12 and host.available_size() == 48 - 12
    ctrl.complete_writes(None)
    cache.check_hicache_events()  # D2H ack -> storage write (immediate); ack drained next
    cache.check_hicache_events()
    assert att.pipeline.write_staged_tokens == 0 and host.available_size() == 48
    assert len(sc.store) == 12 and att.pipeline.beliefs.covered(cache.storage.node_hash_values(
        cache.tree.nodes[max(cache.tree.nodes)]))  # fmt: skip
    assert all(n.host_value is None for n in cache.tree.nodes.values())
    assert cache.evict_host(10) == 0


# -- timed run ---------------------------------------------------------------------------------
def test_a_timed_run_completes(tmp_path: Path) -> None:
    from cli.main import main

    out = tmp_path / "run"
    rc = main([
        "run", str(ROOT / "traces/data/mooncake/conversation_trace.jsonl"), "--out", str(out),
        "--sglang-args",
        "--enable-hierarchical-cache --hicache-host-memory-mode buffer_only "
        "--hicache-storage-backend file --page-size 64",
        "--set", "gpu.device_tokens=200000", "--set", "workload.rate_scale=0.25",
        "--set", "workload.max_requests=300",
    ])  # fmt: skip
    assert rc in (0, None)
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished_requests"] == 300
    assert summary["host_hit_rate"] == 0.0
    assert summary["storage"]["storage_hit_tokens"] > 0


# -- conformance: our buffer core beside the real BufferModePipeline ---------------------------
REAL_VENV = ROOT / ".venv-conformance-0.5.23"


def test_buffer_conformance_self_test_reaches_the_staged_loads(tmp_path: Path) -> None:
    """The buffer_only conformance driver with our core on both sides: it agrees with itself
    and reaches the paths the check is for (backups staged and stored, staged L3 loads
    consumed at admission)."""
    import json

    from conformance.v0523 import run

    args = ["--buffer-only", "--self-test", "--sequences", "1", "--steps", "80",
            "--page-sizes", "1,4", "--evictions", "lru", "--out", str(tmp_path)]  # fmt: skip
    assert run.main(args) == 0
    report = json.loads((tmp_path / "conformance-buffer.json").read_text())
    assert report["mismatches"] == []
    cov = report["totals"]["ours"]["coverage"]
    for key in ("l3_backup_ops", "l3_loaded_from_storage", "staged_loaded", "admit_pending"):
        assert cov.get(key, 0) > 0, key


def test_buffer_conformance_catches_a_planted_difference() -> None:
    """One buffer decision changed on one side (the staging FIFO launched newest first) is
    reported."""
    from conformance.v0523 import run_l3
    from conformance.v0523.ours_side import OursUnifiedCache

    class _Lifo(OursUnifiedCache):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            pl = self.l3.pipeline  # type: ignore[union-attr]
            real = pl.flush_pending_writes

            def flush() -> None:
                pl.pending.reverse()
                real()

            pl.flush_pending_writes = flush

    def lifo(c: Any) -> _Lifo:
        return _Lifo(page_size=c.page_size, device_pages=c.device_pages,
                     host_pages=c.host_pages, write_policy=c.write_policy,
                     eviction_policy=c.eviction_policy, l3=c.l3,
                     host_memory_mode=c.host_memory_mode)  # fmt: skip

    combo = run_l3.L3Combo("write_through", "lru", 1, host_pages=8, threshold_pages=2,
                           host_memory_mode="buffer_only")  # fmt: skip
    found = [run_l3.run_l3_sequence(combo, s, 80, run_l3.ours_l3, lifo) for s in range(8)]
    assert any(found), "a LIFO staging queue went unnoticed"


@pytest.mark.skipif(
    not (REAL_VENV / ".ready-0.5.23").exists(),
    reason="needs .venv-conformance-0.5.23 (make conformance SGLANG_VERSION=0.5.23)",
)
def test_buffer_sequences_equal_the_real_class(tmp_path: Path) -> None:
    """A short slice of ``make conformance``'s buffer_only run: the real ``UnifiedRadixCache``
    with its ``BufferModePipeline`` (both TreeCores) beside ours, compared after every step."""
    import subprocess

    out = subprocess.run(
        [str(REAL_VENV / "bin/python"), "-m", "conformance.v0523.run", "--buffer-only",
         "--cores", "python,rust", "--sequences", "1", "--steps", "60", "--page-sizes", "1",
         "--evictions", "lru", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.count(" 0 mismatching") == 2
