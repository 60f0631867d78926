"""SimController: the policy core's TransferController on the SimPy link.

Writes become device->host jobs that ack at completion; a batch's loads become one layer-wise
host->device job whose ``done`` event the scheduler waits on; ``wait_writes`` (write_back
eviction) blocks simulated time. Every job is charged by the one cost rule (:mod:`sim.costs`)
and recorded as a :class:`~sim.metrics.TransferRow`.
"""

from __future__ import annotations

import simpy

from hicache.policy import PageAllocator
from hicache.policy.controller import BaseController, LoadBatch, WriteOp
from sim.costs import Costs, count_runs
from sim.link import DuplexLink, Job
from sim.metrics import Recorder, TransferRow


class SimController(BaseController):
    """See the module docstring. Implements ``sim.scheduler.LinkControl`` for the scheduler."""

    def __init__(
        self,
        env: simpy.Environment,
        device: PageAllocator,
        host: PageAllocator | None,
        link: DuplexLink,
        costs: Costs,
        recorder: Recorder,
    ) -> None:
        super().__init__(device, host)
        self.env = env
        self.link = link
        self.costs = costs
        self.recorder = recorder
        self._stall_until = 0.0
        self._last_load: Job | None = None

    def _record(self, job: Job) -> None:
        self.recorder.add_transfer(
            TransferRow(job.direction, job.kind, job.nbytes, job.pages, job.runs, job.enqueued,
                        job.start, job.end)
        )  # fmt: skip

    def _issue_write(self, op: WriteOp) -> None:
        nbytes = len(op.device_pages) * self.costs.bytes_per_page
        runs = count_runs(op.device_pages, op.host_pages)

        def done(job: Job, op: WriteOp = op) -> None:
            op.done = True
            self._record(job)

        work = self.costs.op_time("write", nbytes, runs)
        self.link.submit(Job("d2h", work, nbytes, len(op.device_pages), runs, "write", done))

    def _issue_load(self, batch: LoadBatch) -> None:
        dev = [p for op in batch.ops for p in op.device_pages]
        host = [p for op in batch.ops for p in op.host_pages]
        nbytes = len(dev) * self.costs.bytes_per_page
        runs = count_runs(dev, host)

        def done(job: Job, batch: LoadBatch = batch) -> None:
            batch.done = True
            self._record(job)

        work = self.costs.op_time("load", nbytes, runs)
        job = Job("h2d", work, nbytes, len(dev), runs, "load", done, self.env.event())
        self._last_load = job
        self.link.submit(job)

    def _wait_all_writes(self) -> None:
        t = self.link.complete_all_now("d2h")
        self._stall_until = max(self._stall_until, t)

    def launch_loads(self) -> Job | None:
        """``ready_to_load_host_cache``: the batch's merged load job, or None."""
        self._last_load = None
        self.start_loading()
        return self._last_load

    def hold(self, seconds: float) -> None:
        """Block the scheduler for ``seconds`` more (a synchronous copy on its thread, e.g. a
        PD decode server's retraction backup, sim.pd.retraction), after any block already
        set: its next step starts then."""
        self._stall_until = max(self._stall_until, self.env.now) + seconds

    def take_stall(self) -> float:
        """Time until which the scheduler is blocked by a write_back wait (then cleared)."""
        t, self._stall_until = self._stall_until, 0.0
        return t
