"""Fixtures for the traces tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.traces.trace_helpers import WriteLines


@pytest.fixture
def write_lines(tmp_path: Path) -> WriteLines:
    """Write lines (str as is, anything else dumped as JSON) to a new .jsonl file in tmp_path
    and return its path."""
    counter = iter(range(1_000_000))

    def write(*lines: object, name: str | None = None) -> Path:
        path = tmp_path / (name or f"t{next(counter)}.jsonl")
        text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
        path.write_text(text)
        return path

    return write
