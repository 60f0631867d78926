"""SGLang request logs (``--log-requests``; ``--from sglang-log``).

SGLang's ``RequestLogger`` (``sglang/srt/utils/request_logger.py``, the same in 0.5.14 and
0.5.23) writes two lines per request to stdout or to ``--log-requests-target`` folders,
each through a logger formatted ``[%Y-%m-%d %H:%M:%S] message``
(``sglang/srt/utils/log_utils.py``):

* ``--log-requests-format text`` (default): ``Receive: obj=GenerateReqInput(rid='..',
  ..., input_ids=[...], ...)`` when a request arrives and ``Finish: obj=GenerateReqInput(
  ...), out={'text': .., 'output_ids': [...], 'meta_info': {...}}`` when it finishes;
  values are Python reprs (``_dataclass_to_string_truncated``);
* ``--log-requests-format json``: one JSON object per line (``log_json``), ``{"timestamp":
  ISO time, "event": "request.received" | "request.finished", "rid", "obj": {...}, "out":
  {...}}`` after the same ``[...]`` prefix.

Only ``--log-requests-level`` 2 and 3 log ``input_ids``; level 2 cuts lists and strings
over 2048 entries to their first and last 1024 (such a request is an error here: log at
level 3). The requests are the Finish lines (see `traces.importers.sglang_records` for what
each field becomes); Receive lines give arrival times where the answer carries none. Other
lines (the server's own log) are skipped; a request line that cannot be parsed is an error
naming its line.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from traces.importers.common import finish_trace, open_text, skip_or_raise
from traces.importers.sglang_records import (
    TRUNCATED_VALUE,
    RequestRecord,
    records_to_rows,
    text_tokenizer,
)
from traces.schema import Trace, TraceError

#: ``[2025-06-01 10:00:00] Receive: obj=`` / ``Finish: obj=`` / a JSON object.
_LINE = re.compile(
    r"\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] "
    r"(?:(?P<kind>Receive|Finish): obj=|(?P<json>\{\"timestamp\"))"
)
_INT_LIST = re.compile(r"\[[0-9, ]*\]")
_SPECIAL = re.compile(r"[\[\](){}'\",]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: How many lines `looks_like_log` reads.
SNIFF_LINES = 200


class _Unparsed(str):
    """A value logged with ``str()`` that is no Python literal (kept as its text)."""


def looks_like_log(path: Path) -> bool:
    """True if one of the first `SNIFF_LINES` lines of a text file is a request-log line."""
    try:
        with open_text(path) as f:
            for _, text in zip(range(SNIFF_LINES), f, strict=False):
                m = _LINE.search(text)
                if m and (m.group("kind") or '"event": "request.' in text):
                    return True
    except (TraceError, UnicodeDecodeError, OSError):
        return False
    return False


class _ReprError(ValueError):
    pass


def _skip_string(s: str, i: int) -> int:
    """Index after the quoted string starting at s[i]."""
    q = s[i]
    k = i + 1
    n = len(s)
    while k < n:
        c = s[k]
        if c == "\\":
            k += 2
            continue
        if c == q:
            return k + 1
        k += 1
    raise _ReprError("unterminated string")


def _items(s: str, i: int, closer: str | None) -> tuple[list[str], int]:
    """Split s[i:] at top-level commas up to `closer` (or the end of s); returns the item
    texts (stripped) and the index after the closer."""
    items: list[str] = []
    depth = 0
    start = i
    n = len(s)
    k = i
    while True:
        m = _SPECIAL.search(s, k)
        if m is None:
            if closer is not None or depth:
                raise _ReprError(f"missing {closer!r}")
            tail = s[start:].strip()
            if tail:
                items.append(tail)
            return items, n
        k = m.start()
        c = s[k]
        if c in "'\"":
            k = _skip_string(s, k)
        elif c == "[" and (fast := _INT_LIST.match(s, k)):
            k = fast.end()
        elif c in "([{":
            depth += 1
            k += 1
        elif c in ")]}":
            if depth == 0:
                if c != closer:
                    raise _ReprError(f"unbalanced {c!r}")
                tail = s[start:k].strip()
                if tail:
                    items.append(tail)
                return items, k + 1
            depth -= 1
            k += 1
        else:  # ","
            if depth == 0:
                items.append(s[start:k].strip())
                start = k + 1
            k += 1


def _value(text: str) -> Any:
    """A logged value: a Python literal, a dataclass repr (a dict of its fields), a dict
    with some non-literal values, `TRUNCATED_VALUE` or `_Unparsed` text."""
    if _INT_LIST.fullmatch(text):
        inner = text[1:-1].strip()
        return [int(x) for x in inner.split(",")] if inner else []
    if " ... " in text:
        parts, _ = _items(text.replace(" ... ", ", ", 1), 0, None)
        if len(parts) == 2 and parts[0][:1] == parts[1][:1] and parts[0][:1] in "['\"(":
            return TRUNCATED_VALUE
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    if text.startswith("{"):
        return _dict(text)
    m = _NAME.match(text)
    if m and text[m.end() : m.end() + 1] == "(" and text.endswith(")"):
        return _record(text, m.end() + 1)[0]
    return _Unparsed(text)


def _dict(text: str) -> dict[Any, Any]:
    items, end = _items(text, 1, "}")
    if end != len(text):
        raise _ReprError("text after a dict")
    out: dict[Any, Any] = {}
    for item in items:
        if item[:1] in "'\"":
            k = _skip_string(item, 0)
            key: Any = ast.literal_eval(item[:k])
        else:
            k = item.find(":")
            if k < 0:
                raise _ReprError("dict item without ':'")
            key = item[:k]
        rest = item[k:].lstrip()
        if not rest.startswith(":"):
            raise _ReprError("dict item without ':'")
        out[key] = _value(rest[1:].strip())
    return out


def _fields(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        m = _NAME.match(item)
        if m is None or item[m.end() : m.end() + 1] != "=":
            raise _ReprError(f"expected name=value, got {item[:40]!r}")
        out[m.group()] = _value(item[m.end() + 1 :])
    return out


def _record(s: str, i: int) -> tuple[dict[str, Any], int]:
    """The fields of the dataclass repr whose '(' ends at s[i-1]; and the index after ')'."""
    items, end = _items(s, i, ")")
    return _fields(items), end


def parse_text_line(s: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(obj fields, out) of the text after ``Receive: obj=`` / ``Finish: obj=``."""
    m = _NAME.match(s)
    if m is None or s[m.end() : m.end() + 1] != "(":
        raise _ReprError("expected obj=GenerateReqInput(...)")
    obj, end = _record(s, m.end() + 1)
    rest = s[end:].strip()
    tail: dict[str, Any] = {}
    if rest:
        if not rest.startswith(","):
            raise _ReprError("text after the request object")
        items, _ = _items(rest, 1, None)
        tail = _fields(items)
    out = tail.get("out")
    return obj, out if isinstance(out, dict) else {}


