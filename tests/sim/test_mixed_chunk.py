"""Mixed chunked prefill (``scheduler.enable_mixed_chunk``, SGLang's ``--enable-mixed-chunk``):
a prefill batch carries one decode step of every running request, and the prefill budgets
give up one token per running request. Every number is computed by hand in the comment above
its assertion (page size 1, prefill 1e-4 s per new token, a decode step 10 ms)."""

from __future__ import annotations

import pytest

from hicache.sglang_args import format_sglang_command, parse_sglang_args
from sim.engine import Engine
from sim.scheduler import SchedulerParams
from tests.sim.harness import admit, decode_once, engine, prefill_all, req

VERSIONS = ("0.5.14", "0.5.23")


def _run(version: str, mixed: bool) -> Engine:
    # A: prompt 10, 20 outputs, at 0; B: prompt 400, 1 output, at 50 ms; chunks of 100
    e = engine(
        [req(1, 0.0, 10, 20), req(2, 0.05, 400, 1)],
        page_size=1,
        sched=SchedulerParams(page_size=1, chunked_prefill_size=100, enable_mixed_chunk=mixed),
        sglang_version=version,
    )
    e.run()
    return e


def _times(e: Engine) -> dict[int, tuple[float, float]]:
    df = e.frames()["requests"]
    return {int(r.rid): (r.first_token_s, r.finish_s) for r in df.itertuples()}


@pytest.mark.parametrize("version", VERSIONS)
def test_decoding_goes_on_while_a_long_prompt_prefills(version: str) -> None:
    # A prefills in 1 ms (first token at 1 ms) and decodes; B arrives at 50 ms and is seen at
    # the end of A's 5th step, 51 ms (A has 6 tokens).
    # Without mixing: B's 4 chunks of 100 take 10 ms each (first token 91 ms) while A waits;
    # A's other 14 steps end at 91 + 140 = 231 ms.
    plain = _times(_run(version, False))
    assert plain[2][0] == pytest.approx(0.091) and plain[1][1] == pytest.approx(0.231)
    # Mixed: every chunk gives up a token to A's row, so B takes chunks of 99, 99, 99, 99 and
    # 4, in forwards of 100, 100, 100, 100 and 5 tokens: first token at 91.5 ms. A gains a
    # token per forward (11 at 91.5 ms) and its other 9 steps end at 181.5 ms.
    e = _run(version, True)
    mixed = _times(e)
    assert mixed[2][0] == pytest.approx(0.0915) and mixed[1][1] == pytest.approx(0.1815)
    rows = [bs for kind, _, _, bs in e.sched.spans if kind == "prefill"]
    assert rows == [1, 2, 2, 2, 2, 2]  # A alone, then B's five chunks with A's row


@pytest.mark.parametrize(("version", "chunk"), [("0.5.14", 98), ("0.5.23", 99)])
def test_the_budget_counts_the_running_batch_as_each_release_does(version: str, chunk: int) -> None:
    # A (2 outputs) and C (5 outputs) prefill together; one decode step finishes A. 0.5.14
    # keeps A in the running batch until the next decode filters it, so a prefill formed now
    # counts 2 running requests (chunk 100 - 2); 0.5.23 filters every step (100 - 1).
    e = engine(
        [],
        page_size=1,
        sched=SchedulerParams(page_size=1, chunked_prefill_size=100, enable_mixed_chunk=True),
        sglang_version=version,
    )
    assert prefill_all(e, req(1, 0.0, 10, 2), req(3, 0.0, 10, 5)) == 1
    decode_once(e)
    assert [r.rid for r in e.sched.running] == [3]
    batch = admit(e, req(2, 0.0, 400, 1))
    assert batch is not None and [(r.rid, ext) for r, ext, _ in batch] == [(2, chunk)]


def test_off_by_default_and_off_without_chunked_prefill() -> None:
    assert SchedulerParams(page_size=1).enable_mixed_chunk is False
    e = engine([], page_size=1, sched=SchedulerParams(
        page_size=1, chunked_prefill_size=-1, enable_mixed_chunk=True))  # fmt: skip
    assert prefill_all(e, req(1, 0.0, 10, 20)) == 1
    assert e.sched._mixed_rows() == 0  # SGLang: is_mixed_chunk needs a chunked prefill size


def test_the_sglang_flag_maps_both_ways() -> None:
    from hicache.config import load_config

    parsed = parse_sglang_args("--enable-mixed-chunk")
    assert "scheduler.enable_mixed_chunk=true" in parsed.overrides
    cfg = load_config(None, ["scheduler.enable_mixed_chunk=true"])
    assert "--enable-mixed-chunk" in format_sglang_command(cfg).split()
    assert "--enable-mixed-chunk" not in format_sglang_command(load_config(None, [])).split()
