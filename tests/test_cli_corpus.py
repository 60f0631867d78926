"""The CLI's bad-input corpus: every command, fed bad arguments and bad files, answers with exit
code 2 and exactly one line on stderr naming the file or argument, never a traceback, and leaves
no partial output behind (``cli.errors``: the one user-error rule).

The explicit cases are the ones reported (each used to give a traceback, a wrong blame or a
silent result); the generated ones (hypothesis) vary argument values and file contents for
every subcommand. A generated input may happen to be valid: then the command must succeed
(exit 0). Everything runs in-process through ``cli.main.main`` on tiny inputs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import string
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from hicache.config.keys import key_docs

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
PROFILE = Path(__file__).resolve().parent.parent / "hicache" / "profiles"

# six small requests sharing a prefix: every command runs on them in well under a second
TINY = "\n".join(
    json.dumps({"timestamp": 100 * i, "input_length": 520 + 80 * i, "output_length": 8,
                "hash_ids": [0, 1 + i]})
    for i in range(6)
) + "\n"  # fmt: skip
SMALL_POOL = ["--set", "gpu.device_tokens=8192"]

#: few examples per generated test: the whole file must stay well under a minute on 2 cores
#: (CORPUS_EXAMPLES=500 explores more, for a change to the CLI)
FEW = settings(
    max_examples=int(os.environ.get("CORPUS_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def call(argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def check(
    argv: Sequence[str],
    root: Path,
    names: Sequence[str],
    *,
    may_succeed: bool = False,
    outputs: Sequence[Path] = (),
) -> int:
    """Run ``argv``; a failure must be exit 2 with one stderr line naming one of ``names`` and
    leave ``root`` as it was. ``may_succeed``: exit 0 is fine too (then ``outputs`` are removed
    so the next example starts clean). Returns the exit code."""
    before = snapshot(root)
    rc, out, err = call(argv)
    assert "Traceback" not in out + err, (argv, out, err)
    if rc == 0 and may_succeed:
        for p in outputs:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        return rc
    assert rc == 2, (argv, rc, out[-500:], err)
    lines = err.splitlines()
    assert len(lines) == 1, (argv, err)
    assert any(n in lines[0] for n in names), (argv, lines[0], names)
    assert snapshot(root) == before, (argv, snapshot(root) ^ before)
    return rc


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("corpus")
    (d / "tiny.jsonl").write_text(TINY)
    (d / "afile").write_text("a plain file\n")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (d / "adir").mkdir()
    (d / "adir" / "keep.txt").write_text("x")
    cpu = json.loads((PROFILE / "h100-sxm-pcie5-x16-default.json").read_text())
    cpu["provenance"] = {"source": "test", "measured_on": "cpu", "machine_device": "cpu"}
    (d / "cpu-profile.json").write_text(json.dumps(cpu))
    yield d


@pytest.fixture
def here(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(root)
    return root


# --- the reported cases ----------------------------------------------------------------------

CASES: list[tuple[list[str], list[str]]] = [
    # 1. outputs checked before the work
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--plot", "x.txt"], ["x.txt"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--csv", "afile/x.csv"],
     ["afile/x.csv"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--csv", "adir"], ["adir"]),
    (["report", "adir", "--out", "adir"], ["adir"]),
    (["report", "adir", "--out", "report.txt"], ["report.txt"]),
    (["run", "tiny.jsonl", "--out", "afile", *SMALL_POOL], ["afile"]),
    (["run", "tiny.jsonl", "--out", "afile/sub", *SMALL_POOL], ["afile/sub"]),
    (["run", "tiny.jsonl", "--out", "adir", *SMALL_POOL], ["adir", "--force"]),
    (["sweep", "tiny.jsonl", "--out", "afile"], ["afile"]),
    (["trace", "convert", "tiny.jsonl", "out.csv"], ["out.csv"]),
    (["trace", "gen", "multiturn", "--out", "adir"], ["adir"]),
    (["replay", "calibrate", "adir", "--out", "p.txt"], ["p.txt"]),
    # 2. bad numbers and unreadable files
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192,16384", "--jobs", "-3"], ["--jobs"]),
    (["sweep", "afile", "--out", "s", "--jobs", "-1"], ["--jobs"]),
    (["run", "tiny.jsonl", "--config", "binary.bin", "--out", "r"], ["binary.bin"]),
    (["sweep", "binary.bin", "--out", "s"], ["binary.bin"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "inf"], ["--device-tokens"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "nan"], ["--device-tokens"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "-64"], ["--device-tokens"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "10"], ["--device-tokens"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "1e15"], ["--device-tokens"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--hicache-ratio", "1e12"],
     ["--hicache-ratio"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--page-size", "0"], ["--page-size"]),
    (["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--eviction", "nope"], ["--eviction"]),
    (["run", "tiny.jsonl", "--out", "r", "--set", "gpu.device_tokens=1e12",
      "--set", "cache.page_size=1"], ["gpu.device_tokens"]),
    (["run", "tiny.jsonl", "--out", "r", "--seed", "-1"], ["--seed"]),
    (["trace", "stats", "binary.bin"], ["binary.bin"]),
    (["trace", "validate", "binary.bin"], ["binary.bin"]),
    (["trace", "stats", "tiny.jsonl", "--page-size", "-4"], ["--page-size"]),
    (["replay", "calibrate", "binary.bin", "--out", "p.json"], ["binary.bin"]),
    # 5. a profile for another machine; 9. a missing profile is not blamed on the trace
    (["run", "tiny.jsonl", "--out", "r", "--profile", "cpu-profile.json", *SMALL_POOL],
     ["--allow-profile-mismatch"]),
    (["run", "tiny.jsonl", "--out", "r", "--profile", "missing.json"], ["missing.json: "]),
    # 10. SGLang flags
    (["run", "tiny.jsonl", "--out", "r", "--sglang-args", "--model-path acme/Frob-7B"],
     ["--model-path"]),
    (["run", "tiny.jsonl", "--out", "r", "--sglang-args", "--page-size x"], ["--page-size"]),
    (["run", "tiny.jsonl", "--out", "r", "--sglang-args", "--schedule-policy lof"],
     ["--schedule-policy lof"]),
    (["run", "tiny.jsonl", "--out", "r", "--sglang-args", "--tp 0"], ["--tp 0"]),
    (["config", "sglang", "--sglang-args", "--page-size 64 --max-total-tokens 10"],
     ["--max-total-tokens"]),
    (["config", "keys", "--bogus"], ["--bogus"]),
    (["config", "sglang", "--set", "cache.nope=1"], ["cache.nope"]),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_reported_bad_inputs(argv: list[str], names: list[str], here: Path) -> None:
    check(argv, here, names)


def test_an_unwritable_run_directory(here: Path) -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc")
    check(["run", "tiny.jsonl", "--out", "/proc/x", *SMALL_POOL], here, ["/proc/x"])


def test_demo_jobs_is_checked(here: Path) -> None:
    from cli.args import jobs_arg
    from cli.main import build_parser

    demo = build_parser()._subparsers._group_actions[0].choices["demo"]  # type: ignore[union-attr]
    jobs = next(a for a in demo._actions if "--jobs" in a.option_strings)
    if jobs.type is not jobs_arg:  # the demo's own options are another change's
        pytest.skip("demo --jobs does not use cli.args.jobs_arg yet")
    check(["demo", "--jobs", "-1", "--out", "demo-out"], here, ["--jobs"])


def test_results_come_before_a_failed_write(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that still cannot be written after the checks (disk full) does not lose the
    table: it is printed first, then the one error line."""
    import cli.hitrate

    def full(rows: object, path: Path) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(cli.hitrate, "write_csv", full)
    rc, out, err = call(["hitrate", "tiny.jsonl", "--device-tokens", "8192", "--csv", "t.csv"])
    assert rc == 2 and "infinite-capacity hit rate" in out
    assert err == "hicache-sim: t.csv: cannot write CSV table: No space left on device\n"


