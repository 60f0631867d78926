"""Import-time stand-ins so ``sglang.srt.mem_cache.hiradix_cache`` imports on a CPU box.

The wheel is installed with ``--no-deps`` plus the few small packages in
``conformance/requirements.txt``. What remains missing is of two kinds, both replaced here by
empty modules whose attributes are inert placeholders:

* heavy third-party packages pulled in by ``sglang.srt.utils`` at import time and never called
  on the paths we drive (:data:`THIRD_PARTY`);
* SGLang modules that the decision paths never execute (:data:`SGLANG_CUT`): the device/host
  KV pools (replaced by stub pools), the hybrid/DSA controller, metrics, and the two modules
  ``cache_controller`` imports only names from (``distributed``, ``layers.dp_attention``: rank
  and group getters the storage half we drive never calls). Cutting them also cuts the import
  chain into ``server_args`` and, from there, transformers and most of SGLang.

The modules under test -- ``hiradix_cache``, ``radix_cache``, ``base_prefix_cache``,
``evict_policy``, ``mem_cache.utils``, and for the L3 tier ``managers.cache_controller`` (its
``PrefetchOperation`` / ``StorageOperation`` and storage methods) and ``mem_cache.hicache_storage``
(``HiCacheFile``) -- are always the real ones; :func:`check_real` asserts it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterable, Sequence
from typing import Any

THIRD_PARTY = ("triton", "torchvision", "IPython")
SGLANG_CUT = (
    "sglang.srt.distributed",
    "sglang.srt.layers.dp_attention",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.memory_pool_host",
    "sglang.srt.mem_cache.hybrid_cache",
    "sglang.srt.observability.metrics_collector",
)
#: modules whose code is what we compare against: never stubbed
UNDER_TEST = (
    "sglang.srt.mem_cache.hiradix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.hicache_storage",
)


class _PlaceholderBase:
    """What a class statement gets when it subclasses a placeholder."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class Placeholder:
    """An inert value: callable (as a decorator it returns the function), indexable, iterable
    (empty), falsy, and usable as a base class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Placeholder()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Placeholder()

    def __getitem__(self, key: Any) -> Any:
        return Placeholder()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:
        return Placeholder()

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_PlaceholderBase,)


class StubModule(types.ModuleType):
    """A module whose every public attribute exists: CamelCase names are fresh classes (so
    ``isinstance`` checks against them work and are False), anything else a Placeholder."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value: Any
        if name[:1].isupper() and not name.isupper():
            value = type(name, (_PlaceholderBase,), {"__module__": self.__name__})
        else:
            value = Placeholder()
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(roots)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == r or fullname.startswith(r + ".") for r in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_installed = False


def install() -> None:
    """Put the stand-ins first on ``sys.meta_path`` (idempotent). Third-party packages that are
    really installed are left alone."""
    global _installed
    if _installed:
        return
    roots = [m for m in THIRD_PARTY if importlib.util.find_spec(m) is None]
    sys.meta_path.insert(0, _Finder([*roots, *SGLANG_CUT]))
    _installed = True


def stubbed_modules() -> list[str]:
    return sorted(n for n, m in sys.modules.items() if isinstance(m, StubModule))


def check_real() -> None:
    """Raise if a module under test is a stand-in (it would make the comparison meaningless)."""
    for name in UNDER_TEST:
        module = sys.modules.get(name)
        if module is None or isinstance(module, StubModule):
            raise RuntimeError(f"{name} must be the real SGLang module")
