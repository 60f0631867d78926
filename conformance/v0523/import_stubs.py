"""Import-time stand-ins so ``sglang.srt.mem_cache.unified_radix_cache`` (0.5.23) imports on a
CPU-only box with the light packages of ``conformance/requirements-0.5.23.txt``.

What is replaced, and why (nothing under ``sglang/srt/mem_cache`` is replaced):

* the ``sglang`` and ``sglang.srt`` *package* ``__init__`` files: ``sglang/__init__.py`` imports
  the whole front end (``sglang.lang``, the HF patches, aiohttp, ...). The stand-ins are empty
  packages whose ``__path__`` is the real directory, so every submodule is the wheel's own file;
  ``sglang.__version__`` is the installed distribution's version.
* ``triton`` and ``torchvision``: imported at module level by ``sglang.srt.utils.common`` and
  ``sglang.srt.multimodal.internvl_utils`` (reached through ``srt/configs``), never called on the
  cache paths. The real torchvision wheel needs a CUDA torch, the real triton is a large
  download. The stand-ins are invisible to ``importlib.util.find_spec`` (only a real ``import``
  finds them), so that torch (``torch.utils._triton``) and transformers
  (``is_torchvision_available``) keep treating the packages as absent; a read of
  ``triton.__version__`` raises ImportError for the same reason (``torch._inductor.ir``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

from conformance.import_stubs import StubModule, _Finder

HIDDEN_THIRD_PARTY = ("triton", "torchvision")
PACKAGE_INITS = ("sglang", "sglang.srt")
#: the modules whose code the comparison is about: never stand-ins
UNDER_TEST = (
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core",
    "sglang.srt.mem_cache.unified_cache.components.full",
    "sglang.srt.mem_cache.rust_tree_core.adapter",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller",
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.pool_host.group",
)


class _NoVersionModule(StubModule):
    def __getattr__(self, name: str) -> Any:
        if name == "__version__":
            raise ImportError(f"{self.__name__} is a conformance stand-in")
        return super().__getattr__(name)


class _HiddenFinder(_Finder):
    """Serves stand-ins to ``import`` only; ``importlib.util.find_spec`` gets None."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        frame: types.FrameType | None = sys._getframe(1)
        for _ in range(3):
            if frame is None:
                break
            if frame.f_code is importlib.util.find_spec.__code__:
                return None
            frame = frame.f_back
        return super().find_spec(fullname, path, target)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = _NoVersionModule(spec.name)
        module.__path__ = []
        return module


_installed = False


def _site_dir() -> str:
    for entry in sys.path:
        if os.path.isdir(os.path.join(entry, "sglang", "srt", "mem_cache")):
            return entry
    raise RuntimeError("the sglang wheel is not installed in this interpreter")


def install() -> None:
    """Idempotent. Must run before anything imports ``sglang``."""
    global _installed
    if _installed:
        return
    site = _site_dir()
    try:
        import importlib.metadata

        version = importlib.metadata.version("sglang")
    except Exception:
        version = "unknown"
    for name in PACKAGE_INITS:
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(site, *name.split("."))]
        module.__file__ = None
        if name == "sglang":
            module.__version__ = version  # type: ignore[attr-defined]
        sys.modules[name] = module
    missing = [m for m in HIDDEN_THIRD_PARTY if importlib.util.find_spec(m) is None]
    if missing:
        sys.meta_path.insert(0, _HiddenFinder(missing))
    _installed = True


def stubbed_modules() -> list[str]:
    return sorted(n for n, m in sys.modules.items() if isinstance(m, StubModule))


def check_real() -> None:
    for name in UNDER_TEST:
        module = sys.modules.get(name)
        real = getattr(module, "__file__", None)
        if module is None or isinstance(module, StubModule) or not real:
            raise RuntimeError(f"{name} must be the real SGLang module")
