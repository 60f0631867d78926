"""``hicache-sim compare-metrics RUN BEFORE.prom AFTER.prom``: the simulator beside a server.

``BEFORE.prom`` and ``AFTER.prom`` are two scrapes of a real SGLang server's ``/metrics``
(``--enable-metrics``), taken just before and just after a benchmark; their difference is
what the benchmark did. ``RUN`` is a run directory of the same trace; its ``metrics.prom``
(:mod:`sim.prom`) holds the same metrics for the simulated server. Both sides go through one
reading: counters summed over their series (``model_name``, ``is_streaming``, ... ignored),
per-rank cache counters read on one TP rank (every rank reports the same count), histograms'
buckets summed and read as Prometheus' ``histogram_quantile`` does. Printed tier by tier,
with simulator - server; ``--json`` for the same as one object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.errors import UserError

#: (key, what it is, unit) in print order; a header line where key is None
ROWS: tuple[tuple[str | None, str, str], ...] = (
    (None, "requests", ""),
    ("requests", "finished requests", "count"),
    ("prompt_tokens", "prompt tokens", "count"),
    ("generation_tokens", "output tokens", "count"),
    (None, "cache, tier by tier (cached_tokens_total by cache_source)", ""),
    ("cached_tokens", "cached tokens, all tiers", "count"),
    ("cached_device", "cached tokens: device", "count"),
    ("cached_host", "cached tokens: host", "count"),
    ("cached_storage", "cached tokens: storage (L3)", "count"),
    ("hit_rate", "hit rate, all tiers", "rate"),
    ("device_hit_rate", "hit rate: device", "rate"),
    ("host_hit_rate", "hit rate: host", "rate"),
    ("storage_hit_rate", "hit rate: storage (L3)", "rate"),
    (None, "latency (histogram buckets, read as histogram_quantile)", ""),
    ("ttft_mean_s", "TTFT mean", "s"),
    ("ttft_p50_s", "TTFT p50", "s"),
    ("ttft_p90_s", "TTFT p90", "s"),
    ("ttft_p99_s", "TTFT p99", "s"),
    ("itl_mean_s", "inter-token latency mean", "s"),
    ("itl_p50_s", "inter-token latency p50", "s"),
    ("itl_p90_s", "inter-token latency p90", "s"),
    ("tpot_mean_s", "TPOT per request mean (0.5.23)", "s"),
    ("tpot_p90_s", "TPOT per request p90 (0.5.23)", "s"),
    ("e2e_mean_s", "e2e latency mean", "s"),
    ("e2e_p50_s", "e2e latency p50", "s"),
    ("e2e_p90_s", "e2e latency p90", "s"),
    (None, "copies", ""),
    ("load_back_tokens", "load-back tokens, host -> device", "count"),
    ("backup_tokens", "backup tokens, device -> host (0.5.23)", "count"),
    ("prefetched_tokens", "L3 prefetched tokens", "count"),
    ("backuped_tokens", "L3 backed-up tokens", "count"),
    (None, "pools (gauges: AFTER's value)", ""),
    ("device_pool_tokens", "device pool tokens (max_total_num_tokens)", "count"),
    ("host_pool_tokens", "host pool tokens (hicache_host_total_tokens)", "count"),
)

#: gauges compared as they are (not differenced)
GAUGES = {
    "sglang:max_total_num_tokens": "device_pool_tokens",
    "sglang:hicache_host_total_tokens": "host_pool_tokens",
}

Key = tuple[str, tuple[tuple[str, str], ...]]


class Scrape:
    """The ``sglang:`` samples of one Prometheus text file: counters and histogram samples
    (``_total``, ``_bucket``, ``_count``, ``_sum``) and gauges, each ``(sample name,
    sorted labels) -> value``; ``_created`` samples are left out."""

    def __init__(self, path: Path) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.path = path
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise UserError(f"{path}: is a directory, not a scrape of /metrics") from None
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: cannot read it: {e}") from None
        self.counters: dict[Key, float] = {}
        self.gauges: dict[Key, float] = {}
        try:
            for fam in text_string_to_metric_families(text):
                if not fam.name.startswith("sglang:"):
                    continue
                for s in fam.samples:
                    if s.name.endswith("_created"):
                        continue
                    key = (s.name, tuple(sorted(s.labels.items())))
                    if fam.type in ("counter", "histogram"):
                        self.counters[key] = float(s.value)
                    elif fam.type == "gauge":
                        self.gauges[key] = float(s.value)
        except ValueError as e:
            raise UserError(f"{path}: not a Prometheus text scrape: {e}") from None
        if not self.counters and not self.gauges:
            raise UserError(
                f"{path}: no SGLang metrics (sglang:...) in it; scrape the /metrics of a "
                "server launched with --enable-metrics"
            )

    def looks_0523(self) -> bool:
        """Whether the scrape has what only 0.5.23 exports (the per-request TPOT, the
        ``is_streaming`` label)."""
        return any(
            n.startswith("sglang:request_time_per_output_token_seconds")
            or any(k == "is_streaming" for k, _ in labels)
            for n, labels in self.counters
        )


def difference(before: Scrape, after: Scrape) -> dict[Key, float]:
    """AFTER - BEFORE for every counter and histogram sample of AFTER (a series BEFORE lacks
    started at 0). A counter that went down, or one BEFORE has and AFTER lacks, means the
    server restarted between them (or the files are swapped): a user error."""
    out: dict[Key, float] = {}
    for key, value in after.counters.items():
        d = value - before.counters.get(key, 0.0)
        if d < 0:
            raise UserError(
                f"{key[0]}{_labels(key[1])} went down from {before.counters[key]:g} in "
                f"{before.path} to {value:g} in {after.path}: AFTER must be scraped after "
                "BEFORE from the same server run (a restart resets the counters)"
            )
        out[key] = d
    gone = [k for k in before.counters if k not in after.counters]
    if gone:
        raise UserError(
            f"{gone[0][0]}{_labels(gone[0][1])} is in {before.path} but not in {after.path}: "
            "the server restarted between the scrapes (or they are swapped)"
        )
    return out


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""


def _series(samples: dict[Key, float], name: str) -> list[tuple[dict[str, str], float]]:
    """The series of sample ``name``; where they carry ``tp_rank``, only the lowest rank's
    (every TP rank reports the same logical count)."""
    items = [(dict(labels), v) for (n, labels), v in samples.items() if n == name]
    ranks = {lab["tp_rank"] for lab, _ in items if "tp_rank" in lab}
    if ranks:
        lo = min(ranks, key=lambda r: (len(r), r))
        items = [(lab, v) for lab, v in items if lab.get("tp_rank", lo) == lo]
    return items


def _sum(samples: dict[Key, float], name: str) -> float | None:
    items = _series(samples, name)
    return sum(v for _, v in items) if items else None


def _hist(samples: dict[Key, float], name: str) -> dict[str, float]:
    """Mean, p50, p90 and p99 of histogram ``name`` (its series' buckets summed); empty when
    the scrape has no observation of it."""
    from sim.prom import histogram_quantile

    buckets: dict[float, float] = {}
    for lab, v in _series(samples, name + "_bucket"):
        le = float(lab["le"])
        buckets[le] = buckets.get(le, 0.0) + v
    count, total = _sum(samples, name + "_count"), _sum(samples, name + "_sum")
    if not count:
        return {}
    pairs = sorted(buckets.items())
    return {
        "mean": (total or 0.0) / count,
        **{f"p{int(q * 100)}": histogram_quantile(q, pairs) for q in (0.5, 0.9, 0.99)},
    }


def quantities(samples: dict[Key, float], gauges: dict[Key, float]) -> dict[str, float | None]:
    """The compared figures of one side (``ROWS``' keys; None: the side does not export it)."""
    out: dict[str, float | None] = {
        "requests": _sum(samples, "sglang:num_requests_total"),
        "prompt_tokens": _sum(samples, "sglang:prompt_tokens_total"),
        "generation_tokens": _sum(samples, "sglang:generation_tokens_total"),
    }
    by_source: dict[str, float] = {"device": 0.0, "host": 0.0, "storage": 0.0}
    cached = _series(samples, "sglang:cached_tokens_total")
    for lab, v in cached:
        src = lab.get("cache_source", "total")
        src = "storage" if src.startswith("storage") else src
        by_source[src] = by_source.get(src, 0.0) + v
    out["cached_tokens"] = sum(by_source.values()) if cached else None
    prompt = out["prompt_tokens"]
    for s in ("device", "host", "storage"):
        out[f"cached_{s}"] = by_source[s] if cached else None
        out[f"{s}_hit_rate"] = by_source[s] / prompt if cached and prompt else None
    out["hit_rate"] = (out["cached_tokens"] or 0.0) / prompt if cached and prompt else None
    for key, name, qs in (
        ("ttft", "sglang:time_to_first_token_seconds", ("mean", "p50", "p90", "p99")),
        ("itl", "sglang:inter_token_latency_seconds", ("mean", "p50", "p90")),
        ("tpot", "sglang:request_time_per_output_token_seconds", ("mean", "p90")),
        ("e2e", "sglang:e2e_request_latency_seconds", ("mean", "p50", "p90")),
    ):
        h = _hist(samples, name)
        for q in qs:
            out[f"{key}_{q}_s"] = h.get(q)
    out["load_back_tokens"] = _sum(samples, "sglang:load_back_tokens_total")
    out["backup_tokens"] = _sum(samples, "sglang:hicache_backup_tokens_total")
    out["prefetched_tokens"] = _sum(samples, "sglang:prefetched_tokens_total")
    out["backuped_tokens"] = _sum(samples, "sglang:backuped_tokens_total")
    for name, key in GAUGES.items():
        out[key] = _sum(gauges, name)
    return out


def _clean(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def only_engine(samples: dict[Key, float], engine_type: str | None) -> dict[Key, float]:
    """The samples of one ``engine_type`` (a PD run's prefill or decode servers); all of them
    when ``engine_type`` is None or no sample carries the label (one server's own scrape)."""
    if engine_type is None:
        return samples
    want = ("engine_type", engine_type)
    if not any(any(k == "engine_type" for k, _ in labels) for _, labels in samples):
        return samples
    return {key: v for key, v in samples.items() if want in key[1]}


def compare(
    run: Path, before_path: Path, after_path: Path, engine_type: str | None = None
) -> dict[str, Any]:
    """The comparison as one object: the run, the versions, and a row per figure
    (``simulator``, ``server``, ``difference`` = simulator - server, ``relative`` =
    difference / server; None where a side lacks the figure). ``engine_type``: which role of
    a PD run (``prefill`` or ``decode``: its servers' series, summed) to set beside the scrapes
    (needed for a PD run, whose metrics.prom holds both roles)."""
    if not run.is_dir():
        raise UserError(f"{run}: not a run directory (hicache-sim run --out DIR)")
    prom = run / "metrics.prom"
    pd_run = _is_pd_run(run)
    if pd_run and engine_type is None:
        raise UserError(
            f"{run}: a prefill/decode (pd.enabled) run: its metrics.prom holds both roles' "
            "servers; say which to compare with --engine-type prefill or --engine-type decode "
            "(and scrape that role's servers)"
        )
    if not pd_run and engine_type is not None:
        raise UserError(f"{run}: --engine-type is for a prefill/decode (pd.enabled) run")
    if not prom.is_file() and pd_run:
        raise UserError(
            f"{run}: a prefill/decode run made before PD runs wrote metrics.prom; run it again"
        )
    if not prom.is_file():
        raise UserError(
            f"{run}: no metrics.prom in this run directory (a run made before metrics.prom "
            "existed, or not a run directory); run it again"
        )
    sim = Scrape(prom)
    before, after = Scrape(before_path), Scrape(after_path)
    delta = only_engine(difference(before, after), engine_type)
    server = quantities(delta, only_engine(after.gauges, engine_type))
    if not server["requests"]:
        raise UserError(
            f"no request finished between {before_path} and {after_path} "
            "(sglang:num_requests_total did not change): scrape before and after the benchmark"
        )
    ours = quantities(only_engine(sim.counters, engine_type), only_engine(sim.gauges, engine_type))
    version = None
    with contextlib.suppress(OSError, ValueError):
        version = json.loads((run / "summary.json").read_text()).get("sglang_version")
    rows: list[dict[str, Any]] = []
    for key, what, unit in ROWS:
        if key is None:
            rows.append({"section": what})
            continue
        a, b = _clean(ours.get(key)), _clean(server.get(key))
        diff = a - b if a is not None and b is not None else None
        rel = diff / b if diff is not None and b else None
        rows.append({"key": key, "what": what, "unit": unit, "simulator": a, "server": b,
                     "difference": diff, "relative": rel})  # fmt: skip
    return {
        "run": str(run),
        "before": str(before_path),
        "after": str(after_path),
        "simulated_sglang_version": version,
        "server_looks_like": "0.5.23" if after.looks_0523() else "0.5.14",
        "rows": rows,
    }


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "rate":
        return f"{100 * x:.1f}%"
    if unit == "s":
        return f"{1e3 * x:,.1f} ms" if abs(x) < 1 else f"{x:,.2f} s"
    return f"{x:,.0f}"


def _fmt_diff(row: dict[str, Any]) -> str:
    d, unit = row["difference"], row["unit"]
    if d is None:
        return "-"
    if unit == "rate":
        return f"{100 * d:+.1f} pt"
    text = f"{1e3 * d:+,.1f} ms" if unit == "s" and abs(d) < 1 else (
        f"{d:+,.2f} s" if unit == "s" else f"{d:+,.0f}"
    )  # fmt: skip
    rel = row["relative"]
    return text + (f" ({100 * rel:+.1f}%)" if rel is not None else "")


def render_text(result: dict[str, Any]) -> str:
    lines = [
        f"compare-metrics: simulator run {result['run']} (SGLang "
        f"{result['simulated_sglang_version'] or '?'}) against the server, {result['before']} "
        f"-> {result['after']} (looks like SGLang {result['server_looks_like']})",
    ]
    if result["simulated_sglang_version"] and (
        result["simulated_sglang_version"] != result["server_looks_like"]
    ):
        lines.append(
            f"note: the run simulated SGLang {result['simulated_sglang_version']}, the scrape "
            f"looks like {result['server_looks_like']} (set sglang.version to match)"
        )
    lines.append(f"{'':48}{'simulator':>14}{'server':>14}  difference")
    for row in result["rows"]:
        if "section" in row:
            lines.append(row["section"])
            continue
        sim_v, srv_v = _fmt(row["simulator"], row["unit"]), _fmt(row["server"], row["unit"])
        lines.append(f"  {row['what']:46}{sim_v:>14}{srv_v:>14}  {_fmt_diff(row)}")
    return "\n".join(lines)


# --- command line ----------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``compare-metrics`` command to an argparse sub-parsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "compare-metrics",
        help="a run beside a real server's /metrics: cached tokens per tier, hit rates, "
        "TTFT/ITL/e2e, copies",
        description="Compare a run directory's metrics.prom with what a real SGLang server "
        "counted over a benchmark: BEFORE.prom and AFTER.prom are its /metrics (started with "
        "--enable-metrics) scraped just before and just after the benchmark (curl -s "
        "http://HOST:PORT/metrics > before.prom). The difference of the two is set beside "
        "the simulator's figures, tier by tier, with simulator - server. The run should "
        "replay the benchmark's requests; its warm-up window (workload.warmup_s) is left out "
        "of metrics.prom, so scrape BEFORE after the server's own warm-up.",
    )
    p.add_argument("run", type=Path, metavar="RUN", help="run directory (hicache-sim run --out)")
    p.add_argument("before", type=Path, metavar="BEFORE.prom", help="scrape before the benchmark")
    p.add_argument("after", type=Path, metavar="AFTER.prom", help="scrape after the benchmark")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument(
        "--engine-type", choices=("prefill", "decode"), default=None,
        help="a prefill/decode run: compare this role's servers (the series labelled "
        "engine_type=ROLE, summed over the role's servers) with scrapes of that role",
    )  # fmt: skip
    p.set_defaults(func=_cmd_compare)
    return p


def _cmd_compare(args: argparse.Namespace) -> int:
    result = compare(args.run, args.before, args.after, args.engine_type)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(render_text(result))
    return 0


def _is_pd_run(run: Path) -> bool:
    """Whether the run directory holds a PD run (its summary has the ``roles`` block)."""
    try:
        return "roles" in json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.compare_metrics RUN BEFORE AFTER``: the command on its own."""
    from cli.errors import run_one_command

    return run_one_command("compare-metrics", register, argv)


if __name__ == "__main__":
    sys.exit(main())
