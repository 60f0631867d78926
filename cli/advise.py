"""``hicache-sim advise TRACE``: one page that answers whether HiCache helps on this trace and
configuration, the host pool that fits the server, the write policy, L3 against recompute,
what enabling costs when nothing hits, the router and SGLang's metric names (the answers are
:mod:`studies.advise`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.args import check_output_dir, jobs_arg
from cli.errors import input_and_os_errors


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``advise`` command to an argparse sub-parsers object."""
    from cli.config import add_config_options
    from cli.inputs import add_max_requests

    p: argparse.ArgumentParser = subparsers.add_parser(
        "advise",
        help="a verdict first: will HiCache help on this trace, how big, which policy, L3",
        description="Answer the questions operators ask before enabling HiCache, for one trace "
        "and configuration (--sglang-args, --config, --set as in run): will it help, the host "
        "pool per rank that fits the server, the write policy, L3 against recompute, what "
        "enabling costs when nothing hits, the router, and the per-tier hits in SGLang's own "
        "metric names; each answer names the run that backs it. Writes advise.html and "
        "advise.json with --out.",
    )
    p.add_argument("trace", type=Path, help="trace file (.jsonl, .jsonl.gz, .parquet)")
    add_config_options(p)
    add_max_requests(p)
    p.add_argument("--out", type=Path, help="folder for advise.html and advise.json")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.add_argument(
        "--no-timed", action="store_true",
        help="skip the two timed runs (TTFT without and with HiCache): cache-only answers only",
    )  # fmt: skip
    p.add_argument("--jobs", type=jobs_arg, default=0, help="worker processes (0 = all cores)")
    p.set_defaults(func=_cmd_advise, user_errors=input_and_os_errors)
    return p


def _cmd_advise(args: argparse.Namespace) -> int:
    from cli.config import resolve_config
    from cli.inputs import load_trace, max_requests_override
    from studies.advise import advise
    from studies.advise_html import advice_html, advice_text
    from traces.fsutil import write_json_atomic, write_text_atomic

    t0 = time.perf_counter()
    resolved = resolve_config(args, max_requests_override(args))
    if args.out is not None:
        check_output_dir(args.out, force=args.force, what="advise folder")
    trace = load_trace(args.trace, args.lenient)
    resolved.print_notes()
    advice = advise(resolved.cfg, trace, jobs=args.jobs, timed=not args.no_timed)
    print(advice_text(advice))
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        title = f"Should {args.trace.name} run with HiCache?"
        write_text_atomic(advice_html(advice, title), args.out / "advise.html")
        data = {"setup": advice.setup, "answers": [a.__dict__ for a in advice.answers],
                "facts": advice.facts}  # fmt: skip
        write_json_atomic(data, args.out / "advise.json", indent=1, sort_keys=True)
        print(f"advice: {args.out / 'advise.html'}, {args.out / 'advise.json'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.advise TRACE ...``: the ``advise`` command on its own."""
    from cli.errors import run_one_command

    return run_one_command("advise", register, argv)


if __name__ == "__main__":
    sys.exit(main())
