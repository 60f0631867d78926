"""The optional compiled core: the hot modules built with mypyc.

Every module stays plain Python and the reference. ``python -m hicache.policy.native build``
(``make native``; ``make demo`` and ``make test`` run it) compiles the modules that hold the
per-node and per-event work (:data:`MODULES`: the radix tree and its allocators, the transfer
controllers' shared bookkeeping, the 0.5.23 tree core and cache, the request lifecycles, the
timed scheduler, its admission arithmetic and the link) with mypyc, the compiler that ships
with mypy, into ``hicache/policy/_native/``, next to a manifest of the exact sources it
compiled. The same source, compiled: every decision, clock value and page id stays as the
interpreted code makes it (``tests/test_native_core.py`` compares whole runs), and a timed run
takes about half the time (BENCHMARKS.md).

Whether a process uses the build is decided once, when the first of ``hicache``,
``hicache.policy`` and ``sim`` is imported, by the environment variable ``HICACHE_NATIVE``:

* ``auto`` (the default): the build is used when it exists, was made for this interpreter and
  machine, and its manifest matches the current sources byte for byte; otherwise the
  interpreted modules are used. The manifest covers every source of ``hicache``, ``sim`` and
  ``traces`` (what the compiled modules were checked against), so a source edited after the
  build is never shadowed by stale compiled code: it all runs interpreted until the next build.
* ``off``: always the interpreted modules (what the test suite's main run uses: some tests
  patch methods, which compiled classes do not look up).
* ``require``: the build must be usable, or the import fails and says why.

``HICACHE_NATIVE_DIR`` names another folder for the build (an install whose package folder is
read-only). ``python -m hicache.policy.native status`` says which one a process would get, and
why. Standard library only: mypyc runs in a child process and only ``build`` needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hicache.policy._loader import (
    BUILD_DIR,
    ENV,
    GROUPS,
    MANIFEST,
    MODES,
    MODULES,
    PACKAGES,
    ROOT,
    NativeStatus,
    _extension,
    compiled_modules,
    extension_dir,
    platform_tag,
    source_file,
    source_hashes,
    unusable_reason,
)

__all__ = [
    "BUILD_DIR",
    "ENV",
    "GROUPS",
    "MODES",
    "MODULES",
    "NativeStatus",
    "build",
    "compiled_modules",
    "main",
    "unusable_reason",
]


def build(build_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """Compile :data:`MODULES` with mypyc into ``build_dir`` (default :data:`BUILD_DIR`;
    replaced as a whole only once the new build is complete). Raises ``RuntimeError`` with
    mypyc's output on failure."""
    build_dir = BUILD_DIR if build_dir is None else build_dir
    if shutil.which("cc") is None and shutil.which("gcc") is None and "CC" not in os.environ:
        raise RuntimeError("no C compiler found (cc/gcc, or set CC): the core stays interpreted")
    probe = subprocess.run(
        [sys.executable, "-c", "import mypy.version; print(mypy.version.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        raise RuntimeError(
            "mypyc is not installed in this environment: pip install -e '.[native]' (or '.[dev]')"
        )
    mypy_version = probe.stdout.strip()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hicache-native-") as tmp:
        work = Path(tmp) / "src"
        # the packages the compiled modules import, for the type checker (sources only)
        for package in PACKAGES:
            for src in (ROOT / package).rglob("*.py"):
                dest = work / src.relative_to(ROOT)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
        hashes = source_hashes(work)  # of exactly what is compiled and checked against
        files = [str(source_file(m, work).relative_to(work)) for m in MODULES]
        cmd = [sys.executable, "-m", "mypyc", *files]
        res = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-30:])
            raise RuntimeError(f"mypyc failed (exit {res.returncode}):\n{tail}")
        shared = [p for p in work.iterdir() if p.is_file() and "__mypyc" in p.name]
        if len(shared) != 1:
            raise RuntimeError(f"expected one shared library from mypyc, found {len(shared)}")
        staging = Path(tmp) / "out"
        staging.mkdir()
        shutil.copy2(shared[0], staging / shared[0].name)
        for m in MODULES:
            package, _, stem = m.rpartition(".")
            ext = _extension(extension_dir(work, package), stem)
            if ext is None:
                raise RuntimeError(f"mypyc produced no extension for {m}")
            dest = extension_dir(staging, package)
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ext, dest / ext.name)
        manifest = {
            "platform": platform_tag(),
            "sources": hashes,
            "shared": shared[0].name.split(".", 1)[0],
            "mypy": mypy_version,
            "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        old = build_dir.with_name(build_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if build_dir.exists():
            build_dir.rename(old)
        shutil.move(str(staging), str(build_dir))
        shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        took = time.perf_counter() - t0
        print(f"compiled {len(MODULES)} modules ({', '.join(MODULES)}) in {took:.0f}s -> "
              f"{build_dir}")  # fmt: skip
    return build_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hicache.policy.native", description="The optional compiled core."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the hot modules with mypyc")
    b.add_argument(
        "--optional",
        action="store_true",
        help="on failure, say why and exit 0 (the core then stays interpreted)",
    )
    b.add_argument(
        "--if-needed",
        action="store_true",
        help="build only when there is no usable build for the current sources",
    )
    sub.add_parser("status", help="say whether this environment would use the build, and why")
    sub.add_parser("clean", help="delete the build")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        if args.if_needed and unusable_reason() is None:
            print(f"compiled core up to date ({BUILD_DIR})")
            return 0
        try:
            build()
        except RuntimeError as e:
            print(f"compiled core not built: {e}", file=sys.stderr)
            return 0 if args.optional else 1
        why = unusable_reason()
        if why is not None:  # built, but would not be picked up: say so rather than pretend
            print(f"the build is not usable: {why}", file=sys.stderr)
            return 0 if args.optional else 1
        return 0
    if args.cmd == "clean":
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        print(f"removed {BUILD_DIR}")
        return 0
    from hicache.policy import NATIVE  # the decision this process made at import

    print(NATIVE.reason)
    why = unusable_reason()
    print(f"build: {'usable' if why is None else why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
