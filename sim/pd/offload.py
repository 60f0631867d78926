"""The decode server's KV offload to L3 (``pd.decode_offload_kvcache``): SGLang 0.5.23's
``--disaggregation-decode-enable-offload-kvcache`` (``DecodeKVCacheOffloadManager``).

What SGLang 0.5.23 does (``disaggregation/decode_kvcache_offload_manager.py``, file:line of
the installed wheel):

- **Enabling.** On a decode server with the flag, the scheduler builds the manager
  (managers/scheduler.py:639-650): its own host pool (``build_kv_host_pool`` of the device KV
  pool) and its own ``HiCacheController`` with the server's storage backend
  (decode_kvcache_offload_manager.py:112-140). It does not use or need the decode radix cache.
- **Stride.** ``SGLANG_HICACHE_DECODE_OFFLOAD_STRIDE``, default the page size, else rounded
  down to whole pages and at least one page (:61-68).
- **What is offloaded.** After each decode step of a running request and at its finish
  (``batch_result_processor.py:1428-1456``), ``offload_kv_cache`` (:187-246): of prompt +
  outputs but the last token, the part past the page-aligned prompt (the prefill server
  backed the prompt up itself, :183-185) and not yet offloaded, cut down to whole strides; a
  device->host write through the manager's controller (:224-233; "Not enough host memory":
  nothing, :234-236). The prompt's page hashes start the chain, so the keys are the ones a
  prefill server computes for the same tokens (``_compute_prefix_hash``, :388-396).
- **Backup.** The scheduler polls the manager every loop iteration
  (``check_offload_progress``, decode.py:3462-3463): a finished device->host copy is backed up
  to the store (``write_storage``, :364-385); a finished backup frees its host pages (:347-362).
- **Release.** A finished request's device KV is freed once its last copy is done (:323-345,
  ``finalize_release_on_finish``: the unaligned tail is never offloaded, :398-403).

What this module does with that: :class:`DecodeOffload` offloads at a request's finish what
SGLang has offloaded by then (the whole strides past the page-aligned prompt of its committed
KV), as one device->host copy on the decode server's PCIe link followed by one store write;
the pages enter the store when the write ends, under the keys the prefill side computes (the
request's page symbols chained from its prompt's). Simplified: SGLang copies a stride at a
time while the request decodes (each after the step that completes it), so its copies are
spread over the decode and only the last stride is left at the finish; here the bytes and the
store's contents are the same but the copy is one burst at the finish. The device pages are
freed at the finish (SGLang: after the last copy), and the copies do not wait for the
scheduler's next iteration to be acknowledged.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from hicache.policy.storage import PageHasher, PageStore
from sim.link import DuplexLink, Job
from sim.metrics import Recorder, TransferRow
from sim.storage import StorageLink


@dataclass
class OffloadStats:
    """What one decode server's offload manager did (tokens; ops)."""

    ops: int = 0
    tokens: int = 0
    host_full: int = 0  # offloads skipped: the manager's host pool had no room
    stored_tokens: int = 0  # tokens whose store write has ended
    d2h_bytes: int = 0  # per rank
    write_bytes: int = 0  # to the store, all ranks

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


@dataclass
class DecodeOffload:
    """One decode server's offload manager (see the module docstring). ``link``: the server's
    PCIe link; ``store``/``hasher``/``store_link``: its L3 store (shared with the prefill
    servers where the backend is shared); ``host_tokens``: the manager's host pool."""

    env: simpy.Environment
    link: DuplexLink
    recorder: Recorder  # the decode server's (its PCIe copies in transfers.parquet)
    costs: Any  # sim.costs.Costs of the decode role
    store: PageStore
    hasher: PageHasher
    store_link: StorageLink
    spec: Any  # hicache.storage_backends.StorageBackendSpec
    page_size: int
    stride: int
    host_tokens: int
    page_bytes_per_rank: int
    ranks: int
    stats: OffloadStats = field(default_factory=OffloadStats)
    _host_used: int = 0
    _uniq: int = 0

    def offloaded_tokens(self, input_length: int, output_length: int) -> int:
        """What SGLang has offloaded of a finished request: the whole strides of its committed
        KV (prompt + outputs but the last) past the page-aligned prompt."""
        aligned = input_length // self.page_size * self.page_size
        committed = input_length + max(1, output_length) - 1
        return (committed - aligned) // self.stride * self.stride

    def finished(
        self, prompt: Sequence[Hashable], out_symbols: Sequence[Hashable],
        input_length: int, output_length: int,
    ) -> None:  # fmt: skip
        """A request finished on this server: ``prompt`` its full prompt pages' symbols,
        ``out_symbols`` the symbols its output pages got (fewer: the rest are its own)."""
        n = self.offloaded_tokens(input_length, output_length)
        if n <= 0:
            return
        if self._host_used + n > self.host_tokens:
            self.stats.host_full += 1
            return
        pages = n // self.page_size
        syms = list(out_symbols[:pages])
        while len(syms) < pages:  # outputs no later prompt reads: symbols of their own
            self._uniq -= 1
            syms.append(("offload", self._uniq))
        last = self.hasher.seed(None)
        own = input_length // self.page_size
        if own:
            last = self.hasher.chain(last, prompt[:own])[-1]
        keys = self.hasher.chain(last, syms)
        self._host_used += n
        st = self.stats
        st.ops += 1
        st.tokens += n
        nbytes = pages * self.page_bytes_per_rank
        st.d2h_bytes += nbytes
        work = self.costs.op_time("write", nbytes, 1)

        def copied(job: Job) -> None:
            self.recorder.add_transfer(
                TransferRow(job.direction, job.kind, job.nbytes, job.pages, job.runs,
                            job.enqueued, job.start, job.end)
            )  # fmt: skip
            self._backup(keys, n)

        self.link.submit(Job("d2h", work, nbytes, pages, 1, "offload", copied))

    def _backup(self, keys: list[int], tokens: int) -> None:
        """The device->host copy is done: back the pages up to the store."""
        pages = len(keys)
        fixed = self.spec.stage_seconds("write", pages, self.page_bytes_per_rank)
        nbytes = pages * self.page_bytes_per_rank * self.ranks
        self.stats.write_bytes += nbytes

        def stored(_event: simpy.Event) -> None:
            self.store.set(keys)
            self._host_used -= tokens
            self.stats.stored_tokens += tokens

        def move(_event: simpy.Event) -> None:
            self.store_link.transfer("write", nbytes).callbacks.append(stored)

        self.env.timeout(fixed).callbacks.append(move)
