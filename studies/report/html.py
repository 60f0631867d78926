"""The report as HTML: the figures (inline SVG, their data as JSON scripts, their numbers),
the comparison table with the best values highlighted, the configurations and the sweeps.
One self-contained document, no external resources."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from studies.report.canvas import ReportFigure
from studies.report.derive import best_cells, comparison_columns, comparison_table, warmup_note
from studies.report.derive_pd import (
    PD_PARTS,
    link_totals,
    pd_runs,
    role_rows,
    role_tables,
    ttft_parts,
)
from studies.report.figures_storage import defect_rows
from studies.report.fmt import integer
from studies.report.load import ReportData, config_key_order

if TYPE_CHECKING:
    import pandas as pd


def _html_table(df: pd.DataFrame, best: Mapping[str, set[str]] | None = None, cls: str = "") -> str:
    """A DataFrame as an HTML table (cells already formatted as text; index as first column
    when named). Cells listed in ``best`` (column -> index labels) get class ``best``."""
    best = best or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    index = df.index.name is not None
    if index:
        head = f"<th>{html.escape(str(df.index.name))}</th>" + head
    body = []
    for label, row in df.iterrows():
        cells = [f'<th scope="row">{html.escape(str(label))}</th>'] if index else []
        for c in df.columns:
            mark = ' class="best" title="best"' if str(label) in best.get(str(c), ()) else ""
            cells.append(f"<td{mark}>{html.escape(str(row[c]))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


#: Rows of a figure's table shown at once; the rest fold into a ``<details>`` below it.
NUMBERS_ROWS = 12

#: The comparison's columns in tables (by :data:`~studies.report.derive.COMPARISON` key),
#: each narrow enough for a 1,400 px page: the cache and TTFT, then the rest, then (with an
#: L3 tier) the prefetch wait and the store's traffic. Columns that do not apply are left out.
COMPARISON_PARTS = (
    ("device_tokens", "host_tokens", "hit_rate", "device_hit_rate", "host_hit_rate",
     "storage_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s"),
    ("tpot_mean_s", "e2e_mean_s", "queue_mean_s", "throughput_output_tok_s", "gb_d2h",
     "gb_h2d", "write_amplification", "retractions", "rejected_requests"),
    ("prefetch_wait_mean_s", "gb_l3_read", "gb_l3_written"),
)  # fmt: skip


def _numbers_html(df: pd.DataFrame) -> str:
    """A figure's table: the first :data:`NUMBERS_ROWS` rows, the others folded below."""
    if len(df) <= NUMBERS_ROWS + 2:  # folding away one or two rows would only hide them
        return _html_table(df)
    rest = len(df) - NUMBERS_ROWS
    return (
        _html_table(df.iloc[:NUMBERS_ROWS])
        + f'<details class="more"><summary>the other {rest} rows</summary>'
        + _html_table(df.iloc[NUMBERS_ROWS:])
        + "</details>"
    )


def _comparison_html(data: ReportData) -> str:
    """The comparison tables (:data:`COMPARISON_PARTS`), formatted, best cells marked."""
    import pandas as pd

    raw = comparison_table(data)
    best = best_cells(raw)
    columns = comparison_columns(data)
    shown = pd.DataFrame(
        {title: [fmt(v) for v in raw[key]] for title, key, fmt, _ in columns},
        index=pd.Index(raw.index, name="run"),
    )
    by_title = {title: best[key] for title, key, _, _ in columns if key in best}
    titles = {key: title for title, key, _, _ in columns}
    parts = [[titles[k] for k in keys if k in titles] for keys in COMPARISON_PARTS]
    return "".join(_html_table(shown[p], by_title, "comparison") for p in parts if p)


def defects_title(data: ReportData) -> str:
    """The section's title: the releases of the runs (0.5.14's defects, or the one 0.5.23
    still has)."""
    versions = sorted({_release(r.summary) for r in data.runs})
    return f"SGLang {' and '.join(versions)} defects this trace would hit"


def _release(summary: dict[str, Any]) -> str:
    return str(summary.get("sglang_version") or "0.5.14")


