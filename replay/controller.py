"""TorchController: the policy core's TransferController, doing every copy for real.

It is :class:`hicache.policy.controller.BaseController` (page allocation, FIFO ack queues, the
SGLang semantics documented there) with the copies of :mod:`replay.transfer`:

* ``write`` -> one :class:`~replay.transfer.Transfer` on the write stream, issued at once;
* ``start_loading`` -> the batch's queued loads merged into one layer-by-layer transfer on the
  load stream (one mark per layer, :meth:`TorchController.layer_done`); at most
  ``max_loads_in_flight`` (SGLang's 3-slot producer ring) are in flight: starting a fourth first
  waits for the oldest, where SGLang would assert;
* acks: an op's ``done`` flag is set only when its last mark has completed *and* the controller
  has seen it (:meth:`TorchController.poll`, which ``pop_completed_writes`` /
  ``pop_completed_loads`` call first). Ops are finished in issue order per direction, so the
  FIFO ack queues never see a later op done before an earlier one;
* ``wait_writes`` (write_back eviction) waits for every write.

Every finished op becomes an :class:`OpRecord` in :attr:`TorchController.records`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from hicache.policy.allocator import PageAllocator
from hicache.policy.controller import BaseController, LoadBatch, WriteOp
from replay.pools import KVPools
from replay.runtime import Runtime
from replay.transfer import CopyEngine, Transfer

#: SGLang's LayerDoneCounter ring size (POLICY_CORE.md §4.3).
LOAD_RING = 3


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One finished copy op, as the replay tables store it. Times in seconds; ``issue_s`` is
    relative to the controller's creation."""

    op_id: int
    kind: str
    """``write`` or ``load``."""
    direction: str
    backend: str
    layout: str
    nbytes: int
    pages: int
    runs: int
    layers: int
    calls: int
    nodes: int
    issue_s: float
    duration_s: float
    host_s: float
    issue_cpu_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TorchController(BaseController):
    """See the module docstring. ``device`` / ``host`` are the policy core's allocators; their
    page ids index ``pools`` (so the pools must have at least as many pages)."""

    def __init__(
        self,
        device: PageAllocator,
        host: PageAllocator | None,
        pools: KVPools,
        runtime: Runtime,
        backend: str = "kernel",
        max_loads_in_flight: int = LOAD_RING,
    ) -> None:
        super().__init__(device, host)
        spec = pools.spec
        if device.page_size != spec.page_size:
            raise ValueError(f"allocator page size {device.page_size} != pool {spec.page_size}")
        if device.num_pages > spec.device_pages:
            raise ValueError(
                f"device allocator has {device.num_pages} pages, the pool only {spec.device_pages}"
            )
        if host is not None and host.num_pages > spec.host_pages:
            raise ValueError(
                f"host allocator has {host.num_pages} pages, the pool only {spec.host_pages}"
            )
        if max_loads_in_flight < 1:
            raise ValueError(f"max_loads_in_flight must be >= 1, got {max_loads_in_flight}")
        self.pools = pools
        self.runtime = runtime
        self.backend = backend
        self.max_loads_in_flight = max_loads_in_flight
        self.engine: CopyEngine | None = CopyEngine(pools, runtime, backend) if host else None
        self._writes: OrderedDict[int, tuple[WriteOp, Transfer]] = OrderedDict()
        self._loads: OrderedDict[int, tuple[LoadBatch, Transfer]] = OrderedDict()
        self._load_transfers: dict[int, Transfer] = {}
        self.records: list[OpRecord] = []
        self.t0 = time.perf_counter()

    # -- hooks of BaseController ------------------------------------------------------------
    def _issue_write(self, op: WriteOp) -> None:
        assert self.engine is not None, "write without a host pool"
        self._writes[op.op_id] = (op, self.engine.d2h(op.device_pages, op.host_pages))

    def _issue_load(self, batch: LoadBatch) -> None:
        assert self.engine is not None, "load without a host pool"
        while len(self._loads) >= self.max_loads_in_flight:
            # the producer ring is full: wait for the oldest batch (SGLang asserts instead)
            self._finish_loads(block_until=next(iter(self._loads)))
        dev = [p for o in batch.ops for p in o.device_pages]
        host = [p for o in batch.ops for p in o.host_pages]
        t = self.engine.h2d(dev, host)
        self._loads[batch.op_id] = (batch, t)
        self._load_transfers[batch.op_id] = t

    def _wait_all_writes(self) -> None:
        if self._writes:
            self._finish_writes(block_until=next(reversed(self._writes)))

    # -- acks -------------------------------------------------------------------------------
    def pop_completed_writes(self) -> list[int]:
        self._finish_writes()
        return super().pop_completed_writes()

    def pop_completed_loads(self) -> list[list[int]]:
        self._finish_loads()
        return super().pop_completed_loads()

    def poll(self) -> None:
        """Finish every op whose copies have completed, oldest first, stopping per direction at
        the first one still in flight (what ``writing_check`` / ``loading_check`` observe)."""
        self._finish_writes()
        self._finish_loads()

    def synchronize(self) -> None:
        """Block until every issued copy has completed, and finish them all."""
        if self._writes:
            self._finish_writes(block_until=next(reversed(self._writes)))
        if self._loads:
            self._finish_loads(block_until=next(reversed(self._loads)))

    def _finish_writes(self, block_until: int | None = None) -> None:
        eng = self.engine
        while self._writes:
            op_id, (op, t) = next(iter(self._writes.items()))
            if block_until is not None and op_id <= block_until:
                assert eng is not None
                eng.wait(t)
            elif eng is None or not eng.complete(t):
                return
            del self._writes[op_id]
            op.done = True
            self._record(op_id, "write", t, nodes=1)

    def _finish_loads(self, block_until: int | None = None) -> None:
        eng = self.engine
        while self._loads:
            op_id, (batch, t) = next(iter(self._loads.items()))
            if block_until is not None and op_id <= block_until:
                assert eng is not None
                eng.wait(t)
            elif eng is None or not eng.complete(t):
                return
            del self._loads[op_id]
            batch.done = True
            self._record(op_id, "load", t, nodes=len(batch.node_ids))
            # layer queries only make sense for recent batches; keep the map small
            while len(self._load_transfers) > 4 * self.max_loads_in_flight:
                oldest = next(iter(self._load_transfers))
                if oldest in self._loads:
                    break
                del self._load_transfers[oldest]

    def _record(self, op_id: int, kind: str, t: Transfer, nodes: int) -> None:
        assert t.duration_s is not None
        self.records.append(
            OpRecord(
                op_id=op_id,
                kind=kind,
                direction=t.direction,
                backend=t.backend,
                layout=self.pools.spec.layout,
                nbytes=t.nbytes,
                pages=t.pages,
                runs=t.runs,
                layers=t.layers,
                calls=t.calls,
                nodes=nodes,
                issue_s=t.issue_s - self.t0,
                duration_s=t.duration_s,
                host_s=t.host_s,
                issue_cpu_s=t.issue_cpu_s,
            )
        )

    # -- per-layer events -------------------------------------------------------------------
    def layer_done(self, handle: int, layer: int) -> bool:
        """Whether layer ``layer`` of the load batch ``handle`` (``start_loading``'s return)
        has arrived on the device: what a forward pass waits on before reading that layer."""
        t = self._load_transfers[handle]
        assert self.engine is not None
        return self.engine.layer_done(t, layer)

    def wait_layer(self, handle: int, layer: int) -> None:
        """Block until layer ``layer`` of load batch ``handle`` has arrived."""
        t = self._load_transfers[handle]
        assert self.engine is not None
        self.engine.wait_layer(t, layer)

    # -- lifecycle --------------------------------------------------------------------------
    def reset(self) -> None:
        """Wait for the copies in flight (their buffers are about to be reused), then drop the
        queues and clear the host pool as ``BaseController.reset`` does."""
        self.synchronize()
        self._load_transfers.clear()
        super().reset()


__all__ = ["LOAD_RING", "OpRecord", "TorchController"]
