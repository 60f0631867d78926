"""The TransferController interface (SGLang's HiCacheController role) and a manual implementation.

The policy core never moves bytes and never waits. It asks a controller to reserve pages and to
start copies, and it drains the controller's FIFO ack queues in ``writing_check`` /
``loading_check``. Three implementations share this interface: :class:`ManualController` (tests
decide when copies finish), ``sim.controller.SimController`` (copies are jobs on a SimPy PCIe
link) and ``replay.controller.TorchController`` (real copies on CUDA streams).

Semantics shared by every implementation (they follow SGLang 0.5.14):

* ``write`` reserves host pages synchronously and launches the device->host copy at once (one
  op per call, never merged). ``None`` means the host pool could not supply the pages; nothing
  was reserved.
* ``load`` reserves device pages synchronously and *queues* the host->device copy;
  ``start_loading`` merges every queued load of the batch into one layer-by-layer operation and
  appends one ack (holding the node ids of all merged loads) to the load-ack FIFO.
* Acks complete in issue order per direction (CUDA streams are in order). ``pop_completed_*``
  returns the acks at the *front* of the FIFO that have completed, stopping at the first one
  that has not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hicache.policy.allocator import PageAllocator

try:  # mypyc's class attributes, read when the module is compiled (mypy ships the package)
    from mypy_extensions import mypyc_attr
except ImportError:  # no mypy here, so no compiled build either: a no-op marker

    def mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:  # type: ignore[misc]
        return lambda cls: cls


class TransferController(Protocol):
    """What the policy core needs from whoever performs the copies."""

    page_size: int
    device: PageAllocator
    host: PageAllocator | None

    def write(self, device_pages: list[int], node_id: int) -> list[int] | None:
        """Reserve host pages and start a device->host copy; ``None`` if the host is full."""
        ...

    def load(self, host_pages: list[int], node_id: int) -> list[int] | None:
        """Reserve device pages and queue a host->device copy; ``None`` if the device is full."""
        ...

    def start_loading(self) -> int:
        """Launch all queued loads as one layer-wise op; returns its handle, or -1 if none."""
        ...

    def pop_completed_writes(self) -> list[int]:
        """Node ids of the completed writes at the front of the write-ack FIFO (popped)."""
        ...

    def wait_writes(self) -> list[int]:
        """Block until every issued write is done; pop and return all their node ids in order."""
        ...

    def pop_completed_loads(self) -> list[list[int]]:
        """Node-id lists of the completed load batches at the front of the load-ack FIFO."""
        ...

    def free_device(self, pages: list[int]) -> None:
        """Return device pages (distinct ids; the list is not modified by the caller after)."""
        ...

    def free_host(self, pages: list[int]) -> None:
        """Return host pages (distinct ids; the list is not modified by the caller after)."""
        ...

    def reset(self) -> None:
        """Drop all queues and clear the host pool (HiRadixCache.reset)."""
        ...


@dataclass(slots=True)
class WriteOp:
    """One device->host copy (one ``write`` call)."""

    op_id: int
    node_id: int
    device_pages: list[int]
    host_pages: list[int]
    done: bool = False
    node_ids: list[int] | None = None
    """The nodes of a merged op (0.5.23's ``start_writing``), in submission order; None for
    one node's own op (``node_id``)."""


def _acked(op: WriteOp) -> list[int]:
    """The node ids a write op's ack names (one, or a merged op's)."""
    return [op.node_id] if op.node_ids is None else op.node_ids


@dataclass(slots=True)
class LoadOp:
    """One ``load`` call, queued until ``start_loading`` merges the batch."""

    node_id: int
    host_pages: list[int]
    device_pages: list[int]


@dataclass(slots=True)
class LoadBatch:
    """The merged, layer-by-layer host->device copy of one prefill batch."""

    op_id: int
    ops: list[LoadOp]
    done: bool = False
    node_ids: list[int] = field(default_factory=list)

    @property
    def num_pages(self) -> int:
        return sum(len(op.device_pages) for op in self.ops)


@mypyc_attr(allow_interpreted_subclasses=True)
class BaseController:
    """Allocation, queues and FIFO ack bookkeeping; subclasses decide when copies finish.

    Subclasses override :meth:`_issue_write` / :meth:`_issue_load` (start the copy) and
    :meth:`_wait_all_writes` (block until all writes are done), and set ``op.done = True`` when
    an op completes.
    """

    def __init__(self, device: PageAllocator, host: PageAllocator | None) -> None:
        if host is not None and host.page_size != device.page_size:
            raise ValueError("device and host pools must use the same page_size")
        self.device = device
        self.host = host
        self.page_size = device.page_size
        self.write_queue: deque[WriteOp] = deque()
        self.load_queue: deque[LoadBatch] = deque()
        self.pending_loads: list[LoadOp] = []
        self.merge_writes = False
        """0.5.23: ``write`` reserves host pages and queues the copy; ``start_writing`` submits
        every queued write as one op (``write(flush=False)`` + ``flush_pending_backups``)."""
        self.pending_writes: list[WriteOp] = []
        self._next_op = 0
        # running totals (tokens), handy for reports and tests
        self.tokens_written = 0
        self.tokens_loaded = 0
        self.write_ops = 0
        self.load_batches = 0
        self.host_alloc_failures = 0
        self.device_alloc_failures = 0

    # -- the TransferController interface -------------------------------------------------------
    def write(self, device_pages: list[int], node_id: int) -> list[int] | None:
        if self.host is None:
            return None
        host_pages = self.host.alloc_pages(len(device_pages))
        if host_pages is None:
            self.host_alloc_failures += 1
            return None
        if self.merge_writes:
            self.pending_writes.append(WriteOp(0, node_id, device_pages, host_pages))
            return host_pages
        self._next_op += 1
        op = WriteOp(self._next_op, node_id, device_pages, host_pages)
        self._submit_write(op)
        return host_pages

    def start_writing(self) -> None:
        """Submit every queued write as one merged op (0.5.23 ``start_writing``)."""
        if not self.pending_writes:
            return
        queued, self.pending_writes = self.pending_writes, []
        self._next_op += 1
        if len(queued) == 1:
            # one queued write (each write_back victim's) is the merged op itself (its page
            # lists the caller's, as an unmerged op's)
            op = queued[0]
            op.op_id = self._next_op
            op.node_ids = [op.node_id]
            self._submit_write(op)
            return
        device: list[int] = []
        host: list[int] = []
        for w in queued:
            device += w.device_pages
            host += w.host_pages
        op = WriteOp(
            self._next_op, queued[0].node_id, device, host, node_ids=[w.node_id for w in queued]
        )
        self._submit_write(op)

    def _submit_write(self, op: WriteOp) -> None:
        self.write_queue.append(op)
        self.write_ops += 1
        self.tokens_written += len(op.host_pages) * self.page_size
        self._issue_write(op)

    def load(self, host_pages: list[int], node_id: int) -> list[int] | None:
        device_pages = self.device.alloc_pages(len(host_pages))
        if device_pages is None:
            self.device_alloc_failures += 1
            return None
        self.pending_loads.append(LoadOp(node_id, host_pages, device_pages))
        return device_pages

    def start_loading(self) -> int:
        if not self.pending_loads:
            return -1
        self._next_op += 1
        ops, self.pending_loads = self.pending_loads, []
        batch = LoadBatch(self._next_op, ops, node_ids=[op.node_id for op in ops])
        self.load_queue.append(batch)
        self.load_batches += 1
        self.tokens_loaded += batch.num_pages * self.page_size
        self._issue_load(batch)
        return batch.op_id

    def pop_completed_writes(self) -> list[int]:
        q = self.write_queue
        out: list[int] = []
        while q and q[0].done:
            out += _acked(q.popleft())
        return out

    def wait_writes(self) -> list[int]:
        self._wait_all_writes()
        out: list[int] = []
        for op in self.write_queue:
            if not op.done:
                raise AssertionError("wait_writes returned with unfinished writes")
            out += _acked(op)
        self.write_queue.clear()
        return out

    def pop_completed_loads(self) -> list[list[int]]:
        q = self.load_queue
        out: list[list[int]] = []
        while q and q[0].done:
            out.append(q.popleft().node_ids)
        return out

    def free_device(self, pages: list[int]) -> None:
        self.device.free_distinct(pages)

    def free_host(self, pages: list[int]) -> None:
        if self.host is None:
            raise AssertionError("free_host without a host pool")
        self.host.free_distinct(pages)

    def reset(self) -> None:
        self.write_queue.clear()
        self.pending_writes.clear()
        self.load_queue.clear()
        self.pending_loads.clear()
        if self.host is not None:
            self.host.clear()

    # -- hooks --------------------------------------------------------------------------------
    def _issue_write(self, op: WriteOp) -> None:
        """Start the copy of ``op`` (it completes later, by setting ``op.done``)."""

    def _issue_load(self, batch: LoadBatch) -> None:
        """Start the merged layer-wise copy of ``batch``."""

    def _wait_all_writes(self) -> None:
        """Block until every op in ``write_queue`` is done."""
        for op in self.write_queue:
            op.done = True

    @property
    def writes_in_flight(self) -> int:
        return sum(1 for op in self.write_queue if not op.done)


@mypyc_attr(allow_interpreted_subclasses=True)
class ManualController(BaseController):
    """Copies finish only when the caller says so (``complete_writes`` / ``complete_loads``).

    ``wait_writes`` (the blocking wait of a write_back eviction) completes every write, as the
    real synchronize would.
    """

    def complete_writes(self, count: int | None = None) -> int:
        """Mark the oldest ``count`` unfinished writes (all if None) as done; returns how many."""
        n = 0
        for op in self.write_queue:
            if count is not None and n >= count:
                break
            if not op.done:
                op.done = True
                n += 1
        return n

    def complete_write_of(self, node_id: int) -> None:
        """Mark the write issued for ``node_id`` done, even out of order (acks stay FIFO)."""
        for op in self.write_queue:
            if op.node_id == node_id and not op.done:
                op.done = True
                return
        raise KeyError(f"no unfinished write for node {node_id}")

    def complete_loads(self, count: int | None = None) -> int:
        """Mark the oldest ``count`` started load batches (all if None) as done."""
        n = 0
        for batch in self.load_queue:
            if count is not None and n >= count:
                break
            if not batch.done:
                batch.done = True
                n += 1
        return n

    def complete_all(self) -> None:
        self.complete_writes()
        self.complete_loads()


class ImmediateController(BaseController):
    """Every copy is finished as soon as it is issued (no timing model).

    For cache-only replays: acks are still only *processed* by ``writing_check`` /
    ``loading_check``, so pins last until the caller's next check, as in SGLang.
    """

    def _issue_write(self, op: WriteOp) -> None:
        op.done = True

    def _issue_load(self, batch: LoadBatch) -> None:
        batch.done = True
