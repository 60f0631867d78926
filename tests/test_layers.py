"""ARCHITECTURE.md §2, enforced: who may import whom, read from every source file's imports.

Each package lists what it may import at module level ("eager"), what it may import only
inside a function ("lazy": loaded when a command needs it), and what it must never import.
Imports under ``if TYPE_CHECKING:`` are annotations only and count as lazy.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)
OURS = ("hicache.policy", "hicache", "traces", "sim", "replay", "studies", "cli")


@dataclass(frozen=True)
class Rule:
    eager: frozenset[str]
    lazy: frozenset[str] = frozenset()


def _rule(eager: str, lazy: str = "") -> Rule:
    return Rule(frozenset(eager.split()), frozenset(lazy.split()))


# the table of ARCHITECTURE.md §2 (tqdm: progress bars, allowed wherever work is long)
RULES = {
    "hicache.policy": _rule("hicache.policy"),
    "traces": _rule("traces numpy pandas pyarrow"),
    "hicache": _rule("hicache hicache.policy traces numpy", "pandas"),
    "sim": _rule("sim hicache hicache.policy traces simpy numpy pandas tqdm"),
    "replay": _rule("replay hicache hicache.policy traces torch numpy pandas"),
    "studies": _rule(
        "studies sim hicache hicache.policy traces pandas numpy matplotlib tqdm", "replay ray"
    ),
    "cli": _rule(
        "cli studies sim hicache hicache.policy traces pandas numpy matplotlib tqdm simpy",
        "replay ray torch",
    ),
}


def _package(module: str) -> str:
    """The layer a dotted module name belongs to (``hicache.policy`` before ``hicache``)."""
    for name in OURS:
        if module == name or module.startswith(name + "."):
            return name
    return module.split(".")[0]


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, eager?, line) for every absolute import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            in_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            typing_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            child_eager = eager and not (in_function or typing_only)
            if isinstance(child, ast.Import):
                out.extend((a.name, eager, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append((child.module, eager, child.lineno))
            visit(child, child_eager)

    visit(tree, True)
    return out


def _sources() -> list[tuple[str, Path]]:
    files = []
    for top in ("hicache", "traces", "sim", "replay", "studies", "cli"):
        for path in sorted((ROOT / top).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            files.append((_package(module), path))
    return files


def violations() -> list[str]:
    bad = []
    for layer, path in _sources():
        rule = RULES[layer]
        for module, eager, line in _imports(path):
            target = _package(module)
            if target in STDLIB and target not in OURS:
                continue
            ok = target in rule.eager or (not eager and target in rule.lazy)
            if not ok:
                how = "at import time" if eager else "lazily"
                where = path.relative_to(ROOT)
                bad.append(f"{where}:{line}: {layer} imports {module} {how}")
    return bad


def test_every_import_follows_the_dependency_table() -> None:
    assert violations() == []


def test_replay_never_imports_sim() -> None:
    for layer, path in _sources():
        if layer == "replay":
            assert all(_package(m) != "sim" for m, _, _ in _imports(path)), path


@pytest.mark.parametrize(
    ("layer", "source", "expect"),
    [
        ("replay", "import sim.engine\n", "replay imports sim.engine at import time"),
        ("hicache", "import pandas\n", "hicache imports pandas at import time"),
        ("studies", "def f():\n    import cli.main\n", "studies imports cli.main lazily"),
        ("cli", "import torch\n", "cli imports torch at import time"),
    ],
)
def test_the_checker_catches_a_forbidden_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer: str, source: str, expect: str
) -> None:
    """The check itself can fail: a planted import in a throwaway package is reported."""
    pkg = tmp_path / layer.replace(".", "/")
    pkg.mkdir(parents=True)
    (pkg / "planted.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_sources", lambda: [(layer, pkg / "planted.py")])
    assert [v.split(": ", 1)[1] for v in violations()] == [expect]


def test_allowed_lazy_import_is_not_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "cli"
    pkg.mkdir()
    (pkg / "ok.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import replay.run\n"
        "def f():\n    import torch\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_sources", lambda: [("cli", pkg / "ok.py")])
    assert violations() == []
