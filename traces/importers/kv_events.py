"""KV-cache events (SGLang's and vLLM's ZMQ/msgpack ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``): `record` subscribes and writes them to a file, ``--from kv-events``
turns a recorded file into a trace.

**Wire format** (``sglang/srt/disaggregation/kv_events.py``, ``ZmqEventPublisher``): each
message is three frames, ``(topic, seq as 8 bytes big-endian, payload)``; the payload is a
msgpack ``EventBatch`` ``[ts, events, attn_dp_rank]`` (``ts`` unix seconds; 0.5.14 omits
``attn_dp_rank`` when None). Events are tagged structs: 0.5.14 (and older vLLM) encode
each as an array ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, medium]`` (``array_like``, trailing defaults omitted), 0.5.23 (and vLLM now) as a
map ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash", "token_ids",
"block_size", "lora_id", "medium", "session_id", ...}``. SGLang's ``mem_cache/events.py``
emits one BlockStored per page of each radix node it inserts (``block_size`` = the page's
tokens), chained through ``parent_block_hash``.

**Recorded file** (`record`): JSON lines. Line 1 ``{"format": "hicache-kv-events",
"version": 1, "endpoint", "topic", "started"}``, then one line per message ``{"recv": unix
seconds, "topic": str, "seq": int, "payload": base64 of the msgpack bytes}``: the wire bytes
as they came, decoded only by the importer.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from traces.importers.common import ImportedRow, PrefixIds, finish_trace, json_lines, skip_or_raise
from traces.schema import Trace, TraceError, TraceParamError

FORMAT = "hicache-kv-events"
INSTALL_HINT = "install it with: pip install 'hicache-sim[import]' (or: pip install msgpack pyzmq)"
#: BlockStored's positional fields after the tag (0.5.14 / vLLM array_like).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "cache_salt", "session_id", "lora_name")  # fmt: skip
_REMOVED_FIELDS = ("block_hashes", "medium")
#: Media whose stores are new KV computed on the GPU (others are HiCache backups / loads).
_DEVICE_MEDIA = (None, "GPU")
NOTE = (
    "converted from KV-cache events: a request is a chain of blocks stored in one batch; "
    "arrivals are the batches' times, output lengths are unknown (set to 1), prompts whose "
    "blocks were already cached store nothing and are missing"
)


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise TraceParamError(
            f"KV-cache events need the {module!r} package: {INSTALL_HINT}"
        ) from None


def looks_like(obj: object) -> bool:
    """A recorded file's first line."""
    return isinstance(obj, dict) and obj.get("format") == FORMAT


def decode_event(raw: Any) -> dict[str, Any]:
    """One event as a dict with ``type``: from a tagged map or a tagged array."""
    if isinstance(raw, dict):
        if not isinstance(raw.get("type"), str):
            raise ValueError("an event map without a 'type'")
        return raw
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        names = {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS}.get(raw[0], ())
        return {"type": raw[0], **dict(zip(names, raw[1:], strict=False))}
    raise ValueError(f"not a tagged event: {raw!r:.60}")


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]], int | None]:
    """(ts, events, attn_dp_rank) of one msgpack EventBatch payload."""
    msgpack = _need("msgpack")
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("expected an EventBatch [ts, events, attn_dp_rank]")
    ts = batch[0]
    if type(ts) not in (int, float):
        raise ValueError(f"EventBatch ts is not a number: {ts!r}")
    rank = batch[2] if len(batch) > 2 and type(batch[2]) is int else None
    return float(ts), [decode_event(e) for e in batch[1]], rank


