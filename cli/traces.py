"""``hicache-sim trace ...``: stats, convert, gen, validate.

`register(subparsers)` adds the ``trace`` command to a parent argparse parser (its
``func`` default is `run`); `main(argv)` runs it stand-alone (``python -m cli.traces``).
User errors (bad files, bad parameters: `TraceError`, `OSError`, `TraceParamError`) are printed
by :func:`cli.errors.run_command` as one line, ``hicache-sim: `` and the reader's
``path:line: field: problem`` form, and give exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.args import check_output_file, float_above, int_at_least
from cli.errors import Parser, parse_args, run_command
from traces.schema import DEFAULT_BLOCK_SIZE, Trace, TraceError

#: What a trace file's name ends in (the writer picks the format by it).
TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``trace`` command (with sub-commands stats, convert, gen, validate) to an
    ``argparse`` sub-parsers object; the parsed namespace gets ``func=run``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "trace",
        help="inspect, convert, generate and validate request traces",
        description="Inspect, convert, generate and validate request traces "
        "(JSONL, JSONL.gz, Parquet; see traces/README.md).",
    )
    _add_subcommands(parser)
    parser.set_defaults(func=run, user_errors=user_error)
    return parser


def _add_subcommands(parser: argparse.ArgumentParser) -> None:
    from traces.convert import SOURCE_FORMATS

    sub = parser.add_subparsers(dest="trace_command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("stats", help="print statistics of a trace (or of a vidur/Azure CSV)")
    p.add_argument(
        "file",
        type=Path,
        help="trace file (.jsonl, .jsonl.gz, .parquet; stats also reads vidur/Azure CSVs)",
    )
    p.add_argument(
        "--page-size",
        type=int_at_least(1),
        default=None,
        help="page size for the infinite-capacity hit ratio (default: 1 and the block size)",
    )
    p.add_argument("--no-reuse", action="store_true", help="skip the reuse-distance histogram")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--lenient", action="store_true", help="skip bad lines (and count them)")

    p = sub.add_parser(
        "convert",
        help="convert between trace formats, from CSV and from server/benchmark logs",
        description="Convert a trace, or import what a server or benchmark recorded "
        "(OpenAI chat logs, Weka agentic traces, bench_serving / bench_multiturn output, SGLang "
        "request logs and dumps); "
        "see traces/README.md for each format.",
    )
    p.add_argument("input", type=Path, help="the file to convert (its format: --from, or detected)")
    p.add_argument("output", type=Path, help="output file: .jsonl, .jsonl.gz or .parquet")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument(
        "--from",
        dest="from_format",
        choices=SOURCE_FORMATS,
        default="auto",
        help="source format (default: by content where unambiguous, else by suffix; a .csv "
        "is recognised by its header row)",
    )
    p.add_argument(
        "--block-size",
        type=int_at_least(1),
        default=DEFAULT_BLOCK_SIZE,
        help="block size of sources without their own: CSV, OpenAI logs, bench_serving "
        "(default %(default)s)",
    )
    p.add_argument("--lenient", action="store_true", help="skip bad lines (and count them)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    _add_import_options(p)

    p = sub.add_parser("validate", help="check a trace file; exit 0 if it is valid")
    p.add_argument(
        "file",
        type=Path,
        help="trace file (.jsonl, .jsonl.gz, .parquet; stats also reads vidur/Azure CSVs)",
    )
    p.add_argument("--lenient", action="store_true", help="skip bad lines (and count them)")
    p.add_argument("--json", action="store_true", help="print a JSON summary")

    _add_compose(sub)
    _add_record(sub)
    _add_gen(sub.add_parser("gen", help="generate a synthetic trace"))


def _add_compose(sub: Any) -> None:
    p = sub.add_parser(
        "merge",
        help="merge traces into one, hash ids namespaced",
        description="Merge traces into one in arrival order. Each input's hash ids are shifted "
        "past the previous inputs' (every generator and importer starts at 0), sessions get "
        "the prefix '<i>/'.",
    )
    p.add_argument("inputs", type=Path, nargs="+", help="trace files (any --from auto format)")
    p.add_argument("--out", type=Path, required=True, help="output: .jsonl, .jsonl.gz, .parquet")
    p.add_argument(
        "--rate-scale",
        default=None,
        metavar="S[,S...]",
        help="divide each input's times (and think times) by S: one value for all or one per "
        "input (default 1)",
    )
    p.add_argument(
        "--shared-ids",
        action="store_true",
        help="keep the ids as they are (the inputs come from one id space)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--json", action="store_true", help="print a JSON summary")

    p = sub.add_parser(
        "slice",
        help="keep a time window or a number of requests of a trace",
        description="Keep the requests arriving in [--start, --end) seconds after the first, "
        "then --count of them after the first --skip.",
    )
    p.add_argument("input", type=Path, help="trace file (any --from auto format)")
    p.add_argument("output", type=Path, help="output: .jsonl, .jsonl.gz or .parquet")
    p.add_argument("--start", type=float_above(-math.inf), default=0.0, help="seconds (default 0)")
    p.add_argument(
        "--end", type=float_above(-math.inf), default=None, help="seconds (default: end)"
    )
    p.add_argument("--skip", type=int_at_least(0), default=0, help="requests to drop first")
    p.add_argument("--count", type=int_at_least(1), default=None, help="requests to keep")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def _add_record(sub: Any) -> None:
    p = sub.add_parser(
        "record",
        help="record KV-cache events from a ZMQ publisher (SGLang/vLLM --kv-events-config)",
        description="Subscribe to a server's KV-cache event publisher and write the messages "
        "to FILE (JSON lines, the msgpack payloads as they came); convert it with "
        "'trace convert FILE OUT --from kv-events'.",
    )
    p.add_argument("--zmq", required=True, metavar="ENDPOINT", help="e.g. tcp://127.0.0.1:5557")
    p.add_argument("--out", type=Path, required=True, help="the recording (.jsonl)")
    p.add_argument("--topic", default="", help="the publisher's topic (default: all)")
    stop = p.add_mutually_exclusive_group(required=True)
    stop.add_argument("--duration", type=float_above(0.0), help="seconds to record")
    stop.add_argument("--max-events", type=int_at_least(1), help="stop after N events")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def _record(args: argparse.Namespace) -> int:
    from traces.importers.kv_events import record

    check_output_file(args.out, (".jsonl",), what="recording", force=args.force)
    messages, events = record(
        args.zmq,
        args.out,
        topic=args.topic,
        duration_s=args.duration,
        max_events=args.max_events,
    )
    if args.json:
        print(json.dumps({"output": str(args.out), "messages": messages, "events": events}))
    else:
        print(f"wrote {args.out}: {messages:,} messages, {events:,} events")
    return 0


def _add_import_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("OpenAI chat logs (--from openai)")
    g.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="the model's tokenizer.json (or its folder, whose tokenizer_config.json gives "
        "the chat template; also tokenizes SGLang log/dump requests sent as text); needs the "
        "'import' extra",
    )
    g.add_argument(
        "--chat-template",
        type=Path,
        default=None,
        help="a jinja chat template file (or a tokenizer_config.json) instead of the tokenizer's",
    )
    g.add_argument(
        "--hash-text",
        action="store_true",
        help="no tokenizer: block-hash the rendered text (lengths approximate tokens as "
        "--bytes-per-token UTF-8 bytes); no text leaves the machine",
    )
    g.add_argument(
        "--bytes-per-token",
        type=int_at_least(1),
        default=4,
        help="UTF-8 bytes per token assumed by --hash-text (default %(default)s)",
    )
    p.add_argument_group("bench_multiturn logs (--from bench-multiturn)").add_argument(
        "--bench-args",
        default="",
        metavar="FLAGS",
        help='the bench_multiturn flags of the runs, e.g. "--num-clients 64 --num-rounds 8 '
        "--request-length 1024\" (the log does not record them; defaults: bench_multiturn's)",
    )


def _import_options(args: argparse.Namespace) -> Any:
    from traces.importers import ImportOptions
    from traces.importers.openai_chat import ChatOptions

    chat = ChatOptions(
        tokenizer=args.tokenizer,
        template=args.chat_template,
        hash_text=args.hash_text,
        bytes_per_token=args.bytes_per_token,
    )
    return ImportOptions(chat=chat, bench_args=args.bench_args)


def _add_gen(p: argparse.ArgumentParser) -> None:
    from traces.generate import (
        ASSIGNMENTS,
        DISTRIBUTIONS,
        GENERATOR_SUMMARY,
        GENERATORS,
        PARAM_HELP,
        generator_params,
    )

    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True
    for kind, fn in GENERATORS.items():
        k = kinds.add_parser(
            kind,
            help=GENERATOR_SUMMARY[kind],
            description=inspect.cleandoc(fn.__doc__ or GENERATOR_SUMMARY[kind]),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        k.add_argument(
            "--out", type=Path, required=True, help="output file: .jsonl, .jsonl.gz or .parquet"
        )
        k.add_argument("--json", action="store_true", help="print a JSON summary")
        k.add_argument("--force", action="store_true", help="overwrite an existing --out")
        if kind == "multiturn":
            k.add_argument(
                "--fit",
                type=Path,
                default=None,
                metavar="TRACE",
                help="fit lognormal request, sub-question and output lengths and think times "
                "to TRACE and use them (instead of the --*-dist options)",
            )
        for name, default in generator_params(kind, optional=True).items():
            flag = "--" + name.replace("_", "-")
            text = PARAM_HELP.get(name, "")
            if isinstance(default, bool):
                k.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=default, help=text
                )
            elif name == "distribution":
                k.add_argument(
                    flag,
                    choices=DISTRIBUTIONS,
                    default=default,
                    help=text + " (default %(default)s)",
                )
            elif name == "system_prompt_assignment":
                k.add_argument(
                    flag, choices=ASSIGNMENTS, default=default, help=text + " (default %(default)s)"
                )
            elif name.endswith("_dist"):
                shown = f" (default {default})" if default else ""
                k.add_argument(flag, default=default, metavar="DIST", help=text + shown)
            else:
                # a float must be finite: NaN would slip through every range check
                typ = float_above(-math.inf) if isinstance(default, float) else type(default)
                k.add_argument(
                    flag, type=typ, default=default, help=text + " (default %(default)s)"
                )


def build_parser() -> argparse.ArgumentParser:
    """Stand-alone parser (``python -m cli.traces``), same options as ``hicache-sim trace``."""
    parser = Parser(
        prog="hicache-sim trace",
        description="Inspect, convert, generate and validate request traces.",
    )
    _add_subcommands(parser)
    parser.set_defaults(func=run, user_errors=user_error)
    return parser


def user_error(err: Exception, args: argparse.Namespace) -> str | None:
    """The one-line message of a user error of a ``trace`` command (None: not one, a bug)."""
    from traces.schema import TraceParamError

    if isinstance(err, TraceError):
        return str(err)
    source = getattr(args, "file", None) or getattr(args, "input", None)
    if isinstance(err, OSError):
        where = err.filename if err.filename is not None else (source or "trace")
        return f"{where}:0: file: {err.strerror or err}"
    if isinstance(err, TraceParamError):
        # a generator's, a converter's or a page key's parameter: named with the command
        text = " ".join(str(err).split())
        return f"trace {args.trace_command}: {text}"
    return None


def _report_skips(trace: Trace) -> None:
    if trace.skipped:
        print("warning: " + trace.skip_summary(), file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``trace`` command; returns the exit code (0 ok). User errors propagate
    (see :func:`user_error`) to :func:`cli.errors.run_command`."""
    with warnings.catch_warnings():
        # Lenient reads warn; the CLI prints its own one-line summary instead.
        warnings.simplefilter("ignore")
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    command = args.trace_command
    if command == "stats":
        return _stats(args)
    if command == "convert":
        return _convert(args)
    if command == "validate":
        return _validate(args)
    if command == "gen":
        return _gen(args)
    if command in ("merge", "slice"):
        return _compose(args)
    if command == "record":
        return _record(args)
    raise AssertionError(f"unknown trace command {command!r}")