def _truncated_text(value: object) -> object:
    # the JSON format cuts a string over 2048 characters to data[:1024] + "..." + data[-1024:]
    if isinstance(value, str) and len(value) == 2051 and value[1024:1027] == "...":
        return TRUNCATED_VALUE
    return value


def _local_seconds(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def read_sglang_log(
    path: Path, *, tokenizer: Path | None, block_size: int, lenient: bool = False
) -> Trace:
    """Import an SGLang request log (see the module docstring)."""
    trace = Trace(requests=[], path=path)
    received: dict[str, tuple[float, str]] = {}
    finished: list[RequestRecord] = []
    formats: set[str] = set()
    line_no = 0
    with open_text(path) as f:
        while True:
            try:
                text = f.readline()
            except (UnicodeDecodeError, OSError) as exc:
                raise TraceError(path, line_no + 1, "line", f"cannot read: {exc}") from None
            if not text:
                break
            line_no += 1
            m = _LINE.search(text)
            if m is None:
                continue
            try:
                rec = _parse(path, line_no, text, m, received, formats)
            except TraceError as err:
                skip_or_raise(trace, err, lenient)
                continue
            if rec is not None:
                finished.append(rec)
    if not finished:
        raise TraceError(
            path,
            0,
            "file",
            "no SGLang request-log Finish lines ('[time] Finish: obj=...' or JSON "
            '"event": "request.finished"): start the server with --log-requests '
            "--log-requests-level 3",
        )
    for rec in finished:
        rid = rec.obj.get("rid")
        if isinstance(rid, str) and rid in received:
            rec.received_s, rec.received_kind = received[rid]
    finished_rids = {r.obj.get("rid") for r in finished}
    unfinished = sum(1 for rid in received if rid not in finished_rids)

    def on_error(err: TraceError) -> None:
        skip_or_raise(trace, err, lenient)

    rows, arrival = records_to_rows(finished, tokenize=text_tokenizer(tokenizer), on_error=on_error)
    extra = {
        "source": "SGLang request log (--log-requests)",
        "source_file": path.name,
        "log_format": "+".join(sorted(formats)),
        "arrival_source": arrival,
        "unfinished_left_out": unfinished,
    }
    return finish_trace(trace, rows, block_size=block_size, extra=extra, lenient=lenient)


def _parse(
    path: Path,
    line: int,
    text: str,
    m: re.Match[str],
    received: dict[str, tuple[float, str]],
    formats: set[str],
) -> RequestRecord | None:
    if m.group("json"):
        try:
            data = json.loads(text[m.start("json") :])
        except json.JSONDecodeError as exc:
            raise TraceError(path, line, "line", f"request-log JSON: {exc.msg}") from None
        event = data.get("event") if isinstance(data, dict) else None
        if event not in ("request.received", "request.finished"):
            return None
        formats.add("json")
        obj, out = data.get("obj"), data.get("out")
        if not isinstance(obj, dict):
            raise TraceError(path, line, "obj", "expected the request object")
        obj = {k: _truncated_text(v) if k == "text" else v for k, v in obj.items()}
        try:
            t = _local_seconds(str(data.get("timestamp")))
        except ValueError:
            raise TraceError(
                path, line, "timestamp", f"not an ISO time: {data.get('timestamp')!r}"
            ) from None
        kind = "receive line timestamp"
        is_finish = event == "request.finished"
    else:
        formats.add("text")
        try:
            obj, out = parse_text_line(text[m.end() :].rstrip("\n"))
        except (_ReprError, ValueError, SyntaxError) as exc:
            raise TraceError(
                path, line, "line", f"cannot parse the logged request: {exc}"
            ) from None
        t = _local_seconds(m.group("time"))
        kind = "receive line time (seconds)"
        is_finish = m.group("kind") == "Finish"
    if not is_finish:
        rids = obj.get("rid")
        for rid in rids if isinstance(rids, list) else [rids]:
            if isinstance(rid, str):
                received.setdefault(rid, (t, kind))
        return None
    if not isinstance(out, dict) or not isinstance(out.get("meta_info"), dict):
        raise TraceError(path, line, "out", "expected the answer with its meta_info")
    return RequestRecord(obj=obj, out=out, line=line, path=path, finished_s=t)