def record(
    endpoint: str,
    out: Path,
    *,
    topic: str = "",
    duration_s: float | None = None,
    max_events: int | None = None,
    poll_ms: int = 100,
) -> tuple[int, int]:
    """Subscribe to `endpoint` (a ZMQ PUB) and write its messages to `out` (see the module
    docstring) until `duration_s` has passed or `max_events` events came (or Ctrl-C).
    Returns (messages, events)."""
    zmq = _need("zmq")
    _need("msgpack")
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    try:
        sub.connect(endpoint)
    except zmq.ZMQError as exc:
        sub.close()
        raise TraceParamError(f"--zmq {endpoint}: {exc}") from None
    start = time.time()
    messages = events = 0
    header = {"format": FORMAT, "version": 1, "endpoint": endpoint, "topic": topic,
              "started": start}  # fmt: skip
    try:
        with open(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            while True:
                if duration_s is not None and time.time() - start >= duration_s:
                    break
                if max_events is not None and events >= max_events:
                    break
                if not sub.poll(poll_ms):
                    continue
                frames = sub.recv_multipart()
                recv = time.time()
                if len(frames) != 3:
                    continue  # not a KV-event message
                t_bytes, seq_bytes, payload = frames
                with contextlib.suppress(Exception):  # kept as it came; convert reports it
                    events += len(decode_batch(payload)[1])
                line = {"recv": recv, "topic": t_bytes.decode("utf-8", "replace"),
                        "seq": int.from_bytes(seq_bytes, "big"),
                        "payload": base64.b64encode(payload).decode("ascii")}  # fmt: skip
                f.write(json.dumps(line) + "\n")
                f.flush()
                messages += 1
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
    return messages, events


class _Requests:
    """Turns stored-block runs into rows: hash chains from the root, ids made dense."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}
        self.size: dict[Any, int] = {}
        self.ids = PrefixIds()
        self.unknown_parents = 0

    def chain(self, last: Any) -> list[Any]:
        out = []
        seen = set()
        while last is not None and last in self.size and last not in seen:
            seen.add(last)
            out.append(last)
            last = self.parent.get(last)
        return out[::-1]


def _key(h: Any) -> Any:
    # SGLang: signed 64-bit ints; vLLM: ints or bytes
    if isinstance(h, (int, bytes, str)) and not isinstance(h, bool):
        return h
    raise ValueError(f"a block hash must be an int or bytes, got {h!r:.40}")


def read_kv_events(path: Path, *, lenient: bool = False) -> Trace:
    """Import a file written by `record` (see the module docstring and traces/README.md)."""
    trace = Trace(requests=[], path=path)
    state = _Requests()
    runs: list[tuple[float, int, list[Any], str | None]] = []
    counts: Counter[str] = Counter()
    block_sizes: Counter[int] = Counter()
    first = True
    for line, obj in json_lines(path):
        try:
            if first:
                first = False
                if not looks_like(obj):
                    raise TraceError(
                        path, line, "format", f"expected a {FORMAT} file written by trace record"
                    )
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("payload"), str):
                raise TraceError(path, line, "payload", "expected a recorded message")
            try:
                ts, events, _ = decode_batch(base64.b64decode(obj["payload"], validate=True))
            except TraceParamError:
                raise
            except Exception as exc:  # msgpack and base64 raise many kinds
                raise TraceError(path, line, "payload", f"not an EventBatch: {exc}") from None
            _batch(path, line, ts, events, state, runs, counts, block_sizes)
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
    if not block_sizes:
        raise TraceError(path, 0, "file", "no BlockStored events on the device (GPU)")
    block_size = max(block_sizes)
    rows: list[ImportedRow] = []
    for ts, line, last_chain, session in runs:
        hashes = state.chain(last_chain[-1])
        sizes = [state.size[h] for h in hashes]
        try:
            if any(s != block_size for s in sizes[:-1]):
                raise TraceError(
                    path, line, "block_size", f"a block before the last is not {block_size} tokens"
                )
            rows.append(
                ImportedRow(
                    time_ms=ts * 1000.0,
                    input_length=sum(sizes),
                    output_length=1,
                    line=line,
                    hash_ids=state.ids.map(0, hashes),
                    session=session,
                )
            )
        except TraceError as err:
            skip_or_raise(trace, err, lenient)
    extra = {
        "source": "KV-cache events (BlockStored / BlockRemoved / AllBlocksCleared)",
        "source_file": path.name,
        "events": dict(counts),
        "unknown_parents": state.unknown_parents,
        "prefix_info": True,
        "note": NOTE,
    }
    return finish_trace(trace, rows, block_size=block_size, extra=extra, lenient=lenient)


def _batch(
    path: Path,
    line: int,
    ts: float,
    events: list[dict[str, Any]],
    state: _Requests,
    runs: list[tuple[float, int, list[Any], str | None]],
    counts: Counter[str],
    block_sizes: Counter[int],
) -> None:
    """Add one batch's device stores to `state` and its runs (chains extended event by
    event) to `runs`."""
    current: list[Any] | None = None
    session: str | None = None
    for i, ev in enumerate(events):
        kind = ev["type"]
        counts[kind] += 1
        if kind != "BlockStored":
            continue
        if ev.get("medium") not in _DEVICE_MEDIA:
            counts[f"BlockStored({ev.get('medium')})"] += 1
            continue
        try:
            hashes = [_key(h) for h in ev.get("block_hashes") or []]
            parent = ev.get("parent_block_hash")
            parent = None if parent is None else _key(parent)
            size = ev.get("block_size")
            if type(size) is not int or size < 1 or not hashes:
                raise ValueError(f"block_size {size!r}, block_hashes {hashes!r:.40}")
        except ValueError as exc:
            raise TraceError(path, line, f"events[{i}]", str(exc)) from None
        tokens = ev.get("token_ids")
        n_last = len(tokens) - size * (len(hashes) - 1) if isinstance(tokens, list) else size
        if current is None or parent != current[-1]:
            if current is not None:
                runs.append((ts, line, current, session))
            current = []
            session = ev.get("session_id") if isinstance(ev.get("session_id"), str) else None
            if parent is not None and parent not in state.size:
                state.unknown_parents += 1
                parent = None
        prev = parent
        for j, h in enumerate(hashes):
            state.parent[h] = prev
            state.size[h] = n_last if j == len(hashes) - 1 else size
            prev = h
        current.extend(hashes)
        block_sizes[size] += 1
    if current:
        runs.append((ts, line, current, session))