#: What the section says about 0.5.23 (the one defect it still has is reproduced).
DEFECTS_INTRO_0523 = (
    "SGLang 0.5.23 fixed the 0.5.14 defects below on the dense path but one, which the "
    "simulator reproduces, as SGLang behaves, and counts: B6, under write_back a request whose "
    "deepest match is an unbacked device node issues no L3 prefetch."
)
#: What the defects section says about the simulator itself.
DEFECTS_INTRO = (
    "SGLang 0.5.14 has defects (summary.json's sglang_defects lists them) that this simulator does "
    "not reproduce where they would crash the server, corrupt the KV pools or misreport hits: "
    "the simulator itself stays consistent, does what each row's 'here:' says "
    "instead, and counts every time a run reaches such a point. A row is a defect this trace "
    "would hit on a real SGLang 0.5.14 server with that run's configuration: how often, and "
    "the tokens involved. D7 (prefetch keys chained from a misaligned anchor) is the "
    "exception: it only loses hits, so it is reproduced, and counted with the tokens it cost."
)


def _defects_html(data: ReportData) -> str | None:
    """The defects section's body: the intro, then a table of the nonzero counters, or one
    line saying none were hit; None when no run records defect counters (old runs)."""
    import pandas as pd

    rows = defect_rows(data)
    if rows is None:
        return None
    releases = {_release(r.summary) for r in data.runs}
    parts = []
    if "0.5.14" in releases:
        parts.append(f"<p>{html.escape(DEFECTS_INTRO)}</p>")
    if releases - {"0.5.14"}:
        parts.append(f"<p>{html.escape(DEFECTS_INTRO_0523)}</p>")
    uncounted = [r for r in data.runs if not isinstance(r.summary.get("sglang_defects"), dict)]
    older = sum(1 for r in uncounted if not r.is_pd)
    pd_runs_ = len(uncounted) - older
    if not rows:
        counted = []
        if "0.5.14" in releases:
            counted.append("0.5.14: D1-D10 with an L3 tier, L2LB always")
        if releases - {"0.5.14"}:
            counted.append("0.5.23: B6 with an L3 tier")
        parts.append(
            '<p class="none-hit">None were hit: no run reached any of the defects the '
            f"simulator counts ({'; '.join(counted)}).</p>"
        )
    else:
        t = pd.DataFrame(
            {
                "run": [r["run"] for r in rows],
                "count": [integer(r["count"]) for r in rows],
                "tokens": [integer(r["tokens"]) for r in rows],
                "what SGLang does (0.5.14 rows: here, what the simulator does instead)": [
                    r["what"] for r in rows
                ],
            },
            index=pd.Index([r["code"] for r in rows], name="code"),
        )
        parts.append(f'<div class="wide">{_html_table(t, cls="defects")}</div>')
    parts.append(_json_script("sglang-defects", {"rows": rows}))
    if pd_runs_:
        parts.append(
            f"<p>{pd_runs_} PD run(s) are not included: a PD run does not count these defects "
            "yet.</p>"
        )
    if older:
        parts.append(
            f"<p>{older} run(s) were written before the simulator counted these defects and "
            "are not included.</p>"
        )
    return "".join(parts)


#: What the per-role section says first.
PD_INTRO = (
    "A PD run (pd.enabled) splits each request between a prefill server and a decode server: "
    "the decode server pre-allocates its KV pages (its prealloc queue), the prefill server "
    "takes it after the bootstrap (its bootstrap queue, then its waiting queue), prefills it "
    "with its HiCache and sends the KV over its link; the decode server merges it and "
    "decodes. One row per PD run, from summary.json's roles block and requests.parquet; hit "
    "rates on the prefill side are its HiCache's, on the decode side its radix cache's "
    "(pd.decode_radix_cache; 'off' without it), whose prefix the prefill server does not "
    "send (the bytes saved). Link busy: the share of the run each prefill server's KV link "
    "was sending."
)


def _pd_html(data: ReportData) -> str | None:
    """The per-role section of the PD runs (:func:`~studies.report.derive_pd.role_tables`)
    with their raw rows as JSON (``data-figure="pd-roles"``); None without PD runs."""
    tables = role_tables(data)
    if not tables:
        return None
    parts = [f"<p>{html.escape(PD_INTRO)}</p>"]
    for title, df in tables:
        parts.append(
            f"<h3>{html.escape(title)}</h3>"
            f'<div class="wide">{_html_table(df, cls="comparison")}</div>'
        )
    parts.append(_json_script("pd-roles", {"rows": [role_rows(r) for r in pd_runs(data)]}))
    return "".join(parts)


