"""The decode server's radix cache in PD mode (``pd.decode_radix_cache``, sim.pd.decode_cache):
a second turn whose prefix the decode server holds gets only its suffix's KV over the link
(exact bytes and TTFT), a host hit on a small decode pool is loaded back there and gates the
first token, the send-op count past a decode prefix, and the switch off changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cli.pd_summary import format_pd_summary
from hicache.config import ConfigError, load_config
from hicache.models import kv_bytes_per_token
from sim.engine import run_simulation
from sim.pd.run import build_pd_engine
from sim.pd.transfer import transfer_chunks
from tests.test_pd import BASE, _trace

SMALL_DECODE = "pd.decode_set=gpu.device_tokens=8192;cache.write_policy=write_through"


def _run(trace: Any, extra: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    cfg = load_config(None, [*BASE, "pd.enabled=true", *extra])
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    return cfg, frames, s


def test_second_turn_sends_only_the_suffix(tmp_path: Path) -> None:
    """Turn 1: 2,048 tokens; turn 2 (100 s later): the same 2,048 tokens + 2,048 new. With the
    decode radix cache, turn 2's prompt prefix is in the decode tree (inserted at turn 1's
    finish): 2,048 device-hit tokens there, the prefill side sends the 32 pages past them in one
    op (its own cached prefix ends where the decode prefix does: no early send), so TTFT drops
    by one op's latency plus 2,048 tokens' bytes over the link; the prefill server and the
    decode steps are unchanged."""
    trace = _trace(tmp_path, [(0, 2048, 64, 0), (100_000, 4096, 64, 0)])
    cfg, off, s_off = _run(trace, [])
    _, on, s_on = _run(trace, ["pd.decode_radix_cache=true"])
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    a, b = off["requests"], on["requests"]
    assert list(a["transfer_bytes"]) == [2048 * bpt, 4096 * bpt]
    assert list(b["transfer_bytes"]) == [2048 * bpt, 2048 * bpt]
    assert list(b["transfer_bytes_saved"]) == [0, 2048 * bpt]
    assert list(a["transfer_chunks"]) == [1, 2] and list(b["transfer_chunks"]) == [1, 1]
    assert list(b["decode_device_hit_tokens"]) == [0, 2048]
    assert list(b["decode_host_hit_tokens"]) == [0, 0]
    assert list(a["decode_device_hit_tokens"]) == [0, 0]
    ttft_a = a["first_token_s"] - a["arrival_s"]
    ttft_b = b["first_token_s"] - b["arrival_s"]
    assert ttft_b[0] == ttft_a[0]
    saved = cfg.pd.rdma_latency_s + 2048 * bpt / (cfg.pd.rdma_gbps * 1e9)
    assert ttft_a[1] - ttft_b[1] == pytest.approx(saved, rel=1e-9)
    pd.testing.assert_frame_equal(off["prefill"]["requests"], on["prefill"]["requests"])
    assert s_on["tpot_mean_s"] == s_off["tpot_mean_s"]
    # per-role summary: the decode server's hits, the bytes saved
    dec = s_on["roles"]["decode"]
    assert dec["radix_cache"] and dec["decode_prefix_tokens"] == 2048
    assert dec["device_hit_rate"] == dec["hit_rate"] == pytest.approx(2048 / 6144, rel=1e-12)
    assert dec["host_hit_rate"] == 0.0
    assert s_on["transfer_bytes_saved_per_rank"] == dec["transfer_bytes_saved_per_rank"]
    assert s_on["transfer_bytes_saved_per_rank"] == 2048 * bpt
    assert s_on["transfer_bytes_saved_share"] == pytest.approx(2048 / 6144, rel=1e-12)
    assert "decode radix cache: hit rate 33.33% (device 33.33%" in format_pd_summary(s_on)
    assert "transfer_bytes_saved_per_rank" not in s_off
    assert "radix_cache" not in s_off["roles"]["decode"]
    assert "decode radix cache" not in format_pd_summary(s_off)


def test_without_shared_prefixes_the_switch_changes_no_time(tmp_path: Path) -> None:
    """Distinct prompts: nothing to match on the decode side, every time as with it off."""
    reqs = [(0, 10_000, 40, 0), (100_000, 3000, 65, 100), (200_000, 700, 2, 200)]
    trace = _trace(tmp_path, reqs)
    _, off, _ = _run(trace, [])
    _, on, _ = _run(trace, ["pd.decode_radix_cache=true"])
    pd.testing.assert_frame_equal(off["requests"], on["requests"])


def test_decode_host_hit_on_a_small_decode_pool(tmp_path: Path) -> None:
    """Decode pool of 8,192 tokens with a host tier (write_through): turn 1 (6,144 tokens) is
    backed up to host at its finish, an unrelated 6,400-token request evicts it from the
    device, and turn 2 (6,656 tokens, turn 1's blocks + one) finds 6,144 tokens on the decode
    server's host: loaded back there (one H2D copy of those bytes), the prefill sends only the
    last 512 tokens. On an A100's PCIe 4 decode host link the load outlasts the transfer, so
    the first token waits for it (the restore gate) and comes when it ends."""
    reqs = [(0, 6144, 64, 0), (100_000, 6400, 64, 100), (200_000, 6656, 64, 0)]
    trace = _trace(tmp_path, reqs)
    slow = SMALL_DECODE + ";gpu.name=a100-80gb;link.name=pcie4-x16"
    cfg, frames, s = _run(trace, ["pd.decode_radix_cache=true", slow])
    bpt = kv_bytes_per_token(cfg.model.spec, 1)
    req = frames["requests"]
    assert list(req["decode_device_hit_tokens"]) == [0, 0, 0]
    assert list(req["decode_host_hit_tokens"]) == [0, 0, 6144]
    assert list(req["transfer_bytes"]) == [6144 * bpt, 6400 * bpt, 512 * bpt]
    loads = frames["decode"]["transfers"]
    loads = loads[loads["direction"] == "h2d"]
    assert list(loads["bytes"]) == [6144 * bpt]
    dec = s["roles"]["decode"]
    assert dec["bytes_h2d"] == 6144 * bpt
    assert dec["host_hit_rate"] == pytest.approx(6144 / (6144 + 6400 + 6656), rel=1e-12)
    assert dec["device_hit_rate"] == 0.0
    third = req.iloc[2]
    load_end = float(loads["end_s"].iloc[0])
    assert load_end > third["transfer_end_s"]
    assert third["first_token_s"] == load_end  # the restore gate
    # with the default H100 decode server the load ends first: the transfer decides
    _, fast, _ = _run(trace, ["pd.decode_radix_cache=true", SMALL_DECODE])
    f = fast["requests"].iloc[2]
    assert f["decode_host_hit_tokens"] == 6144
    assert f["first_token_s"] == f["transfer_end_s"]
    # without the radix cache the decode role has no host tier at all
    _, roles = build_pd_engine(load_config(None, [*BASE, "pd.enabled=true", slow]), trace)
    assert roles["decode"]["host_tokens"] == 0
    _, roles_on = build_pd_engine(cfg, trace)
    assert roles_on["decode"]["host_tokens"] > 0


def test_send_ops_past_a_decode_prefix() -> None:
    # no decode prefix: the rule without the radix cache
    assert transfer_chunks(10_000, 0, 8192, 0, 64) == transfer_chunks(10_000, 0, 8192) == 2
    assert transfer_chunks(100, 512, 8192, 0, 64) == 2
    # the prefill's cached prefix ends at the decode prefix: no early send
    assert transfer_chunks(2048, 2048, 8192, 2048, 64) == 1
    # the decode prefix covers the early send's range but not the first chunk's
    assert transfer_chunks(20_000, 1024, 8192, 4096, 64) == 3
    # a first chunk ending (page-floored) at or below the decode prefix sends nothing
    assert transfer_chunks(20_000, 0, 8192, 8192, 64) == 2
    assert transfer_chunks(20_000, 4096, 8192, 20_480, 64) == 1
    # a decode prefix past the prefill's cached prefix: the early send goes
    assert transfer_chunks(100, 4096, 8192, 1024, 64) == 2


def test_decode_radix_cache_needs_0523(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [(0, 512, 4, 0)])
    cfg = load_config(None, [*BASE, "pd.enabled=true", "pd.decode_radix_cache=true",
                             "sglang.version=0.5.14"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"pd\.decode_radix_cache"):
        build_pd_engine(cfg, trace)
