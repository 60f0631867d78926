"""The per-request HiCache all-reduces under TP (``Costs.tp_sync_s``): each prefetch check
that SGLang votes on across the TP ranks blocks the scheduler thread for one all-reduce
(``hicache_check_s`` of the profile), and so does a PD decode server's L3 hit-count query.

How many votes a check makes is SGLang's code, per version:

* 0.5.14 (hiradix_cache.py:1324-1393): ``can_terminate_prefetch`` all-reduces its verdict
  unless the policy is best_effort, and ``check_prefetch_progress`` all-reduces the completed
  tokens when it ends the prefetch.
* 0.5.23 (unified_radix_cache.py:2295-2311): only the timeout policy votes, once per check
  that finds the prefetch running; the termination reduces nothing on this thread.

A vote made while the server idles delays nothing; one made in the pass that admits the
request delays that pass's prefill, so the first token comes later by exactly its cost."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import sim.engine
from hicache.config import load_config
from sim.costs import build_costs
from sim.engine import run_simulation
from sim.pd.run import build_pd_engine
from tests.test_pd import BASE, _trace
from tests.test_pd_decode_l3 import RADIX, REQS, STORE, record_holds

#: one request whose 8,192-token prompt the store holds (written by an identical earlier
#: request that the small device and host pools have pushed out by then)
L3_REQS = [(0, 8192, 4, 0), (1_000, 12_800, 4, 100_000), (2_000, 12_800, 4, 200_000),
           (3_000, 12_800, 4, 300_000), (10_000, 8192, 4, 0)]  # fmt: skip
POOLS = ["gpu.device_tokens=16384", "cache.hicache_ratio=1.5", "gpu.allow_host_overcommit=true",
         "storage.backend=mooncake"]  # fmt: skip


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, policy: str, sync: float
) -> dict[str, Any]:
    """The summary and request rows of :data:`L3_REQS` at tp 2 with ``tp_sync_s`` = ``sync``
    (everything else as the config builds it)."""
    trace = _trace(tmp_path, L3_REQS)
    cfg = load_config(None, [*BASE, *POOLS, "model.tp=2", f"sglang.version={version}",
                             f"storage.prefetch_policy={policy}"])  # fmt: skip
    costs = dataclasses.replace(build_costs(cfg), tp_sync_s=sync)
    monkeypatch.setattr(sim.engine, "build_costs", lambda _cfg: costs)
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, frames_out=frames)
    return {"summary": s, "requests": frames["requests"]}


def test_tp_sync_is_the_profile_check_at_tp_above_one() -> None:
    """One CPU all-reduce per vote: the profile's ``hicache_check_s`` under TP with a host
    tier, nothing at tp 1 or without the host tier (no all-reduce is made)."""
    cfg = load_config(None, [*BASE, "model.tp=2"])
    assert build_costs(cfg).tp_sync_s == pytest.approx(0.00015)
    assert build_costs(load_config(None, BASE)).tp_sync_s == 0.0
    off = load_config(None, [*BASE, "model.tp=2", "cache.enable_host=false"])
    assert build_costs(off).tp_sync_s == 0.0


@pytest.mark.parametrize(
    ("version", "policy", "votes_at_admission"),
    [("0.5.14", "best_effort", 1), ("0.5.14", "wait_complete", 2), ("0.5.14", "timeout", 2),
     ("0.5.23", "best_effort", 0), ("0.5.23", "wait_complete", 0)],
)  # fmt: skip
def test_the_admitting_pass_pays_its_votes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, policy: str,
    votes_at_admission: int,
) -> None:  # fmt: skip
    """The last request's prefetch ends in the pass that admits it: its prefill starts after
    that pass's votes, so its first token comes exactly ``votes x tp_sync_s`` later than with
    free all-reduces, and nothing else about it changes (its L3 hit is the same)."""
    # large enough to see; small enough that the votes of the earlier checks (made while the
    # server idles) end before the prefetch does, so only the admitting pass's votes delay
    sync = 0.001
    free = _run(tmp_path, monkeypatch, version, policy, 0.0)
    paid = _run(tmp_path, monkeypatch, version, policy, sync)
    a, b = free["requests"].iloc[-1], paid["requests"].iloc[-1]
    assert a["storage_hit_tokens"] == b["storage_hit_tokens"]
    if policy != "best_effort":
        assert b["storage_hit_tokens"] == 8192 - 64  # the last page is recomputed
    ttft = lambda r: r["first_token_s"] - r["arrival_s"]  # noqa: E731
    assert ttft(b) - ttft(a) == pytest.approx(votes_at_admission * sync, abs=1e-9)
    st = paid["summary"]["storage"]
    if version == "0.5.14":
        # one completed-token MIN per ended prefetch, plus a verdict per check but best_effort
        ended = st["prefetches_terminated"]
        assert st["prefetch_tp_votes"] >= ended > 0
        if policy == "best_effort":
            assert st["prefetch_tp_votes"] == ended
        else:
            assert st["prefetch_tp_votes"] > ended
    else:
        assert st["prefetch_tp_votes"] == 0


def test_0523_timeout_votes_while_the_prefetch_runs(tmp_path: Path) -> None:
    """0.5.23 under timeout: a check that finds the prefetch still running votes; a slow store
    keeps it running past the deadline, so the check that ends it votes in the admitting pass
    (one vote), and every earlier check voted too."""
    slow = ["storage.read_gbps_override=0.05"]
    trace = _trace(tmp_path, L3_REQS)
    cfg = load_config(None, [*BASE, *POOLS, *slow, "model.tp=2", "sglang.version=0.5.23",
                             "storage.prefetch_policy=timeout"])  # fmt: skip
    s = run_simulation(cfg, trace)
    st = s["storage"]
    assert st["prefetch_deadline_expired"] > 0
    assert st["prefetch_tp_votes"] >= st["prefetch_deadline_expired"]
    tp1 = load_config(None, [*BASE, *POOLS, *slow, "sglang.version=0.5.23",
                             "storage.prefetch_policy=timeout"])  # fmt: skip
    # the votes are counted as SGLang makes them, whatever the TP size; only their cost is 0
    assert run_simulation(tp1, trace)["storage"]["prefetch_tp_votes"] > 0


def test_the_decode_query_pays_its_all_reduce(tmp_path: Path) -> None:
    """A PD decode server at tp 2: each pre-allocation's L3 query is the backend call plus
    the hit count's MIN all-reduce (unified_radix_cache.py:2072-2076), held against the decode
    scheduler; the restore's progress checks (timeout policy) add their votes."""
    trace = _trace(tmp_path, REQS)
    cfg = load_config(None, [*BASE, "pd.enabled=true", "model.tp=2", *STORE, *RADIX])
    engine, _ = build_pd_engine(cfg, trace)
    role = engine.decode[0]
    l3 = role.l3
    assert l3 is not None
    sync = l3.tp_sync_s
    assert sync == pytest.approx(0.00015)
    held = record_holds(role)
    engine.run()
    assert l3.queries == 4
    spec, page_bytes = l3.storage.spec, l3.storage.page_bytes
    pages = [n // 64 for _, n, _, _ in REQS]
    queries = [spec.stage_seconds("query", p, page_bytes) + sync for p in pages]
    votes = l3.attachment.stats.prefetch_tp_votes
    assert votes > 0  # turn 2's restore was checked while its prefetch ran
    assert sorted(held) == sorted(queries + [sync] * votes)
