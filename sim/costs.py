"""The latency model bound to one configuration: what the scheduler and the controller charge.

Copy ops follow the one cost rule of :mod:`hicache.latency` (``op_charges`` / ``op_time``);
prefill and decode come from its compute model under the run's profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hicache import latency
from hicache.latency import LinkParams, count_runs

if TYPE_CHECKING:
    from hicache.config import SimConfig


@dataclass(frozen=True)
class Costs:
    """The latency model of one run (``sim.scheduler.CostModel`` and the controller's copies)."""

    num_layers: int
    bytes_per_page: int
    d2h: LinkParams
    h2d: LinkParams
    prefill_fn: Callable[[list[tuple[int, int]]], float]
    decode_fn: Callable[[int, int], float]
    _decode_memo: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)

    @property
    def eta_d2h(self) -> float:
        return self.d2h.eta

    @property
    def eta_h2d(self) -> float:
        return self.h2d.eta

    def op_time(self, kind: str, nbytes: int, runs: int) -> float:
        """Uncoupled seconds of a ``"write"`` (d2h) or ``"load"`` (h2d) op."""
        link = self.d2h if kind == "write" else self.h2d
        return latency.op_time(link, latency.op_charges(kind, nbytes, runs, self.num_layers))

    def prefill_time(self, reqs: list[tuple[int, int]]) -> float:
        return self.prefill_fn(reqs)

    def decode_coeffs(self, batch_size: int) -> tuple[float, float]:
        """(a, b) of a decode step ``a + b * kv_tokens`` for this batch size (memoized: the
        scheduler asks once per decode segment)."""
        got = self._decode_memo.get(batch_size)
        if got is None:
            a = self.decode_fn(batch_size, 0)
            got = self._decode_memo[batch_size] = (a, self.decode_fn(batch_size, 1) - a)
        return got


__all__ = ["Costs", "build_costs", "count_runs"]


def build_costs(cfg: SimConfig) -> Costs:
    """The latency model for a resolved :class:`hicache.config.SimConfig`."""
    from hicache.config import resolve_pools
    from hicache.hardware import get_gpu, get_model

    model = get_model(cfg.model.name)
    gpu = get_gpu(cfg.gpu.name)
    tp = cfg.model.tp
    _, _, kv_bytes = resolve_pools(cfg)
    prof = latency.load_profile(cfg.run.profile or None, cfg.gpu.name, cfg.link.name)
    backend = cfg.link.io_backend

    def prefill(reqs: list[tuple[int, int]]) -> float:
        return latency.prefill_time(model, gpu, prof, reqs, tp)

    def decode(bs: int, kv: int) -> float:
        return latency.decode_step_time(model, gpu, prof, bs, kv, tp)

    return Costs(
        num_layers=model.num_layers,
        bytes_per_page=kv_bytes * cfg.cache.page_size,
        d2h=prof.link(backend, "d2h"),
        h2d=prof.link(backend, "h2d"),
        prefill_fn=prefill,
        decode_fn=decode,
    )