def _stats(args: argparse.Namespace) -> int:
    from traces.convert import read_any
    from traces.stats import format_stats, trace_stats

    # read_any: a lengths-only CSV works too (its header notes that nothing is shared)
    trace = read_any(args.file, lenient=args.lenient)
    _report_skips(trace)
    stats = trace_stats(trace, args.page_size, reuse=not args.no_reuse)
    print(json.dumps(stats) if args.json else format_stats(stats))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from traces.convert import convert

    check_output_file(args.output, TRACE_SUFFIXES, what="trace", option="output", force=args.force)
    trace = convert(
        args.input,
        args.output,
        args.from_format,
        block_size=args.block_size,
        lenient=args.lenient,
        options=_import_options(args),
    )
    _report_skips(trace)
    summary: dict[str, Any] = {
        "input": str(args.input),
        "output": str(args.output),
        "requests": len(trace),
        "skipped": trace.skipped,
        "block_size": trace.block_size,
        "prefix_info": trace.header.extra.get("prefix_info", True),
        "sessions": len({r.session_id for r in trace.requests if r.session_id is not None}),
    }
    note = (
        trace.header.extra.get("note") if trace.header.extra.get("prefix_info") is False else None
    )
    if args.json:
        if note:
            summary["note"] = note
        print(json.dumps(summary))
    else:
        sessions = f", {summary['sessions']:,} sessions" if summary["sessions"] else ""
        print(
            f"wrote {args.output}: {len(trace):,} requests{sessions} "
            f"(block_size {trace.block_size})"
        )
        if note:
            print(f"note: {note}")
    return 0


