"""SGLang request dumps (``--dump-requests-folder``, also ``--crash-dump-folder``;
``--from sglang-dump``), read with a restricted unpickler.

SGLang's tokenizer manager (``TokenizerManager.dump_requests`` and ``_dump_data_to_file``
in ``sglang/srt/managers/tokenizer_manager.py``, 0.5.14 and 0.5.23 alike) pickles, every
``--dump-requests-threshold`` finished requests (default 1000), one file
``<folder>/<%Y-%m-%d_%H-%M-%S>.pkl`` holding ``{"server_args": ServerArgs, "requests":
[(obj, out, created_time, finished_time), ...]}`` (0.5.23 adds ``"config_updates"`` and
``"resolved_config"``; crash dumps ``"launch_command"``): ``obj`` the ``GenerateReqInput``,
``out`` the answer dict (``output_ids``, ``meta_info``), the times unix seconds.

A pickle can run any code it names, so the dump is read by `SafeUnpickler`, which never
imports or calls anything: every global a pickle names is refused, with the one-line error
``FILE:0: file: refused to unpickle MODULE.NAME ...``, except SGLang's own classes and
functions (a module under ``sglang.``), which are not imported either: each becomes an
inert `SGLangObject` that only holds the data the pickle gives it (``GenerateReqInput``'s
fields, ``ServerArgs``' rebuild arguments). Plain data (dicts, lists, tuples, sets,
strings, bytes, numbers) needs no global at all.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from traces.importers.common import finish_trace, skip_or_raise
from traces.importers.sglang_records import RequestRecord, records_to_rows, text_tokenizer
from traces.schema import Trace, TraceError


class SGLangObject:
    """An SGLang object of a dump, as data only: the pickle's constructor arguments
    (`args`, `kwargs`) and state (`state`, what ``__setstate__`` would get). Its class
    (one per SGLang name, see `SafeUnpickler`) is named after the SGLang class."""

    sglang_name = ""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}  # noqa: RUF012 -- never mutated: instances set their own
    state: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def fields(self) -> dict[str, Any]:
        """The object's fields by name (a dataclass's ``__dict__``, with slots merged)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:
            merged: dict[str, Any] = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            return merged
        if isinstance(state, dict):
            return state
        return dict(self.kwargs)


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global that `SafeUnpickler` does not allow."""

    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing: SGLang names become inert `SGLangObject`
    subclasses, every other global is refused (`RefusedGlobal`); persistent ids too."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self._classes: dict[str, type[SGLangObject]] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "sglang" or module.startswith("sglang."):
            full = f"{module}.{name}"
            cls = self._classes.get(full)
            if cls is None:
                cls = type(name, (SGLangObject,), {"sglang_name": full})
                self._classes[full] = cls
            return cls
        raise RefusedGlobal(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not supported")


#: opcodes that load an object from ``copyreg``'s extension registry without asking
#: ``find_class`` (CPython's unpickler looks the cache up directly): refused before loading
_EXTENSION_OPCODES = frozenset({"EXT1", "EXT2", "EXT4"})


def _refuse_extensions(data: bytes) -> None:
    """Raise `RefusedGlobal` if the pickle uses a copyreg extension code."""
    import pickletools

    for op, arg, _ in pickletools.genops(data):
        if op.name in _EXTENSION_OPCODES:
            raise RefusedGlobal("copyreg", f"extension code {arg}")


def load_dump(path: Path) -> Any:
    """Unpickle one dump file with `SafeUnpickler` (after refusing copyreg extension codes,
    which skip `find_class`); `TraceError` (line 0) if it names a refused global or is no
    pickle."""
    import io

    try:
        data = path.read_bytes()
        _refuse_extensions(data)
        return SafeUnpickler(io.BytesIO(data)).load()
    except RefusedGlobal as exc:
        raise TraceError(
            path,
            0,
            "file",
            f"refused to unpickle {exc.module}.{exc.name}: an SGLang request dump holds only "
            "plain data and SGLang's own records; this file is not one (nothing was run)",
        ) from None
    except OSError as exc:
        raise TraceError(path, 0, "file", f"cannot open: {exc.strerror or exc}") from None
    except Exception as exc:  # a damaged pickle raises many kinds
        raise TraceError(path, 0, "file", f"not a readable pickle: {exc}") from None


def dump_files(path: Path) -> list[Path]:
    """The dump files of a source: the file itself, or a folder's ``*.pkl`` files at any
    depth (crash dumps are in ``<folder>/<hostname>/``), sorted by path."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*.pkl") if p.is_file())
    return [path]


