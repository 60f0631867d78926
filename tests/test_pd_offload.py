"""The decode servers' KV offload to L3 (``pd.decode_offload_kvcache``, sim.pd.offload): the
whole strides of a finished request's committed KV past its page-aligned prompt go to the
store under the prefill side's keys, so the next turn's prefill server prefetches the answer
from L3 without any decode radix cache; the stride, the store requirement, the host pool and
the PCIe copy are SGLang's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hicache.config import ConfigError, load_config
from sim.costs import build_costs
from sim.engine import run_simulation
from sim.pd.offload import DecodeOffload
from tests.test_output_reuse import BASE, TURNS, _trace

PD = [*BASE, "pd.enabled=true", "workload.output_reuse=next_turn"]
OFFLOAD = ["pd.decode_offload_kvcache=true", "storage.backend=mooncake"]


def _run(tmp_path: Path, extra: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    frames: dict[str, Any] = {}
    s = run_simulation(load_config(None, [*PD, *extra]), _trace(tmp_path, TURNS), frames_out=frames)
    return s, frames


def test_the_answer_reaches_the_prefill_server_through_l3(tmp_path: Path) -> None:
    """Turn 0 commits 1,024 + 513 - 1 = 1,536 tokens: the 512 past its page-aligned prompt
    are 8 whole strides of 64 (the page size); turn 1's prefill server holds its 1,024 prompt
    tokens and prefetches those 512 from the store."""
    s, f = _run(tmp_path, OFFLOAD)
    pre = f["prefill"]["requests"]
    assert list(pre["device_hit_tokens"]) == [0, 1024]
    assert list(pre["storage_hit_tokens"]) == [0, 512]
    off = s["roles"]["decode"]["offload"]
    # turn 1 commits 2,048 + 4 - 1 = 2,051 tokens: 3 tokens past its aligned prompt, no stride
    assert off["ops"] == 1 and off["tokens"] == off["stored_tokens"] == 512
    assert off["host_full"] == 0
    # one device->host copy of the 8 pages on the decode server's link, in its transfers
    copies = f["decode"]["transfers"]
    row = copies[copies["kind"] == "offload"]
    page_bytes = build_costs(load_config(None, PD)).bytes_per_page
    assert len(row) == 1 and int(row["pages"].iloc[0]) == 8
    assert int(row["bytes"].iloc[0]) == 8 * page_bytes == off["d2h_bytes"]
    # without the offload the store never sees the answer
    _, f0 = _run(tmp_path, ["storage.backend=mooncake"])
    assert list(f0["prefill"]["requests"]["storage_hit_tokens"]) == [0, 0]


def test_stride_rounds_down_to_pages(tmp_path: Path) -> None:
    """Stride 400 -> 384 tokens (6 pages): one stride of the 512 is offloaded."""
    s, f = _run(tmp_path, [*OFFLOAD, "pd.decode_offload_stride=400"])
    assert s["roles"]["decode"]["offload"]["tokens"] == 384
    assert list(f["prefill"]["requests"]["storage_hit_tokens"]) == [0, 384]


def test_offload_needs_a_storage_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="storage backend"):
        _run(tmp_path, ["pd.decode_offload_kvcache=true"])


def test_a_full_host_pool_skips_the_offload() -> None:
    """SGLang's 'Not enough host memory': nothing is copied or stored."""

    class _Link:
        submitted = 0

        def submit(self, job: object) -> None:
            self.submitted += 1

    class _Costs:
        def op_time(self, kind: str, nbytes: int, runs: int) -> float:
            return 0.0

    link = _Link()
    off = DecodeOffload(
        None,
        link,
        None,
        _Costs(),
        None,
        None,
        None,
        None,
        64,
        64,
        256,
        1000,
        1,  # type: ignore[arg-type]
    )
    assert off.offloaded_tokens(1024, 513) == 512
    off.finished(list(range(16)), [], 1024, 513)
    assert link.submitted == 0 and off.stats.host_full == 1


def test_decode_server_flags_map_both_ways() -> None:
    """A decode server's SGLang flags set the pd keys, and a PD config prints them back."""
    from hicache.sglang_args import format_sglang_command, parse_sglang_args

    got = parse_sglang_args(
        "--disaggregation-decode-enable-radix-cache --disaggregation-decode-enable-offload-kvcache"
        " --disaggregation-decode-retraction-backup host_pool --num-reserved-decode-tokens 256",
        64,
    )
    assert {"pd.decode_radix_cache=true", "pd.decode_offload_kvcache=true",
            "pd.decode_retraction_backup=host_pool",
            "pd.num_reserved_decode_tokens=256"} <= set(got.overrides)  # fmt: skip
    cfg = load_config(None, ["pd.enabled=true", *got.overrides])
    line = format_sglang_command(cfg).splitlines()[-1]
    assert line == (
        "# decode servers add: --disaggregation-mode decode --num-reserved-decode-tokens 256 "
        "--disaggregation-decode-enable-radix-cache --disaggregation-decode-enable-offload-kvcache "
        "--disaggregation-decode-retraction-backup host_pool"
    )
