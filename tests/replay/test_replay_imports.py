"""The replay's dependency rules (ARCHITECTURE.md §2), checked in fresh interpreters: importing
the package or its CLI loads no torch, and no replay module imports SimPy or the timed engine."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

HAVE_TORCH = importlib.util.find_spec("torch") is not None

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(stmt: str) -> set[str]:
    code = f"import sys\n{stmt}\nprint(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    return set(out.stdout.split())


def test_package_and_cli_import_without_torch() -> None:
    loaded = _loaded_after(
        "import replay, cli.replay, replay.presets\n"
        "import argparse\n"
        "p = argparse.ArgumentParser(); cli.replay.register(p.add_subparsers())\n"
        "try:\n    p.parse_args(['replay', '--help'])\nexcept SystemExit:\n    pass"
    )
    assert "torch" not in loaded and "simpy" not in loaded and "pandas" not in loaded


def test_calibration_needs_no_torch() -> None:
    loaded = _loaded_after("import replay.calibrate")
    assert "torch" not in loaded and "simpy" not in loaded


def test_no_replay_module_imports_simpy_or_the_engine() -> None:
    allowed_sim = ("hicache.policy", "hicache.latency", "hicache.hardware", "hicache.config")
    for path in sorted((ROOT / "replay").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith("simpy"), f"{path.name} imports {name}"
                if name == "sim" or name.startswith("sim."):
                    assert name.startswith(allowed_sim), f"{path.name} imports {name}"


@pytest.mark.skipif(not HAVE_TORCH, reason="making the bench table needs torch")
def test_without_torch_copy_steps_fail_cleanly_and_calibrate_works(tmp_path: Path) -> None:
    # a bench table made here (with torch), then read in an interpreter where torch is missing
    code_bench = (
        "from pathlib import Path\n"
        "import torch\n"
        "torch.set_num_threads(1)\n"
        "from replay.bench import BenchConfig, run_bench, write_bench\n"
        "from replay.runtime import CpuRuntime\n"
        "cfg = BenchConfig.quick(plain_sizes=(4096, 65536), bidir_sizes=(65536,), "
        "op_pages=(1, 16, 64), op_layers=(1,), repeats=3, flush_bytes=0)\n"
        "rt = CpuRuntime()\n"
        f"write_bench(run_bench(cfg, rt), cfg, rt, Path({str(tmp_path / 'b')!r}), 0.0)\n"
    )
    subprocess.run([sys.executable, "-c", code_bench], check=True, cwd=ROOT)
    no_torch = "import sys\nsys.modules['torch'] = None\nfrom cli.replay import main\n"
    run = subprocess.run(
        [sys.executable, "-c", no_torch + f"sys.exit(main(['bench', '--device', 'cpu', "
         f"'--out', {str(tmp_path / 'x')!r}]))"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "hicache-sim replay: torch is not installed; the replay needs it: pip install "
        "'hicache-sim[replay]' (or torch==2.13.0 for the CPU build)"
    )
    prof = tmp_path / "p.json"
    cal = subprocess.run(
        [sys.executable, "-c", no_torch + f"sys.exit(main(['calibrate', "
         f"{str(tmp_path / 'b')!r}, '--out', {str(prof)!r}]))"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert cal.returncode == 0, cal.stderr
    assert prof.is_file()
