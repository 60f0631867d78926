"""Small builders for the simulator scenario tests: a hand-made cost model whose numbers are easy
to compute by hand, hand-made requests, an Engine around them, and helpers that drive the
scheduler one step at a time (admission, one prefill batch, one decode segment) without its
main loop, so that a test can look at the state in between.

Copied in spirit from ``tests/test_engine.py`` (not imported: test modules are not a library).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hicache.latency import LinkParams
from hicache.lifecycle import PagedRequest
from hicache.policy import PageKey
from sim.costs import Costs
from sim.engine import Engine
from sim.scheduler import SchedulerParams, SimReq

PAGE_BYTES = 1000  # bytes per page in every hand-made cost model


def costs(
    prefill_per_token: float = 1e-4,
    decode_step: float = 0.01,
    decode_per_kv_token: float = 0.0,
    decode_per_request: float = 0.0,
    write_s_per_page: float = 1e-3,
    load_s_per_page: float = 1e-3,
    layers: int = 4,
    alpha_d2h: float = 0.0,
    alpha_h2d: float = 0.0,
    gamma_d2h: float = 0.0,
    gamma_h2d: float = 0.0,
    eta_d2h: float = 1.0,
    eta_h2d: float = 1.0,
) -> Costs:
    """Pages of 1,000 bytes: a bandwidth of ``1000 / s_per_page`` bytes/s. A prefill batch takes
    ``prefill_per_token`` per new token; a decode step ``decode_step + decode_per_request *
    (batch size) + decode_per_kv_token * (KV tokens of the batch)``."""
    return Costs(
        num_layers=layers,
        bytes_per_page=PAGE_BYTES,
        d2h=LinkParams(alpha_d2h, PAGE_BYTES / write_s_per_page, gamma_d2h, eta_d2h),
        h2d=LinkParams(alpha_h2d, PAGE_BYTES / load_s_per_page, gamma_h2d, eta_h2d),
        prefill_fn=lambda reqs: prefill_per_token * sum(n for n, _ in reqs),
        decode_fn=lambda bs, kv: decode_step + decode_per_request * bs + decode_per_kv_token * kv,
    )


def req(
    rid: int, arrival: float, prompt: int, outputs: int, symbols: Sequence[Any] | None = None
) -> SimReq:
    """The scheduler state of a hand-made request. ``symbols``: one per full prompt page
    (extra ones are ignored); default: ``prompt`` unique ints from ``rid * 100_000``, enough
    for any page size."""
    if symbols is None:
        symbols = range(rid * 100_000, rid * 100_000 + prompt)
    key = PageKey(tuple(symbols))
    return SimReq(PagedRequest(key, prompt, outputs, rid=rid, arrival_s=arrival))


def engine(reqs: Sequence[SimReq], **kw: Any) -> Engine:
    """An Engine over ``reqs``: page 16, 16K device tokens, 64K host tokens, write_through, LRU,
    the default hand-made costs and SchedulerParams, unless overridden."""
    ps = kw.pop("page_size", 16)
    args: dict[str, Any] = dict(
        device_tokens=16384, host_tokens=65536, page_size=ps, write_policy="write_through",
        eviction="lru", costs=costs(), sched=SchedulerParams(page_size=ps), closed_loop=False,
        progress=False,
    )  # fmt: skip
    args.update(kw)
    return Engine(reqs, **args)


# --- driving the scheduler by hand ----------------------------------------------------------


def admit(e: Engine, *reqs: SimReq) -> list[tuple[SimReq, int, int]] | None:
    """Queue ``reqs`` and form one prefill batch (PrefillAdder), without running it."""
    for r in reqs:
        e.sched.arrive(r)
    return e.sched._get_new_batch_prefill()


def run_batch(e: Engine, batch: list[tuple[SimReq, int, int]]) -> None:
    """Run one prefill batch to completion (simulated time advances)."""
    e.env.process(e.sched._run_prefill(batch))
    e.env.run()


def prefill_all(e: Engine, *reqs: SimReq) -> int:
    """Queue ``reqs`` and run prefill batches until the queue is empty; returns the number of
    batches. Fails if the queue stops making progress."""
    for r in reqs:
        e.sched.arrive(r)
    batches = 0
    while e.sched.waiting or e.sched.chunked is not None:
        batch = e.sched._get_new_batch_prefill()
        assert batch is not None, "the queue head cannot be admitted"
        run_batch(e, batch)
        batches += 1
    return batches


def decode_once(e: Engine) -> None:
    """Run one decode segment (the decode memory check, retractions, k steps)."""
    e.env.process(e.sched._run_decode(chain=False))
    e.env.run()


def ballast(e: Engine, pages: int) -> list[int]:
    """Take ``pages`` device pages out of the pool (memory held by something else)."""
    got = e.device.alloc_pages(pages)
    assert got is not None
    return got


def record_calls(obj: Any, name: str) -> list[Any]:
    """Wrap ``obj.name`` so that every call's first argument is appended to the returned
    list (used to capture the controller's write ops and load batches)."""
    seen: list[Any] = []
    real: Callable[..., Any] = getattr(obj, name)

    def wrapper(arg: Any, *rest: Any) -> Any:
        seen.append(arg)
        return real(arg, *rest)

    setattr(obj, name, wrapper)
    return seen


# --- watching a whole run ------------------------------------------------------------------


def observe_run(m: Any, got: dict[str, Any]) -> None:
    """Inside a ``monkeypatch.context()`` ``m``: make the next runs record into ``got`` every
    router read of an instance's running tokens (``router_reads``: instance, time, value)
    and, when the engine's run ends, each instance's clock, match count, free list and
    compute spans and the requests table (what two runs that must decide alike compare)."""
    from sim.instance import Instance

    reads = got["router_reads"] = []
    running_tokens = Instance.running_tokens

    def logged(self: Instance) -> int:
        n = running_tokens(self)
        reads.append((self.index, self.env.now, n))
        return n

    m.setattr(Instance, "running_tokens", logged)
    run = Engine.run

    def keep(self: Engine) -> float:
        out = run(self)
        got["clocks"] = [i.cache.now() for i in self.instances]
        got["matches"] = [i.cache.stats.match_calls for i in self.instances]
        got["free"] = [i.device.free_pages_snapshot() for i in self.instances]
        got["spans"] = [list(i.sched.spans) for i in self.instances]
        got["requests"] = self.frames()["requests"]
        return out

    m.setattr(Engine, "run", keep)
