"""Atomic writes of the replay's output files (JSON, Parquet + CSV tables).

Every file is written to a temporary name in the destination folder and renamed into place, so
a reader (or a crashed run) never leaves half a file behind (ENGINEERING.md: outputs are atomic).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give what open() would
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(obj: Any, path: Path) -> None:
    """``obj`` as indented JSON (keys in insertion order) ending in a newline."""
    text = json.dumps(obj, indent=2, default=str) + "\n"

    def write(p: Path) -> None:
        p.write_text(text, encoding="utf-8")

    _atomic(path, write)


def write_text(text: str, path: Path) -> None:
    """``text`` as UTF-8."""

    def write(p: Path) -> None:
        p.write_text(text, encoding="utf-8")

    _atomic(path, write)


def write_table(df: pd.DataFrame, folder: Path, stem: str) -> tuple[Path, Path]:
    """``df`` as ``folder/stem.parquet`` and ``folder/stem.csv``; returns both paths."""
    pq, csv = folder / f"{stem}.parquet", folder / f"{stem}.csv"
    _atomic(pq, lambda p: df.to_parquet(p, index=False))
    _atomic(csv, lambda p: df.to_csv(p, index=False))
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
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


__all__ = ["read_json", "read_table", "write_json", "write_table", "write_text"]
