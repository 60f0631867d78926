"""A PD decode server's retraction backup (``pd.decode_retraction_backup``, sim.pd.retraction):
SGLang 0.5.23's default per server, the cost of each mode's synchronous copies, and that the
decode scheduler waits for them (a retracted request pays a backup and a restore)."""

from __future__ import annotations

import math
from typing import Any

import pytest

import sim.pd.decode_side as decode_side
from hicache.config import ConfigError, load_config
from sim.costs import build_costs
from sim.engine import run_simulation
from sim.pd.retraction import CPU_OFFLOAD_CHUNK_TOKENS, PAGEABLE_SHARE, copy_seconds, resolve_backup
from tests.test_pd import CONVERSATION
from traces.io import read_trace

RETRACTING = ["pd.enabled=true", "workload.max_requests=400",
              "pd.decode_set=gpu.device_tokens=40960;scheduler.max_running_requests=64",
              "pd.num_reserved_decode_tokens=0"]  # fmt: skip


def test_sglang_default_per_server() -> None:
    assert resolve_backup("auto", radix_cache=False, offload=False, priority_preemption=False) == (
        "host_pool"
    )
    for flags in ({"radix_cache": True}, {"offload": True}, {"priority_preemption": True}):
        kw = {"radix_cache": False, "offload": False, "priority_preemption": False, **flags}
        assert resolve_backup("auto", **kw) == "cpu_tensor"
    assert resolve_backup("host_pool", radix_cache=True, offload=False,
                          priority_preemption=False) == "host_pool"  # fmt: skip
    with pytest.raises(ConfigError, match="decode_retraction_backup"):
        load_config(None, ["pd.decode_retraction_backup=disk"])


def test_copy_seconds_per_mode() -> None:
    costs = build_costs(load_config(None, []))
    ps = 64
    tokens = 20_000
    nbytes = tokens * costs.bytes_per_page // ps
    assert copy_seconds("host_pool", "d2h", tokens, costs, ps) == costs.op_time("write", nbytes, 1)
    assert copy_seconds("host_pool", "h2d", tokens, costs, ps) == costs.op_time("load", nbytes, 1)
    ops = costs.kv_parts * costs.num_layers * math.ceil(tokens / CPU_OFFLOAD_CHUNK_TOKENS)
    want = ops * costs.d2h.alpha_s + nbytes / (costs.d2h.beta_Bps * PAGEABLE_SHARE["d2h"])
    assert copy_seconds("cpu_tensor", "d2h", tokens, costs, ps) == pytest.approx(want, rel=1e-12)
    # per-layer pageable copies: slower than one pinned HiCache op
    assert copy_seconds("cpu_tensor", "d2h", tokens, costs, ps) > copy_seconds(
        "host_pool", "d2h", tokens, costs, ps
    )
    assert copy_seconds("cpu_tensor", "h2d", 0, costs, ps) == 0.0


def _run(extra: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    frames: dict[str, Any] = {}
    s = run_simulation(load_config(None, [*RETRACTING, *extra]), read_trace(CONVERSATION),
                       frames_out=frames)  # fmt: skip
    return s, frames


def test_the_decode_scheduler_waits_for_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every backup and restore taking 1 s, a retracted request's decode lasts at least
    2 s per retraction (the step after its backup waits 1 s, the step after its restore
    another); with free copies the same run is faster."""
    monkeypatch.setattr(decode_side, "copy_seconds", lambda *a: 1.0)
    slow, f = _run([])
    dec = f["decode"]["requests"]
    hit = dec[dec["retractions"] > 0]
    assert len(hit) > 0
    lifetime = hit["finish_s"] - hit["first_token_s"]
    assert (lifetime >= 2.0 * hit["retractions"]).all()
    monkeypatch.setattr(decode_side, "copy_seconds", lambda *a: 0.0)
    free, _ = _run([])
    assert slow["tpot_mean_s"] > free["tpot_mean_s"]
