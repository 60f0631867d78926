"""Issue 28 item 5: a PD run's ``metrics.prom`` (sim.pd.prom): every server's SGLang metrics,
labelled ``engine_type`` prefill/decode and ``server``, parseable by prometheus_client, printed
as ``generate_latest`` prints the same families, and every counter and histogram equal to what
the run's own tables give for that server; compare-metrics reads it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hicache.config import load_config
from sim.pd.prom import pd_families, write_pd_metrics
from sim.pd.run import run_pd_simulation
from sim.prom import render
from tests.test_pd import BASE, CONVERSATION, _trace
from traces.io import read_trace

Samples = dict[str, list[Any]]


def _run(out: Path, trace: Any, sets: list[str]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    cfg = load_config(None, ["pd.enabled=true", *sets])
    frames: dict[str, Any] = {}
    summary = run_pd_simulation(cfg, trace, out, frames_out=frames)
    roles = json.loads((out / "config.json").read_text())["roles"]
    write_pd_metrics(out, cfg, frames, summary, roles)
    return cfg, frames, summary


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    """120 conversation requests on 2 prefill + 2 decode servers, a 10 s warm-up window."""
    out = tmp_path_factory.mktemp("pd") / "run"
    _, frames, summary = _run(out, read_trace(CONVERSATION), [
        "workload.max_requests=120", "workload.rate_scale=0.5", "workload.warmup_s=10",
        "pd.prefill_instances=2", "pd.decode_instances=2"])  # fmt: skip
    return out, frames, summary


def _parse(path: Path) -> Samples:
    return {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}


def _value(got: Samples, family: str, sample: str, **labels: str) -> float:
    vals = [s.value for s in got[family] if s.name == sample and labels.items() <= s.labels.items()]
    assert len(vals) == 1, (sample, labels, vals)
    return float(vals[0])


def _servers(got: Samples, family: str) -> set[str]:
    return {s.labels["server"] for s in got[family]}


def test_every_server_counts_its_own_requests(fleet: tuple[Path, Any, dict[str, Any]]) -> None:
    out, frames, summary = fleet
    got = _parse(out / "metrics.prom")
    rows = frames["requests"]
    assert summary["warmup_requests"] > 0
    measured = rows[(rows["arrival_s"] >= summary["warmup_end_s"]) & (rows["finish_s"] >= 0)]
    assert len(measured) == summary["finished_requests"]
    assert _servers(got, "sglang:num_requests") == {"prefill-0", "prefill-1", "decode-0",
                                                    "decode-1"}  # fmt: skip
    pre = frames["prefill"]["requests"].set_index("rid")
    for role in ("prefill", "decode"):
        for i in range(2):
            mine = measured[measured[f"{role}_instance"] == i]
            lab = {"server": f"{role}-{i}", "engine_type": role}
            n = _value(got, "sglang:num_requests", "sglang:num_requests_total", **lab)
            assert n == len(mine) > 0
            prompt = _value(got, "sglang:prompt_tokens", "sglang:prompt_tokens_total", **lab)
            assert prompt == mine["prompt_tokens"].sum()
            gen = _value(got, "sglang:generation_tokens", "sglang:generation_tokens_total", **lab)
            # the prefill server stops at its one token; the decode server streams them all
            assert gen == (len(mine) if role == "prefill" else mine["output_tokens"].sum())
            ttft = _value(got, "sglang:time_to_first_token_seconds",
                          "sglang:time_to_first_token_seconds_sum", **lab)  # fmt: skip
            end = mine["transfer_end_s"] if role == "prefill" else mine["first_token_s"]
            assert ttft == pytest.approx((end - mine["arrival_s"]).sum(), rel=1e-12)
            dev = pre.loc[mine["rid"], "cached_tokens_device"].sum()
            got_dev = [s.value for s in got["sglang:cached_tokens"]
                       if s.labels["server"] == lab["server"]
                       and s.labels["cache_source"] == "device"]  # fmt: skip
            assert got_dev == ([dev] if dev else [])
    # the decode servers' TTFT is summary.json's
    ttft_n = sum(_value(got, "sglang:time_to_first_token_seconds",
                        "sglang:time_to_first_token_seconds_count", server=f"decode-{i}")
                 for i in range(2))  # fmt: skip
    ttft_sum = sum(_value(got, "sglang:time_to_first_token_seconds",
                          "sglang:time_to_first_token_seconds_sum", server=f"decode-{i}")
                   for i in range(2))  # fmt: skip
    assert ttft_n == summary["finished_requests"]
    assert ttft_sum / ttft_n == pytest.approx(summary["ttft_mean_s"], rel=1e-12)
    # only decode servers observe TPOT and inter-token latency
    assert _servers(got, "sglang:inter_token_latency_seconds") == {"decode-0", "decode-1"}


def test_kv_transfer_histograms_are_the_transfers(
    fleet: tuple[Path, Any, dict[str, Any]],
) -> None:
    out, frames, summary = fleet
    got = _parse(out / "metrics.prom")
    rows = frames["requests"]
    measured = rows[(rows["arrival_s"] >= summary["warmup_end_s"]) & (rows["finish_s"] >= 0)]
    assert _servers(got, "sglang:kv_transfer_latency_ms") == {"prefill-0", "prefill-1"}
    assert _servers(got, "sglang:kv_transfer_alloc_ms") == {"prefill-0", "prefill-1",
                                                            "decode-0", "decode-1"}  # fmt: skip
    for i in range(2):
        mine = measured[measured["prefill_instance"] == i]
        lat = (mine["transfer_end_s"] - mine["prefill_end_s"]) * 1000
        fam = "sglang:kv_transfer_latency_ms"
        assert _value(got, fam, fam + "_count", server=f"prefill-{i}") == len(mine)
        assert _value(got, fam, fam + "_sum", server=f"prefill-{i}") == pytest.approx(lat.sum())
        buckets = [s for s in got[fam] if s.name.endswith("_bucket")
                   and s.labels["server"] == f"prefill-{i}"]  # fmt: skip
        assert [s.value for s in buckets][-1] == len(mine)
        assert all(a.value <= b.value for a, b in itertools.pairwise(buckets))
        le100 = next(s.value for s in buckets if s.labels["le"] == "100.0")
        assert le100 == (lat <= 100).sum()
        fam = "sglang:kv_transfer_total_mb"
        mb = mine["transfer_bytes"].sum() / 2**20  # equal TP: a link carries one rank's slice
        assert _value(got, fam, fam + "_sum", server=f"prefill-{i}") == pytest.approx(mb)
        fam = "sglang:kv_transfer_speed_gb_s"
        speed = (mine["transfer_bytes"] / 2**30 / (lat / 1000)).sum()
        assert _value(got, fam, fam + "_sum", server=f"prefill-{i}") == pytest.approx(speed)
        fam = "sglang:kv_transfer_bootstrap_ms"
        boot = ((mine["bootstrap_s"] - mine["arrival_s"]) * 1000).sum()
        assert _value(got, fam, fam + "_sum", server=f"prefill-{i}") == pytest.approx(boot)
        dec = measured[measured["decode_instance"] == i]
        fam = "sglang:kv_transfer_alloc_ms"
        alloc = ((dec["prealloc_s"] - dec["arrival_s"]) * 1000).sum()
        assert _value(got, fam, fam + "_sum", server=f"decode-{i}") == pytest.approx(alloc)
        assert _value(got, fam, fam + "_count", server=f"decode-{i}") == len(dec)


def test_pools_and_copies_per_server(fleet: tuple[Path, Any, dict[str, Any]]) -> None:
    out, _, summary = fleet
    got = _parse(out / "metrics.prom")
    roles = json.loads((out / "config.json").read_text())["roles"]
    conf = json.loads((out / "config.json").read_text())["config"]
    ps = conf["cache"]["page_size"]
    tr = pd.read_parquet(out / "transfers.parquet")
    tr = tr[tr["start_s"] >= summary["warmup_end_s"]]
    for role in ("prefill", "decode"):
        for i in range(2):
            server = f"{role}-{i}"
            pool = _value(got, "sglang:max_total_num_tokens", "sglang:max_total_num_tokens",
                          server=server)  # fmt: skip
            assert pool == roles[role]["device_tokens"]
            host = [s.value for s in got.get("sglang:hicache_host_total_tokens", [])
                    if s.labels["server"] == server]  # fmt: skip
            assert host == ([roles[role]["host_tokens"]] if roles[role]["host_tokens"] else [])
            mine = tr[(tr["role"] == role) & (tr["instance"] == i)]
            backup = int(mine.loc[mine["direction"] == "d2h", "pages"].sum()) * ps
            got_b = [s.value for s in got["sglang:hicache_backup_tokens"]
                     if s.labels["server"] == server]  # fmt: skip
            assert got_b == ([backup] if backup else [])
    assert roles["decode"]["host_tokens"] == 0  # no decode host tier without its radix cache


def test_the_file_is_what_prometheus_client_prints(
    fleet: tuple[Path, Any, dict[str, Any]],
) -> None:
    """Render the same families with prometheus_client: the same text, byte for byte."""
    out, frames, summary = fleet
    cfg = load_config(None, ["pd.enabled=true", "pd.prefill_instances=2",
                             "pd.decode_instances=2"])  # fmt: skip
    roles = json.loads((out / "config.json").read_text())["roles"]
    fams = pd_families(cfg, frames, summary, roles)
    names = [f.name for f in fams]
    assert len(names) == len(set(names))  # each family once, all servers' series in it

    class Same:
        def collect(self) -> Any:
            for f in fams:
                base = f.name[: -len("_total")] if f.type == "counter" else f.name
                m = Metric(base, f.help, f.type)
                for name, labels, value in f.samples:
                    m.add_sample(name, labels, value)
                yield m

    reg = CollectorRegistry()
    reg.register(Same())
    text = render(fams)
    assert text == generate_latest(reg).decode() == (out / "metrics.prom").read_text()
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            assert s.labels.get("server", "").split("-")[0] in ("prefill", "decode"), s


def test_decode_cached_tokens_add_the_decode_prefix(tmp_path: Path) -> None:
    """A prefill server with a small pool and no host tier forgets turn 1 (a 6,144-token
    request between the turns evicts it); the decode radix cache keeps it: turn 2's
    decode server reports the prefill's 0 cached tokens plus its own 2,048-token prefix as
    device (SGLang's prepare_for_prebuilt)."""
    trace = _trace(tmp_path, [(0, 2048, 16, 0), (100_000, 6144, 16, 500),
                              (200_000, 4096, 16, 0)])  # fmt: skip
    _, frames, _ = _run(tmp_path / "run", trace, [
        *BASE, "pd.decode_radix_cache=true",
        "pd.prefill_set=gpu.device_tokens=8192;cache.enable_host=false"])  # fmt: skip
    rows = frames["requests"]
    assert list(frames["prefill"]["requests"]["cached_tokens"]) == [0, 0, 0]
    assert list(rows["decode_device_hit_tokens"] + rows["decode_host_hit_tokens"]) == [0, 0, 2048]
    got = _parse(tmp_path / "run" / "metrics.prom")
    cached = {(s.labels["server"], s.labels["cache_source"]): s.value
              for s in got["sglang:cached_tokens"]}  # fmt: skip
    assert cached == {("decode-0", "device"): 2048.0}
    unc = "sglang:uncached_prompt_tokens_histogram"
    assert _value(got, unc, unc + "_sum", server="decode-0") == 2048 + 6144 + 4096 - 2048
    assert _value(got, unc, unc + "_sum", server="prefill-0") == 2048 + 6144 + 4096


def test_compare_metrics_reads_a_pd_run(fleet: tuple[Path, Any, dict[str, Any]]) -> None:
    """compare-metrics takes one role of the PD run's metrics.prom (against itself as the
    server, from an empty first scrape: every difference 0)."""
    from cli.compare_metrics import compare

    out, _, summary = fleet
    after = out / "metrics.prom"
    before = out.parent / "before.prom"
    lines = after.read_text().splitlines()
    before.write_text("\n".join([*lines[:2], lines[2].rsplit(" ", 1)[0] + " 0.0"]) + "\n")
    for role in ("prefill", "decode"):
        result = compare(out, before, after, engine_type=role)
        by_key = {r["key"]: r for r in result["rows"] if "key" in r}
        assert by_key["requests"]["simulator"] == summary["finished_requests"]  # one role
        assert all(r["difference"] in (0, None) for r in by_key.values())
