"""`trace convert --from sglang-dump`: SGLang ``--dump-requests-folder`` pickles, as 0.5.14
and 0.5.23 write them (``TokenizerManager.dump_requests`` / ``_dump_data_to_file``), read
with the restricted unpickler: a pickle that names anything but plain data and SGLang's
own records is refused without running it."""

from __future__ import annotations

import os
import pickle
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from tests.test_import_common import one_line_error, roundtrip
from traces.importers.sglang_dump import SafeUnpickler, SGLangObject
from traces.io import read_trace

T0 = 1_750_000_000.0
SYSTEM = list(range(200, 232))


@dataclass
class GenerateReqInput:
    """The fields of SGLang's GenerateReqInput a dump carries (a subset, by name)."""

    rid: str | None = None
    session_id: str | None = None
    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    session_params: dict[str, Any] | None = None
    priority: int | None = None
    custom_labels: dict[str, str] | None = field(default=None)


@dataclass
class ServerArgs:
    """0.5.14's ServerArgs: a dataclass, pickled as its class and __dict__."""

    model_path: str = "m"
    page_size: int = 16


class ServerArgs0523:
    """0.5.23's ServerArgs: a msgspec Struct whose __reduce__ calls _rebuild_server_args."""

    def __reduce__(self) -> Any:
        return (_rebuild_server_args, (ServerArgs, {"model_path": "m"}, {"_sealed": True}))


def _rebuild_server_args(cls: Any, fields: Any, bookkeeping: Any) -> Any:  # pragma: no cover
    raise AssertionError("the importer must never call SGLang's functions")


@pytest.fixture
def sglang_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the classes above where SGLang's live, so that pickle names them as SGLang's."""
    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    server_args = types.ModuleType("sglang.srt.server_args")
    for name, mod, obj in [
        ("GenerateReqInput", io_struct, GenerateReqInput),
        ("ServerArgs", server_args, ServerArgs),
        ("_rebuild_server_args", server_args, _rebuild_server_args),
    ]:
        obj.__module__ = mod.__name__
        obj.__qualname__ = name
        setattr(mod, name, obj)
    ServerArgs0523.__module__ = server_args.__name__
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, io_struct.__name__, io_struct)
    monkeypatch.setitem(sys.modules, server_args.__name__, server_args)


def request(rid: str, ids: list[int], t: float, n_out: int, sid: str | None = None,
            parent: str | None = None) -> tuple[Any, ...]:  # fmt: skip
    """One dump entry: (obj, out, created_time, finished_time); 0.25 s per request."""
    sp = None if sid is None else {"id": sid, "rid": parent, "offset": None, "replace": None,
                                   "drop_previous_output": None}  # fmt: skip
    obj = GenerateReqInput(rid=rid, input_ids=ids, session_params=sp,
                           sampling_params={"max_new_tokens": 8}, priority=2)  # fmt: skip
    output = [9000 + int(t - T0) * 10 + k for k in range(n_out)]
    meta = {"id": rid, "finish_reason": {"type": "length", "length": n_out},
            "prompt_tokens": -1, "completion_tokens": n_out, "cached_tokens": 0,
            "e2e_latency": 0.25, "response_sent_to_client_ts": t + 0.25}  # fmt: skip
    return (obj, {"text": "x", "output_ids": output, "meta_info": meta}, t, t + 0.25)


def write_dumps(folder: Path, version: str) -> None:
    """Two dump files (threshold 2, then the rest): a session of 2 turns and 2 plain
    requests sharing SYSTEM, arriving at T0 + 0, 1, 2, 3 s."""
    entries = [
        request("s0", [*SYSTEM, 1, 2], T0, 3, sid="sess"),
        request("p0", [*SYSTEM, 5], T0 + 1, 2),
        request("s1", [3, 4], T0 + 2, 1, sid="sess", parent="s0"),
        request("p1", [*SYSTEM, 6, 6], T0 + 3, 4),
    ]
    # prompt_tokens as SGLang reports them (the session turn: history + new tokens)
    for entry, n in zip(entries, [34, 33, 34 + 3 + 2, 34], strict=True):
        entry[1]["meta_info"]["prompt_tokens"] = n
    folder.mkdir()
    for k, part in enumerate([entries[:2], entries[2:]]):
        data: dict[str, Any] = {"requests": part}
        if version == "0.5.14":
            data["server_args"] = ServerArgs()
        else:
            data |= {"server_args": ServerArgs0523(), "config_updates": [],
                     "resolved_config": {"page_size": 16}}  # fmt: skip
        (folder / f"2025-06-01_10-00-0{k}.pkl").write_bytes(pickle.dumps(data))


@pytest.mark.usefixtures("sglang_modules")
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_dump_folder_requests_sessions_and_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    folder = tmp_path / "dumps"
    write_dumps(folder, version)
    out = tmp_path / "dump.jsonl"
    assert main(["trace", "convert", str(folder), str(out), "--block-size", "16"]) == 0
    assert "4 requests, 1 sessions" in capsys.readouterr().out
    trace = read_trace(out)
    reqs = list(trace.requests)
    assert [r.rid for r in reqs] == ["s0", "p0", "s1", "p1"]
    assert [r.timestamp for r in reqs] == [0.0, 1000.0, 2000.0, 3000.0]  # created_time
    assert trace.header.extra["arrival_source"] == "dump created_time"
    assert trace.header.extra["dump_files"] == 2
    assert reqs[2].token_ids == [*SYSTEM, 1, 2, 9000, 9001, 9002, 3, 4]
    assert reqs[3].token_ids == [*SYSTEM, 6, 6]
    assert [r.output_length for r in reqs] == [3, 2, 1, 4]
    assert [r.priority for r in reqs] == [2, 2, 2, 2]
    assert (reqs[2].session_id, reqs[2].turn, reqs[2].think_time_ms) == ("sess", 1, 1750.0)
    roundtrip(out, tmp_path, capsys, requests=4)


class Evil:
    """Runs a shell command when unpickled by a plain pickle.load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        (lambda m: {"requests": [Evil(m)]}, f"{os.system.__module__}.system"),
        (lambda m: {"requests": [], "x": Evil(m)}, f"{os.system.__module__}.system"),
        (lambda m: {"requests": [(eval, ("1",))]}, "builtins.eval"),
    ],
)
def test_a_pickle_holding_anything_else_is_refused_unrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: Any, refused: str
) -> None:
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.pkl"
    src.write_bytes(pickle.dumps(payload(marker)))
    assert main(["trace", "convert", str(src), str(tmp_path / "o.jsonl")]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(src), "0", "file")
    assert m["problem"].startswith(f"refused to unpickle {refused}:")
    assert not marker.exists()  # nothing ran


