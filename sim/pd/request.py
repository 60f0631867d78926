"""One request's way through a PD cluster: its state on each role and the times it passed each
step (what ``requests.parquet`` of a PD run records per request)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from sim.cache_types import AnyKV
from sim.pd.decode_l3 import PendingRestore
from sim.scheduler import SimReq


@dataclass(eq=False, slots=True)
class PdReq:
    """``pre``: the request as its prefill server runs it (one output token, SGLang sets
    ``max_new_tokens = 1`` there, prefill.py:478-482); ``dec``: as its decode server runs it."""

    pre: SimReq
    dec: SimReq
    arrival: float
    prefill: int = -1  # instance indices per role
    decode: int = -1
    kv: AnyKV | None = None  # the decode pages pre-allocated for the transfer
    prealloc_s: float = -1.0  # decode pre-allocation (DecodePreallocQueue.pop_preallocated)
    bootstrap_s: float = -1.0  # the prefill server's waiting queue takes it (pop_bootstrapped)
    transfer_bytes: int = 0  # per rank
    transfer_chunks: int = 0
    transfer_start_s: float = -1.0
    transfer_end_s: float = -1.0
    arrived: bool = False  # the KV is on the decode server (KVPoll.Success)
    first_token_s: float = -1.0  # merged into the decode batch: the first token streamed
    finish_s: float = -1.0
    rejected: bool = False
    # the decode radix cache (pd.decode_radix_cache, sim.pd.decode_cache): the prefix the
    # decode server holds (decode_prefix_len, sent to the prefill side), its device and host
    # parts, whether the host part is loaded back and when, the bytes per rank not sent
    decode_prefix: int = 0
    decode_device_hit: int = 0
    decode_host_hit: int = 0
    restored: bool = True
    restore_end_s: float = -1.0
    transfer_bytes_saved: int = 0
    # the promised tokens the store holds (decode-side L3, sim.pd.decode_l3), the local restore
    # of the promised host/L3 part, and whether that restore fell short (the request aborted)
    decode_storage_hit: int = 0
    restore: PendingRestore | None = None
    restore_failed: bool = False
    # the decode side's output page symbols (its SimReq's list, grown as its outputs are
    # cached): what the decode offload manager keys the outputs by (sim.pd.offload)
    out_symbols: list[Hashable] = field(default_factory=list)

    @property
    def rid(self) -> int:
        return self.pre.rid


class PdRow(NamedTuple):
    """A PD request in ``requests.parquet`` (times in seconds; -1: never happened)."""

    rid: int
    prefill_instance: int
    decode_instance: int
    arrival_s: float
    prealloc_s: float
    bootstrap_s: float
    prefill_admitted_s: float
    prefill_end_s: float
    transfer_start_s: float
    transfer_end_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    computed_tokens: int
    transfer_bytes: int
    transfer_chunks: int
    decode_retractions: int
    decode_device_hit_tokens: int
    decode_host_hit_tokens: int
    decode_storage_hit_tokens: int
    decode_restore_failed: bool
    transfer_bytes_saved: int


def pd_row(r: PdReq) -> PdRow:
    pre, dec = r.pre, r.dec
    return PdRow(
        r.rid, r.prefill, r.decode, r.arrival, r.prealloc_s, r.bootstrap_s, pre.admitted,
        pre.first_token, r.transfer_start_s, r.transfer_end_s, r.first_token_s,
        r.finish_s if not r.rejected else -1.0, pre.input_length, dec.output_length,
        max(pre.device_hit, 0), pre.host_hit, pre.storage_hit, pre.computed, r.transfer_bytes,
        r.transfer_chunks, dec.retractions, r.decode_device_hit, r.decode_host_hit,
        r.decode_storage_hit, r.restore_failed, r.transfer_bytes_saved,
    )  # fmt: skip