def pd_verdict_lines(data: ReportData, most: int = 3) -> list[str]:
    """A line per PD run (at most ``most``): its TTFT, the step that takes most of it, how
    busy its KV links were, and its TPOT."""
    lines = []
    for r in pd_runs(data)[:most]:
        parts = ttft_parts(r)
        ttft = parts["ttft"]
        if ttft != ttft:  # no finished request
            continue
        step = max((p for p, _, _ in PD_PARTS), key=lambda p: parts[p])
        share = parts[step] / ttft if ttft else 0.0
        busy = link_totals(r)["busy_mean"]
        lines.append(
            f"PD {r.label}: TTFT mean {_seconds(ttft)}, most of it {step} "
            f"({_seconds(parts[step])}, {share:.0%}); KV links busy {busy:.1%} of the time; "
            f"TPOT {_seconds(parts['tpot'])}."
        )
    return lines


def _config_html(data: ReportData) -> str:
    """What all runs share, the traces, what differs, and each run's config.json."""
    import pandas as pd

    keys = config_key_order()
    flat0 = data.runs[0].config
    common = [(k, flat0[k]) for k in keys if k in flat0 and k not in data.varying]
    parts = ["<h3>Shared by all runs</h3>"]
    traces = sorted(
        {(str(r.conf.get("trace")), str(r.conf.get("trace_sha256"))) for r in data.runs}
    )
    t = pd.DataFrame(
        {"value": [_show(v) for _, v in common]}, index=pd.Index([k for k, _ in common], name="key")
    )
    parts.append(_html_table(t, cls="config"))
    parts.append("<h3>Traces</h3>")
    parts.append(
        _html_table(
            pd.DataFrame(
                {"sha256": [s for _, s in traces]},
                index=pd.Index([p for p, _ in traces], name="trace"),
            )
        )
    )
    if data.varying:
        parts.append("<h3>What differs</h3>")
        cols = [k for k in data.varying if k != "trace"]
        v = pd.DataFrame(
            {
                **{k: [_show(r.config.get(k)) for r in data.runs] for k in cols},
                "HBM pool [tokens]": [integer(r.device_tokens) for r in data.runs],
                "host pool [tokens]": [integer(r.host_tokens) for r in data.runs],
                "directory": [r.shown for r in data.runs],
            },
            index=pd.Index([r.label for r in data.runs], name="run"),
        )
        if "trace" in data.varying:
            v.insert(0, "trace", [str(r.conf.get("trace")) for r in data.runs])
        parts.append(f'<div class="wide">{_html_table(v, cls="config differs")}</div>')
    parts.append("<h3>Each run's config.json</h3>")
    for r in data.runs:
        text = json.dumps(r.conf, indent=1, sort_keys=True)
        parts.append(
            f"<details><summary>{html.escape(r.label)} — {html.escape(r.shown)}"
            f"</summary><pre>{html.escape(text)}</pre></details>"
        )
    return "\n".join(parts)


