"""OpenAI chat-completions logs (``--from openai``): one request per JSONL line.

A line is a request body with ``messages`` at the top level, or an object that holds it
under ``request`` or ``body`` (the Batch API's input lines), optionally with the
``response`` (or, Batch API output, ``response.body``). What each field becomes is in
traces/README.md ("OpenAI chat-completions logs"); the prompt keys (tokens, or text block
hashes with ``--hash-text``) are made by `traces.importers.textkeys`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from traces.importers.common import (
    ImportedRow,
    finish_trace,
    get_int,
    get_number,
    is_number,
    json_lines,
    skip_or_raise,
)
from traces.importers.textkeys import (
    TextBlockHasher,
    Tokenize,
    chat_template,
    template_renderer,
    tokenizer_files,
)
from traces.schema import DEFAULT_BLOCK_SIZE, Trace, TraceError, TraceParamError

#: Keys naming a session, in the order they are looked for (line, then request body).
SESSION_KEYS = ("session_id", "conversation_id", "user")
#: Unix times above this are milliseconds, not seconds (1e11 s is the year 5138).
_MS_THRESHOLD = 1e11


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """How prompts become keys: a `tokenizer` (tokenizer.json or its folder) or `hash_text`
    (no tokenizer), an optional `template` file, the trace `block_size` (tokens) and, for
    hash_text, the assumed `bytes_per_token`."""

    tokenizer: Path | None = None
    template: Path | None = None
    hash_text: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE
    bytes_per_token: int = 4


def looks_like(obj: object) -> bool:
    """True if a parsed first line is an OpenAI chat request (has ``messages``)."""
    if not isinstance(obj, dict):
        return False
    return any(
        isinstance(b, dict) and "messages" in b for b in (obj, *_nested(obj, "request", "body"))
    )


def _nested(obj: dict[str, Any], *keys: str) -> list[dict[str, Any]]:
    return [obj[k] for k in keys if isinstance(obj.get(k), dict)]


def _body(obj: dict[str, Any]) -> dict[str, Any]:
    for b in (obj, *_nested(obj, "request", "body")):
        if "messages" in b:
            return b
    return obj


def _response(obj: dict[str, Any]) -> dict[str, Any]:
    resp = obj.get("response")
    if not isinstance(resp, dict):
        return {}
    body = resp.get("body")
    return body if isinstance(body, dict) else resp


def _content(value: object, path: Path, line: int, i: int) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list):  # content parts: keep the text ones, in order
        texts = [
            p.get("text", "") for p in value if isinstance(p, dict) and p.get("type") == "text"
        ]
        return "".join(t for t in texts if isinstance(t, str))
    raise TraceError(
        path, line, f"messages[{i}].content", f"expected a string or parts, got {value!r}"
    )


def messages_of(body: dict[str, Any], path: Path, line: int) -> list[dict[str, Any]]:
    """The request's messages, checked, with content as plain text (text parts joined)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise TraceError(
            path, line, "messages", "expected a non-empty list of {role, content} objects"
        )
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TraceError(
                path, line, f"messages[{i}]", "expected an object with a string 'role'"
            )
        out.append({**m, "content": _content(m.get("content"), path, line, i)})
    return out


def time_ms(obj: dict[str, Any], path: Path, line: int) -> float | None:
    """The arrival time in ms: ``timestamp`` or ``created`` of the line (then of the
    response): an ISO 8601 string, or unix seconds (values above 1e11: milliseconds)."""
    for src in (obj, _response(obj)):
        for key in ("timestamp", "created"):
            value = src.get(key)
            if value is None:
                continue
            if isinstance(value, str):
                try:
                    return datetime.fromisoformat(value.strip()).timestamp() * 1000.0
                except ValueError:
                    raise TraceError(path, line, key, f"not an ISO 8601 time: {value!r}") from None
            if not is_number(value):
                raise TraceError(
                    path, line, key, f"expected unix seconds or ISO 8601, got {value!r}"
                )
            return float(value) if value > _MS_THRESHOLD else float(value) * 1000.0
    return None


def session_of(obj: dict[str, Any], body: dict[str, Any]) -> str | None:
    """The session named by the line or its request body (session_id, conversation_id,
    user; also under ``metadata``), or None."""
    for src in (obj, body, *_nested(obj, "metadata"), *_nested(body, "metadata")):
        for key in SESSION_KEYS:
            value = src.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value != "":
                return str(value)
    return None


def _reply(resp: dict[str, Any]) -> dict[str, Any] | None:
    choices = resp.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        msg = choices[0].get("message")
        if isinstance(msg, dict):
            return msg
    return None


def output_length(
    obj: dict[str, Any], body: dict[str, Any], count: Callable[[str], int], path: Path, line: int
) -> int:
    """Output tokens: ``usage.completion_tokens`` (response, then line); else the reply
    text counted like prompts; else ``max_completion_tokens`` / ``max_tokens``."""
    resp = _response(obj)
    for src in (resp, obj):
        usage = src.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            n = get_int(usage, "completion_tokens", path, line, field="usage.completion_tokens")
            return n or 0
    reply = _reply(resp)
    if reply is not None and isinstance(reply.get("content"), str):
        return count(reply["content"])
    for key in ("max_completion_tokens", "max_tokens"):
        n = get_int(body, key, path, line)
        if n is not None:
            return n
    raise TraceError(
        path,
        line,
        "response",
        "no output length: expected response.usage.completion_tokens, a response message "
        "(response.choices[0].message) or max_tokens",
    )


