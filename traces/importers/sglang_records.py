"""SGLang's per-request records, shared by the request-log (``--from sglang-log``) and the
request-dump (``--from sglang-dump``) importers.

Both sources record, for each finished request, the request object SGLang's tokenizer
manager received (a ``GenerateReqInput``: ``rid``, ``input_ids`` or ``text``,
``sampling_params``, ``session_params``, ``priority``; 0.5.23 adds ``session_id``) and the
answer it sent (``out``: ``output_ids`` and ``meta_info`` with ``prompt_tokens``,
``completion_tokens``, ``e2e_latency``, ``response_sent_to_client_ts`` and, with
``--enable-metrics``, ``request_received_ts``). `RequestRecord` is that pair in plain data;
`records_to_rows` turns records into `ImportedRow`s: the prompt's token ids (sessions
rebuilt as SGLang's session controller builds them), the arrival and the output length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.importers.common import ImportedRow, is_number
from traces.schema import TraceError

#: Why a prompt's ids are missing from a level-2 log (lists over 2048 entries are logged
#: as their first and last 1024, strings as their first and last 1024 characters).
TRUNCATED = (
    "truncated by SGLang (--log-requests-level 2 logs a list or string over 2048 entries "
    "as its first and last 1024); log with --log-requests-level 3"
)


class Truncated:
    """Stands for a value SGLang logged truncated (``[...] ... [...]``)."""

    def __repr__(self) -> str:
        return "<truncated>"


TRUNCATED_VALUE = Truncated()


@dataclass(slots=True)
class RequestRecord:
    """One finished request as SGLang recorded it, in plain data.

    `obj` holds the request's fields by name (``input_ids``, ``rid``, ...), `out` the answer
    (``output_ids``, ``meta_info``); `received_s` a recorded arrival (unix seconds) from the
    source itself (the dump's ``created_time``; a log's "Receive" line, in `received_kind`
    ``"log-iso"`` or ``"log-seconds"``); `finished_s` the source's finish time (a dump's
    ``finished_time``, a log line's time). `line` locates it for errors (a log line, a
    dump's 1-based request index)."""

    obj: dict[str, Any]
    out: dict[str, Any]
    line: int
    path: Path
    received_s: float | None = None
    received_kind: str | None = None
    finished_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _meta(rec: RequestRecord) -> dict[str, Any]:
    meta = rec.out.get("meta_info")
    return meta if isinstance(meta, dict) else {}


def _num(d: dict[str, Any], key: str) -> float | None:
    v: Any = d.get(key)
    return float(v) if is_number(v) else None


def _arrivals(rec: RequestRecord) -> dict[str, float]:
    meta = _meta(rec)
    out: dict[str, float] = {}
    received = _num(meta, "request_received_ts")
    if received is not None:
        out["meta_info.request_received_ts"] = received
    sent, e2e = _num(meta, "response_sent_to_client_ts"), _num(meta, "e2e_latency")
    if sent is not None and e2e is not None:
        out["meta_info.response_sent_to_client_ts - e2e_latency"] = sent - e2e
    if rec.received_s is not None and rec.received_kind is not None:
        out[rec.received_kind] = rec.received_s
    if rec.finished_s is not None and e2e is not None:
        out["finish line time - e2e_latency"] = rec.finished_s - e2e
    return out


#: Arrival sources, best first.
ARRIVAL_ORDER = (
    "meta_info.request_received_ts",
    "dump created_time",
    "meta_info.response_sent_to_client_ts - e2e_latency",
    "receive line timestamp",
    "receive line time (seconds)",
    "finish line time - e2e_latency",
)


def choose_arrival_source(records: list[RequestRecord]) -> str | None:
    """The best arrival source every record has (one source for all: log times are local
    time, SGLang's ``*_ts`` unix time), or None when no single source covers them all."""
    have = [set(_arrivals(r)) for r in records]
    for name in ARRIVAL_ORDER:
        if all(name in h for h in have):
            return name
    return None


