"""`trace record --zmq` and `trace convert --from kv-events`: a ZMQ publisher started here
on the loopback address sends KV-cache events in SGLang's wire format (0.5.14's tagged
arrays, 0.5.23's tagged maps: ``sglang/srt/disaggregation/kv_events.py``), the recording is
converted and replayed."""

from __future__ import annotations

import base64
import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.importers.kv_events import read_kv_events
from traces.io import read_trace
from traces.schema import TraceParamError

T0 = 1_750_000_000.0


def stored(version: str, hashes: list[int], parent: int | None, tokens: list[int],
           medium: str = "GPU", session: str | None = None) -> Any:  # fmt: skip
    """A BlockStored as msgspec encodes it (block_size: the page's tokens, as SGLang sets)."""
    if version == "0.5.14":  # array_like + tag: [tag, fields...], trailing defaults omitted
        return ["BlockStored", hashes, parent, tokens, len(tokens), None, medium]
    ev = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": len(tokens),
        "lora_id": None,
        "medium": medium,
    }
    if session is not None:
        ev["session_id"] = session
    return ev  # fmt: skip


def removed(version: str, hashes: list[int]) -> Any:
    if version == "0.5.14":
        return ["BlockRemoved", hashes, "GPU"]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def cleared(version: str) -> Any:
    return ["AllBlocksCleared"] if version == "0.5.14" else {"type": "AllBlocksCleared"}


def batches(version: str) -> list[bytes]:
    """EventBatch payloads ([ts, events, attn_dp_rank]; 0.5.14 omits a None rank): request
    A (3 pages of 64 tokens, the last one 32) and a HiCache backup of its first page; B extending
    A's second page, and C from the root, in one batch; a removal and a clear; D whose
    parent was stored before the recording began. Hashes are signed 64-bit, as SGLang's."""
    v = version

    def page(first: int, n: int = 64) -> list[int]:  # a 64-token page (--page-size 64)
        return list(range(first, first + n))

    a1, a2, a3, b1, b2, c1, d1 = -(2**62), 17, 2**62, 5, -6, 7, 8
    evs = [
        (T0, [stored(v, [a1], None, page(0), session="sess-1"),
              stored(v, [a2], a1, page(64), session="sess-1"),
              stored(v, [a3], a2, page(128, 32), session="sess-1"),
              stored(v, [a1], None, page(0), medium="CPU_PINNED")]),
        (T0 + 0.5, [stored(v, [b1], a2, page(1000), session="sess-1"),
                    stored(v, [b2], b1, page(1064), session="sess-1"),
                    stored(v, [c1], None, page(2000))]),
        (T0 + 1, [removed(v, [a3]), cleared(v)]),
        (T0 + 2, [stored(v, [d1], 999, page(3000))]),
    ]  # fmt: skip
    out = []
    for ts, events in evs:
        batch: list[Any] = [ts, events] if version == "0.5.14" else [ts, events, None]
        out.append(msgpack.packb(batch))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def publish(endpoint: str, payloads: list[bytes], topic: bytes = b"kv") -> threading.Thread:
    """A publisher thread: waits for the subscription (an XPUB sees it; a SUB cannot tell a
    PUB from an XPUB), then sends (topic, seq 8 bytes big-endian, payload) per batch."""
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 1000)
    pub.bind(endpoint)

    def run() -> None:
        try:
            if pub.poll(20_000):
                pub.recv()  # the subscription
                for seq, payload in enumerate(payloads):
                    pub.send_multipart([topic, seq.to_bytes(8, "big"), payload])
        finally:
            pub.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_record_convert_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    thread = publish(endpoint, batches(version))
    rec = tmp_path / "events.jsonl"
    cmd = ["trace", "record", "--zmq", endpoint, "--out", str(rec), "--max-events", "10"]
    assert main(cmd) == 0
    thread.join(5)
    assert "4 messages, 10 events" in capsys.readouterr().out
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    assert lines[0]["format"] == "hicache-kv-events" and lines[0]["endpoint"] == endpoint
    assert [(x["topic"], x["seq"]) for x in lines[1:]] == [
        ("kv", 0),
        ("kv", 1),
        ("kv", 2),
        ("kv", 3),
    ]
    assert base64.b64decode(lines[2]["payload"]) == batches(version)[1]  # the wire bytes

    out = tmp_path / "kv.jsonl"
    assert main(["trace", "convert", str(rec), str(out)]) == 0  # detected
    capsys.readouterr()
    trace = read_trace(out)
    reqs = list(trace.requests)
    assert trace.block_size == 64
    assert [r.timestamp for r in reqs] == [0.0, 500.0, 500.0, 2000.0]
    # A; B shares A's first two blocks; C and D (unknown parent: starts at its own block)
    assert [r.hash_ids for r in reqs] == [[0, 1, 2], [0, 1, 3, 4], [5], [6]]
    assert [r.input_length for r in reqs] == [160, 256, 64, 64]
    assert [r.output_length for r in reqs] == [1, 1, 1, 1]
    extra = trace.header.extra
    assert extra["unknown_parents"] == 1
    assert extra["events"]["BlockStored(CPU_PINNED)"] == 1 and extra["events"]["BlockRemoved"] == 1
    sessions = [(r.session_id, r.turn) for r in reqs]
    if version == "0.5.23":  # BlockStored.session_id
        assert sessions == [("sess-1", 0), ("sess-1", 1), (None, None), (None, None)]
    else:
        assert sessions == [(None, None)] * 4
    stats = roundtrip(out, tmp_path, capsys, requests=4)
    assert stats["blocks"]["unique"] == 7  # type: ignore[index]


def _recording(tmp_path: Path, payloads: list[str], header: bool = True) -> Path:
    path = tmp_path / "rec.jsonl"
    lines = [json.dumps({"format": "hicache-kv-events", "version": 1})] if header else []
    lines += [json.dumps({"recv": T0, "topic": "", "seq": i, "payload": p})
              for i, p in enumerate(payloads)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_malformed_recording_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = base64.b64encode(batches("0.5.23")[0]).decode()
    ev = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "block_size": 0}
    bad_event = base64.b64encode(msgpack.packb([T0, [ev]])).decode()
    for payloads, line, field, says in [
        ([good, "%%%"], "3", "payload", "not an EventBatch"),
        ([good, base64.b64encode(msgpack.packb({"x": 1})).decode()], "3", "payload",
         "EventBatch [ts, events"),
        ([bad_event], "2", "events[0]", "block_size 0"),
    ]:  # fmt: skip
        src = _recording(tmp_path, payloads)
        cmd = ["trace", "convert", str(src), str(tmp_path / "o.jsonl"), "--from", "kv-events"]
        assert main(cmd) == 2
        m = one_line_error(capsys.readouterr().err)
        assert (m["path"], m["line"], m["field"]) == (str(src), line, field)
        assert says in m["problem"]
    src = _recording(tmp_path, [good], header=False)
    assert (
        main(["trace", "convert", str(src), str(tmp_path / "o.jsonl"), "--from", "kv-events"]) == 2
    )
    m = one_line_error(capsys.readouterr().err)
    assert (m["line"], m["field"]) == ("1", "format")


def test_missing_msgpack_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _recording(tmp_path, [base64.b64encode(batches("0.5.23")[0]).decode()])
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(TraceParamError, match=r"pip install 'hicache-sim\[import\]'"):
        read_kv_events(src)