class _Conversations:
    """Sessions for lines without a session id: a request whose messages start with all
    the messages of an earlier request (with or without that request's reply) continues
    that request's session; any other request starts a new one (``conv-N``)."""

    def __init__(self) -> None:
        self._by_prefix: dict[bytes, str] = {}
        self._new = 0

    @staticmethod
    def _chain(msgs: list[dict[str, Any]]) -> list[bytes]:
        out, h = [], b""
        for m in msgs:
            key = json.dumps([m.get("role"), m.get("content")], ensure_ascii=False)
            h = hashlib.blake2b(h + key.encode("utf-8"), digest_size=16).digest()
            out.append(h)
        return out

    def session(
        self, msgs: list[dict[str, Any]], reply: dict[str, Any] | None, named: str | None
    ) -> str:
        """The session of a request: `named` (the log's session id) if given, else the one
        its messages continue, else a new one; remembered for later requests."""
        chain = self._chain(msgs)
        found = next(
            (self._by_prefix[h] for h in reversed(chain[:-1]) if h in self._by_prefix), None
        )
        name = named or found or f"conv-{self._new}"
        self._new += 0 if named or found else 1
        self._by_prefix[chain[-1]] = name
        if reply is not None and isinstance(reply.get("content"), str):
            answer = {"role": reply.get("role", "assistant"), "content": reply["content"]}
            self._by_prefix[self._chain([*msgs, answer])[-1]] = name
        return name


def read_openai_chat(path: Path, options: ChatOptions, *, lenient: bool = False) -> Trace:
    """Import an OpenAI chat-completions log (see the module docstring and the README)."""
    keys, count, origin = _prompt_keys(options)
    trace = Trace(requests=[], path=path)
    parsed: list[
        tuple[int, dict[str, Any], dict[str, Any], list[dict[str, Any]], float | None]
    ] = []
    for line, obj in json_lines(path):
        try:
            if not isinstance(obj, dict):
                raise TraceError(path, line, "line", "expected a JSON object (one chat request)")
            body = _body(obj)
            parsed.append(
                (line, obj, body, messages_of(body, path, line), time_ms(obj, path, line))
            )
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
    timed = [p for p in parsed if p[4] is not None]
    if timed and len(timed) != len(parsed):
        missing = next(p[0] for p in parsed if p[4] is None)
        raise TraceError(
            path, missing, "timestamp", "missing (other lines have timestamp or created)"
        )
    parsed.sort(key=lambda p: p[4] or 0.0)
    convs = _Conversations()
    rows: list[ImportedRow] = []
    for line, obj, body, msgs, t in parsed:
        try:
            rows.append(_row(path, line, obj, body, msgs, t, keys, count, convs))
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
    extra: dict[str, Any] = {
        "source": "OpenAI chat-completions log",
        "source_file": path.name,
        "prompt_keys": "text block hashes" if options.hash_text else "token ids",
        "chat_template": origin,
    }
    if options.hash_text:
        extra["bytes_per_token"] = options.bytes_per_token
    return finish_trace(trace, rows, block_size=options.block_size, extra=extra, lenient=lenient)


def _row(
    path: Path,
    line: int,
    obj: dict[str, Any],
    body: dict[str, Any],
    msgs: list[dict[str, Any]],
    t: float | None,
    keys: Callable[[list[dict[str, Any]]], tuple[int, list[int], bool]],
    count: Callable[[str], int],
    convs: _Conversations,
) -> ImportedRow:
    try:
        n_in, ids, are_hashes = keys(msgs)
    except ValueError as exc:
        raise TraceError(path, line, "messages", str(exc)) from None
    if n_in < 1:
        raise TraceError(path, line, "messages", "the rendered prompt is empty")
    reply = _reply(_response(obj))
    session = convs.session(msgs, reply, session_of(obj, body))
    latency = get_number(obj, "latency_ms", path, line)
    if latency is None and (sec := get_number(obj, "latency", path, line)) is not None:
        latency = sec * 1000.0
    rid = next((obj[k] for k in ("id", "custom_id") if isinstance(obj.get(k), str)), None)
    return ImportedRow(
        time_ms=t or 0.0,
        input_length=n_in,
        output_length=output_length(obj, body, count, path, line),
        line=line,
        hash_ids=ids if are_hashes else None,
        token_ids=None if are_hashes else ids,
        session=session,
        latency_ms=latency,
        rid=rid,
    )


def _prompt_keys(
    options: ChatOptions,
) -> tuple[
    Callable[[list[dict[str, Any]]], tuple[int, list[int], bool]], Callable[[str], int], str
]:
    """(messages -> (input_length, ids, ids are hash ids), text -> token count, template
    origin) for the options."""
    if options.hash_text == (options.tokenizer is not None):
        raise TraceParamError(
            "an OpenAI chat log needs either --tokenizer PATH (tokenizer.json) or --hash-text"
            " (block hashes of the text, no tokenizer), not both or neither"
        )
    config = None
    if options.tokenizer is not None:
        tok_file, config = tokenizer_files(options.tokenizer)
        tok = Tokenize(tok_file)
    source, origin, specials = chat_template(config, options.template)
    render = template_renderer(source, specials)
    if options.tokenizer is not None:

        def by_tokens(msgs: list[dict[str, Any]]) -> tuple[int, list[int], bool]:
            ids = tok.ids(render(msgs))
            return len(ids), ids, False

        return by_tokens, tok.count, origin
    hasher = TextBlockHasher(options.block_size, options.bytes_per_token)

    def by_hashes(msgs: list[dict[str, Any]]) -> tuple[int, list[int], bool]:
        n, ids = hasher.ids(render(msgs))
        return n, ids, True

    return by_hashes, hasher.count, origin
