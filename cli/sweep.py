"""The ``hicache-sim sweep`` command (the sweep itself is :mod:`studies.sweep`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.args import check_output_dir, int_at_least, jobs_arg
from cli.errors import UserError, input_and_os_errors
from studies.sweep import EXECUTORS, run_sweep
from studies.sweep.grid import load_grid

if TYPE_CHECKING:
    import pandas as pd

# --- command line ----------------------------------------------------------------------------


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sweep`` command to an argparse sub-parsers object (``func`` returns an exit
    code: 0 all jobs ok, 1 some failed; a grid or argument error, a ``ValueError``, is a user
    error for :func:`cli.errors.run_command`: one line, exit code 2)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sweep",
        help="run a grid of configurations (cross product of axes) as resumable jobs",
        description="Run every combination of a grid file's axes as an independent timed "
        "simulation (format: examples/README.md). Each job writes OUT/runs/<job>/; "
        "OUT/results.parquet and results.csv hold one row per job. Rerunning skips finished "
        "jobs with the same resolved config and retries failed ones.",
    )
    p.add_argument("grid", type=Path, help="grid file (TOML)")
    p.add_argument(
        "--out", type=Path, required=True,
        help="sweep directory to write (an existing one is resumed)",
    )  # fmt: skip
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default=0,
        help="worker processes (local) or CPUs of a local Ray (0 = all cores, the default)",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="local process pool (default) or Ray (needs the 'cluster' extra)",
    )
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument(
        "--sglang-version", metavar="V[,V]",
        help="the SGLang release(s) whose cache decides (sglang.version): one sets it for every "
        "job; several add an axis, e.g. 0.5.14,0.5.23 to see what upgrading changes",
    )  # fmt: skip
    p.add_argument(
        "--allow-host-overcommit", action="store_true",
        help="run jobs whose host pools exceed their server's DRAM anyway "
        "(gpu.allow_host_overcommit = true); without it such a job fails with the figures",
    )  # fmt: skip
    p.add_argument(
        "--seeds", type=int_at_least(1), metavar="K",
        help="run every configuration K times (an axis 'seed': run.seed and router.seed + 0, "
        "1, ..., K-1, each on the trace with its sessions' start offsets permuted by that "
        "seed, seed 0 as recorded); OUT/seeds.csv and the printed table give per "
        "configuration the median and 5th-95th percentile over the seeds",
    )  # fmt: skip
    p.set_defaults(func=_cmd_sweep, user_errors=input_and_os_errors)
    return p


def _check_grid(grid: Path) -> None:
    """A grid file that cannot be read or is not text, as a one-line error naming it."""
    try:
        grid.read_bytes().decode("utf-8")
    except OSError as e:
        raise UserError(f"{grid}: cannot read grid: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{grid}: cannot read grid: not a UTF-8 text (TOML) file") from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    import shutil

    t0 = time.perf_counter()
    _check_grid(args.grid)
    check_output_dir(args.out, force=True, what="sweep directory")
    created = not args.out.exists()
    grid: Any = args.grid
    if args.sglang_version:
        grid = _with_versions(load_grid(args.grid), args.sglang_version)
    if args.allow_host_overcommit:
        grid = (grid if not isinstance(grid, Path) else load_grid(grid)).with_set(
            ["gpu.allow_host_overcommit=true"]
        )
    if args.seeds:
        from studies.sweep.seeds import with_seeds

        grid = with_seeds(grid if not isinstance(grid, Path) else load_grid(grid), args.seeds)
    try:
        df = run_sweep(grid, args.out, jobs=args.jobs, executor=args.executor, address=args.address)
    except Exception:
        # a grid error found before any job ran leaves no empty sweep directory behind
        if created and args.out.is_dir() and not any(args.out.iterdir()):
            shutil.rmtree(args.out, ignore_errors=True)
        raise
    print(format_results(df, time.perf_counter() - t0, args.out, per_job=not args.seeds))
    if args.seeds:
        print(_write_seed_table(df, args.out))
    return 1 if (df["status"] != "ok").any() else 0


def _with_versions(grid: Any, text: str) -> Any:
    """``grid`` with ``--sglang-version``: one version set for every job, several an axis."""
    from hicache.versions import SGLANG_VERSIONS

    versions = [v.strip() for v in text.split(",") if v.strip()]
    for v in versions:
        if v not in SGLANG_VERSIONS:
            raise UserError(
                f"--sglang-version: unknown SGLang version {v!r}; choose from "
                f"{', '.join(SGLANG_VERSIONS)}"
            )
    if len(versions) == 1:
        return grid.with_set([f"sglang.version={versions[0]}"])
    return grid.with_axis("sglang.version", versions)


def _write_seed_table(df: pd.DataFrame, out: Path) -> str:
    """Write ``out/seeds.csv`` (:func:`studies.sweep.seeds.seed_table`); the table as text:
    per configuration the hit rate and TTFT p90 as median [interval], and the overloaded
    seeds."""
    from cli.run_output import duration
    from studies.sweep.seeds import interval_note, seed_table
    from traces.fsutil import write_csv_atomic

    table = seed_table(df)
    write_csv_atomic(table, out / "seeds.csv")
    if not len(table):
        return f"no finished seeds: {out / 'seeds.csv'} is empty"
    axes = list(table.columns[: table.columns.get_loc("seeds")])
    shown = table[axes].copy()
    show = {"hit_rate": lambda v: f"{v:.1%}", "ttft_p90_s": duration}
    for key, fmt in show.items():
        if key in table.columns:
            shown[key] = [
                f"{fmt(m)} [{fmt(lo)} - {fmt(hi)}]"
                for m, lo, hi in zip(
                    table[key], table[f"{key}_lo"], table[f"{key}_hi"], strict=True
                )
            ]
    shown["seeds"] = table["seeds"]
    if "overloaded_seeds" in table.columns:
        shown["overloaded"] = table["overloaded_seeds"].map(lambda n: str(n) if n else "")
    head = f"per configuration, {interval_note()}:"
    body = shown.rename(columns={"hit_rate": "hit rate", "ttft_p90_s": "TTFT p90"})
    return "\n".join(
        [head, body.to_string(index=False, max_rows=40), f"seeds: {out / 'seeds.csv'}"]
    )


def format_results(df: pd.DataFrame, seconds: float, out: Path, per_job: bool = True) -> str:
    """A few lines for the terminal: counts, the headline metrics per job (unless not
    ``per_job``: a ``--seeds`` sweep prints them per configuration instead), the failures."""
    ok = df[df["status"] == "ok"]
    failed = df[df["status"] != "ok"]
    lines = [
        f"{len(df)} jobs: {df.attrs.get('ran', 0)} ran, {df.attrs.get('reused', 0)} already done, "
        f"{len(failed)} failed ({seconds:.1f} s)",
    ]
    if per_job and len(ok) and "hit_rate" in df.columns:
        cols = list(df.columns)
        axes = cols[3 : cols.index("device_tokens")]
        from cli.run_output import duration

        times = {"ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "ttft_p99_s": "TTFT p99"}
        table = ok[[*axes, "hit_rate", *(c for c in times if c in df.columns)]].copy()
        table["hit_rate"] = table["hit_rate"].map(lambda x: f"{x:.1%}")
        for c in times:
            if c in table.columns:
                table[c] = table[c].map(duration)
        if "overloaded" in ok.columns:
            table["overloaded"] = ok["overloaded"].map(lambda x: "yes" if x is True else "")
        lines.append(table.rename(columns=times).to_string(index=False, max_rows=40))
    for _, r in failed.head(10).iterrows():
        lines.append(f"failed: {r['job']}: {r['error']}")
    if len(failed) > 10:
        lines.append(f"... and {len(failed) - 10} more failed jobs (see results.csv)")
    lines.append(f"results: {out / 'results.parquet'}, {out / 'results.csv'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cli.sweep GRID --out DIR ...``: the ``sweep`` command on its own."""
    from cli.errors import run_one_command

    return run_one_command("sweep", register, argv)


if __name__ == "__main__":
    # through the importable module, so pickled job functions refer to cli.sweep, not __main__
    from cli.sweep import main as _main

    sys.exit(_main())