def verdict_lines(data: ReportData) -> list[str]:
    """The report's first lines, the answer before the figures: the highest hit rate (with its
    device / host / L3 split), the lowest TTFT p90, HiCache against no host tier where both
    were run on the same trace, and the overloaded runs (whose latencies are not a steady
    state)."""
    runs = [r for r in data.runs if r.summary.get("requests")]
    if not runs:
        return []

    def p90(r: Any) -> float:
        v = r.summary.get("ttft_p90_s")
        return float(v) if isinstance(v, int | float) and v == v else float("inf")

    def split(r: Any) -> str:
        s = r.summary
        out = f"device {s.get('device_hit_rate', 0):.1%}, host {s.get('host_hit_rate', 0):.1%}"
        return out + (f", L3 {s['storage_hit_rate']:.1%}" if s.get("storage_hit_rate") else "")

    hit = max(runs, key=lambda r: r.summary.get("hit_rate", 0.0))
    fast = min(runs, key=p90)
    lines = [
        f"Highest hit rate: {hit.label}, {hit.summary.get('hit_rate', 0):.1%} of prompt tokens "
        f"from cache ({split(hit)}).",
        f"Lowest TTFT p90: {fast.label}, {_seconds(p90(fast))}.",
    ]
    trace = {r.conf.get("trace_sha256") for r in runs}
    plain = [r for r in runs if not r.config.get("cache.enable_host", True)]
    tiered = [r for r in runs if r.config.get("cache.enable_host", True)]
    if plain and tiered and len(trace) == 1:
        a, b = min(plain, key=p90), min(tiered, key=p90)
        lines.append(
            f"HiCache against no host tier: hit rate {a.summary.get('hit_rate', 0):.1%} -> "
            f"{b.summary.get('hit_rate', 0):.1%}, TTFT p90 {_seconds(p90(a))} -> "
            f"{_seconds(p90(b))} ({a.label} against {b.label})."
        )
    lines += pd_verdict_lines(data)
    over = [r.label for r in runs if r.summary.get("overloaded")]
    if over:
        shown = ", ".join(over[:6]) + (", ..." if len(over) > 6 else "")
        lines.append(
            f"Overloaded ({len(over)} of {len(runs)}): {shown}: the server could not keep up, "
            "so their latencies grow with the trace's length; compare them with care."
        )
    return lines


def _seconds(v: float) -> str:
    if v == float("inf") or v != v:
        return "n/a"
    if v < 0.01:
        return f"{v * 1e3:.1f} ms"
    if v < 1:
        return f"{v * 1e3:.0f} ms"
    return f"{v:.2f} s" if v < 600 else f"{v / 60:.1f} min"


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _sweeps_html(data: ReportData) -> str:
    """Per sweep: its description, jobs finished and failed (with errors), its grid file."""
    import pandas as pd

    parts = []
    for s in data.sweeps:
        res = s.results
        failed = res[res["status"] != "ok"]
        ok = int((res["status"] == "ok").sum())
        desc = f"<p>{html.escape(s.description)}</p>" if s.description else ""
        parts.append(
            f"<h3>{html.escape(s.name)} <small>({html.escape(s.shown)})</small></h3>"
            f"{desc}<p>{len(res)} jobs: {ok} finished, {len(failed)} failed.</p>"
        )
        if len(failed):
            t = pd.DataFrame(
                {
                    "status": failed["status"].astype(str).tolist(),
                    "error": [str(e) for e in failed["error"]],
                },
                index=pd.Index(failed["job"].astype(str).tolist(), name="job"),
            )
            parts.append(_html_table(t, cls="failed"))
        if s.grid_text:
            parts.append(
                f"<details><summary>grid file</summary><pre>{html.escape(s.grid_text)}"
                "</pre></details>"
            )
    return "\n".join(parts)


