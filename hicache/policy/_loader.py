"""Which build of the hot modules this process loads: the interpreted sources or their
compiled build (:mod:`hicache.policy.native` builds it and documents ``HICACHE_NATIVE``).

Imported by the ``__init__`` of each package with compiled modules (``hicache``,
``hicache.policy``, ``sim``) before any of them; in the policy core because that is the one
package all three may import. Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

#: The compiled modules, by package. Only modules whose classes mypyc accepts can be here:
#: no class that an interpreted class subclasses (``CacheCounters``) unless it is marked
#: ``allow_interpreted_subclasses`` (``BaseController``, which the timed and replay controllers
#: subclass: its bookkeeping runs compiled under every one of them), none that
#: subclasses a built-in type or an interpreted class (the key types, ``SchedulerParams``, the
#: metric tables), which is why those live in modules of their own. The rest is not where the
#: time goes. Each package's ``__init__`` calls :func:`activate` with its name.
GROUPS: dict[str, tuple[str, ...]] = {
    "hicache.policy": ("radix", "allocator", "eviction", "controller", "hiradix", "shortcuts"),
    "hicache.policy.v0523": ("node", "victims", "removal", "tree", "cache"),
    "hicache": ("lifecycle", "lifecycle_v0523"),
    "sim": ("scheduler", "scheduler_v0523", "reference", "admission", "prefetching", "link"),
}
#: Every compiled module's dotted name (one mypyc build, one shared library: all or none).
MODULES = tuple(f"{pkg}.{m}" for pkg, names in GROUPS.items() for m in names)

ENV = "HICACHE_NATIVE"
MODES = ("auto", "off", "require")
PACKAGE_DIR = Path(__file__).resolve().parent
#: The folder that holds the ``hicache`` and ``sim`` packages.
ROOT = PACKAGE_DIR.parent.parent
#: Where the build lives: ``hicache/policy/_native`` unless ``HICACHE_NATIVE_DIR`` names another
#: folder (for an install whose package folder is read-only).
BUILD_DIR = Path(os.environ.get("HICACHE_NATIVE_DIR") or PACKAGE_DIR / "_native")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class NativeStatus:
    """Whether this process runs the compiled modules, and why (or why not)."""

    active: bool
    reason: str


def platform_tag() -> str:
    """What a build is only valid for: the interpreter's ABI and the machine."""
    return f"{sys.implementation.cache_tag}-{platform.machine()}"


def source_file(module: str, root: Path | None = None) -> Path:
    """The source of a compiled module (a dotted name of :data:`MODULES`)."""
    return (ROOT if root is None else root).joinpath(*module.split(".")).with_suffix(".py")


#: The packages a build is compiled against: the compiled modules' own and every one they
#: import (the layers below ``sim``). mypyc builds in what it knows of the classes and
#: functions they use, so a build matches only the exact sources of all of them.
PACKAGES = ("hicache", "sim", "traces")


def source_hashes(root: Path | None = None) -> dict[str, str]:
    """SHA-256 of every source file of :data:`PACKAGES`, by path relative to ``root``."""
    base = ROOT if root is None else root
    out = {}
    for package in PACKAGES:
        for path in sorted((base / package).rglob("*.py")):
            out[path.relative_to(base).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _extension(directory: Path, stem: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


def extension_dir(build_dir: Path, package: str) -> Path:
    """Where a package's compiled modules sit in a build."""
    return build_dir.joinpath(*package.split("."))


def unusable_reason(build_dir: Path | None = None, root: Path | None = None) -> str | None:
    """Why the build in ``build_dir`` (default :data:`BUILD_DIR`) cannot be used with the
    sources under ``root`` (default :data:`ROOT`), or None when it can."""
    build_dir = BUILD_DIR if build_dir is None else build_dir
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "not built (run `make native` or `python -m hicache.policy.native build`)"
    except (OSError, ValueError) as e:
        return f"unreadable manifest {build_dir / MANIFEST}: {e}"
    if not isinstance(manifest, dict):
        return f"unreadable manifest {build_dir / MANIFEST}: not a JSON object"
    tag = platform_tag()
    if manifest.get("platform") != tag:
        return f"built for {manifest.get('platform')!r}, this interpreter is {tag!r}; rebuild"
    built = manifest.get("sources")
    if not isinstance(built, dict):
        return "manifest lists no sources; rebuild"
    try:
        now = source_hashes(root)
    except OSError as e:
        return f"a source cannot be read ({e})"
    changed = sorted(f for f in built.keys() | now.keys() if built.get(f) != now.get(f))
    if changed:
        names = ", ".join(changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        return f"stale: {names} changed since the build; rebuild"
    for m in MODULES:
        package, _, stem = m.rpartition(".")
        if _extension(extension_dir(build_dir, package), stem) is None:
            return f"the build has no compiled {m}; rebuild"
    shared = manifest.get("shared")
    if not isinstance(shared, str) or _extension(build_dir, shared) is None:
        return "the build's shared library is missing; rebuild"
    return None


_decided: NativeStatus | None = None


def decide() -> NativeStatus:
    """This process's choice, made once (by ``HICACHE_NATIVE`` and the build's manifest) and
    then kept: every package of :data:`GROUPS` follows the same one."""
    global _decided
    if _decided is not None:
        return _decided
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ImportError(f"{ENV}={mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        _decided = NativeStatus(False, f"interpreted ({ENV}=off)")
        return _decided
    why = unusable_reason()
    if why is not None:
        if mode == "require":
            raise ImportError(f"{ENV}=require, but the compiled core is unusable: {why}")
        _decided = NativeStatus(False, f"interpreted: compiled core {why}")
        return _decided
    # the compiled modules import their shared library as a top-level module
    if str(BUILD_DIR) not in sys.path:
        sys.path.append(str(BUILD_DIR))
    _decided = NativeStatus(True, f"compiled ({BUILD_DIR})")
    return _decided


def activate(package_path: list[str], package: str) -> NativeStatus:
    """Called by the ``__init__`` of each package of :data:`GROUPS` before any of its compiled
    modules is imported: when this process uses the build, the package's folder in it goes
    first on the package's search path."""
    if package not in GROUPS:
        raise ValueError(f"{package!r} has no compiled modules")
    status = decide()
    if status.active:
        where = str(extension_dir(BUILD_DIR, package))
        if where not in package_path:
            package_path.insert(0, where)
    return status


def compiled_modules() -> list[str]:
    """The modules of :data:`MODULES` that this process has loaded from the build."""
    out = []
    for m in MODULES:
        path = getattr(sys.modules.get(m), "__file__", None) or ""
        if path.startswith(str(BUILD_DIR)):
            out.append(m)
    return out
