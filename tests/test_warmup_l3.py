"""A warm-up window with an L3 tier: the per-request L3 figures (prefetch waits, L3 hit tokens)
leave out the warm-up requests as every summary figure does; the tier's own counters
(prefetches issued, bytes) stay the whole run's."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from cli.main import main

TRACE = Path(__file__).resolve().parent.parent / "traces/data/mooncake/conversation_trace.jsonl"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("l3") / "r"
    args = ["run", str(TRACE), "--out", str(out), "--max-requests", "400",
            "--set", "storage.backend=mooncake", "--set", "gpu.device_tokens=200000",
            "--set", "workload.rate_scale=0.25", "--set", "workload.warmup_s=120"]  # fmt: skip
    assert main(args) == 0
    return out


def test_prefetch_waits_and_l3_hits_are_the_measured_requests(run: Path) -> None:
    s = json.loads((run / "summary.json").read_text())
    req = pd.read_parquet(run / "requests.parquet")
    done = req[req["finish_s"] >= 0]
    measured = done[~done["warmup"]]
    assert s["warmup_requests"] == int(req["warmup"].sum()) > 0
    waits = measured.loc[measured["prefetch_wait_s"] > 0, "prefetch_wait_s"]
    every = done.loc[done["prefetch_wait_s"] > 0, "prefetch_wait_s"]
    assert len(waits) > 0 and len(every) > len(waits)  # the window had waits of its own
    assert s["prefetch_wait_mean_s"] == pytest.approx(float(waits.mean()))
    st = s["storage"]
    assert st["requests_prefetch_waited"] == len(waits)
    assert st["prefetch_wait_p90_s"] == pytest.approx(float(waits.quantile(0.9)))
    assert st["storage_hit_tokens"] == int(measured["storage_hit_tokens"].sum())
    # the block's storage hits agree with the summary's L3 hit rate
    assert st["storage_hit_tokens"] / s["prompt_tokens"] == pytest.approx(s["storage_hit_rate"])
