"""The symbols of a request's output pages when the next turn of its session sends them back
(``workload.output_reuse = "next_turn"``).

SGLang's ``cache_finished_req`` inserts prompt + outputs (its ``kv_committed_len``: every
token but the last output, whose KV is never computed). A chat client sends the answer back as
part of the next turn's prompt (SGLang's ``bench_multiturn`` appends it to the history; agents
append it before the tool result), so the next turn matches the answer's KV as well as the
prompt's, on a real server. A trace records each prompt's blocks, not the outputs, so the
simulator gives output pages symbols of their own (``hicache.lifecycle.extend_page_key``:
unique negative ints that no prompt can hit) unless told otherwise.

With ``next_turn`` a request's output pages take the symbols of its session's next prompt at
the same positions: pages ``own .. full - 1``, ``own`` = the request's full prompt pages and
``full`` = the full pages of its committed KV (``input + output - 1`` tokens). Only where the
trace shows the next prompt extends this one: it is at least that long and its first ``own``
pages are this prompt's (else the output keeps its own symbols). What this assumes, and the
trace cannot show: that the tokens right after the prompt in the next turn are this turn's
output (re-tokenised identically), as in the generators' multi-turn and agentic traces
(``traces.generate``: a turn is the previous prompt, its output, then new tokens). A session's
turns are ordered as the closed-loop replay orders them: by ``turn``, then by trace order.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from hicache.config.sections import OUTPUT_REUSE_MODES

if TYPE_CHECKING:
    from traces.schema import Trace


def next_turns(trace: Trace, limit: int = 0) -> dict[int, int]:
    """Request index -> the index of its session's next turn, over the first ``limit``
    requests (0: all), as the closed-loop replay orders a session's turns."""
    reqs = trace.requests[: limit or None]
    sessions: dict[str, list[int]] = {}
    for i, r in enumerate(reqs):
        if r.session_id is not None:
            sessions.setdefault(r.session_id, []).append(i)
    out: dict[int, int] = {}
    for turns in sessions.values():
        turns.sort(key=lambda j: (reqs[j].turn or 0, j))
        out.update(itertools.pairwise(turns))
    return out


def output_keys(trace: Trace, page_size: int, limit: int = 0) -> Callable[[int], list[Hashable]]:
    """Builds request ``rid``'s output page symbols (see the module docstring; an empty list:
    its outputs keep symbols of their own). The list is new (the caller may grow it)."""
    from traces.keys import page_symbols

    reqs, bs = trace.requests, trace.block_size
    nxt = next_turns(trace, limit)

    def build(rid: int) -> list[Hashable]:
        j = nxt.get(rid)
        if j is None:
            return []
        r = reqs[rid]
        own = r.input_length // page_size
        full = (r.input_length + max(1, r.output_length) - 1) // page_size
        if full <= own:
            return []
        later = page_symbols(reqs[j], page_size, bs)
        if len(later) < own or later[:own] != page_symbols(r, page_size, bs):
            return []  # the next prompt does not extend this one
        return list(later[own:full])

    return build


__all__ = [
    "OUTPUT_REUSE_MODES",
    "infinite_capacity_hit_rate_reusing_outputs",
    "next_turns",
    "no_output_keys",
    "output_keys",
    "output_keys_for",
]


def no_output_keys(rid: int) -> list[Hashable]:
    """``output_reuse = "none"``: every request's outputs keep symbols of their own."""
    del rid
    return []


def output_keys_for(
    mode: str, trace: Trace, page_size: int, limit: int = 0
) -> Callable[[int], list[Hashable]]:
    """The builder ``workload.output_reuse`` names."""
    if mode == "next_turn":
        return output_keys(trace, page_size, limit)
    if mode not in OUTPUT_REUSE_MODES:
        raise ValueError(f"unknown output_reuse mode {mode!r}")
    return no_output_keys


def infinite_capacity_hit_rate_reusing_outputs(
    trace: Trace, page_size: int, limit: int = 0
) -> float:
    """``traces.stats.infinite_capacity_hit_rate`` when outputs are reused (``next_turn``): an
    infinite cache that never evicts and holds every earlier request's prompt *and* output
    pages (:func:`output_keys`). Each request matches its first ``(L - 1) // page_size`` prompt
    pages against what earlier requests left; the result is the cached tokens over the prompt
    tokens, as there. Pages are keyed by their whole prefix (chained hashes)."""
    from traces.keys import page_symbols

    reqs, bs = trace.requests[: limit or None], trace.block_size
    outs = output_keys(trace, page_size, limit)
    seen: set[int] = set()
    cached = total = 0
    for i, r in enumerate(reqs):
        syms = page_symbols(r, page_size, bs)
        total += r.input_length
        limit_pages = max(0, (r.input_length - 1) // page_size)
        last, hit = 0, 0
        for sym in syms[:limit_pages]:
            last = hash((last, sym))
            if last not in seen:
                break
            hit += 1
        cached += hit * page_size
        last = 0
        for sym in [*syms, *outs(i)]:
            last = hash((last, sym))
            seen.add(last)
    return cached / total if total else 0.0
