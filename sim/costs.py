"""The latency model bound to one configuration: what the scheduler and the controller charge.

Copy ops follow the one cost rule of :mod:`hicache.latency` (``op_charges`` / ``op_time``) for
the run's IO backend and host layout; prefill and decode come from :mod:`hicache.forward` (the
operator model of the served model) with the run's profile overheads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from hicache import latency
from hicache.latency import LinkParams, count_runs

if TYPE_CHECKING:
    from hicache.config import SimConfig


PREFILL_MEMO_MAX = 1 << 14  # one-request prefill passes remembered (Costs.prefill_time)


@dataclass(frozen=True)
class Costs:
    """The latency model of one run (``sim.scheduler.CostModel`` and the controller's copies).

    ``d2h``/``h2d``: the copy constants of the run's IO backend, with the bandwidth already
    reduced to what each rank gets when all ``tp`` ranks copy at once (the server's shared
    uplinks and socket memory, :func:`hicache.servers.rank_link_share`) and the coupling
    ``eta`` capped by the socket memory both directions share
    (:func:`hicache.servers.both_ways_eta`). ``backend``,
    ``layout`` and ``kv_parts`` select how SGLang issues a copy (:func:`hicache.latency.
    op_charges`).
    """

    num_layers: int
    bytes_per_page: int
    d2h: LinkParams
    h2d: LinkParams
    prefill_fn: Callable[[list[tuple[int, int]]], float]
    decode_fn: Callable[[int, int], float]
    backend: str = "direct"
    layout: str = "layer_first"
    kv_parts: int = 1
    #: one CPU all-reduce over the TP group on the scheduler thread (the profile's
    #: ``hicache_check_s``) when tp > 1 and the host tier is on, else 0: what each per-request
    #: HiCache vote costs (the prefetch checks, the decode side's L3 query; the per-pass
    #: checks are in ``prefill_fn`` / ``decode_fn``, :func:`hicache.forward.hicache_checks`)
    tp_sync_s: float = 0.0
    _decode_memo: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    _prefill_memo: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)
    _op_memo: dict[tuple[str, int, int], float] = field(default_factory=dict, repr=False)

    @property
    def eta_d2h(self) -> float:
        return self.d2h.eta

    @property
    def eta_h2d(self) -> float:
        return self.h2d.eta

    def op_time(self, kind: str, nbytes: int, runs: int) -> float:
        """Uncoupled seconds of a ``"write"`` (d2h) or ``"load"`` (h2d) op. Memoized like
        :meth:`prefill_time` (a pure function of its arguments; nodes of the same length and
        fragmentation recur): cleared when it holds ``PREFILL_MEMO_MAX`` entries."""
        key = (kind, nbytes, runs)
        memo = self._op_memo
        got = memo.get(key)
        if got is None:
            if len(memo) >= PREFILL_MEMO_MAX:
                memo.clear()
            got = memo[key] = self._op_time(kind, nbytes, runs)
        return got

    def _op_time(self, kind: str, nbytes: int, runs: int) -> float:
        link = self.d2h if kind == "write" else self.h2d
        charges = latency.op_charges(
            kind,
            nbytes,
            runs,
            self.num_layers,
            backend=self.backend,
            layout=self.layout,
            pages=nbytes // self.bytes_per_page if self.bytes_per_page else 0,
            kv_parts=self.kv_parts,
        )
        return latency.op_time(link, charges)

    def prefill_time(self, reqs: list[tuple[int, int]]) -> float:
        """Seconds of one prefill pass (``reqs``: new and cached tokens per request). A pass of
        one request is memoized (``prefill_fn`` is a pure function of its argument): chunked
        prefill repeats the same (chunk, prefix) passes across requests. The memo is cleared
        when it holds ``PREFILL_MEMO_MAX`` entries, so it stays small on any trace."""
        if len(reqs) != 1:
            return self.prefill_fn(reqs)
        memo = self._prefill_memo
        key = reqs[0]
        got = memo.get(key)
        if got is None:
            if len(memo) >= PREFILL_MEMO_MAX:
                memo.clear()
            got = memo[key] = self.prefill_fn(reqs)
        return got

    def decode_coeffs(self, batch_size: int) -> tuple[float, float]:
        """(a, b) of a decode step ``a + b * kv_tokens`` for this batch size (memoized: the
        scheduler asks once per decode segment)."""
        got = self._decode_memo.get(batch_size)
        if got is None:
            a = self.decode_fn(batch_size, 0)
            got = self._decode_memo[batch_size] = (a, self.decode_fn(batch_size, 1) - a)
        return got


__all__ = ["Costs", "build_costs", "count_runs", "shared_link"]


def shared_link(p: LinkParams, share: float) -> LinkParams:
    """``p`` with its bandwidth times ``share`` (a rank's part of a shared path)."""
    return p if share == 1.0 else replace(p, beta_Bps=p.beta_Bps * share)


def build_costs(cfg: SimConfig) -> Costs:
    """The latency model for a resolved :class:`hicache.config.SimConfig`."""
    from hicache.config import resolve_pools, server_for
    from hicache.forward import forward_model, hicache_checks
    from hicache.hardware import get_gpu
    from hicache.servers import both_ways_eta, rank_link_share

    model = cfg.model.spec
    gpu = get_gpu(cfg.gpu.name)
    tp = cfg.model.tp
    _, _, kv_bytes = resolve_pools(cfg)
    prof = latency.load_profile(cfg.run.profile or None, cfg.gpu.name, cfg.link.name)
    backend = cfg.link.io_backend
    checks = hicache_checks(cfg.sglang.version, tp, cfg.cache.enable_host, cfg.storage.enabled)
    fwd = forward_model(model, gpu, tp, prof, checks, ep=cfg.model.ep)
    server = server_for(cfg)
    d2h, h2d = prof.link(backend, "d2h"), prof.link(backend, "h2d")
    d2h = shared_link(d2h, rank_link_share(server, d2h.beta_Bps, tp))
    h2d = shared_link(h2d, rank_link_share(server, h2d.beta_Bps, tp))
    # both directions at once draw on the same socket memory: it caps the coupled rates
    d2h = replace(d2h, eta=both_ways_eta(server, d2h.beta_Bps, h2d.beta_Bps, tp, d2h.eta))
    h2d = replace(h2d, eta=both_ways_eta(server, d2h.beta_Bps, h2d.beta_Bps, tp, h2d.eta))
    return Costs(
        num_layers=model.num_layers,
        bytes_per_page=kv_bytes * cfg.cache.page_size,
        d2h=d2h,
        h2d=h2d,
        prefill_fn=fwd.prefill_time,
        decode_fn=fwd.decode_time,
        backend=backend,
        layout=cfg.link.mem_layout,
        kv_parts=1 if model.mla else 2,
        # the per-request votes happen where the per-pass checks do (tp > 1, a host tier)
        tp_sync_s=prof.hicache_check_s if checks != (0, 0) else 0.0,
    )