def _compose(args: argparse.Namespace) -> int:
    from traces.compose import merge, slice_trace
    from traces.convert import read_any
    from traces.io import write_trace
    from traces.schema import TraceParamError

    out = args.out if args.trace_command == "merge" else args.output
    check_output_file(out, TRACE_SUFFIXES, what="trace", force=args.force)
    if args.trace_command == "merge":
        try:
            scales = [float(x) for x in args.rate_scale.split(",")] if args.rate_scale else None
        except ValueError:
            raise TraceParamError(f"--rate-scale: not numbers: {args.rate_scale!r}") from None
        inputs = [read_any(p) for p in args.inputs]
        trace = merge(
            inputs, scales, shared_ids=args.shared_ids, names=[str(p) for p in args.inputs]
        )
        _warn_mixed_loops(args.inputs, inputs)
    else:
        trace = slice_trace(
            read_any(args.input),
            start_s=args.start,
            end_s=args.end,
            skip=args.skip,
            count=args.count,
        )
    write_trace(trace, out)
    sessions = len({r.session_id for r in trace.requests if r.session_id is not None})
    if args.json:
        print(json.dumps({"output": str(out), "requests": len(trace), "sessions": sessions}))
    else:
        print(f"wrote {out}: {len(trace):,} requests, {sessions:,} sessions")
    return 0


