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
    from cli.errors import input_errors

    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="HTML (and PDF) report of runs and sweeps: figures, comparison, configs",
        description="Write one self-contained HTML file (figures as inline SVG, tables, the "
        "configs used) from run directories and/or sweep directories.",
    )
    p.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="run or sweep directory")
    p.add_argument("--out", type=Path, required=True, help="HTML file to write (FILE.html)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    p.add_argument("--pdf", action="store_true", help="also write the figures as a PDF")
    p.set_defaults(func=_cmd_report, user_errors=input_errors)
    return p


def _cmd_report(args: argparse.Namespace) -> int:
    from cli.args import check_output_file
    from cli.errors import UserError

    # before rendering: a directory or a typo in --out must not cost the work
    check_output_file(args.out, (".html", ".htm"), what="HTML report", force=args.force)
    try:
        out = build_report(list(args.dirs), args.out, pdf=args.pdf)
    except OSError as e:
        where = e.filename or args.out
        raise UserError(f"{where}: cannot write the report: {e.strerror or e}") from None
    print(f"report: {out}" + (f" and {out.with_suffix('.pdf')}" if args.pdf else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.report DIR... --out FILE``: the ``report`` command on its own."""
    from cli.errors import run_one_command

    return run_one_command("report", register, argv)


if __name__ == "__main__":
    sys.exit(main())