def test_sglang_names_become_inert_records() -> None:
    import io

    # a pickle naming an SGLang function with arguments: the stand-in keeps them, calls nothing
    data = b"\x80\x04csglang.srt.server_args\n_rebuild_server_args\n(I1\nI2\ntR."
    obj = SafeUnpickler(io.BytesIO(data)).load()
    assert isinstance(obj, SGLangObject) and obj.args == (1, 2)
    assert obj.sglang_name == "sglang.srt.server_args._rebuild_server_args"


@pytest.mark.usefixtures("sglang_modules")
@pytest.mark.parametrize(
    ("content", "line", "field", "says"),
    [
        (lambda: b"not a pickle", "0", "file", "not a readable pickle"),
        (lambda: [1, 2], "0", "requests", "a dict with 'requests'"),
        (lambda: {"requests": [request("a", [1], T0, 1), (1, 2)]}, "2", "requests",
         "(obj, out, created_time, finished_time)"),
        (lambda: {"requests": [request("a", [], T0, 1)]}, "1", "obj.input_ids",
         "empty prompt"),
    ],
)  # fmt: skip
def test_malformed_dump_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, line: str, field: str,
    says: str,
) -> None:  # fmt: skip
    src = tmp_path / "bad.pkl"
    data = content()  # pickled here, where the SGLang modules are in place
    src.write_bytes(data if isinstance(data, bytes) else pickle.dumps(data))
    assert main(["trace", "convert", str(src), str(tmp_path / "o.jsonl")]) == 2
    m = one_line_error(capsys.readouterr().err)
    assert (m["path"], m["line"], m["field"]) == (str(src), line, field)
    assert says in m["problem"]


def test_a_copyreg_extension_code_is_refused_even_when_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CPython's unpickler takes an EXT opcode's object from copyreg's cache without asking
    # find_class: with os.system registered and cached by an earlier ordinary load, a pickle
    # of EXT1 + REDUCE would run it. The importer refuses extension codes before loading.
    import copyreg

    marker = tmp_path / "pwned"
    code = 0xF3
    copyreg.add_extension(os.system.__module__, "system", code)
    try:
        pickle.loads(b"\x80\x02\x82" + bytes([code]) + b".")  # caches os.system
        cmd = f"touch {marker}".encode()
        src = tmp_path / "ext.pkl"
        src.write_bytes(b"\x80\x02\x82" + bytes([code]) + b"(S'" + cmd + b"'\ntR.")
        assert (
            main(["trace", "convert", "--from", "sglang-dump", str(src), str(tmp_path / "o.jsonl")])
            == 2
        )
    finally:
        copyreg.remove_extension(os.system.__module__, "system", code)
    m = one_line_error(capsys.readouterr().err)
    assert m["problem"].startswith("refused to unpickle copyreg.extension code 243")
    assert not marker.exists()


def test_shared_and_cyclic_data_neither_hang_nor_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a list nested 60 deep whose every level holds the one below twice (via the memo): 2^60
    # items if copied naively; converted once per shared object it is small
    nested: Any = [1]
    for _ in range(60):
        nested = [nested, nested]
    src = tmp_path / "shared.pkl"
    src.write_bytes(
        pickle.dumps({"requests": [({"input_ids": [1, 2], "x": nested}, {}, 0.0, 1.0)]})
    )
    # whatever the record then lacks, the answer is one line and quick, not a hang
    rc = main(["trace", "convert", "--from", "sglang-dump", str(src), str(tmp_path / "o.jsonl")])
    assert rc in (0, 2)
    capsys.readouterr()
    cyc: dict[str, Any] = {"input_ids": [1, 2]}
    cyc["self"] = cyc
    src.write_bytes(pickle.dumps({"requests": [(cyc, {}, 0.0, 1.0)]}))
    assert (
        main(["trace", "convert", "--from", "sglang-dump", str(src), str(tmp_path / "c.jsonl")])
        == 2
    )
    m = one_line_error(capsys.readouterr().err)
    assert (m["line"], m["field"]) == ("1", "requests") and "cycle" in m["problem"]