def _ids(value: object, path: Path, line: int, name: str) -> list[int] | None:
    if value is None:
        return None
    if value is TRUNCATED_VALUE or (isinstance(value, list) and "..." in value):
        raise TraceError(path, line, name, TRUNCATED)
    if not isinstance(value, list) or not all(type(x) is int and x >= 0 for x in value):
        raise TraceError(path, line, name, f"expected a list of token ids, got {value!r:.60}")
    return value


def output_length(rec: RequestRecord) -> int:
    """``meta_info.completion_tokens``, else the number of ``output_ids``."""
    meta = _meta(rec)
    n = meta.get("completion_tokens")
    if type(n) is int and n >= 0:
        return n
    ids = rec.out.get("output_ids")
    if isinstance(ids, list) and "..." not in ids:
        return len(ids)
    raise TraceError(
        rec.path,
        rec.line,
        "out.meta_info.completion_tokens",
        "missing (and no output_ids): the output length is unknown",
    )


def session_of(obj: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The request's session: ``session_params.id`` (SGLang sessions: the prompt is built
    from the session's history), else ``session_id`` (0.5.23) or ``conversation_id`` (a
    label only). Returns (session, session_params or None)."""
    params = obj.get("session_params")
    if isinstance(params, list) and len(params) == 1:  # a batch of one
        params = params[0]
    if isinstance(params, dict) and isinstance(params.get("id"), str):
        return params["id"], params
    for key in ("session_id", "conversation_id"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value, None
    return None, None


@dataclass(slots=True)
class _Done:
    prompt: list[int]
    output: list[int] | None
    max_new: int | None


def _session_prompt(
    rec: RequestRecord,
    params: dict[str, Any],
    new: list[int],
    history: dict[str, list[_Done]],
    by_rid: dict[str, _Done],
) -> list[int]:
    """The prompt SGLang's session controller builds (``Session.create_req``,
    ``_concat_token_arrays``): the parent's prompt + its output (cut at its max_new_tokens;
    none with ``drop_previous_output``), cut at ``offset`` if given, + the new ids; a
    leading BOS of the new ids is stripped (``_strip_bos_token``): a new prompt one token
    longer than ``meta_info.prompt_tokens`` loses its first token."""
    sid = params["id"]
    prid = params.get("rid")
    parent = by_rid.get(prid) if isinstance(prid, str) else None
    if parent is None and isinstance(prid, str):
        raise TraceError(
            rec.path, rec.line, "session_params.rid", f"{prid!r} is not an earlier request"
        )
    if parent is None and history.get(sid):
        parent = history[sid][-1]
    if parent is None:
        return new
    if parent.output is None and not params.get("drop_previous_output"):
        raise TraceError(
            rec.path,
            rec.line,
            "session_params",
            "the previous turn's output_ids are not in the source (needed to rebuild the "
            "session's prompt); log with --log-requests-level 3",
        )
    context = list(parent.prompt)
    if not params.get("drop_previous_output"):
        tail = parent.output or []
        context += tail[: parent.max_new] if parent.max_new is not None else tail
    offset = params.get("offset")
    if type(offset) is int and offset != 0:
        context = context[:offset]
    want = _meta(rec).get("prompt_tokens")
    if type(want) is int and len(context) + len(new) == want + 1 and new:
        new = new[1:]  # the BOS SGLang strips from an appended turn
    prompt = context + new
    if type(want) is int and len(prompt) != want:
        raise TraceError(
            rec.path,
            rec.line,
            "session_params",
            f"rebuilt session prompt has {len(prompt)} tokens, SGLang's prompt_tokens says {want}",
        )
    return prompt


def records_to_rows(
    records: list[RequestRecord],
    *,
    tokenize: Callable[[str], list[int]] | None,
    on_error: Callable[[TraceError], None],
) -> tuple[list[ImportedRow], str]:
    """Rows of the finished requests (see the module docstring) and the arrival source
    used. `tokenize` encodes a prompt sent as text (None: such a request is an error);
    `on_error` gets each bad record's error (raise it, or count it and go on)."""
    if not records:
        return [], ""
    source = choose_arrival_source(records)
    if source is None:
        bad = next(r for r in records if not _arrivals(r))
        raise TraceError(
            bad.path,
            bad.line,
            "out.meta_info",
            "no arrival time: needs request_received_ts (--enable-metrics), "
            "response_sent_to_client_ts and e2e_latency, or the request's Receive line",
        )
    timed = sorted(records, key=lambda r: _arrivals(r)[source])
    history: dict[str, list[_Done]] = {}
    by_rid: dict[str, _Done] = {}
    rows: list[ImportedRow] = []
    for rec in timed:
        try:
            rows.append(_row(rec, source, tokenize, history, by_rid))
        except TraceError as err:
            on_error(err)
    return rows, source


