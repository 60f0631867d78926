"""The notebooks run top to bottom in small mode (HICACHE_SMALL=1) and are kept without
outputs, so that they stay small and readable in review."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
OURS = (
    "01_policy_what_if.ipynb",
    "02_trace_explorer.ipynb",
    "03_calibration.ipynb",
    "04_capacity_planning.ipynb",
)


@pytest.mark.parametrize("name", OURS)
def test_notebook_is_stored_without_outputs(name: str) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
    assert (NOTEBOOKS / name).stat().st_size < 20_000


@pytest.mark.slow
@pytest.mark.parametrize("name", OURS)
def test_notebook_runs_in_small_mode(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # the kernel inherits this environment: small traces and grids, outputs under tmp_path
    monkeypatch.setenv("HICACHE_SMALL", "1")
    monkeypatch.setenv("HICACHE_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute()  # raises CellExecutionError with the failing cell and its traceback
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs)  # figures were drawn
    if name.startswith("01"):
        assert (tmp_path / "01_policy_what_if" / "report.html").is_file()
    if name.startswith("04"):
        for f in ("plan.json", "plan.csv", "plan.png"):
            assert (tmp_path / "04_capacity_planning" / f).is_file(), f
