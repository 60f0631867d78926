"""The device check's summary: the figures against the replay issue's targets
(:data:`TARGETS`), what each stage produced, ``summary.json`` and ``summary.md``
(:func:`format_check`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from replay.calibrate import Calibration
    from replay.check.stages import Stages
    from replay.runtime import Runtime

#: the issue's targets: name -> (limit, comparison)
TARGETS = {
    "bench_median_err": (0.05, "<="),
    "replay_median_err": (0.10, "<="),
    "large_op_fraction_of_peak": (0.90, ">="),
}


def _met(value: float, limit: float, op: str) -> bool:
    return value <= limit if op == "<=" else value >= limit


def check_figures(bench_err: dict[str, Any], replays: dict[str, Any]) -> dict[str, float]:
    """The figures :data:`TARGETS` judge, from the bench-op errors and the replays' summaries
    (NaN for what a failed stage did not measure)."""
    nan = float("nan")
    return {
        "bench_median_err": bench_err.get("all", {}).get("median", nan),
        # the worse backend; a backend whose replay failed counts as missed
        "replay_median_err": max(
            (
                replays[b].get("error", {}).get("all", {}).get("median", nan)
                if b in replays
                else nan
                for b in ("direct", "kernel")
            ),
            key=lambda v: math.inf if math.isnan(v) else v,
        ),
        # contiguous large ops of the direct backend: plain copies, the ones that can
        # reach the peak (fragmented ones pay per-run costs by design)
        "large_op_fraction_of_peak": min(
            (
                v["fraction_of_peak"]
                for v in replays.get("direct", {}).get("large_contiguous_ops", {}).values()
            ),
            default=nan,
        ),
    }


def target_checks(figures: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each figure with its target's limit and comparison and whether it is met (NaN: not)."""
    return {
        k: {
            "value": v,
            "limit": TARGETS[k][0],
            "op": TARGETS[k][1],
            "met": bool(_met(v, *TARGETS[k])),
        }
        for k, v in figures.items()
    }


def build_summary(
    *,
    rt: Runtime,
    info: dict[str, str],
    gpu: str,
    link: str,
    out: Path,
    benched: tuple[pd.DataFrame, dict[str, Any]] | None,
    calibrated: tuple[Calibration, dict[str, Any]] | None,
    replays: dict[str, Any],
    flush_bytes: int,
    stages: Stages,
    t_all: float,
) -> dict[str, Any]:
    """The summary of a check (what ``summary.json`` holds): the machine, the profile, the
    bench's prediction errors, the fits, each replay's figures, the targets, each stage's
    seconds and the stages that failed. ``benched``, ``calibrated``: None when that stage did
    not finish; ``t_all``: when the check began (``time.perf_counter``)."""
    cal, bench_err = calibrated if calibrated is not None else (None, {})
    return {
        "device": rt.kind,
        "machine": info,
        "gpu_preset": gpu,
        "link": link,
        "profile": str(out / "profile.json"),
        "profile_measured": bool(cal is not None and cal.profile.measured),
        "bench_rows": len(benched[0]) if benched is not None else 0,
        "bench_s": stages.seconds.get("bench", float("nan")),
        "bench_error": bench_err,
        "fits": (
            {b: {d: f.describe() for d, f in by.items()} for b, by in cal.fits.items()}
            if cal is not None
            else {}
        ),
        "eta": {d: e[0] for d, e in cal.eta.items()} if cal is not None else {},
        "replay": {
            b: {
                "error": r.get("error"),
                "large_ops": r.get("large_ops"),
                "large_contiguous_ops": r.get("large_contiguous_ops"),
                "issue_share": r.get("issue_share"),
                "count": r.get("count"),
                "cache": r["cache"],
                "notes": r["notes"],
            }
            for b, r in replays.items()
        },
        "targets": target_checks(check_figures(bench_err, replays)),
        "targets_apply": rt.kind == "cuda",
        "runtime_notes": list(rt.notes),
        "flush_bytes": flush_bytes,
        "stage_s": stages.seconds,
        "errors": stages.errors,
        "wall_s": time.perf_counter() - t_all,
    }


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """``out/summary.json`` and ``out/summary.md`` (:func:`format_check`), also printed."""
    from replay.outputs import write_json, write_text

    write_json(summary, out / "summary.json")
    text = format_check(summary)
    write_text(text + "\n", out / "summary.md")
    print(text)