def looks_like_source(path: Path) -> bool:
    """A ``.pkl`` file, or a folder holding one."""
    if path.is_dir():
        return any(p.is_file() for p in path.rglob("*.pkl"))
    return path.name.lower().endswith(".pkl")


#: the most containers `_plain` walks (shared ones count once) and the deepest nesting it
#: follows: a real dump's request record is a few hundred values a few levels deep, so these
#: only stop a crafted file (a memo-shared list nested 60 deep expands to 2^60 items)
_PLAIN_MAX_NODES = 10_000_000
_PLAIN_MAX_DEPTH = 64


class _PlainLimit(ValueError):
    """A pickle whose data is cyclic, too deep or too large to be an SGLang dump."""


def _plain(value: Any) -> Any:
    """`value` with SGLang objects turned into dicts of their fields (recursively in dicts
    and lists); a value shared by several containers is converted once (memoized by id), a
    cycle, more than `_PLAIN_MAX_DEPTH` levels or `_PLAIN_MAX_NODES` containers raise
    `_PlainLimit`."""
    memo: dict[int, Any] = {}
    active: set[int] = set()

    def walk(v: Any, depth: int) -> Any:
        if not isinstance(v, SGLangObject | dict | list):
            return v
        key = id(v)
        if key in memo:
            return memo[key]
        if key in active:
            raise _PlainLimit("the data refers to itself (a cycle)")
        if depth > _PLAIN_MAX_DEPTH:
            raise _PlainLimit(f"the data is nested more than {_PLAIN_MAX_DEPTH} levels deep")
        if len(memo) >= _PLAIN_MAX_NODES:
            raise _PlainLimit(f"the data holds more than {_PLAIN_MAX_NODES:,} containers")
        active.add(key)
        if isinstance(v, SGLangObject):
            out: Any = {k: walk(x, depth + 1) for k, x in v.fields().items()}
        elif isinstance(v, dict):
            out = {k: walk(x, depth + 1) for k, x in v.items()}
        else:
            out = [walk(x, depth + 1) for x in v]
        active.discard(key)
        memo[key] = out
        return out

    return walk(value, 0)


def _records(path: Path, data: Any) -> list[RequestRecord]:
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise TraceError(
            path,
            0,
            "requests",
            "expected an SGLang request dump: a dict with 'requests' (a list of (obj, out, "
            "created_time, finished_time))",
        )
    out: list[RequestRecord] = []
    for i, entry in enumerate(data["requests"]):
        line = i + 1
        if not isinstance(entry, tuple | list) or len(entry) != 4:
            raise TraceError(
                path, line, "requests", "expected (obj, out, created_time, finished_time)"
            )
        obj, answer, created, finished = entry
        try:
            obj = _plain(obj)
            answer = _plain(answer)
        except _PlainLimit as exc:
            msg = f"not an SGLang request record: {exc}"
            raise TraceError(path, line, "requests", msg) from None
        except RecursionError:
            msg = "not an SGLang request record: nested too deep"
            raise TraceError(path, line, "requests", msg) from None
        if not isinstance(obj, dict) or not isinstance(answer, dict):
            raise TraceError(path, line, "requests", "obj or out is not a request record")
        if type(created) not in (int, float):
            raise TraceError(path, line, "created_time", f"expected unix seconds: {created!r}")
        out.append(
            RequestRecord(
                obj=obj,
                out=answer,
                line=line,
                path=path,
                received_s=float(created),
                received_kind="dump created_time",
                finished_s=float(finished) if type(finished) in (int, float) else None,
            )
        )
    return out


def read_sglang_dump(
    path: Path, *, tokenizer: Path | None, block_size: int, lenient: bool = False
) -> Trace:
    """Import SGLang request dumps: one ``.pkl`` file or a folder of them (see the module
    docstring). Errors name the file and the 1-based request index in it as the line."""
    trace = Trace(requests=[], path=path)
    files = dump_files(path)
    if not files:
        raise TraceError(path, 0, "file", "no .pkl request dumps in this folder")
    records: list[RequestRecord] = []
    for f in files:
        try:
            records.extend(_records(f, load_dump(f)))
        except TraceError as err:
            skip_or_raise(trace, err, lenient)

    def on_error(err: TraceError) -> None:
        skip_or_raise(trace, err, lenient)

    rows, arrival = records_to_rows(records, tokenize=text_tokenizer(tokenizer), on_error=on_error)
    extra = {
        "source": "SGLang request dump (--dump-requests-folder)",
        "source_file": path.name,
        "dump_files": len(files),
        "arrival_source": arrival,
    }
    return finish_trace(trace, rows, block_size=block_size, extra=extra, lenient=lenient)