# --- the document ----------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1500px;padding:1rem 1.5rem;color:#222;line-height:1.4}
h1{font-size:1.6rem;margin:.2rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:1px solid #ddd}h3{font-size:1.05rem}
nav a{margin-right:1rem;white-space:nowrap}
.row{display:flex;flex-wrap:wrap;gap:1rem 1.5rem;align-items:flex-start}
figure{flex:0 1 auto;margin:0;min-width:0;max-width:100%}
figure svg{display:block;width:100%;height:auto}
figcaption{font-size:.9rem;color:#444;margin-top:.3rem;max-width:60rem}
.numbers{flex:0 1 auto;min-width:0;max-width:100%;overflow-x:auto}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4rem .7rem;max-width:60rem}
table{border-collapse:collapse;font-size:.82rem;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.2rem .45rem;text-align:right;white-space:nowrap}
th{background:#f4f4f4}thead th{white-space:normal;vertical-align:bottom}
tbody th{text-align:left;font-weight:normal;white-space:normal;min-width:9rem}
td.best{background:#c8efd2;font-weight:600}
tbody td:first-child{text-align:left}
table.comparison{margin-bottom:.8rem}table.comparison tbody th{white-space:nowrap}
table.differs td:last-child{white-space:normal;overflow-wrap:anywhere;text-align:left;
min-width:16rem}
table.defects td:last-child{white-space:normal;text-align:left;min-width:30rem}
table.defects td:nth-child(2),table.defects thead th{text-align:left}
details.more{margin-top:.4rem}details.more summary{cursor:pointer;color:#1a5fb4}
.wide{overflow-x:auto}pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;font-size:.8rem}
small{color:#666;font-weight:normal}
"""


def _json_script(fig_id: str, payload: Any) -> str:
    text = json.dumps(_clean(payload), sort_keys=True, separators=(",", ":"), allow_nan=False)
    text = text.replace("</", "<\\/")  # never closes the script element
    return (
        f'<script type="application/json" class="figure-data" data-figure="{fig_id}">'
        f"{text}</script>"
    )


def _clean(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, numpy scalars -> Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if hasattr(x, "item"):
        return _clean(x.item())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def render_html(
    data: ReportData,
    figures: Sequence[ReportFigure],
    title: str,
    extra: Sequence[tuple[str, str, str]] = (),
) -> str:
    """The report as one HTML document (no external resources); ``extra``: ``(id, title, HTML
    body)`` of sections placed after the figures."""
    from hicache import __version__

    pd_body = _pd_html(data)
    nav = '<a href="#pd-roles">PD: per role</a> ' if pd_body is not None else ""
    nav += " ".join(f'<a href="#{f.id}">{html.escape(f.title)}</a>' for f in figures)
    for sid, stitle, _ in extra:
        nav += f' <a href="#{sid}">{html.escape(stitle)}</a>'
    defects = _defects_html(data)
    if defects is not None:
        nav += f' <a href="#sglang-defects">{html.escape(defects_title(data))}</a>'
    nav += ' <a href="#comparison">Comparison</a> <a href="#configs">Configurations</a>'
    inputs = sorted({r.sweep or r.shown for r in data.runs})
    sections = []
    for f in figures:
        note = f'<p class="note">{html.escape(f.note)}</p>' if f.note else ""
        sections.append(
            f'<section id="{f.id}"><h2>{html.escape(f.title)}</h2>{note}<div class="row">'
            f'<figure style="width:{f.width_px}px">{f.to_svg()}'
            f"<figcaption>{html.escape(f.caption)}</figcaption></figure>"
            f'<div class="numbers">{_numbers_html(f.numbers)}</div></div>'
            f"{_json_script(f.id, f.data)}</section>"
        )
    for sid, stitle, body_html in extra:
        sections.append(f'<section id="{sid}"><h2>{html.escape(stitle)}</h2>{body_html}</section>')
    sweeps = _sweeps_html(data)
    versions = ", ".join(sorted({str(r.conf.get("version", "?")) for r in data.runs}))
    warmup = warmup_note(data)
    body = [
        f"<header><h1>{html.escape(title)}</h1>",
        f"<p>{len(data.runs)} runs from {html.escape(', '.join(inputs))}. Simulated with "
        f"hicache-sim {html.escape(versions)}"
        f"; report by hicache-sim {__version__}.</p>",
        *([f'<p class="note" id="warmup">{html.escape(warmup)}</p>'] if warmup else []),
        (
            '<section id="verdict"><h2>Verdict</h2><ul>'
            + "".join(f"<li>{html.escape(line)}</li>" for line in verdict_lines(data))
            + "</ul></section>"
        ),
        f"<nav>{nav}</nav></header>",
        *(
            [f'<section id="pd-roles"><h2>PD runs: per role</h2>{pd_body}</section>']
            if pd_body is not None
            else []
        ),
        *sections,
        *(
            [
                f'<section id="sglang-defects"><h2>{html.escape(defects_title(data))}</h2>'
                f"{defects}</section>"
            ]
            if defects is not None
            else []
        ),
        '<section id="comparison"><h2>Comparison</h2><p>One row per run, in two tables (cache '
        "and TTFT, then the rest; with an L3 tier a third: the prefetch wait and the store's "
        "traffic); the best value of each metric is highlighted (highest hit "
        "rates and throughput, lowest latencies, write amplification, retractions and "
        "rejections).</p>"
        f'<div class="wide">{_comparison_html(data)}</div></section>',
        f'<section id="configs"><h2>Configurations</h2>{_config_html(data)}'
        + (f"<h3>Sweeps</h3>{sweeps}" if sweeps else "")
        + "</section>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