def test_a_mismatched_profile_is_allowed_with_the_flag(here: Path) -> None:
    argv = ["run", "tiny.jsonl", "--out", "allowed", "--profile", "cpu-profile.json",
            "--allow-profile-mismatch", *SMALL_POOL]  # fmt: skip
    rc, out, err = call(argv)
    shutil.rmtree(here / "allowed")
    assert rc == 0 and "TTFT" in out
    assert err.startswith("warning: cpu-profile.json: it was measured on CPU tensors")


def test_interrupt_stops_workers_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C during a process-pool run: the workers ignore SIGINT, the parent stops them and
    prints ``hicache-sim: interrupted`` (130); no worker prints a KeyboardInterrupt."""
    import os
    import signal
    import subprocess
    import sys
    import time

    flag = tmp_path / "started"
    # SIGINT as a terminal's foreground job has it: a shell that starts this suite in the
    # background (`cmd &` in a script) passes SIGINT on ignored, and Python then keeps it so
    script = f"""
import argparse, pathlib, signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from cli.errors import run_command
from studies.sweep.executors import map_local

def work(i):
    pathlib.Path({str(flag)!r}).touch()
    time.sleep(30)
    return i

def cmd(args):
    map_local(work, list(range(4)), 2)
    return 0

if __name__ == "__main__":
    raise SystemExit(run_command(argparse.Namespace(func=cmd)))
