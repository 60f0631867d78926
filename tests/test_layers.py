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
    #: allowed only inside ``try: ... except ImportError:`` (the module runs without them)
    optional: frozenset[str] = frozenset()


def _rule(eager: str, lazy: str = "", optional: str = "") -> Rule:
    return Rule(frozenset(eager.split()), frozenset(lazy.split()), frozenset(optional.split()))


# the table of ARCHITECTURE.md §2 (tqdm: progress bars, allowed wherever work is long)
RULES = {
    # mypy_extensions: mypyc's compile-time class marker (allow_interpreted_subclasses), guarded
    # with a no-op fallback, so the policy core still runs on the standard library alone
    "hicache.policy": _rule("hicache.policy", optional="mypy_extensions"),
    # the importers' optional extra ('import'): a tokenizer and chat template for OpenAI logs,
    # msgpack and ZMQ for KV-cache events, loaded only when that format is converted
    "traces": _rule("traces numpy pandas pyarrow", "tokenizers jinja2 msgpack zmq"),
    "hicache": _rule("hicache hicache.policy traces numpy", "pandas"),
    "sim": _rule("sim hicache hicache.policy traces simpy numpy pandas tqdm"),
    "replay": _rule("replay hicache hicache.policy traces torch numpy pandas"),
    "studies": _rule(
        "studies sim hicache hicache.policy traces pandas numpy matplotlib tqdm", "replay ray"
    ),
    "cli": _rule(
        "cli studies sim hicache hicache.policy traces pandas numpy matplotlib tqdm simpy",
        # prometheus_client: compare-metrics parses a server's /metrics scrapes
        "replay ray torch prometheus_client",
    ),
}


def _package(module: str) -> str:
    """The layer a dotted module name belongs to (``hicache.policy`` before ``hicache``)."""
    for name in OURS:
        if module == name or module.startswith(name + "."):
            return name
    return module.split(".")[0]


def _guards_import_error(node: ast.AST) -> bool:
    """A ``try`` one of whose handlers catches ImportError (its body may import optionals)."""
    return isinstance(node, ast.Try) and any(
        h.type is not None and "ImportError" in ast.unparse(h.type) for h in node.handlers
    )


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(imported module, eager?, line) for every absolute import in ``path``."""
    return [(m, eager, line) for m, eager, _, line in _imports_guarded(path)]


def _imports_guarded(path: Path) -> list[tuple[str, bool, bool, int]]:
    """(imported module, eager?, in the body of a try that catches ImportError?, line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, bool, bool, int]] = []

    def visit(node: ast.AST, eager: bool, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            in_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            typing_only = isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            child_eager = eager and not (in_function or typing_only)
            if isinstance(child, ast.Import):
                out.extend((a.name, eager, guarded, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.append((child.module, eager, guarded, child.lineno))
            if _guards_import_error(child):
                assert isinstance(child, ast.Try)
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), child_eager, True)
                for rest in (*child.handlers, *child.orelse, *child.finalbody):
                    visit(ast.Module(body=[rest], type_ignores=[]), child_eager, guarded)
                continue
            visit(child, child_eager, guarded)

    visit(tree, True, False)
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
        for module, eager, guarded, line in _imports_guarded(path):
            target = _package(module)
            if target in STDLIB and target not in OURS:
                continue
            ok = (
                target in rule.eager
                or (not eager and target in rule.lazy)
                or (guarded and target in rule.optional)
            )
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
        # an optional import must be guarded, and only what is named optional may be
        (
            "hicache.policy",
            "from mypy_extensions import mypyc_attr\n",
            "hicache.policy imports mypy_extensions at import time",
        ),
        (
            "hicache.policy",
            "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n",
            "hicache.policy imports numpy at import time",
        ),
        (
            "hicache.policy",
            "try:\n    import mypy_extensions\nexcept ValueError:\n    pass\n",
            "hicache.policy imports mypy_extensions at import time",
        ),
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


def test_a_guarded_optional_import_is_not_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "hicache" / "policy"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text(
        "try:\n    from mypy_extensions import mypyc_attr\nexcept ImportError:\n"
        "    def mypyc_attr(*a, **k):\n        return lambda c: c\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(
        sys.modules[__name__], "_sources", lambda: [("hicache.policy", pkg / "ok.py")]
    )
    assert violations() == []
