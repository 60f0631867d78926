"""Importers: what servers and benchmarks record, read into the trace data model.

Each format has its own module; `read_import(path, fmt, options)` reads a file in one of
`IMPORT_FORMATS`, `detect(path)` names the importer a file's content calls for (or None:
not an importer's format). See traces/README.md ("Importers") for each format's fields.

| format | module | source |
| --- | --- | --- |
| ``openai`` | `openai_chat` | OpenAI chat-completions logs (JSONL) |
| ``weka`` | `weka` | AgentX / Weka agentic traces (block hashes, subagents) |
| ``bench-serving`` | `bench_serving` | SGLang ``bench_serving --output-details`` results |
| ``bench-multiturn`` | `bench_multiturn` | SGLang ``bench_multiturn`` performance logs |
| ``sglang-log`` | `sglang_log` | SGLang ``--log-requests`` request logs (text or JSON lines) |
| ``sglang-dump`` | `sglang_dump` | SGLang ``--dump-requests-folder`` pickles (restricted) |
| ``kv-events`` | `kv_events` | KV-cache events recorded by ``trace record --zmq`` |
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from traces.importers.openai_chat import ChatOptions
from traces.schema import DEFAULT_BLOCK_SIZE, Trace

IMPORT_FORMATS: tuple[str, ...] = (
    "openai",
    "weka",
    "bench-serving",
    "bench-multiturn",
    "sglang-log",
    "sglang-dump",
    "kv-events",
)


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """Options of the importers: `chat` for OpenAI logs, `block_size` (tokens) for sources
    without one of their own, `bench_args` the bench_multiturn command line of the runs."""

    chat: ChatOptions = field(default_factory=ChatOptions)
    block_size: int = DEFAULT_BLOCK_SIZE
    bench_args: str = ""


def detect(path: Path) -> str | None:
    """The importer format of a file from its first JSON value, or None (not one: a trace
    file, or something no importer reads). A folder or a ``.json`` file of Weka traces is
    ``weka``; a ``.pkl`` file or a folder of them ``sglang-dump``; a text file whose first
    lines hold SGLang request-log lines ``sglang-log``."""
    from traces.importers import (
        bench_multiturn,
        bench_serving,
        kv_events,
        openai_chat,
        sglang_dump,
        sglang_log,
        weka,
    )
    from traces.importers.common import first_json_line

    if sglang_dump.looks_like_source(path):
        return "sglang-dump"
    if path.is_dir() or path.name.lower().endswith(".json"):
        return "weka" if weka.looks_like_source(path) else None
    obj = first_json_line(path)
    if obj is None and path.is_file() and sglang_log.looks_like_log(path):
        return "sglang-log"
    if kv_events.looks_like(obj):
        return "kv-events"
    for name, mod in (
        ("openai", openai_chat),
        ("weka", weka),
        ("bench-serving", bench_serving),
        ("bench-multiturn", bench_multiturn),
    ):
        if mod.looks_like(obj):
            return name
    return None


def read_import(
    path: Path, fmt: str, options: ImportOptions | None = None, *, lenient: bool = False
) -> Trace:
    """Read `path` with the importer `fmt` (one of `IMPORT_FORMATS`)."""
    from traces.importers import bench_multiturn, bench_serving, openai_chat, weka

    options = options or ImportOptions()
    if fmt == "openai":
        return openai_chat.read_openai_chat(path, options.chat, lenient=lenient)
    if fmt == "weka":
        return weka.read_weka(path, lenient=lenient)
    if fmt == "bench-serving":
        return bench_serving.read_bench_serving(
            path, block_size=options.block_size, lenient=lenient
        )
    if fmt == "sglang-log":
        from traces.importers import sglang_log

        return sglang_log.read_sglang_log(
            path, tokenizer=options.chat.tokenizer, block_size=options.block_size, lenient=lenient
        )
    if fmt == "sglang-dump":
        from traces.importers import sglang_dump

        return sglang_dump.read_sglang_dump(
            path, tokenizer=options.chat.tokenizer, block_size=options.block_size, lenient=lenient
        )
    if fmt == "kv-events":
        from traces.importers import kv_events

        return kv_events.read_kv_events(path, lenient=lenient)
    if fmt == "bench-multiturn":
        return bench_multiturn.read_bench_multiturn(
            path, options.bench_args, block_size=options.block_size
        )
    raise AssertionError(f"unknown import format {fmt!r}")
