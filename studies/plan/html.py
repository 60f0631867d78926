"""The plan as a self-contained HTML page (``plan.html``): the trace and setups (model, GPU,
TP, server), the targets, what the host tier saves (like for like), the notes (targets out of
reach, best values reached, idle instances), the table of configurations and the planning
figure (inline SVG), readable offline."""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from studies.plan import Plan

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2rem;max-width:1200px;color:#222}"
    "table{border-collapse:collapse;margin:1rem 0}td,th{padding:.25rem .6rem;"
    "border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child"
    "{text-align:left}th{background:#f4f4f4}figure{margin:1rem 0}svg{max-width:100%;"
    "height:auto}.note{color:#555}"
)


def _cell(key: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if key.endswith("hit_rate"):
        return f"{value:.1%}"
    if key.endswith("_s"):
        return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def plan_html(plan: Plan) -> str:
    """The page (a string); deterministic for a given plan."""
    from studies.plan.figure import plot_plan

    cols = ["configuration", "instances", "gpus", "servers", "gpu_hours",
            *(["cost_usd"] if plan.gpu_hour_usd > 0 else []), "host_dram_gb_per_instance",
            "hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate",
            *(t.key for t in plan.targets)]  # fmt: skip
    names = {"gpus": "GPUs", "gpu_hours": "GPU-hours", "cost_usd": "cost [$]",
             "host_dram_gb_per_instance": "host DRAM / instance [GB]",
             "hit_rate": "hit rate", "device_hit_rate": "device hits",
             "host_hit_rate": "host hits", "storage_hit_rate": "L3 hits",
             **{t.key: t.key.removesuffix("_s") for t in plan.targets}}  # fmt: skip
    head = "".join(f"<th>{html.escape(names.get(c, c))}</th>" for c in cols)
    body = []
    for r in plan.rows():
        cells = []
        for c in cols:
            v = r[c]
            text = f"&gt; {plan.max_instances}" if c == "instances" and v is None else None
            if r["instances"] is None and c in {t.key for t in plan.targets}:
                text = f"({html.escape(_cell(c, r[f'{c}_best']))} best)"
            elif r.get(f"{c}_lo") is not None:  # --seeds: the median and its interval
                shown = f"{_cell(c, v)} [{_cell(c, r[f'{c}_lo'])} – {_cell(c, r[f'{c}_hi'])}]"
                text = html.escape(shown)
            cells.append(f"<td>{text or html.escape(_cell(c, v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    targets = ", ".join(t.label for t in plan.targets)
    if plan.slo is not None:
        targets += f"; goodput counts requests with {plan.slo.label}"
    if plan.seeds > 1:
        targets += (f"; each judged on the median of {plan.seeds} seeds (sessions resampled), "
                    "in brackets the 5th-95th percentile")  # fmt: skip
    savings = "".join(f"<li>{html.escape(s)}</li>" for s in _savings(plan))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan.notes())
    setups = "".join(
        f"<li>{html.escape(s)}</li>" for s in dict.fromkeys(c.config.setup for c in plan.configs)
    )
    trace = f"Trace <code>{html.escape(plan.trace)}</code>. " if plan.trace else ""
    svg = plot_plan(plan, fmt="svg").decode()
    svg = svg[svg.index("<svg") :]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>hicache-sim plan</title><style>{_STYLE}</style></head><body>"
        "<h1>Capacity plan</h1>"
        f"<p>{trace}Setups:</p><ul>{setups}</ul>"
        f"<p>Targets: {html.escape(targets)}, and not overloaded. Smallest number of instances "
        f"that meets them, searched up to {plan.max_instances} (doubling, then bisection).</p>"
        f"<h2>What HiCache saves (like for like)</h2><ul>{savings}</ul>"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        '<p class="note">GPU-hours: instances × model.tp × the trace\'s arrival span; servers: '
        "instances placed whole on gpu.server's GPUs. A missed target shows the best value any "
        "evaluated N reached. The figures rest on the simulator's timing profile "
        "(FIDELITY.md).</p>"
        f"<figure>{svg}</figure></body></html>\n"
    )


def _savings(plan: Plan) -> list[str]:
    from studies.plan import savings_lines

    return savings_lines(plan, plan.gpu_hour_usd) or [
        "no configuration without a host tier to compare against"
    ]
