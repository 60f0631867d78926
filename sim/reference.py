"""The reference scheduler (``scheduler.engine = "reference"``): SGLang's event loop written as
plainly as it can be, one SimPy event per forward.

:class:`sim.scheduler.Scheduler` (the fast scheduler) runs whole decode segments, chains of
them and multi-segment spans under one timeout, so that an hour of traffic simulates in
seconds. None of that is here. The loop itself is :meth:`Scheduler.run`, which
is already one pass of SGLang's ``event_loop_normal`` per iteration (0.5.14 ``scheduler.py``
``event_loop_normal`` / ``get_next_batch_to_run``; 0.5.23 the same loop, ``scheduler.py``):

1. ``recv_requests`` / ``process_input_requests``: arrivals join the waiting queue when they
   happen (:meth:`Scheduler.arrive`), so every arrival, open or closed loop, routed or not, is
   in the queue at the next iteration;
2. ``_process_hicache_events`` (the cache's acks and drains; 0.5.23 adds the L3 retry pass);
3. ``get_next_batch_to_run``: ``get_new_batch_prefill`` (admission, every iteration unless the
   running batch is full), else ``update_running_batch`` (the finished requests filtered,
   ``check_decode_mem``, retraction) for **one** decode step (:func:`_decode_step`, here);
4. ``run_batch``: one timeout for the forward;
5. ``process_batch_result``: counters, finishes, the checkpoint (and, in 0.5.23, the merged
   device->host writes, ``flush_pending_backups``).

Idle, it waits for an arrival, a copy or storage event, or a prefetch deadline (an idle SGLang
loop polls; nothing it could see changes in between).

The steps themselves (admission, the prefill forward and its result, the memory check, the
finish) are the fast scheduler's own methods, called one per iteration: what the reference
replaces is the decode call, which is where every shortcut lives (segments, their chains and
spans under one timeout). The differential test (``tests/sim/test_reference_differential.py``,
``bench/differential.py``) asserts that both give the same per-request times and tier counters.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from sim.scheduler import Scheduler
from sim.scheduler_v0523 import Scheduler0523


def _decode_step(s: Scheduler) -> Generator[simpy.Event, Any, None]:
    """``update_running_batch`` then one decode forward and its result
    (``process_batch_result_decode``)."""
    env, cache, run = s.env, s.cache, s.running
    s._filter_finished()  # filter_batch: the requests that finished leave (0.5.14)
    cache.writing_check()  # flush_write_through_acks
    at_boundary, retracted = s._check_decode_mem()  # check_decode_mem, retract_decode
    # prepare_for_decode: alloc_for_decode's eviction, the page each request's next token needs
    taken = s._alloc_decode(at_boundary)
    assert taken, "check_decode_mem left the pages of the requests at a boundary"
    bs = len(run)
    a, b = s.cost.decode_coeffs(bs)
    start = max(env.now, s.ctrl.take_stall())  # a write_back wait blocks the loop
    end = start + (a + b * s.kv_total)
    if end > env.now:
        yield env.timeout(end - env.now)
    if not retracted:  # new_token_ratio decays once per decode step that did not retract
        s._decay(1)
    s._span("decode", start, end, bs)
    s._end_decode(1, bs)  # process_batch_result_decode


class ReferenceScheduler(Scheduler):
    """The reference loop against SGLang 0.5.14's cache."""

    def _run_decode(self, chain: bool = True) -> Generator[simpy.Event, Any, None]:
        yield from _decode_step(self)


class ReferenceScheduler0523(Scheduler0523):
    """The reference loop against SGLang 0.5.23's cache: the same loop, 0.5.23's steps."""

    def _run_decode(self, chain: bool = True) -> Generator[simpy.Event, Any, None]:
        yield from _decode_step(self)
        self._v0523()[1].flush_pending_backups()  # after every batch result
