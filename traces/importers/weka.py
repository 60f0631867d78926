"""AgentX / Weka agentic traces (``--from weka``): Claude-Code sessions with block hashes.

The public corpus (Weka's kv-cache-tester captures; SemiAnalysis' ``cc-traces-weka-*``
datasets used by InferenceX AgentX) stores one JSON object per agent session::

    {"id": "...", "models": [...], "block_size": 64, "hash_id_scope": "local",
     "requests": [
       {"t": 0.0, "type": "n", "model": "...", "in": 418, "out": 20,
        "hash_ids": [0, 1, ...], "api_time": 2.3, "think_time": 0.4, ...},
       {"t": 10.0, "type": "subagent", "agent_id": "a", "subagent_type": "Explore",
        "requests": [ ...the subagent's own requests, same shape... ], ...},
       ...]}

``t``, ``api_time`` and ``think_time`` are seconds; ``type`` is ``n`` (a call), ``s`` (a
streamed call) or ``subagent`` (a nested session). ``hash_id_scope: "local"`` means one id
space per session object: the root and its subagents share it, two objects do not. A
source is a ``.json`` file holding one object, a folder of such files (sorted by name), or a
JSONL file with one object per line (the datasets' rows). What each field becomes is in
traces/README.md ("AgentX / Weka agentic traces").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.importers.common import (
    ImportedRow,
    PrefixIds,
    finish_trace,
    get_int,
    get_number,
    json_lines,
    open_text,
    skip_or_raise,
)
from traces.schema import Trace, TraceError

_KINDS = ("n", "s", "subagent")


def looks_like(obj: object) -> bool:
    """True if a parsed JSON value is a Weka session object (``requests`` and ``block_size``)."""
    return isinstance(obj, dict) and isinstance(obj.get("requests"), list) and "block_size" in obj


def _json_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.lower().endswith(".json"))


def _load_json(path: Path) -> Any:
    with open_text(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise TraceError(path, exc.lineno, "line", f"not JSON: {exc.msg}") from None
        except UnicodeDecodeError:
            raise TraceError(path, 1, "line", "not valid UTF-8") from None


def looks_like_source(path: Path) -> bool:
    """True if a folder's first .json file, or a .json file, holds a Weka session object."""
    if path.is_dir():
        files = _json_files(path)
        path = files[0] if files else path
    try:
        return path.is_file() and looks_like(_load_json(path))
    except TraceError:
        return False


def _sources(path: Path) -> list[tuple[Path, int, Any]]:
    """(file, line, parsed object) of every session object in the source."""
    if path.is_dir():
        files = _json_files(path)
        if not files:
            raise TraceError(path, 0, "file", "no .json files in this folder")
        return [(f, 1, _load_json(f)) for f in files]
    if path.name.lower().endswith(".json"):
        obj = _load_json(path)
        objs = obj if isinstance(obj, list) else [obj]
        return [(path, 1, o) for o in objs]
    return [(path, line, obj) for line, obj in json_lines(path)]


@dataclass
class _Walk:
    """The state of one import: the id map, the rows and the shared block size."""

    ids: PrefixIds = field(default_factory=PrefixIds)
    rows: list[ImportedRow] = field(default_factory=list)
    block_size: int | None = None
    sessions: int = 0
    relative: int = 0


def read_weka(path: Path, *, lenient: bool = False) -> Trace:
    """Import a Weka / AgentX source (see the module docstring and the README)."""
    trace = Trace(requests=[], path=path)
    walk = _Walk()
    sources = _sources(path)
    for index, (file, line, obj) in enumerate(sources):
        try:
            _session_object(file, line, obj, index, walk)
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
    if walk.block_size is None:
        raise TraceError(path, 0, "file", "no valid Weka session object")
    extra = {
        "source": "Weka / AgentX agentic trace",
        "source_file": path.name,
        "sessions": walk.sessions,
        "subagents_with_relative_times": walk.relative,
        "hash_id_scope": "local (one id space per session object)",
    }
    return finish_trace(trace, walk.rows, block_size=walk.block_size, extra=extra, lenient=lenient)


def _session_object(file: Path, line: int, obj: Any, index: int, walk: _Walk) -> None:
    if not looks_like(obj):
        raise TraceError(
            file, line, "line", "expected a Weka session object with 'requests' and 'block_size'"
        )
    bs = obj["block_size"]
    if type(bs) is not int or bs < 1:
        raise TraceError(file, line, "block_size", f"must be a positive integer, got {bs!r}")
    if walk.block_size is not None and bs != walk.block_size:
        raise TraceError(
            file, line, "block_size", f"{bs}, but earlier sessions have {walk.block_size}"
        )
    name = obj.get("id")
    session = name if isinstance(name, str) and name else f"trace-{index}"
    rows: list[ImportedRow] = []
    ctx = _Ctx(file, line, bs, ("scope", index), walk, rows)
    ctx.entries(obj["requests"], "requests", session, 0.0)
    walk.block_size = bs
    walk.sessions += 1
    walk.rows.extend(rows)


