"""PD routing (``pd.prefill_router`` / ``pd.decode_router``): the gateway's PD mode picks a
prefill and a decode server per request, each with its own policy (default the gateway's
``--policy``, cache_aware, for both). A session's turns stay on the prefill server that holds
its prefix (cache_aware) where round_robin scatters them; tier_aware on the decode side sends
a turn to the decode server whose radix cache holds its prefix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hicache.config import load_config
from sim.engine import run_simulation
from traces.io import read_trace

BASE = ["model.name=llama-3-8b", "gpu.name=h100-sxm", "cache.page_size=64",
        "gpu.device_tokens=65536", "pd.enabled=true", "pd.prefill_instances=2",
        "pd.decode_instances=2"]  # fmt: skip
SESSIONS, TURNS, STEP = 3, 3, 2048  # turn k's prompt: (k + 1) * 2,048 tokens, extending k - 1


def _trace(tmp_path: Path) -> Any:
    lines = []
    for s in range(SESSIONS):
        for k in range(TURNS):
            n = (k + 1) * STEP
            lines.append(json.dumps({
                "timestamp": 0, "input_length": n, "output_length": 16,
                "hash_ids": list(range(s * 100, s * 100 + n // 512)), "session_id": f"s{s}",
                "turn": k, "think_time_ms": 1000,
            }))  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return read_trace(path)


def _run(tmp_path: Path, extra: list[str]) -> Any:
    frames: dict[str, Any] = {}
    run_simulation(load_config(None, [*BASE, *extra]), _trace(tmp_path), frames_out=frames)
    req = frames["requests"].copy()
    req["session"] = req["rid"] // TURNS
    return req


def _sticky(req: Any, column: str) -> bool:
    return bool((req.groupby("session")[column].nunique() == 1).all())


def test_default_is_cache_aware_on_both_roles() -> None:
    cfg = load_config(None, BASE)
    assert (cfg.pd.prefill_router, cfg.pd.decode_router) == ("cache_aware", "cache_aware")


def test_cache_aware_prefill_keeps_a_session_where_its_prefix_is(tmp_path: Path) -> None:
    aware = _run(tmp_path, [])
    rr = _run(tmp_path, ["pd.prefill_router=round_robin", "pd.decode_router=round_robin"])
    assert _sticky(aware, "prefill_instance") and _sticky(aware, "decode_instance")
    assert not _sticky(rr, "prefill_instance")
    # every later turn hits its previous prompt on the prefill server holding it
    later = aware[aware["rid"] % TURNS > 0]
    assert list(later["device_hit_tokens"]) == list(later["prompt_tokens"] - STEP)
    assert rr["device_hit_tokens"].sum() < aware["device_hit_tokens"].sum()
    # the first turns (all at once, empty trees) were spread by load: both servers used
    assert aware["prefill_instance"].nunique() == 2


def test_tier_aware_decode_follows_the_decode_radix_cache(tmp_path: Path) -> None:
    """tier_aware scores each decode server's real tree: a later turn goes where its prefix
    (the previous turn's prompt and output, inserted at that turn's finish) is cached."""
    on = ["pd.decode_radix_cache=true", "pd.decode_router=tier_aware"]
    req = _run(tmp_path, [*on, "pd.prefill_router=round_robin"])
    assert _sticky(req, "decode_instance")
    later = req[req["rid"] % TURNS > 0]
    assert (later["decode_device_hit_tokens"] >= later["prompt_tokens"] - STEP).all()
    rr = _run(tmp_path, ["pd.decode_radix_cache=true", "pd.prefill_router=round_robin",
                         "pd.decode_router=round_robin"])  # fmt: skip
    assert rr["decode_device_hit_tokens"].sum() < req["decode_device_hit_tokens"].sum()


def test_a_prefill_bound_run_does_not_flag_the_decode_role(tmp_path: Path) -> None:
    """200 8K-token prompts at 20/s on one prefill server (about 5 a second served): the
    prefill queue grows without bound. The decode role's queueing is its own (pre-allocation
    and merge waits, not the TTFT), and the pre-allocation wait it has comes from requests
    that hold the decode pool while they wait for the prefill: the run blames the prefill
    role only."""
    lines = [
        json.dumps(
            {
                "timestamp": i * 50,
                "input_length": 8192,
                "output_length": 4,
                "hash_ids": list(range(i * 100, i * 100 + 16)),
            }
        )
        for i in range(200)
    ]
    path = tmp_path / "burst.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cfg = load_config(None, ["model.name=llama-3-8b", "gpu.name=h100-sxm", "pd.enabled=true"])
    s = run_simulation(cfg, read_trace(path))
    pre, dec = s["roles"]["prefill"], s["roles"]["decode"]
    assert pre["overloaded"] and not dec["overloaded"]
    waits = dec["prealloc_wait_mean_s"] + dec["merge_wait_mean_s"]
    assert dec["queue_mean_s"] == pytest.approx(waits, rel=1e-9)
    assert dec["queue_mean_s"] < s["ttft_mean_s"]
    assert "the prefill role is overloaded" in dec["overload_message"]
    assert "the prefill role cannot keep up" in s["overload_message"]
