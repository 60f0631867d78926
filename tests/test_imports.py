"""Dependency direction (ARCHITECTURE.md §2), checked in fresh interpreters."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("simpy", "torch", "numpy", "pandas", "pyarrow", "matplotlib", "traces", "replay")


def _loaded_after(stmt: str) -> set[str]:
    code = f"import sys\n{stmt}\nprint(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_policy_core_imports_only_the_standard_library() -> None:
    loaded = _loaded_after("import hicache.policy")
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_policy_sources_import_nothing_outside_stdlib_and_the_core() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "sim" / "policy"
    stdlib = sys.stdlib_module_names
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                ok = top in stdlib or name.startswith("hicache.policy")
                assert ok, f"{path.name} imports {name}"


def test_cli_help_works_without_heavy_imports() -> None:
    loaded = _loaded_after(
        "sys.argv = ['hicache-sim', '--help']\n"
        "from cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert not loaded & {"torch", "simpy", "pandas", "matplotlib"}, loaded
