"""What upgrading SGLang changes: the same setups run under two ``sglang.version`` values, side by
side (hit rate per tier, and TTFT for timed runs), with one line per big difference and the
cause SGLang's code gives for it (``../shared/design/SGLANG_0523.md``).

Used by ``hicache-sim demo`` (terminal, report.md, report.html); any pair of summaries with a
``setup`` and an ``sglang_version`` works.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

#: A difference worth a line: a hit rate (a fraction) that moves by at least HIT_POINTS, or
#: by at least HIT_FLOOR when that is HIT_RELATIVE of the larger of the two (a small tier that
#: loses most of its hits)...
HIT_POINTS = 0.005
HIT_FLOOR = 0.001
HIT_RELATIVE = 0.25
#: ...or a TTFT mean / p90 that moves by at least this fraction.
TTFT_FRACTION = 0.05

#: Why a tier's hit rate moves between 0.5.14 and 0.5.23, per write policy (the decisions
#: that changed, SGLANG_0523.md's behaviour table).
CAUSES: dict[str, str] = {
    "write_through_selective": (
        "0.5.23 counts hits by a per-request inserted-length watermark, so a request no longer "
        "counts its own second insert and fewer nodes reach the 2 hits selective backs up at"
    ),
    "write_back": (
        "0.5.23 backs up and demotes one victim at a time, drops a subtree the host cannot take "
        "and reclaims host duplicates before evicting host leaves"
    ),
    "write_through": (
        "0.5.23 backs up unbacked ancestors with the node and evicts only the shortfall"
    ),
}
TTFT_CAUSE = (
    "the hit rates above, 0.5.23's shortfall-only eviction and its device->host writes merged "
    "into one copy per scheduler step"
)

COLUMNS = ("setup", "version", "hit", "device", "host", "TTFT mean", "TTFT p90")
#: Rows without TTFT (the cache-only replay) leave those two columns out.
CACHE_ONLY_COLUMNS = COLUMNS[:5]


def _pct(x: float) -> str:
    return f"{x:.2%}"


def _pairs(
    old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each setup of ``old`` with its twin in ``new`` (same ``setup``), in ``old``'s order."""
    by_setup = {r["setup"]: r for r in new}
    return [(a, by_setup[a["setup"]]) for a in old if a["setup"] in by_setup]


def upgrade_rows(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Table rows (:data:`COLUMNS`): each setup of ``old`` then its twin in ``new`` (matched
    by ``setup``), formatted."""
    out = []
    for a, b in _pairs(old, new):
        for r in (a, b):
            row = [str(r["setup"]), str(r["sglang_version"]), _pct(r["hit_rate"]),
                   _pct(r["device_hit_rate"]), _pct(r["host_hit_rate"])]  # fmt: skip
            if "ttft_mean_s" in r:
                row += [f"{r['ttft_mean_s']:.2f} s", f"{r['ttft_p90_s']:.2f} s"]
            out.append(row)
    return out


def _columns(old: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    return COLUMNS if old and "ttft_mean_s" in old[0] else CACHE_ONLY_COLUMNS


def big_differences(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[str]:
    """One line per big difference (:data:`HIT_POINTS`, :data:`HIT_RELATIVE`,
    :data:`TTFT_FRACTION`) between each
    setup of ``old`` and its twin in ``new``, with its cause; a line saying there is none
    otherwise."""
    lines = []
    for a, b in _pairs(old, new):
        setup, va, vb = a["setup"], a["sglang_version"], b["sglang_version"]
        for key, tier in (("device_hit_rate", "device"), ("host_hit_rate", "host")):
            d = b[key] - a[key]
            big = abs(d) >= HIT_POINTS
            if not big and abs(d) >= HIT_FLOOR:
                big = abs(d) >= HIT_RELATIVE * max(a[key], b[key])
            if big:
                policy = a.get("write_policy") or setup
                cause = CAUSES.get(policy, "the changed cache decisions (SGLANG_0523.md)")
                lines.append(
                    f"{setup}: {tier} hit rate {_pct(a[key])} ({va}) -> {_pct(b[key])} ({vb}), "
                    f"{d * 100:+.1f} points: {cause}"
                )
        for key, what in (("ttft_mean_s", "TTFT mean"), ("ttft_p90_s", "TTFT p90")):
            if key not in a or key not in b:
                continue  # a cache-only row: no timing
            base = a[key]
            if base > 0 and abs(b[key] - base) / base >= TTFT_FRACTION:
                lines.append(
                    f"{setup}: {what} {base:.2f} s ({va}) -> {b[key]:.2f} s ({vb}), "
                    f"{(b[key] - base) / base:+.0%}: {TTFT_CAUSE}"
                )
    if not lines:
        lines.append(
            f"no difference above {HIT_POINTS * 100:.1f} hit-rate points (or "
            f"{HIT_RELATIVE:.0%} of a tier's hits) or {TTFT_FRACTION:.0%} TTFT here"
        )
    return lines


def format_upgrade(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> str:
    """The comparison as text: the table, then the big differences."""
    cols = _columns(old)
    rows = [list(cols), *upgrade_rows(old, new)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    text = [" ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(text + big_differences(old, new))


def upgrade_html(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> str:
    """The comparison as an HTML fragment (a table and a list), for the report."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _columns(old))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
        for r in upgrade_rows(old, new)
    )
    items = "".join(f"<li>{html.escape(x)}</li>" for x in big_differences(old, new))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table><ul>{items}</ul>"


__all__ = ["big_differences", "format_upgrade", "upgrade_html", "upgrade_rows"]
