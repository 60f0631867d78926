"""One evaluation of a plan (a configuration at N instances, one timed simulation) and the
executors that run a wave of them: a local process pool or Ray.

A job is an :class:`EvalTask`: the resolved config (:func:`hicache.config.config_to_dict`),
N, and the key of the trace in :data:`_TRACES`. The driver puts the trace there before any
pool starts, so forked workers share it (:func:`studies.sweep.executors.run_local` with
``needs_parent_state``); a Ray task gets it once through the object store instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from studies.errors import StudyError
from studies.sweep.executors import EXECUTORS, run_local

if TYPE_CHECKING:
    from studies.plan.targets import Slo
    from traces.schema import Trace

Config = dict[str, dict[str, Any]]

#: Traces of the plans running in this process, by key (inherited by forked workers).
_TRACES: dict[str, Trace] = {}


#: What an evaluation sizes: ``cluster.instances``, or a PD run's (prefill, decode) servers.
Size = int | tuple[int, int]


class EvalTask(NamedTuple):
    """One job: ``config`` with ``cluster.instances = instances`` (a pair: ``pd.prefill_instances``
    and ``pd.decode_instances``), over trace ``trace_key``;
    with ``slo``, the summary gains ``goodput``; ``replica`` >= 0: replica ``replica`` of a
    ``--seeds`` plan (:func:`sim.seeds.replica_settings`)."""

    config: Config
    instances: Size
    trace_key: str
    slo: Slo | None = None
    replica: int = -1


def simulate(
    config: Config, instances: Size, trace: Trace, slo: Slo | None = None, replica: int = -1
) -> dict[str, Any]:
    """The summary of one run of ``config`` with ``instances`` instances (a pair: prefill and
    decode servers of a PD run) (no files), with
    ``goodput`` (:func:`goodput`) when an ``slo`` is given; replica ``replica`` of it when
    >= 0 (:func:`sim.seeds.replica_settings`)."""
    from hicache.config import config_from_dict
    from sim.engine import run_simulation
    from sim.seeds import replica_settings

    data = {section: dict(body) for section, body in config.items()}
    if isinstance(instances, tuple):
        data["pd"]["prefill_instances"], data["pd"]["decode_instances"] = instances
    else:
        data.setdefault("cluster", {})["instances"] = instances
    if replica >= 0:
        seeds = replica_settings(data["run"]["seed"], data["router"]["seed"], replica)
        for key, value in seeds.items():
            section, _, name = key.partition(".")
            data[section][name] = value
    frames: dict[str, Any] = {}
    summary = run_simulation(config_from_dict(data), trace, None, False, frames)
    if slo is not None:
        req = frames["requests"]
        summary["goodput"] = goodput(pd_request_times(req) if summary.get("pd") else req, slo)
    return summary


def pd_request_times(requests: Any) -> Any:
    """A PD run's request table (:class:`sim.pd.request.PdRow` columns) with the columns
    :func:`goodput` reads, as a single server's table has them (sim.metrics): ``ttft_s`` =
    first token (streamed by the decode server) - arrival, ``tpot_s`` = (finish - first
    token) / (outputs - 1), NaN for one output token or an unfinished request."""
    import numpy as np

    done = requests["finish_s"] >= 0
    out = requests["output_tokens"].to_numpy()
    ttft = (requests["first_token_s"] - requests["arrival_s"]).where(done)
    span = (requests["finish_s"] - requests["first_token_s"]).to_numpy()
    tpot = np.where(done & (out > 1), span / np.maximum(out - 1, 1), np.nan)
    return requests.assign(ttft_s=ttft, tpot_s=tpot)


def goodput(requests: Any, slo: Slo) -> float:
    """The share of ``requests`` (a run's request table) that finished with TTFT and TPOT
    within ``slo``. A rejected or unfinished request misses; a request with one output token
    has no TPOT and is judged on TTFT alone."""
    if not len(requests):
        return float("nan")
    done = requests["finish_s"] >= 0
    ttft_ok = requests["ttft_s"] <= slo.ttft_s
    tpot_ok = requests["tpot_s"].isna() | (requests["tpot_s"] <= slo.tpot_s)
    return float((done & ttft_ok & tpot_ok).sum() / len(requests))


def evaluate(task: EvalTask) -> dict[str, Any]:
    """The job function of the local pool: :func:`simulate` on the shared trace."""
    return simulate(task.config, task.instances, _TRACES[task.trace_key], task.slo, task.replica)


def _evaluate_with(task: EvalTask, trace: Trace) -> dict[str, Any]:
    """The job function of a Ray task (the trace comes from the object store)."""
    return simulate(task.config, task.instances, trace, task.slo, task.replica)


class Executor:
    """Runs waves of :class:`EvalTask` s; a context manager (Ray starts once per plan).

    ``kind``: ``"local"`` (processes; ``jobs`` workers, 0 = all cores, 1 = this process) or
    ``"ray"`` (``address`` = an existing cluster; otherwise a local runtime with ``jobs``
    CPUs). ``on_done()`` is called as each run ends (a progress bar). ``seeds`` > 1: each
    evaluation is that many replicas (:mod:`sim.seeds`), run side by side and folded into
    their :func:`sim.seeds.median_summary`. A failing simulation raises: a plan with a hole
    in it is not a plan.
    """

    def __init__(
        self,
        trace: Trace,
        kind: str = "local",
        jobs: int = 0,
        address: str | None = None,
        on_done: Callable[[], None] | None = None,
        slo: Slo | None = None,
        seeds: int = 1,
    ) -> None:
        if kind not in EXECUTORS:
            raise StudyError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
        if address and kind != "ray":
            raise StudyError("an address needs the ray executor")
        self.trace = trace
        self.kind, self.jobs, self.address = kind, jobs, address
        self.on_done = on_done
        self.slo = slo
        self.seeds = max(1, seeds)
        self.key = f"plan-{id(self)}"
        self._ray: Any = None
        self._ray_started = False
        self._trace_ref: Any = None

    def __enter__(self) -> Executor:
        _TRACES[self.key] = self.trace
        if self.kind == "ray":
            self._start_ray()
        return self

    def __exit__(self, *exc: object) -> None:
        _TRACES.pop(self.key, None)
        if self._ray_started:
            self._ray.shutdown()

    def run(self, configs: Sequence[Config], wave: Sequence[tuple[int, Size]]) -> list[Any]:
        """Summaries of ``(configuration index, N or (prefill, decode))`` pairs, in order (with
        ``seeds`` > 1,
        each the median summary of its replicas)."""
        from sim.seeds import median_summary

        k = self.seeds
        replicas = range(k) if k > 1 else [-1]
        tasks = [EvalTask(configs[i], n, self.key, self.slo, r) for i, n in wave for r in replicas]
        runs = self._run_ray(tasks) if self.kind == "ray" else self._run_local(tasks)
        if k == 1:
            return runs
        out = []
        for j, (i, _) in enumerate(wave):
            base = configs[i]["run"]["seed"]
            out.append(median_summary(runs[j * k : (j + 1) * k], [base + r for r in range(k)]))
        return out

    def _run_local(self, tasks: Sequence[EvalTask]) -> list[Any]:
        results: dict[int, dict[str, Any]] = {}

        def collect(i: int, summary: dict[str, Any]) -> None:
            results[i] = summary
            if self.on_done is not None:
                self.on_done()

        run_local(evaluate, tasks, self.jobs, collect, needs_parent_state=True)
        return [results[i] for i in range(len(tasks))]

    def _start_ray(self) -> None:
        try:
            # by name: Ray is an optional extra, so neither mypy nor CI may have it
            ray = importlib.import_module("ray")
        except ImportError:
            raise StudyError(
                "the ray executor needs Ray: pip install 'hicache-sim[cluster]'"
            ) from None
        if not ray.is_initialized():
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(
                        num_cpus=self.jobs or None, include_dashboard=False, log_to_driver=False
                    )
            except Exception as e:
                where = f" at {self.address}" if self.address else ""
                raise StudyError(f"cannot start Ray{where}: {' '.join(str(e).split())}") from None
            self._ray_started = True
        self._ray = ray
        self._trace_ref = ray.put(self.trace)  # once per plan, not once per job

    def _run_ray(self, tasks: Sequence[EvalTask]) -> list[Any]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(_evaluate_with)
        refs = {remote.remote(t, self._trace_ref): i for i, t in enumerate(tasks)}
        results: dict[int, Any] = {}
        left = list(refs)
        try:
            while left:
                done, left = ray.wait(left, num_returns=1)
                for ref in done:
                    results[refs[ref]] = ray.get(ref)
                    if self.on_done is not None:
                        self.on_done()
        except BaseException:
            for ref in left:
                ray.cancel(ref, force=True)
            raise
        return [results[i] for i in range(len(tasks))]


__all__ = ["EvalTask", "Executor", "Size", "evaluate", "pd_request_times", "simulate"]
