"""The advice as a self-contained page (``advise.html``): the verdicts first, one line each,
then each answer with what backs it, then the figures as JSON; readable offline."""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from studies.advise import Advice

__all__ = ["advice_html", "advice_text"]

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222;"
    "line-height:1.45}table{border-collapse:collapse;width:100%}td,th{padding:.45rem .6rem;"
    "border-bottom:1px solid #ddd;vertical-align:top;text-align:left}th{background:#f4f4f4}"
    "td.v{font-weight:600;white-space:nowrap}.yes{color:#11722f}.no{color:#a1260d}"
    ".b{color:#666;font-size:.9em}pre{background:#f7f7f7;padding:.8rem;overflow:auto}"
)


def _cls(verdict: str) -> str:
    return {"yes": "yes", "faster": "yes", "no": "no", "slower": "no"}.get(verdict, "")


def advice_text(advice: Advice) -> str:
    """The terminal page: the setup, then one block per question."""
    lines = [f"setup: {advice.setup}", ""]
    for a in advice.answers:
        lead = f" [{a.verdict}]" if a.verdict else ""
        lines += [f"{a.question}{lead}", f"  {a.answer}", f"  (from: {a.backing})", ""]
    return "\n".join(lines).rstrip()


def advice_html(advice: Advice, title: str) -> str:
    """The page (a string); deterministic for given advice."""
    rows = "".join(
        f'<tr><th>{html.escape(a.question)}</th><td class="v {_cls(a.verdict)}">'
        f'{html.escape(a.verdict)}</td><td>{html.escape(a.answer)}<div class="b">from: '
        f"{html.escape(a.backing)}</div></td></tr>"
        for a in advice.answers
    )
    facts = json.dumps(advice.facts, indent=1, sort_keys=True, default=str)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(advice.setup)}</p>"
        f"<table><thead><tr><th>question</th><th>verdict</th><th>answer, and what backs it"
        f"</th></tr></thead><tbody>{rows}</tbody></table>"
        '<p class="b">Every figure is the simulator\'s (cache-only replays and timed runs of '
        "this trace; FIDELITY.md says how far its times hold). The questions are those SGLang "
        "operators ask (REFERENCES.md §U).</p>"
        f"<details><summary>The figures behind the answers (JSON)</summary><pre>"
        f"{html.escape(facts)}</pre></details></body></html>\n"
    )