def format_check(s: dict[str, Any]) -> str:
    """The summary as Markdown-ish text (what ``summary.md`` holds)."""
    lines = [
        f"# device check: {s['machine'].get('gpu_name')} ({s['device']}), {s['wall_s']:.0f} s",
        "",
        f"profile: {s['profile']} (gpu {s['gpu_preset']}, link {s['link']}, "
        f"measured={s['profile_measured']})",
        "",
        "| target | value | limit | met |",
        "| --- | ---: | ---: | --- |",
    ]
    for k, c in s["targets"].items():
        pct = f"{c['value']:.1%}"
        lines.append(
            f"| {k} | {pct} | {c['op']} {c['limit']:.0%} | {'yes' if c['met'] else 'NO'} |"
        )
    if not s["targets_apply"]:
        lines += ["", "CPU run: these are GPU targets; the figures only show the pipeline works."]
    if s.get("errors"):
        lines += ["", "FAILED stages (their figures are NaN; tracebacks on stderr):"]
        lines += [f"- {k}: {v}" for k, v in s["errors"].items()]
    if s.get("stage_s"):
        lines += ["", "stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in s["stage_s"].items())]
    lines += ["", "bench op prediction |rel err| (median / p90):"]
    for k, e in s["bench_error"].items():
        lines.append(f"- {k}: {e['median']:.1%} / {e['p90']:.1%} (n={e['n']})")
    lines += ["", "replay:"]
    for b, r in s["replay"].items():
        lines += _replay_lines(b, r)
    lines += ["", "fits:"]
    for b, by in s["fits"].items():
        for d, text in by.items():
            lines.append(f"- {b} {d}: {text}")
    if s["device"] == "cuda" and "calibrate" not in s.get("errors", {}):
        gpu = s["gpu_preset"]
        lines += [
            "",
            f"commit: cp {Path(s['profile']).parent / (gpu + '-measured.json')} "
            f"hicache/profiles/{gpu}-measured.json",
        ]
    return "\n".join(lines)


def _replay_lines(b: str, r: dict[str, Any]) -> list[str]:
    """The summary lines of backend ``b``'s replay ``r`` (its entry in ``summary["replay"]``)."""
    lines = []
    e = (r.get("error") or {}).get("all", {})
    if e.get("n"):
        lines.append(
            f"- {b}: op |rel err| median {e['median']:.1%}, p90 {e['p90']:.1%} "
            f"(n={e['n']}), hit rate {r['cache']['hit_rate']:.1%}"
        )
    if r.get("count"):
        lines.append(
            f"  - ops: {r['count'].get('write', 0)} writes, {r['count'].get('load', 0)} loads"
        )
    if r.get("issue_share"):
        i = r["issue_share"]
        lines.append(
            f"  - issuing thread busy a median {i['median']:.0%} of an op's time; "
            f"{i['issue_bound_fraction']:.0%} of ops issue-bound"
        )
    for key in ("large_ops", "large_contiguous_ops"):
        for d, v in (r.get(key) or {}).items():
            lines.append(
                f"  - {d} {v['selection']} (n={v['n']}): {v['median_Bps'] / 1e9:.2f} GB/s"
                f" = {v['fraction_of_peak']:.0%} of peak {v['peak_Bps'] / 1e9:.2f} GB/s"
            )
    return lines


__all__ = [
    "TARGETS",
    "build_summary",
    "check_figures",
    "format_check",
    "target_checks",
    "write_summary",
]
