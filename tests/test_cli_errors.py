"""The one user-error rule (`cli.errors.run_command`): one line, exit 2; Ctrl-C gives 130;
a bug keeps its traceback; every command's line keeps its form."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.errors import (
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    UserError,
    run_command,
    value_and_os_errors,
    value_errors,
)
from cli.main import main

TRACE = Path(__file__).resolve().parent.parent / "traces" / "data" / "synthetic" / "multiturn.jsonl"


def args_for(fn: Callable[[argparse.Namespace], int], **kw: object) -> argparse.Namespace:
    return argparse.Namespace(func=fn, **kw)


def raising(exc: BaseException) -> Callable[[argparse.Namespace], int]:
    def fn(args: argparse.Namespace) -> int:
        raise exc

    return fn


def test_user_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(args_for(raising(UserError("bad\nthing")))) == EXIT_USER_ERROR
    assert capsys.readouterr().err == "hicache-sim: bad thing\n"


def test_exit_code_of_the_command_is_returned() -> None:
    assert run_command(args_for(lambda a: 1)) == 1
    assert run_command(args_for(lambda a: 0)) == 0


def test_interrupt_gives_130(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(args_for(raising(KeyboardInterrupt()))) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "hicache-sim: interrupted\n"


def test_converters_and_prefixes(capsys: pytest.CaptureFixture[str]) -> None:
    ns = args_for(raising(ValueError("grid: x")), user_errors=value_errors)
    assert run_command(ns) == 2
    assert capsys.readouterr().err == "hicache-sim: grid: x\n"
    missing = FileNotFoundError(2, "No such file or directory", "f.json")
    ns = args_for(raising(missing), user_errors=value_and_os_errors, error_prefix="p q")
    assert run_command(ns) == 2
    assert capsys.readouterr().err == "p q: f.json: No such file or directory\n"
    ns = args_for(raising(UserError("plain")), error_prefix="")
    assert run_command(ns) == 2
    assert capsys.readouterr().err == "plain\n"


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(ValueError, match="a bug"):  # no converter: not the user's error
        run_command(args_for(raising(ValueError("a bug"))))
    with pytest.raises(KeyError):  # a converter answers only for what it knows
        run_command(args_for(raising(KeyError("k")), user_errors=value_and_os_errors))


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", str(TRACE), "--out", "o", "--set", "cache.nope=1"], "hicache-sim: "),
        (["sweep", "missing.toml", "--out", "o"], "hicache-sim: missing.toml: "),
        (["report", "missing-dir", "--out", "r.html"], "hicache-sim: "),
        (["trace", "validate", "missing.jsonl"], "missing.jsonl:0: file: "),
        (["trace", "gen", "shared-prefix", "--prefixes", "0", "--out", "x.jsonl"],
         "trace gen: prefixes must be > 0, got 0"),
        (["replay", "calibrate", "missing-bench", "--out", "p.json"], "hicache-sim replay: "),
    ],
)  # fmt: skip
def test_every_command_through_main_prints_one_line(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
