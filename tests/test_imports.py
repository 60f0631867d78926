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


def test_the_shared_model_loads_neither_simpy_nor_torch_nor_pandas() -> None:
    # the static table is tests/test_layers.py; this checks what really gets loaded
    loaded = _loaded_after(
        "import hicache.config, hicache.hardware, hicache.latency, hicache.lifecycle, traces.fsutil"
    )
    assert not loaded & {"simpy", "torch", "pandas", "matplotlib", "sim", "replay"}, loaded


def test_replay_driver_loads_no_simpy() -> None:
    loaded = _loaded_after("import replay.driver, replay.run, replay.calibrate")
    assert not loaded & {"simpy", "sim", "studies", "cli"}, loaded


def test_cli_help_works_without_heavy_imports() -> None:
    loaded = _loaded_after(
        "sys.argv = ['hicache-sim', '--help']\n"
        "from cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert not loaded & {"torch", "simpy", "pandas", "matplotlib"}, loaded
