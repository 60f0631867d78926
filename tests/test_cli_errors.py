"""The one user-error rule (`cli.errors.run_command`): one line, exit 2; Ctrl-C gives 130;
a bug keeps its traceback; every command's line keeps its form."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.errors import (
    BUG_LINE,
    EXIT_BROKEN_PIPE,
    EXIT_BUG,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    UserError,
    input_and_os_errors,
    input_errors,
    run_command,
    value_and_os_errors,
)
from cli.main import main
from hicache.config import ConfigError
from studies.errors import StudyError
from traces.schema import TraceParamError

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
    for err in (ConfigError("k", "bad"), TraceParamError("x"), StudyError("grid: x")):
        ns = args_for(raising(err), user_errors=input_errors)
        assert run_command(ns) == 2
        assert capsys.readouterr().err == f"hicache-sim: {' '.join(str(err).split())}\n"
    missing = FileNotFoundError(2, "No such file or directory", "f.json")
    ns = args_for(raising(missing), user_errors=input_and_os_errors, error_prefix="p q")
    assert run_command(ns) == 2
    assert capsys.readouterr().err == "p q: f.json: No such file or directory\n"
    ns = args_for(raising(UserError("plain")), error_prefix="")
    assert run_command(ns) == 2
    assert capsys.readouterr().err == "plain\n"


def test_a_bug_keeps_its_traceback_and_asks_for_a_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # no converter: not the user's error
    assert run_command(args_for(raising(ValueError("a bug")))) == EXIT_BUG == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ValueError: a bug" in err
    assert err.endswith(f"hicache-sim: {BUG_LINE}\n")
    # a converter answers only for what it knows: a plain ValueError out of a study or the
    # simulator (plan's old zip() error) is a bug, not the user's
    for exc in (KeyError("k"), ValueError("zip() argument 2 is shorter than argument 1")):
        assert run_command(args_for(raising(exc), user_errors=input_and_os_errors)) == 70
        assert "Traceback" in capsys.readouterr().err
    # replay keeps the broader rule: its readers report malformed files as ValueError
    ns = args_for(raising(ValueError("b.csv: bad")), user_errors=value_and_os_errors)
    assert run_command(ns) == 2


def test_a_closed_pipe_ends_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_command(args_for(raising(BrokenPipeError()))) == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["run", str(TRACE), "--out", "{tmp}/r", "--set", "workload.max_requests=20"],
        ["config", "keys", "--json"],
        ["hitrate", str(TRACE), "--json", "--device-tokens", "4096", "--host-tokens", "8192"],
        ["trace", "stats", str(TRACE)],
    ],
)
def test_piping_into_head_gives_no_traceback(argv: list[str], tmp_path: Path) -> None:
    """``hicache-sim ... | head -1``: the reader closes the pipe after one line."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "cli.main", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]
    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()
    p.stdout.close()  # as head does after its line
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode in (0, EXIT_BROKEN_PIPE)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["run", str(TRACE), "--out", "o", "--set", "cache.nope=1"], "hicache-sim: "),
        (["sweep", "missing.toml", "--out", "o"], "hicache-sim: missing.toml: "),
        (["report", "missing-dir", "--out", "r.html"], "hicache-sim: "),
        (["trace", "validate", "missing.jsonl"], "hicache-sim: missing.jsonl:0: file: "),
        (["trace", "gen", "shared-prefix", "--prefixes", "0", "--out", "x.jsonl"],
         "hicache-sim: trace gen: prefixes must be > 0, got 0"),
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
