"""Atomic writes of the replay's output files (JSON, Parquet + CSV tables).

Every file goes through the project's one atomic writer (:mod:`traces.fsutil`): a reader, or a
crashed run, never sees half a file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from traces.fsutil import (
    write_csv_atomic,
    write_json_atomic,
    write_parquet_atomic,
    write_text_atomic,
)


def write_json(obj: Any, path: Path) -> None:
    """``obj`` as indented JSON (keys in insertion order) ending in a newline."""
    write_json_atomic(obj, path, indent=2)


def write_text(text: str, path: Path) -> None:
    """``text`` as UTF-8."""
    write_text_atomic(text, path)


def write_table(df: pd.DataFrame, folder: Path, stem: str) -> tuple[Path, Path]:
    """``df`` as ``folder/stem.parquet`` and ``folder/stem.csv``; returns both paths."""
    pq, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
    write_parquet_atomic(df, pq)
    write_csv_atomic(df, csv)
    return pq, csv


def read_table(folder: Path, stem: str) -> pd.DataFrame:
    """``folder/stem.parquet`` (or the CSV twin when the Parquet file is missing);
    ``ValueError`` naming the folder when neither exists."""
    pq, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
    if pq.is_file():
        return pd.read_parquet(pq)
    if csv.is_file():
        return pd.read_csv(csv)
    raise ValueError(f"{folder}: no {stem}.parquet or {stem}.csv")


def read_json(path: Path) -> Any:
    """Parsed JSON; ``ValueError`` naming the file for a missing or malformed one."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: cannot read: not a UTF-8 text (JSON) file") from None
    except json.JSONDecodeError as e:
        msg = e.msg.removesuffix(" at")  # "Unterminated string starting at": the column says
        raise ValueError(f"{path}:{e.lineno}: invalid JSON: {msg} at column {e.colno}") from None


__all__ = ["read_json", "read_table", "write_json", "write_table", "write_text"]
