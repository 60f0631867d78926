"""The ``hicache-sim report`` command (the report itself is :mod:`studies.report`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studies.report import build_report

# --- command line ----------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` command to an argparse sub-parsers object (``func`` returns an exit
    code; a ``ValueError`` is a user error for :func:`cli.errors.run_command`: one line, 2)."""
    from cli.errors import value_errors

    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="HTML (and PDF) report of runs and sweeps: figures, comparison, configs",
        description="Write one self-contained HTML file (figures as inline SVG, tables, the "
        "configs used) from run directories and/or sweep directories.",
    )
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="run or sweep directory")
    p.add_argument("--out", type=Path, required=True, help="HTML file to write")
    p.add_argument("--pdf", action="store_true", help="also write the figures as a PDF")
    p.set_defaults(func=_cmd_report, user_errors=value_errors)
    return p


def _cmd_report(args: argparse.Namespace) -> int:
    out = build_report(list(args.dirs), args.out, pdf=args.pdf)
    print(f"report: {out}" + (f" and {out.with_suffix('.pdf')}" if args.pdf else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.report DIR... --out FILE``: the ``report`` command on its own."""
    from cli.errors import run_command

    parser = argparse.ArgumentParser(prog="hicache-sim")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
