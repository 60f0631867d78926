"""Re-fit the compute models from the shipped H100 tables and print how well they fit.

    python bench/fit_compute.py               # fit, print, write the profile JSON
    python bench/fit_compute.py --check       # fit and print only; exit 1 if the JSON differs
    python bench/fit_compute.py --derive DIR  # first rebuild hicache/data/vidur/*.csv from a
                                              # copy of Vidur's data/profiling (DIR)

Prints the leave-one-model-out table of ``linear_s`` (the target is a median error of at most
10 % per model), the in-sample errors of the final fit, the attention curve against the FA3
points, and the all-reduce errors on held-out sizes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from hicache.compute.fit import ErrorStats, fit_compute_profile
from hicache.compute.profile import compute_profile_path, compute_to_dict, profile_differences
from hicache.compute.tables import (
    ALL_REDUCE_COLUMNS,
    ALL_REDUCE_TABLE,
    MLP_OPS,
    MLP_TABLE,
    SHAPE_COLUMNS,
    median_column,
)
from traces.fsutil import write_json_atomic, write_text_atomic

#: Vidur's per-model folders under ``compute/h100`` whose ``mlp.csv`` we keep.
VIDUR_MODELS = (
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-70b-hf",
    "codellama/CodeLlama-34b-Instruct-hf",
    "microsoft/phi-2",
)


def _csv_text(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = [",".join(header)] + [",".join(r) for r in rows]
    return "\n".join(lines) + "\n"


def derive_tables(src: Path) -> None:
    """Rebuild the compact tables: median columns and shape columns only, values unchanged."""
    header = ["model", *SHAPE_COLUMNS, *(median_column(op) for op in MLP_OPS)]
    rows = []
    for model in VIDUR_MODELS:
        with open(src / "compute" / "h100" / model / "mlp.csv", newline="") as f:
            for rec in csv.DictReader(f):
                rows.append([model] + [rec.get(c, "") for c in header[1:]])
    write_text_atomic(_csv_text(header, rows), MLP_TABLE)
    with open(src / "network" / "h100_dgx" / "all_reduce.csv", newline="") as f:
        ar = [[rec[c] for c in ALL_REDUCE_COLUMNS] for rec in csv.DictReader(f)]
    write_text_atomic(_csv_text(list(ALL_REDUCE_COLUMNS), ar), ALL_REDUCE_TABLE)


def _row(name: str, s: dict[str, float] | ErrorStats) -> str:
    d = s._asdict() if isinstance(s, ErrorStats) else s
    pct = " ".join(f"{d[k]:>8.2f}" for k in ("median_pct", "p90_pct", "max_pct"))
    return f"  {name:<38} {d['n']:>5} {pct}"


def report(prov: dict[str, object], coeffs: dict[str, object]) -> None:
    head = f"  {'':<38} {'n':>5} {'median%':>8} {'p90%':>8} {'max%':>8}"
    print("coefficients:", json.dumps(coeffs, indent=1))
    for key, title in (
        ("lomo_linear_s_pct", "leave-one-model-out linear_s (64-4096 tokens, all TP)"),
        ("in_sample_linear_s_pct", "in-sample linear_s, final fit"),
    ):
        print(f"\n{title}\n{head}")
        for name, s in prov[key].items():  # type: ignore[attr-defined]
            print(_row(name, s))
    print("\nattention vs FA3 points (signed %):", prov["attention_point_err_pct"])
    print(
        "causal/non-causal ratio vs FA3 paper (signed %):", prov["attention_causal_ratio_err_pct"]
    )
    print(f"\nall-reduce, held-out sizes (fit on every other size)\n{head}")
    for w, bands in prov["all_reduce_heldout_pct"].items():  # type: ignore[attr-defined]
        for band, s in bands.items():
            print(_row(f"{w} workers {band}", s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if JSON differs")
    ap.add_argument("--derive", type=Path, metavar="DIR", help="Vidur data/profiling folder")
    args = ap.parse_args(argv)
    if args.derive:
        derive_tables(args.derive)
    profile = fit_compute_profile(args.gpu, date=datetime.date.today().isoformat())
    out = compute_to_dict(profile)
    report(profile.provenance, {k: out[k] for k in ("gemm", "attention", "all_reduce")})
    path = compute_profile_path(args.gpu)
    if args.check:
        on_disk = json.loads(path.read_text()) if path.is_file() else {}
        diffs = profile_differences(on_disk, json.loads(json.dumps(out)))
        print(f"\n{path}: {'DIFFERS from' if diffs else 'matches'} a fresh fit", *diffs, sep="\n")
        return 1 if diffs else 0
    write_json_atomic(out, path)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