@dataclass
class _Ctx:
    """Walks one session object's entries (recursing into subagents)."""

    file: Path
    line: int
    block_size: int
    scope: object
    walk: _Walk
    rows: list[ImportedRow]

    def entries(self, entries: Any, where: str, session: str, offset_s: float) -> None:
        """Add the rows of an entry list; `offset_s` is added to its ``t`` values."""
        if not isinstance(entries, list):
            raise TraceError(self.file, self.line, where, "expected a list of requests")
        for i, entry in enumerate(entries):
            at = f"{where}[{i}]"
            if not isinstance(entry, dict):
                raise TraceError(self.file, self.line, at, "expected an object")
            kind = entry.get("type", "n")
            if kind not in _KINDS:
                raise TraceError(
                    self.file, self.line, f"{at}.type", f"expected one of {_KINDS}, got {kind!r}"
                )
            if kind == "subagent":
                self.subagent(entry, at, session, offset_s)
            else:
                self.request(entry, at, session, offset_s)

    def _t(self, entry: dict[str, Any], at: str) -> float:
        t = get_number(entry, "t", self.file, self.line, field=f"{at}.t")
        if t is None or t < 0:
            raise TraceError(self.file, self.line, f"{at}.t", "expected seconds >= 0")
        return t

    def subagent(self, entry: dict[str, Any], at: str, session: str, offset_s: float) -> None:
        """A nested session ``<parent>::sa:<agent_id>``. Its requests' ``t`` are absolute
        (SemiAnalysis' datasets) unless its first request is earlier than the marker, in
        which case they are relative to the marker (kv-cache-tester's raw captures)."""
        t = self._t(entry, at)
        agent = entry.get("agent_id")
        name = f"{session}::sa:{agent if isinstance(agent, str) and agent else at}"
        inner = entry.get("requests")
        firsts = (
            [
                r["t"]
                for r in inner or []
                if isinstance(r, dict) and isinstance(r.get("t"), (int, float))
            ]
            if isinstance(inner, list)
            else []
        )
        relative = bool(firsts) and min(firsts) < t
        self.walk.relative += relative
        self.entries(inner, f"{at}.requests", name, offset_s + t if relative else offset_s)

    def request(self, entry: dict[str, Any], at: str, session: str, offset_s: float) -> None:
        """One call: ``in``/``out`` tokens, ``hash_ids`` (remapped into this object's id
        scope with prefix semantics; fresh ids when absent), times in seconds."""
        t = self._t(entry, at)
        n_in = get_int(entry, "in", self.file, self.line, field=f"{at}.in")
        n_out = get_int(entry, "out", self.file, self.line, field=f"{at}.out")
        if n_in is None or n_in < 1:
            raise TraceError(self.file, self.line, f"{at}.in", "expected input tokens >= 1")
        if n_out is None:
            raise TraceError(self.file, self.line, f"{at}.out", "expected output tokens >= 0")
        need = -(-n_in // self.block_size)
        raw = entry.get("hash_ids")
        if raw is None:
            ids = self.walk.ids.fresh(need)
        else:
            if not isinstance(raw, list) or any(type(h) is not int or h < 0 for h in raw):
                raise TraceError(
                    self.file, self.line, f"{at}.hash_ids", "expected a list of integers >= 0"
                )
            if len(raw) != need:
                raise TraceError(
                    self.file,
                    self.line,
                    f"{at}.hash_ids",
                    f"{len(raw)} ids, but in={n_in} with block_size {self.block_size} needs {need}",
                )
            ids = self.walk.ids.map(self.scope, raw)
        think = get_number(entry, "think_time", self.file, self.line, field=f"{at}.think_time")
        api = get_number(entry, "api_time", self.file, self.line, field=f"{at}.api_time")
        self.rows.append(
            ImportedRow(
                time_ms=(offset_s + t) * 1000.0,
                input_length=n_in,
                output_length=n_out,
                line=self.line,
                hash_ids=ids,
                session=session,
                think_ms=None if think is None else think * 1000.0,
                latency_ms=None if api is None else api * 1000.0,
                rid=f"{session}:{at}",
            )
        )
