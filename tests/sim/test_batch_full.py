"""SGLang's ``batch_is_full`` (conformance/v0523/SCHEDULER.md §1a): after a NO_TOKEN while
requests run, or at the running cap, the waiting queue is not tried again until a running
request leaves, even when the room has grown meanwhile. 0.5.23 filters finished requests out of
the running batch every step and retries in the iteration right after a finish; 0.5.14 filters
them only in ``update_running_batch``, so it retries one decode step later."""

from __future__ import annotations

import pytest

from sim.scheduler import SchedulerParams
from tests.sim.harness import engine, req

STEP = 0.01  # the hand-made decode step
PREFILL = 1e-4  # per token


def _blocked_head(version: str) -> tuple[float, float, float]:
    """Page 1, 300 tokens, new_token_ratio 0.7 decaying to 0.098 in 10 steps. A (10 tokens, 50
    outputs) and D (10, 150) prefill at 0 (20 tokens: 2 ms); B (150 tokens, 1 output) arrives
    meanwhile. At 2 ms: free 280, reserved (49 + 149) x 0.7 = 138.6, so B's 152 tokens do not
    fit: NO_TOKEN, and the batch is full. Ten steps later the ratio has decayed and B would fit
    (free 260, reserved ~17), but nothing is tried until A leaves, 49 steps after 2 ms.
    Returns A's finish, B's admission and D's finish."""
    sp = SchedulerParams(page_size=1, init_new_token_ratio=0.7, new_token_ratio_decay_steps=10)
    a, d = req(0, 0.0, 10, 50), req(1, 0.0, 10, 150)
    b = req(2, 0.001, 150, 1)
    e = engine([a, d, b], page_size=1, device_tokens=300, sched=sp, sglang_version=version)
    e.run()
    return a.finish, b.admitted, d.finish


def test_a_full_batch_waits_for_a_leave_then_0523_retries_at_once() -> None:
    a_finish, b_admitted, _ = _blocked_head("0.5.23")
    assert a_finish == pytest.approx(20 * PREFILL + 49 * STEP)
    assert b_admitted == pytest.approx(a_finish)


def test_0514_retries_one_decode_step_after_the_leave() -> None:
    a_finish, b_admitted, _ = _blocked_head("0.5.14")
    assert a_finish == pytest.approx(20 * PREFILL + 49 * STEP)
    assert b_admitted == pytest.approx(a_finish + STEP)


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_reference_scheduler_agrees(version: str) -> None:
    sp = SchedulerParams(page_size=1, init_new_token_ratio=0.7, new_token_ratio_decay_steps=10,
                         engine="reference")  # fmt: skip
    a, d = req(0, 0.0, 10, 50), req(1, 0.0, 10, 150)
    b = req(2, 0.001, 150, 1)
    e = engine([a, d, b], page_size=1, device_tokens=300, sched=sp, sglang_version=version)
    e.run()
    assert (a.finish, b.admitted, d.finish) == pytest.approx(_blocked_head(version))


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_running_cap_marks_the_batch_full(version: str) -> None:
    """max_running_requests 1: B waits behind A at the cap (the flag set without a match) and
    is admitted when A's leave clears it (0.5.14: at the filter of the all-finished batch, no
    forward in between)."""
    sp = SchedulerParams(page_size=1, max_running_requests=1)
    a, b = req(0, 0.0, 10, 5), req(1, 0.0, 10, 5)
    e = engine([a, b], page_size=1, device_tokens=300, sched=sp, sglang_version=version)
    e.run()
    assert a.finish == pytest.approx(10 * PREFILL + 4 * STEP)
    assert b.admitted == pytest.approx(a.finish)
