"""Which policy-core modules this process loads: the interpreted sources or their compiled
build (:mod:`hicache.policy.native` builds it and documents ``HICACHE_NATIVE``).

Imported by ``hicache/policy/__init__.py`` before any compiled module; standard library only.
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

#: The compiled modules (of ``hicache.policy``). The rest of the package stays interpreted:
#: the controllers are subclassed by the simulator and the replay (compiled classes cannot be
#: subclassed by interpreted ones), the key types subclass ``tuple`` (compiled classes cannot),
#: and the storage tier and checks are not where the time goes.
MODULES = ("radix", "allocator", "eviction", "hiradix", "shortcuts")

ENV = "HICACHE_NATIVE"
MODES = ("auto", "off", "require")
PACKAGE_DIR = Path(__file__).resolve().parent
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


def source_hashes(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """SHA-256 of each compiled module's source file."""
    return {m: hashlib.sha256((package_dir / f"{m}.py").read_bytes()).hexdigest() for m in MODULES}


def _extension(directory: Path, stem: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


def unusable_reason(build_dir: Path | None = None, package_dir: Path | None = None) -> str | None:
    """Why the build in ``build_dir`` (default :data:`BUILD_DIR`) cannot be used with the
    sources in ``package_dir`` (default this package's), or None when it can."""
    build_dir = BUILD_DIR if build_dir is None else build_dir
    package_dir = PACKAGE_DIR if package_dir is None else package_dir
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
    now = source_hashes(package_dir)
    changed = sorted(m for m in MODULES if built.get(m) != now[m])
    if changed:
        names = ", ".join(f"{m}.py" for m in changed)
        return f"stale: {names} changed since the build; rebuild"
    for m in MODULES:
        if _extension(build_dir / "hicache" / "policy", m) is None:
            return f"the build has no compiled {m} module; rebuild"
    shared = manifest.get("shared")
    if not isinstance(shared, str) or _extension(build_dir, shared) is None:
        return "the build's shared library is missing; rebuild"
    return None


def activate(package_path: list[str]) -> NativeStatus:
    """Decide (by ``HICACHE_NATIVE``) whether this process uses the build; when it does, put
    the build first on the package's search path. Called by ``hicache/policy/__init__.py``
    before any of the compiled modules is imported."""
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ImportError(f"{ENV}={mode!r}: choose one of {', '.join(MODES)}")
    if mode == "off":
        return NativeStatus(False, f"interpreted ({ENV}=off)")
    why = unusable_reason()
    if why is not None:
        if mode == "require":
            raise ImportError(f"{ENV}=require, but the compiled policy core is unusable: {why}")
        return NativeStatus(False, f"interpreted: compiled core {why}")
    # the compiled modules import their shared library as a top-level module
    if str(BUILD_DIR) not in sys.path:
        sys.path.append(str(BUILD_DIR))
    package_path.insert(0, str(BUILD_DIR / "hicache" / "policy"))
    return NativeStatus(True, f"compiled ({BUILD_DIR})")


def compiled_modules() -> list[str]:
    """The modules of :data:`MODULES` that this process has loaded from the build."""
    out = []
    for m in MODULES:
        mod = sys.modules.get(f"hicache.policy.{m}")
        path = getattr(mod, "__file__", None) or ""
        if path.startswith(str(BUILD_DIR)):
            out.append(m)
    return out
