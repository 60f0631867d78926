"""What several commands share: reading a trace with one-line errors, ``--max-requests``,
the comma-separated list arguments, and atomic CSV tables."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.args import int_at_least
from cli.errors import UserError

REPO_DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def int_list(text: str) -> list[int]:
    """Comma-separated token counts >= 0; ``1e6`` is read as 1000000 (a fraction is dropped)."""
    try:
        out = [int(float(x)) for x in text.split(",") if x.strip()]
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one value")
    if min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return out


def str_list(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected at least one name")
    return out


def check_names(option: str, what: str, names: Sequence[str], choices: Sequence[str]) -> None:
    bad = [n for n in names if n not in choices]
    if bad:
        names = ", ".join(map(repr, bad))
        raise UserError(f"{option}: unknown {what} {names}; choose from {', '.join(choices)}")


def load_trace(path: Path, lenient: bool = False) -> Any:
    """The trace at ``path``; ``lenient``: malformed lines are skipped, and one warning line
    says how many and why. Every read error is a ``UserError``."""
    import warnings

    from traces.io import read_trace
    from traces.schema import TraceError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the one-line summary below instead
            trace = read_trace(path, lenient=lenient)
        if trace.skipped:
            print(f"warning: {path}: {trace.skip_summary()}", file=sys.stderr)
        return trace
    except TraceError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"{path}: cannot read trace: {e.strerror or e}") from None
    except ValueError as e:  # e.g. a Parquet file pyarrow cannot read
        raise UserError(f"{path}: cannot read trace: {' '.join(str(e).split())}") from None


def add_max_requests(p: argparse.ArgumentParser) -> None:
    """``--max-requests N``: replay only the trace's first N requests."""
    p.add_argument(
        "--max-requests", type=int_at_least(1), metavar="N",
        help="replay only the trace's first N requests (workload.max_requests; default: all)",
    )  # fmt: skip


def max_requests_override(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``--max-requests`` as a config override for :func:`cli.config.resolve_config`."""
    n = getattr(args, "max_requests", None)
    return [(f"workload.max_requests={n}", f"--max-requests {n}")] if n else []


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import csv

    from traces.fsutil import write_atomic

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            # every row's keys, in first-seen order (rows of two grids may differ)
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            w.writeheader()
            w.writerows(rows)

    write_atomic(path, write)


__all__ = [
    "REPO_DATA",
    "add_max_requests",
    "load_trace",
    "max_requests_override",
    "write_csv",
]