def _row(
    rec: RequestRecord,
    source: str,
    tokenize: Callable[[str], list[int]] | None,
    history: dict[str, list[_Done]],
    by_rid: dict[str, _Done],
) -> ImportedRow:
    obj = rec.obj
    ids = _ids(obj.get("input_ids"), rec.path, rec.line, "obj.input_ids")
    if ids is None:
        text = obj.get("text")
        if text is TRUNCATED_VALUE:
            raise TraceError(rec.path, rec.line, "obj.text", TRUNCATED)
        if not isinstance(text, str):
            raise TraceError(
                rec.path,
                rec.line,
                "obj.input_ids",
                "neither input_ids nor a text prompt recorded (log at --log-requests-level 2 "
                "or 3; image/embedding inputs are not supported)",
            )
        if tokenize is None:
            raise TraceError(
                rec.path,
                rec.line,
                "obj.text",
                "the request was sent as text (no input_ids): give --tokenizer (the model's "
                "tokenizer.json) to tokenize it as SGLang does",
            )
        ids = tokenize(text)
    session, params = session_of(obj)
    prompt = ids
    if params is not None:
        prompt = _session_prompt(rec, params, ids, history, by_rid)
    if not prompt:
        raise TraceError(rec.path, rec.line, "obj.input_ids", "empty prompt")
    n_out = output_length(rec)
    out_ids = rec.out.get("output_ids")
    sampling = obj.get("sampling_params")
    max_new = sampling.get("max_new_tokens") if isinstance(sampling, dict) else None
    done = _Done(
        prompt,
        out_ids if isinstance(out_ids, list) and "..." not in out_ids else None,
        max_new if type(max_new) is int else None,
    )
    rid = obj.get("rid") if isinstance(obj.get("rid"), str) else _meta(rec).get("id")
    if isinstance(rid, str):
        by_rid[rid] = done
    if session is not None:
        history.setdefault(session, []).append(done)
    e2e = _num(_meta(rec), "e2e_latency")
    priority = obj.get("priority")
    return ImportedRow(
        time_ms=_arrivals(rec)[source] * 1000.0,
        input_length=len(prompt),
        output_length=n_out,
        line=rec.line,
        token_ids=prompt,
        session=session,
        latency_ms=e2e * 1000.0 if e2e is not None else None,
        rid=rid if isinstance(rid, str) else None,
        priority=priority if type(priority) is int else None,
    )


def text_tokenizer(tokenizer: Path | None) -> Callable[[str], list[int]] | None:
    """Encode text as SGLang's tokenizer manager does (special tokens added: the BOS),
    with the user's ``tokenizer.json``; None without one."""
    if tokenizer is None:
        return None
    from traces.importers.textkeys import Tokenize, tokenizer_files

    tok = Tokenize(tokenizer_files(tokenizer)[0])
    raw = tok._tok  # the same tokenizers object, encoding with special tokens

    def encode(text: str) -> list[int]:
        return list(raw.encode(text, add_special_tokens=True).ids)

    return encode
