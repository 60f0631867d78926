"""The KV transfer from a prefill server to a decode server (SGLang's PD transfer engines).

What SGLang 0.5.23 does (``disaggregation/``):

- The prefill side sends each prefill chunk's KV once that chunk is computed
  (``send_kv_chunk``, prefill.py:1501-1527; the last chunk from
  ``process_batch_result_disagg_prefill``, prefill.py:1087-1090), the pages past the prefix
  the decode side holds (``_num_pages_to_send``, prefill.py:446-450): whole pages.
- Mooncake queues each chunk on one of ``SGLANG_DISAGGREGATION_QUEUE_SIZE`` (4, environ.py:754)
  transfer queues, picked by the decode session (mooncake/conn.py:3118-3123), and sends all
  of the chunk's layers in one ``batch_transfer_sync`` (``process_layers``,
  mooncake/conn.py:1200-1204, 1225-1226; ``SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES`` 0 =
  one batch). Contiguous pages go as one block (``group_concurrent_contiguous``,
  common/utils.py:112-136).
- Every TP rank sends its own KV slice (its ``kv_args.engine_rank``) over its own NIC.

The model: a transfer of ``chunks`` ops over one link takes ``chunks * latency +
bytes_per_rank / bandwidth``; the ops of all of a prefill server's transfers share its NICs in
one FIFO (SGLang's four queues run in parallel threads over the same NICs: the FIFO gives the
same total time and a conservative order). The ops start when the prefill ends (SGLang sends
earlier chunks after their own forward, so a long chunked prompt overlaps part of its transfer
with its later chunks: not modelled).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import simpy

from hicache.config.pd import PdConfig
from hicache.models import ModelSpec, kv_bytes_per_token


@dataclass(frozen=True)
class TransferCost:
    """The transfer rule of one run: per-rank bandwidth (bytes/s), seconds per op, the
    bootstrap after pre-allocation and the once-per-pair handshake."""

    bandwidth_Bps: float
    latency_s: float
    bootstrap_s: float
    handshake_s: float

    @classmethod
    def of(cls, pd: PdConfig) -> TransferCost:
        gbps, lat = (
            (pd.rdma_gbps, pd.rdma_latency_s)
            if pd.transfer == "rdma"
            else (pd.nvlink_gbps, pd.nvlink_latency_s)
        )
        return cls(gbps * 1e9, lat, pd.bootstrap_s, pd.handshake_s)

    def seconds(self, nbytes: int, chunks: int) -> float:
        """One request's transfer on an idle link: ``chunks`` ops, ``nbytes`` per rank."""
        return chunks * self.latency_s + nbytes / self.bandwidth_Bps


def rank_bytes_per_token(model: ModelSpec, tp_prefill: int, tp_decode: int) -> int:
    """KV bytes per token that one link carries: a rank's slice at the smaller TP of the two
    roles (the side with fewer ranks has fewer NICs; an MLA latent is whole on every rank)."""
    return kv_bytes_per_token(model, min(tp_prefill, tp_decode))


def transfer_chunks(
    extend: int, device_prefix: int, chunk_size: int, start: int = 0, page_size: int = 1
) -> int:
    """``send_kv_chunk`` calls of one prefill: one per prefill chunk of the ``extend`` tokens
    (``chunk_size`` <= 0: unchunked), plus the early send of a device-resident cached prefix
    (``SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX``, default on, environ.py:768;
    ``maybe_send_cached_prefix_chunk``, prefill.py:1460-1499). ``start``: the prefix the decode
    side holds (``start_send_idx = decode_prefix_len``, prefill.py:437-438): the early send only
    past it, and a non-last chunk whose page-floored end does not pass it sends nothing
    (prefill.py:1544-1564; an empty send is not counted); the last chunk always goes (it
    carries the metadata). ``start`` 0: one op per chunk, plus the early send."""
    chunks = 1 if chunk_size <= 0 else max(1, math.ceil(extend / chunk_size))
    early = 1 if device_prefix > start else 0
    if start <= 0:
        return chunks + early
    ops = early + 1  # the last chunk
    for k in range(chunks - 1):
        end = device_prefix + (k + 1) * chunk_size
        if end - end % page_size > start:
            ops += 1
    return ops


class KvLinks:
    """The outbound NICs of each prefill server, one FIFO per server."""

    def __init__(self, env: simpy.Environment, prefill_instances: int) -> None:
        self.env = env
        self._fifo = [simpy.Resource(env, capacity=1) for _ in range(prefill_instances)]

    def send(
        self, prefill: int, seconds: float, started: Callable[[float], None],
        done: Callable[[float], None],
    ) -> None:  # fmt: skip
        """Queue a transfer of ``seconds`` on ``prefill``'s link; ``started`` and ``done`` hear
        its start and end times."""
        self.env.process(self._run(self._fifo[prefill], seconds, started, done))

    def _run(
        self, fifo: simpy.Resource, seconds: float, started: Callable[[float], None],
        done: Callable[[float], None],
    ) -> Generator[simpy.Event, Any, None]:  # fmt: skip
        with fifo.request() as slot:
            yield slot
            started(self.env.now)
            yield self.env.timeout(seconds)
        done(self.env.now)
