"""A server's context limit applied to a trace, as SGLang applies ``--context-length`` and
``--allow-auto-truncate`` to the requests it receives.

SGLang (0.5.14 and 0.5.23 alike) derives two limits from the context length ``C`` and the KV
pool's size in tokens ``kv`` (``tp_worker.py``: 0.5.23 :568-572)::

    max_req_len       = min(C - 1, kv - 1)
    max_req_input_len = max_req_len - 5

A prompt of ``max_req_input_len`` tokens or more is aborted (``validate_input_length``,
``managers/utils.py:258-285``), or with ``--allow-auto-truncate`` cut to its first
``max_req_input_len`` tokens (the head is kept, so what it shares with other prompts stays
shared). Then a request's output is capped at ``max_req_len - input - 1`` tokens
(``init_req_max_new_tokens``, ``scheduler.py:2693-2716``). (The tokenizer's own check against
``C`` is implied: ``max_req_input_len < C``.)

:func:`apply_context_limit` returns the trace with the truncations and caps done and the
indices of the requests the server would abort, which the simulator records as rejected.
Standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from traces.schema import Request, Trace

#: ``max_req_input_len = max_req_len - 5`` (SGLang's margin below the request limit)
INPUT_MARGIN = 5


class ContextLimit(NamedTuple):
    """SGLang's two limits for one server."""

    max_req_len: int
    max_req_input_len: int

    @classmethod
    def of(cls, context_length: int, kv_tokens: int) -> ContextLimit:
        """The limits of a server with ``context_length`` (0: none, only the pool bounds
        them) and a KV pool of ``kv_tokens``."""
        caps = [kv_tokens - 1] + ([context_length - 1] if context_length > 0 else [])
        max_req_len = min(caps)
        return cls(max_req_len, max_req_len - INPUT_MARGIN)


class Limited(NamedTuple):
    """What :func:`apply_context_limit` made of a trace."""

    trace: Trace
    aborted: frozenset[int]
    """Indices of the requests SGLang aborts (prompt too long, no auto-truncate)."""
    truncated: int
    capped: int
    """Requests whose prompt was cut / whose output was capped."""


def _truncated(r: Request, n: int, block_size: int) -> Request:
    """``r`` with its prompt cut to its first ``n`` tokens."""
    tokens = None if r.token_ids is None else r.token_ids[:n]
    hashes = None if r.hash_ids is None else r.hash_ids[: -(-n // block_size)]
    return dataclasses.replace(r, input_length=n, token_ids=tokens, hash_ids=hashes)


def apply_context_limit(trace: Trace, limit: ContextLimit, truncate: bool) -> Limited:
    """``trace`` as a server with ``limit`` receives it (module docstring): prompts at or above
    ``max_req_input_len`` cut to it when ``truncate``, else listed in ``aborted`` (left as
    they are); every other request's output capped at ``max_req_len - input - 1``."""
    out, aborted, truncated, capped = [], set(), 0, 0
    bs = trace.block_size
    for i, r in enumerate(trace.requests):
        if r.input_length >= limit.max_req_input_len:
            if not truncate:
                aborted.add(i)
                out.append(r)
                continue
            r = _truncated(r, limit.max_req_input_len, bs)
            truncated += 1
        room = limit.max_req_len - r.input_length - 1
        if r.output_length > room:
            r = dataclasses.replace(r, output_length=room)
            capped += 1
        out.append(r)
    return Limited(dataclasses.replace(trace, requests=out), frozenset(aborted), truncated, capped)


__all__ = ["INPUT_MARGIN", "ContextLimit", "Limited", "apply_context_limit"]
