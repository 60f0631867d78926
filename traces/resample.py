"""Resampled copies of a trace for repeated runs (``hicache-sim run --seeds K``).

:func:`resample_sessions` keeps every session whole and every request exactly once, and
permutes the sessions' start offsets: session *s* starts where session *pi(s)* started in the
trace, and its turns keep their offsets from its start, their think times and their prompts.
(A session drawn so late that it would end after the trace does starts early enough to end
with it: the replica spans the recorded time.) So the replicas differ in which users overlap
in time (what the cache sees as competition and reuse distance), not in which users there
are. A trace without session ids (Mooncake's) has
its conversations recovered from the prefix hash ids (:func:`session_groups`), so that a
follow-up turn moves with the turn it follows instead of landing before it.

Why a permutation and not a bootstrap (sessions drawn with replacement): two copies of one
session would share its private prefix blocks (the same hash ids), so the copy would hit
the cache its twin filled, which two independent users never do; telling private blocks from
shared ones (a system prompt) needs a guess per trace, and for a ``token_ids`` trace there is
no sound way to give a copy fresh tokens. A permutation changes no prompt, keeps the request
count, the token totals and all sharing between sessions exactly as recorded, and so also
keeps ``workload.max_requests`` meaning the same requests.

Standard library only.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from traces.schema import Request, Trace

#: what ``summary.json`` records as the resampling behind ``--seeds``
RESAMPLE_METHOD = "session start offsets permuted (seed 0: the trace as recorded)"


def session_groups(requests: Sequence[Request], *, infer: bool = True) -> list[list[int]]:
    """The indices of each session's requests, sessions in order of their first request.

    Requests with a ``session_id`` group by it. One without (a Mooncake trace has none) is a
    session of its own unless ``infer`` links it to the conversation it continues: with
    Mooncake's prefix hash ids a block id names the whole prefix up to it, so a prompt that
    contains an earlier session-less prompt's last full block (``hash_ids[-2]``) extends that
    prompt; the link is made only when that block was new in the earlier prompt (its own
    content, not a prefix shared by everyone such as a system prompt) and each prompt is
    continued at most once (the latest continuation claims it), so unrelated users that
    share a system prompt stay apart. A ``token_ids`` request is never linked (its ids name
    tokens, not prefixes).
    """
    groups: dict[str, list[int]] = {}
    out: list[list[int]] = []
    owner: dict[int, list[int]] = {}  # a prompt's own last full block -> its conversation
    seen: set[int] = set()
    for i, r in enumerate(requests):
        if r.session_id is not None:
            group = groups.get(r.session_id)
            if group is None:
                group = groups[r.session_id] = []
                out.append(group)
            group.append(i)
            continue
        ids = r.hash_ids if infer else None
        if not ids:
            out.append([i])
            continue
        found = None
        for block in reversed(ids):  # the longest earlier prompt this one extends
            found = owner.pop(block, None)
            if found is not None:
                break
        if found is None:
            found = [i]
            out.append(found)
        else:
            found.append(i)
        if len(ids) >= 2 and ids[-2] not in seen:
            owner[ids[-2]] = found
        seen.update(ids)
    return out


def resample_sessions(trace: Trace, seed: int) -> Trace:
    """``trace`` with its sessions' start offsets permuted by ``random.Random(seed)``; seed 0
    returns ``trace`` itself (so replica 0 of ``--seeds`` is the plain run).

    A session's start is its earliest timestamp; it takes another session's start, moved
    earlier if it would otherwise end after the trace's last timestamp (so the replica spans
    the same time and its run is as long), and each of its requests moves by the same amount
    (offsets from the session start, turns and ``think_time_ms`` unchanged). The
    requests come back sorted by the new timestamps (ties in the original order), so the
    result reads like a recorded trace; the earliest start stays the earliest, so the first
    arrival (time 0 of a run) does not move. The header gains ``resampled: {"seed": ...}``.
    """
    if seed == 0:
        return trace
    reqs = list(trace.requests)
    groups = session_groups(reqs)
    starts = [min(reqs[i].timestamp for i in g) for g in groups]
    ends = [max(reqs[i].timestamp for i in g) for g in groups]
    last = max(ends, default=0.0)
    offsets = list(starts)
    random.Random(seed).shuffle(offsets)
    moved: list[tuple[float, int, Request]] = []
    for group, start, end, drawn in zip(groups, starts, ends, offsets, strict=True):
        # a long session drawn late starts early enough to end within the trace's span
        new = min(drawn, last - (end - start))
        for i in group:
            r = reqs[i]
            t = new + (r.timestamp - start)
            moved.append((t, i, dataclasses.replace(r, timestamp=t)))
    moved.sort(key=lambda m: (m[0], m[1]))
    extra = {**trace.header.extra, "resampled": {"seed": seed, "method": RESAMPLE_METHOD}}
    header = dataclasses.replace(trace.header, extra=extra)
    return Trace(requests=[m[2] for m in moved], header=header, path=trace.path)


__all__ = ["RESAMPLE_METHOD", "resample_sessions", "session_groups"]
