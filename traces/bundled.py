"""Paths of the traces shipped in `traces/data/`, and the recipe of the synthetic ones.

The synthetic files are outputs of `traces.generate` with the parameters in
`SYNTHETIC_RECIPES`; `write_synthetic()` rebuilds them byte-for-byte (a test checks that the
bundled files are up to date).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
MOONCAKE_DIR = DATA_DIR / "mooncake"
SYNTHETIC_DIR = DATA_DIR / "synthetic"

MOONCAKE_CONVERSATION = MOONCAKE_DIR / "conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = MOONCAKE_DIR / "synthetic_trace.jsonl"

# kind -> generator parameters (everything else at its default); file = <kind>.jsonl
SYNTHETIC_RECIPES: dict[str, dict[str, Any]] = {
    "multiturn": {"clients": 32, "rounds": 5, "request_rate": 4.0, "seed": 1},
    "shared-prefix": {"requests": 400, "prefixes": 8, "jitter": 0.5, "seed": 1},
    "long-context-qa": {"documents": 4, "questions_per_document": 16, "seed": 1},
    "agentic": {"sessions": 16, "steps": 8, "seed": 1},
}


def synthetic_path(kind: str) -> Path:
    """Path of the bundled synthetic trace of a generator kind."""
    if kind not in SYNTHETIC_RECIPES:
        raise KeyError(
            f"no bundled synthetic trace {kind!r} (have: " + ", ".join(SYNTHETIC_RECIPES) + ")"
        )
    return SYNTHETIC_DIR / f"{kind}.jsonl"


def write_synthetic(directory: Path | None = None) -> list[Path]:
    """(Re)generate the bundled synthetic traces into `directory` (default: the bundled
    location) and return their paths."""
    from traces.generate import generate
    from traces.io import write_trace

    out_dir = directory if directory is not None else SYNTHETIC_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, params in SYNTHETIC_RECIPES.items():
        paths.append(write_trace(generate(kind, **params), out_dir / f"{kind}.jsonl"))
    return paths


if __name__ == "__main__":
    for p in write_synthetic():
        print(p)
