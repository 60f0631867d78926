"""``--export``: the device check's results as the few flat files a lent GPU machine hands back."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from traces.fsutil import write_atomic

#: the archive of the whole check that ``--export`` writes
ARCHIVE = "device-check.tar.gz"


def export(out: Path, dest: Path) -> list[Path]:
    """Copy what a reader needs at once (``summary.md``, ``summary.json``, a measured profile)
    and a gzipped tar of all of ``out`` into ``dest``; returns the files written.

    At most 4 flat files named in letters, digits, ``.``, ``_`` and ``-``: what a lent GPU
    machine's result folder hands back (8 files, 2 folders deep), whatever the check wrote."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    names = ["summary.md", "summary.json", *sorted(p.name for p in out.glob("*-measured.json"))]
    for name in names:
        if (out / name).is_file():
            shutil.copyfile(out / name, dest / name)
            written.append(dest / name)

    def write(tmp: Path) -> None:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(out, arcname=out.resolve().name or "device-check")

    written.append(write_atomic(dest / ARCHIVE, write))
    return written


__all__ = ["ARCHIVE", "export"]