"""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the "terminal" Ctrl-C signals
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        deadline = time.monotonic() + 30
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flag.exists(), "no worker started"
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err == "hicache-sim: interrupted\n", err


# --- generated ---------------------------------------------------------------------------------

_NUMBERS = st.one_of(
    st.integers(-(10**8), 10**8).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", "0", "-0", "1e400", "1e15", "1,2", "0x10", "64.5", " 7", "1_000"]),
)
_WORDS = st.text(alphabet=string.ascii_letters + string.digits + "_-.,=/ ", max_size=12)
VALUES = st.one_of(_NUMBERS, _WORDS, st.text(max_size=8))


@FEW
@given(
    option=st.sampled_from(["--device-tokens", "--host-tokens", "--hicache-ratio", "--page-size",
                            "--eviction", "--write-policy", "--outputs", "--jobs"]),
    value=VALUES,
)  # fmt: skip
def test_hitrate_argument_values(root: Path, option: str, value: str) -> None:
    argv = ["hitrate", str(root / "tiny.jsonl"), "--device-tokens", "8192", f"{option}={value}"]
    check(argv, root, [option, "argument", "tiny.jsonl"], may_succeed=True)


_KEYS = [d.dotted for d in key_docs()]


@FEW
@given(key=st.sampled_from(_KEYS), value=VALUES)
def test_run_set_values(root: Path, key: str, value: str) -> None:
    out = root / "set-run"
    argv = ["run", str(root / "tiny.jsonl"), "--out", str(out), *SMALL_POOL,
            "--set", f"{key}={value}"]  # fmt: skip
    check(argv, root, [key, "--set", "tiny.jsonl", value.strip() or "\0"], may_succeed=True,
          outputs=[out])  # fmt: skip


_SGLANG_FLAGS = [
    "--model-path", "--tp", "--tp-size", "--page-size", "--hicache-ratio", "--hicache-size",
    "--hicache-write-policy", "--hicache-io-backend", "--hicache-mem-layout",
    "--max-total-tokens", "--mem-fraction-static", "--schedule-policy", "--chunked-prefill-size",
    "--max-prefill-tokens", "--max-running-requests", "--radix-eviction-policy", "--bogus-flag",
]  # fmt: skip


@FEW
@given(
    pairs=st.lists(st.tuples(st.sampled_from(_SGLANG_FLAGS), _NUMBERS | _WORDS), max_size=4),
    hierarchical=st.booleans(),
)
def test_config_sglang_args(root: Path, pairs: list[tuple[str, str]], hierarchical: bool) -> None:
    import shlex

    words = ["--enable-hierarchical-cache"] if hierarchical else []
    for flag, value in pairs:
        words += [flag, value]
    text = " ".join(shlex.quote(w) for w in words)
    argv = ["config", "sglang", "--sglang-args", text]
    names = ["--sglang-args", *(f for f, _ in pairs)]
    check(argv, root, names, may_succeed=True)


_JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(), st.text(max_size=6)
)
_TRACE_KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "session_id", "turn",
               "format", "version", "block_size"]  # fmt: skip
_TRACE_LINES = st.lists(
    st.one_of(
        st.dictionaries(
            st.sampled_from(_TRACE_KEYS),
            _JSON_SCALARS | st.lists(st.integers(-5, 50), max_size=4),
            max_size=6,
        ).map(json.dumps),
        st.text(max_size=30),
    ),
    max_size=5,
).map("\n".join)
CONTENTS = st.one_of(st.binary(max_size=200), _TRACE_LINES.map(str.encode))


def _file(root: Path, name: str, content: bytes) -> Path:
    d = root / "gen"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    path = d / name
    path.write_bytes(content)
    return path


@FEW
@given(
    command=st.sampled_from(["run", "hitrate", "stats", "validate", "convert"]),
    suffix=st.sampled_from([".jsonl", ".jsonl.gz", ".parquet"]),
    content=CONTENTS,
)
def test_trace_file_contents(root: Path, command: str, suffix: str, content: bytes) -> None:
    path = _file(root, "t" + suffix, content)
    out = path.parent / "out"
    argv = {
        "run": ["run", str(path), "--out", str(out), *SMALL_POOL],
        "hitrate": ["hitrate", str(path), "--device-tokens", "8192"],
        "stats": ["trace", "stats", str(path)],
        "validate": ["trace", "validate", str(path)],
        "convert": ["trace", "convert", str(path), str(out) + ".jsonl"],
    }[command]
    check(argv, root, [path.name], may_succeed=True,
          outputs=[out, Path(str(out) + ".jsonl")])  # fmt: skip


_TOML = st.lists(
    st.one_of(
        st.sampled_from(["[model]", "[cache]", "[gpu]", "[base]", "[axes]", "[nope]", "x = 1"]),
        st.builds(lambda k, v: f"{k} = {v}",
                  st.sampled_from([*_KEYS, "trace", "name", "page_size"]),
                  st.sampled_from(["1", "-1", "'x'", "[1, 2]", "true", "1e400", "{a=1}", "nan"])),
        st.text(max_size=20),
    ),
    max_size=6,
).map(lambda lines: "\n".join(lines).encode())  # fmt: skip


@FEW
@given(command=st.sampled_from(["run", "sweep"]), content=st.one_of(st.binary(max_size=80), _TOML))
def test_config_and_grid_contents(root: Path, command: str, content: bytes) -> None:
    path = _file(root, "c.toml", content)
    out = path.parent / "out"
    if command == "run":
        argv = ["run", str(root / "tiny.jsonl"), "--config", str(path), "--out", str(out),
                *SMALL_POOL]  # fmt: skip
    else:
        argv = ["sweep", str(path), "--out", str(out), "--jobs", "1"]
    check(argv, root, [path.name], may_succeed=True, outputs=[out])


_PROFILE_JSON = st.one_of(
    st.binary(max_size=60),
    st.recursive(_JSON_SCALARS, lambda kids: st.dictionaries(
        st.sampled_from(["version", "gpu", "link", "measured", "provenance", "links", "compute",
                         "kernel", "d2h", "alpha_s", "beta_Bps", "source", "mfu"]), kids,
        max_size=5), max_leaves=12).map(lambda v: json.dumps(v).encode()),
)  # fmt: skip


@FEW
@given(content=_PROFILE_JSON)
def test_profile_contents(root: Path, content: bytes) -> None:
    path = _file(root, "p.json", content)
    argv = ["run", str(root / "tiny.jsonl"), "--profile", str(path), "--out",
            str(path.parent / "out"), *SMALL_POOL]  # fmt: skip
    check(argv, root, [path.name])  # no random JSON is a complete, valid profile


_BENCH_HEADER = ("kind,backend,direction,host_memory,layout,bytes,run_pages,layers,n_alpha,"
                 "n_gamma,flops,duration_s")  # fmt: skip
_BENCH_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["op", "plain", "bidir", "gemm", "x"]),
        st.sampled_from(["kernel", "direct", "plain"]),
        st.sampled_from(["d2h", "h2d"]),
        st.sampled_from(["pinned", ""]),
        st.sampled_from(["page_first", "layer_first"]),
        *[st.one_of(st.integers(-2, 1 << 20), st.floats(), st.just("x"))] * 6,
        st.floats(min_value=-1, max_value=1),
    ),
    max_size=12,
).map(lambda rows: "\n".join([_BENCH_HEADER, *(",".join(map(str, r)) for r in rows)]).encode())


@FEW
@given(bench=st.one_of(st.binary(max_size=100), _BENCH_ROWS), meta=_PROFILE_JSON)
def test_calibrate_bench_contents(root: Path, bench: bytes, meta: bytes) -> None:
    path = _file(root, "bench.csv", bench)
    (path.parent / "meta.json").write_bytes(meta)
    out = root / "cal.json"
    check(["replay", "calibrate", str(path.parent), "--out", str(out)], root,
          [str(path.parent)], may_succeed=True, outputs=[out])  # fmt: skip


@FEW
@given(summary=_PROFILE_JSON, config=_PROFILE_JSON)
def test_report_inputs(root: Path, summary: bytes, config: bytes) -> None:
    path = _file(root, "summary.json", summary)
    (path.parent / "config.json").write_bytes(config)
    check(["report", str(path.parent), "--out", str(root / "r.html")], root, [str(path.parent)])


@FEW
@given(words=st.lists(st.text(max_size=10), min_size=1, max_size=3))
def test_config_keys_arguments(root: Path, words: list[str]) -> None:
    check(["config", "keys", *words], root, ["argument", "hicache-sim"], may_succeed=True)
