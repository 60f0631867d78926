"""The one atomic writer: every output file of the project goes through :func:`write_atomic`.

It lives in the bottom layer (``traces``, which imports nothing of ours) so that every layer
above can use it, the trace writer included.

A file is written to a temporary name in its destination folder, flushed and fsynced, given the
mode a plain ``open()`` would give it, and renamed into place; on any failure the temporary
file is removed. A reader, or a run killed half-way, never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(
    path: str | Path, write: Callable[[Path], object], *, make_parents: bool = True
) -> Path:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then rename it to ``path``.

    ``write`` may open ``tmp`` itself (pandas' ``to_parquet``, matplotlib's ``savefig``): the
    file is fsynced after it returns. The parent folder is created if missing, unless
    ``make_parents`` is False (then a missing folder is the ``OSError`` of creating the file).
    """
    dest = Path(path)
    if make_parents:
        dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _umask_mode())  # mkstemp creates 0600
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def write_bytes_atomic(data: bytes, path: str | Path) -> Path:
    return write_atomic(path, lambda p: p.write_bytes(data))


def write_text_atomic(text: str, path: str | Path) -> Path:
    return write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_json_atomic(
    obj: Any, path: str | Path, *, indent: int = 2, sort_keys: bool = False
) -> Path:
    """``obj`` as JSON (non-JSON values via ``str``; NaN as ``NaN``), newline-ended."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, default=str)
    return write_text_atomic(text + "\n", path)


def write_parquet_atomic(df: Any, path: str | Path) -> Path:
    """A pandas DataFrame as Parquet (no index)."""
    return write_atomic(path, lambda p: df.to_parquet(p, index=False))


def write_csv_atomic(df: Any, path: str | Path) -> Path:
    """A pandas DataFrame as CSV (no index)."""
    return write_atomic(path, lambda p: df.to_csv(p, index=False))


__all__ = [
    "write_atomic",
    "write_bytes_atomic",
    "write_csv_atomic",
    "write_json_atomic",
    "write_parquet_atomic",
    "write_text_atomic",
]
