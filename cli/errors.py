"""The one user-error rule of ``hicache-sim``.

A command raises :class:`UserError` for anything the user can fix (bad arguments, unreadable or
malformed input); a command may also declare which library errors it already treats as the
user's (``set_defaults(user_errors=...)``: :func:`input_errors`, the input-error classes of the
layers below: :class:`hicache.config.ConfigError`, :class:`traces.schema.TraceError` and
``TraceParamError``, :class:`studies.errors.StudyError`), and :func:`run_command` converts
them in this one place.
:func:`run_command` is the only code that prints the error: one line, ``hicache-sim:
<message>`` (a command may set another ``error_prefix``), exit code 2. Ctrl-C prints
``hicache-sim: interrupted`` and gives 130. A closed output pipe (``run ... | head -1``) ends
the command quietly with 141, as a shell reports SIGPIPE. Any other exception -- a plain
``ValueError`` included -- is a bug: its traceback is printed with a line asking for a report,
exit code 70 (``EX_SOFTWARE``). :func:`cli.main.main` and the standalone entry points
(``python -m cli.sweep`` and the like) all end here.

Argument errors follow the same rule: every parser is a :class:`Parser`, whose ``error`` prints
one line, ``<prog>: <message> (see <prog> --help)``, and exits 2 (argparse's default prints
the usage block first). :func:`parse_args` runs a parser and turns its exit into a return code,
so an in-process ``main(argv)`` returns 2 instead of raising ``SystemExit``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

PROG = "hicache-sim"
#: Exit code of a user error.
EXIT_USER_ERROR = 2
#: Exit code after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: Exit code of a bug (sysexits.h ``EX_SOFTWARE``: an internal software error).
EXIT_BUG = 70
#: Exit code when stdout's reader went away (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE = 141
#: What follows a bug's traceback.
BUG_LINE = (
    "internal error: this is a bug in hicache-sim, not a problem with your input; please "
    "report it with the command line and the traceback above"
)

#: Turns an exception a command raised into a user-error message, or None (a bug: re-raised).
Converter = Callable[[Exception, argparse.Namespace], "str | None"]


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit code 2 (its
    sub-parsers are ``Parser`` too: argparse makes them of the parent's class)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(EXIT_USER_ERROR, f"{self.prog}: {line} (see {self.prog} --help)\n")


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit code argparse asked for (2 after an argument
    error, already printed; 0 after ``--help`` or ``--version``)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        if e.code is None:
            return 0
        return e.code if isinstance(e.code, int) else EXIT_USER_ERROR


def _input_error_classes() -> tuple[type[Exception], ...]:
    # imported here: a command's --help must not load the config or trace modules
    from hicache.config import ConfigError
    from studies.errors import StudyError
    from traces.schema import TraceError, TraceParamError

    return (ConfigError, TraceError, TraceParamError, StudyError)


def input_errors(e: Exception, args: argparse.Namespace) -> str | None:
    """A config, trace or study input error as its message (None for anything else: a plain
    ``ValueError`` out of the simulator is a bug, not the user's)."""
    return str(e) if isinstance(e, _input_error_classes()) else None


def input_and_os_errors(e: Exception, args: argparse.Namespace) -> str | None:
    """:func:`input_errors`, and an ``OSError`` as ``<file>: <reason>``."""
    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror}" if e.filename else str(e)
    return input_errors(e, args)


def value_and_os_errors(e: Exception, args: argparse.Namespace) -> str | None:
    """Every ``ValueError`` and ``OSError`` as its message: the broader rule of ``replay``,
    whose readers of bench tables and profiles report malformed files as ``ValueError``
    naming the file (see :mod:`cli.replay`)."""
    if isinstance(e, ValueError):
        return str(e)
    return input_and_os_errors(e, args)


def stdout_gone() -> None:
    """Point stdout at /dev/null after its reader closed the pipe, so that the interpreter's
    last flush does not raise again (the recipe of Python's ``signal`` documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output)
        pass
    finally:
        os.close(devnull)


def _message(e: Exception, args: argparse.Namespace) -> str | None:
    if isinstance(e, UserError):
        return str(e)
    convert: Converter | None = getattr(args, "user_errors", None)
    return None if convert is None else convert(e, args)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command (``args.func(args)``) and return its exit code; a user error is
    printed here, as one line on stderr, and gives :data:`EXIT_USER_ERROR`."""
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        stdout_gone()
        return EXIT_BROKEN_PIPE
    except Exception as e:
        message = _message(e, args)
        if message is None:
            traceback.print_exc()
            print(f"{PROG}: {BUG_LINE}", file=sys.stderr)
            return EXIT_BUG
    prefix: str = getattr(args, "error_prefix", PROG)
    line = " ".join(message.splitlines())
    print(f"{prefix}: {line}" if prefix else line, file=sys.stderr)
    return EXIT_USER_ERROR


__all__ = [
    "BUG_LINE",
    "EXIT_BROKEN_PIPE",
    "EXIT_BUG",
    "EXIT_INTERRUPTED",
    "EXIT_USER_ERROR",
    "PROG",
    "Parser",
    "UserError",
    "input_and_os_errors",
    "input_errors",
    "parse_args",
    "run_command",
    "stdout_gone",
    "value_and_os_errors",
]


def run_one_command(
    name: str, register: Callable[[Any], object], argv: Sequence[str] | None
) -> int:
    """``python -m cli.<name> ...``: the one command ``name`` on its own (its ``register``
    adds it to a parser), through the same parsing and error rule as ``hicache-sim``."""
    parser = Parser(prog="hicache-sim")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    args = parse_args(parser, [name, *(sys.argv[1:] if argv is None else argv)])
    return args if isinstance(args, int) else run_command(args)
