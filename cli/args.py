"""Argument types and output checks every ``hicache-sim`` command shares.

Types (``type=`` of ``add_argument``) reject a bad value while the command line is parsed, so
argparse's one-line error (:class:`cli.errors.Parser`) names the option and nothing has run:
:func:`jobs_arg` for every ``--jobs``, :func:`int_at_least`, :func:`float_above` and
:func:`float_in_unit` for the other numbers.

Output checks run before a command does any work, so a typo in ``--out`` does not cost a
replay, and leave nothing behind: :func:`check_output_file` (a file of a known kind in a
folder that can be written) and :func:`check_output_dir` (a folder to create or reuse). Both
raise :class:`cli.errors.UserError` naming the path and the option.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from cli.errors import UserError

__all__ = [
    "check_output_dir",
    "check_output_file",
    "float_above",
    "float_in_unit",
    "int_at_least",
    "jobs_arg",
]


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _integer(text: str) -> int:
    """An integer; ``1e5`` and ``2.0`` are read as integers, ``2.5`` or ``x`` are errors."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def jobs_arg(text: str) -> int:
    """``--jobs``: worker processes, an integer >= 0 (0 = all cores). Every command's
    ``--jobs`` uses this type, so ``--jobs -1`` is an argument error before anything runs."""
    n = _integer(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = all cores), got {text!r}")
    return n


def int_at_least(lo: int) -> Callable[[str], int]:
    """A type: an integer >= ``lo`` (``1e5`` is read as 100000)."""

    def parse(text: str) -> int:
        n = _integer(text)
        if n < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text!r}")
        return n

    parse.__name__ = f"integer >= {lo}"
    return parse


def float_above(lo: float, *, inclusive: bool = False) -> Callable[[str], float]:
    """A type: a finite number > ``lo`` (>= with ``inclusive``)."""

    def parse(text: str) -> float:
        x = _number(text)
        if x < lo or (x == lo and not inclusive):
            raise argparse.ArgumentTypeError(
                f"must be {'>=' if inclusive else '>'} {lo:g}, got {text!r}"
            )
        return x

    parse.__name__ = f"number > {lo:g}"
    return parse


def float_in_unit(text: str) -> float:
    """A type: a number in (0, 1]."""
    x = _number(text)
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return x


# --- outputs ---------------------------------------------------------------------------------


def _probe_folder(folder: Path, target: Path, what: str) -> None:
    """Check that files can be created in ``folder`` (created if missing) by creating and
    removing one, and the missing folders with it; ``UserError`` naming ``target`` if not."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists():
        if probe.is_symlink():  # a dangling link: creating under it fails
            raise UserError(f"{target}: cannot write {what}: {probe} is a broken link")
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"{target}: cannot write {what}: {probe} is not a directory")
    created: list[Path] = []
    try:
        for d in reversed(missing):
            d.mkdir()
            created.append(d)
        fd, name = tempfile.mkstemp(prefix=".hicache-sim-probe.", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise UserError(f"{target}: cannot write {what}: {e.strerror or e}") from None
    finally:
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()


def check_output_file(
    path: Path, suffixes: Sequence[str], *, what: str, option: str = "--out", force: bool = False
) -> None:
    """Before any work: ``path`` (the value of ``option``) must end in one of ``suffixes``
    (e.g. ``(".png", ".svg", ".pdf")``), must not be a folder, must not exist unless ``force``
    (the command's ``--force``), and its folder must be writable (it is created later if
    missing; nothing is left behind by the check)."""
    name = path.name.lower()
    if suffixes and not any(name.endswith(s) for s in suffixes):
        raise UserError(f"{path}: {option} must end in {', '.join(suffixes)} ({what})")
    if path.is_dir():
        raise UserError(f"{path}: {option} is a directory, not a file ({what})")
    if path.exists() and not force:
        raise UserError(f"{path}: {what} exists (use --force to overwrite, or a new {option})")
    _probe_folder(path.parent, path, what)


def check_output_dir(path: Path, *, force: bool, what: str = "output folder",
                     option: str = "--out") -> None:  # fmt: skip
    """Before any work: ``path`` (the value of ``option``) must be a folder that can be
    created, or an existing writable folder that is empty unless ``force`` (use ``force=True``
    for outputs that are resumed). Nothing is left behind by the check."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: {option} exists and is not a directory")
    if path.is_dir() and not force and any(path.iterdir()):
        raise UserError(
            f"{path}: {what} exists and is not empty (use --force to overwrite, or a new {option})"
        )
    _probe_folder(path, path, what)