def _warn_mixed_loops(paths: Any, inputs: Any) -> None:
    """A warning when some inputs record think times and others do not: a run replays a
    trace closed loop when any request records one (workload.closed_loop = auto), so the
    open-loop inputs' later turns would follow their predecessors instead of their own
    timestamps."""
    timed = [any(r.think_time_ms is not None for r in t.requests) for t in inputs]
    if any(timed) and not all(timed):
        shown = ", ".join(str(p) for p, t in zip(paths, timed, strict=True) if not t)
        print(
            f"warning: {shown} record no think times but the other inputs do: a run replays "
            "the merged trace closed loop (workload.closed_loop = auto), so their later turns "
            "follow their predecessors' finish (think time 0) instead of their timestamps; set "
            "workload.closed_loop = off to replay every arrival as recorded",
            file=sys.stderr,
        )


def _validate(args: argparse.Namespace) -> int:
    from traces.io import iter_requests

    reader = iter_requests(args.file, lenient=args.lenient)
    with reader:
        for _ in reader:
            pass
    summary = {
        "file": str(args.file),
        "valid": True,
        "requests": reader.count,
        "skipped": reader.skipped,
        "block_size": reader.header.block_size,
    }
    if reader.skipped:
        fields = ", ".join(f"{n} x {f}" for f, n in reader.skipped_by_field.most_common())
        print(
            f"warning: {args.file}: skipped {reader.skipped} bad lines ({fields}); first: "
            f"{reader.skipped_examples[0]}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{args.file}: ok, {reader.count:,} requests (block_size {reader.header.block_size})")
    return 0


def _gen(args: argparse.Namespace) -> int:
    from traces.generate import OPTIONAL_PARAMS, generate, generator_params
    from traces.io import write_trace

    params = {name: getattr(args, name) for name in generator_params(args.kind)}
    # the later options only where set: the --json summary of a default run stays as it was
    later = OPTIONAL_PARAMS[args.kind]
    params.update({n: getattr(args, n) for n, d in later.items() if getattr(args, n) != d})
    check_output_file(args.out, TRACE_SUFFIXES, what="trace", force=args.force)
    fitted = _fit(args, params) if getattr(args, "fit", None) is not None else None
    trace = generate(args.kind, **params)
    if fitted is not None:
        trace.header.extra["fitted_from"] = fitted
    write_trace(trace, args.out)
    if args.json:
        print(
            json.dumps(
                {
                    "output": str(args.out),
                    "generator": args.kind,
                    "requests": len(trace),
                    "params": params,
                }
            )
        )
    else:
        print(f"wrote {args.out}: {len(trace):,} requests ({args.kind}, seed {args.seed})")
    return 0


def _fit(args: argparse.Namespace, params: dict[str, Any]) -> str:
    """``--fit TRACE``: the fitted distributions into `params` (an explicit ``--*-dist``
    alongside is an error); returns the fitted trace's path for the header."""
    from traces.convert import read_any
    from traces.generate import fit_multiturn
    from traces.schema import TraceParamError

    given = [n for n in params if n.endswith("_dist")]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise TraceParamError(f"--fit replaces the length distributions: drop {flags}")
    params.update(fit_multiturn(read_any(args.fit)))
    return str(args.fit)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m cli.traces stats FILE`` etc."""
    args = parse_args(build_parser(), argv)
    return args if isinstance(args, int) else run_command(args)


if __name__ == "__main__":
    sys.exit(main())
