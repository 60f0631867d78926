"""Helpers shared by the traces tests."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

# type of the `write_lines` fixture (conftest.py)
WriteLines = Callable[..., Path]

HEADER: dict[str, Any] = {"format": "hicache-trace", "version": 1, "block_size": 4}

# FILE:LINE: field: problem, on one line
ERROR_LINE = re.compile(
    r"^(?P<path>[^\n]+?):(?P<line>\d+): (?P<field>[A-Za-z_]+): (?P<problem>[^\n]+)$"
)


def req(ts: Any, n_in: Any, n_out: Any = 1, **fields: Any) -> dict[str, Any]:
    """A request object for block_size 4, with hash ids 0.. unless ids are given."""
    obj: dict[str, Any] = {"timestamp": ts, "input_length": n_in, "output_length": n_out}
    if "token_ids" not in fields and "hash_ids" not in fields:
        obj["hash_ids"] = list(range(-(-n_in // 4)))
    obj.update(fields)
    return obj
