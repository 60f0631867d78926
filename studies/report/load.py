"""Loading runs and sweeps for a report, and labelling them.

A run directory holds ``config.json``, ``summary.json`` and the Parquet tables of
:mod:`sim.metrics`; a sweep directory holds ``results.parquet`` and the job run directories
(:mod:`studies.sweep`). Runs are grouped automatically: the config keys whose values differ
between runs label them. Keys that size the pools (device tokens, host ratio/size) form the
capacity axis; the others (write policy, eviction, ...) form the series ("policy"). When only
the request rate varies, the rate is the x axis instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from studies.errors import StudyError
from studies.report.fmt import capacity_text

if TYPE_CHECKING:
    import pandas as pd

#: Keys that size the KV pools: together they are the capacity axis, not part of a series.
CAPACITY_KEYS = (
    "gpu.device_tokens",
    "gpu.mem_fraction",
    "gpu.reserve_gb",
    "cache.hicache_ratio",
    "cache.hicache_size_gb",
)
RATE_KEYS = ("workload.rate_scale",)
#: Keys that mean nothing without a host tier (left out of the labels of such runs).
HOST_ONLY_KEYS = (
    "cache.write_policy",
    "cache.hicache_ratio",
    "cache.hicache_size_gb",
    "cache.load_back_threshold",
)
#: Keys that mean nothing without an L3 tier (``storage.backend = "none"``): every
#: ``storage.*`` key but the backend itself.
STORAGE_ONLY_PREFIX = "storage."
#: Keys of prefill/decode disaggregation (labels: :func:`_pd_label`).
PD_PREFIX = "pd."
_SHORT = {
    "gpu.device_tokens": "device",
    "cache.hicache_ratio": "ratio",
    "cache.hicache_size_gb": "host GB",
    "cache.page_size": "page",
    "workload.rate_scale": "rate",
    "workload.max_requests": "requests",
    "storage.prefetch_threshold": "threshold",
    "storage.capacity_gb": "L3 GB",
    "storage.shared": "L3 shared",
    "storage.read_gbps_override": "L3 read GB/s",
    "storage.write_gbps_override": "L3 write GB/s",
    "storage.store_gbps": "store GB/s",
}


@dataclass
class Run:
    """One run directory: its config.json and summary.json, tables read on first use."""

    path: Path
    shown: str  # the path as the report prints it
    conf: dict[str, Any]
    summary: dict[str, Any]
    sweep: str | None = None
    label: str = ""
    series: str = ""
    _tables: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config, flat: ``{"section.key": value}``. A run written before the L3
        tier existed has no ``storage`` section: it gets the defaults (no L3), so it compares
        equal to a new run without one."""
        flat = {f"{s}.{k}": v for s, body in self.conf["config"].items() for k, v in body.items()}
        if "storage" not in self.conf["config"]:
            flat.update(_storage_defaults())
        served = self.conf.get("model", {}).get("name")
        if served and flat.get("model.config"):
            # model.config (a config.json) decides the shape: model.name is then only the
            # preset it was read against; show the model that ran
            flat["model.name"] = served
        return flat

    def value(self, key: str) -> Any:
        """A config value, or the trace (its checksum when known) for ``"trace"``."""
        if key == "trace":
            return self.conf.get("trace_sha256") or self.conf.get("trace")
        return self.config.get(key)

    @property
    def instances(self) -> int:
        """Servers in the run (a cluster's ``cluster.instances``; 1 otherwise)."""
        return int(self.summary.get("instances", 1))

    @property
    def is_pd(self) -> bool:
        """True for a prefill/decode run (``pd.enabled``: summary.json has ``pd`` and
        ``roles``, config.json each role's pools)."""
        return bool(self.summary.get("pd")) and "roles" in self.conf

    def role_pools(self, role: str) -> tuple[int, int]:
        """A PD run's ``role`` ("prefill" or "decode") pools: (device, host) tokens of one
        of its servers."""
        one = self.conf["roles"][role]
        return int(one["device_tokens"]), int(one["host_tokens"])

    @property
    def device_tokens(self) -> int:
        """The device pool (tokens; a PD run's: one prefill server's, where its hits are)."""
        if self.is_pd:
            return self.role_pools("prefill")[0]
        return int(self.conf["device_tokens"])

    @property
    def host_tokens(self) -> int:
        """The host pool (tokens; a PD run's: one prefill server's)."""
        if self.is_pd:
            return self.role_pools("prefill")[1]
        return int(self.conf["host_tokens"])

    @property
    def page_size(self) -> int:
        return int(self.conf["config"]["cache"]["page_size"])

    @property
    def capacity(self) -> tuple[int, int]:
        return (self.device_tokens, self.host_tokens)

    @property
    def storage(self) -> dict[str, Any] | None:
        """The ``storage`` block of summary.json: present only for a run with an L3 tier
        (runs written before the L3 tier never have one)."""
        block = self.summary.get("storage")
        return block if isinstance(block, dict) else None

    @property
    def has_l3(self) -> bool:
        """True for a run with an L3 storage tier (``storage.backend`` not "none")."""
        return self.storage is not None

    def rate(self, key: str) -> float:
        """A hit rate of summary.json (``storage_hit_rate`` is 0 for runs without one)."""
        v = self.summary.get(key)
        return float(v) if v is not None else 0.0

    def table(self, name: str) -> pd.DataFrame:
        """``requests``, ``timeline`` or ``transfers`` as a DataFrame (cached)."""
        import pandas as pd

        if name not in self._tables:
            df = pd.read_parquet(self.path / f"{name}.parquet")
            if name == "requests" and self.is_pd and "ttft_s" not in df:
                # a PD run's rows carry each step's time: the client's TTFT and e2e from them
                done = df["finish_s"] >= 0
                df = df.assign(
                    ttft_s=(df["first_token_s"] - df["arrival_s"]).where(done),
                    e2e_s=(df["finish_s"] - df["arrival_s"]).where(done),
                )
            self._tables[name] = df
        out: pd.DataFrame = self._tables[name]
        return out

    @property
    def warmup_s(self) -> float:
        """The warm-up window's length (``workload.warmup_s``; 0 for a run without one, and
        for runs written before windows existed)."""
        return float(self.summary.get("warmup_s") or 0.0)

    @property
    def warmup_window_s(self) -> tuple[float, float] | None:
        """The warm-up window, (start, end) in simulated seconds: the first arrival and
        ``warmup_end_s`` of summary.json; None without a window."""
        end = self.summary.get("warmup_end_s")
        if not self.warmup_s or end is None:
            return None
        return (float(end) - self.warmup_s, float(end))

    @property
    def warmup_requests(self) -> int:
        """Requests of the warm-up window (they ran but count in no figure); 0 without one."""
        return int(self.summary.get("warmup_requests") or 0)

    def measured(self) -> pd.DataFrame:
        """The requests that count, as in summary.json: all but the warm-up window's (the
        ``warmup`` column of requests.parquet; every request when there is no such column)."""
        req = self.table("requests")
        if "warmup" not in req:
            window = self.warmup_window_s
            if self.is_pd and window is not None:  # PD rows: the window by arrival, as summary
                return req[req["arrival_s"] >= window[1]]
            return req
        return req[~req["warmup"].astype(bool)]

    def finished(self) -> pd.DataFrame:
        """Measured requests (:meth:`measured`) that finished (rejected ones have
        ``finish_s`` -1)."""
        req = self.measured()
        return req[req["finish_s"] >= 0]

    def measured_transfers(self) -> pd.DataFrame:
        """The copies that count, as in summary.json's PCIe bytes: those that started at or
        after the warm-up window's end (every copy without a window)."""
        tr = self.table("transfers")
        window = self.warmup_window_s
        if window is None or not len(tr):
            return tr
        return tr[tr["start_s"] >= window[1]]


@dataclass
class Sweep:
    """A sweep directory: its description, grid file text, and results table."""

    path: Path
    shown: str
    name: str
    description: str
    grid_text: str
    columns: list[str]
    results: pd.DataFrame


@dataclass
class ReportData:
    """Everything a report shows, loaded by :func:`load_runs`."""

    runs: list[Run]
    sweeps: list[Sweep]
    varying: list[str]  # keys whose values differ between runs, in display order
    x: str  # "capacity" or "rate": the x axis of the TTFT figures

    @property
    def x_keys(self) -> tuple[str, ...]:
        return CAPACITY_KEYS if self.x == "capacity" else RATE_KEYS

    def x_value(self, run: Run) -> float:
        """Total KV capacity (device + host tokens), or the rate scale."""
        if self.x == "capacity":
            return float(run.device_tokens + run.host_tokens)
        return float(run.config["workload.rate_scale"])

    def x_title(self, run: Run) -> str:
        if self.x == "capacity":
            return capacity_text(run.capacity)
        return f"rate × {run.config['workload.rate_scale']:g}"

    def series_order(self) -> list[str]:
        return list(dict.fromkeys(r.series for r in self.runs))

    @property
    def any_l3(self) -> bool:
        """True when some run has an L3 storage tier."""
        return any(r.has_l3 for r in self.runs)

    @property
    def any_warmup(self) -> bool:
        """True when some run has a warm-up window (``workload.warmup_s`` > 0)."""
        return any(r.warmup_window_s is not None for r in self.runs)


def _storage_defaults() -> dict[str, Any]:
    """``{"storage.key": default}`` of the ``[storage]`` section (no L3 tier)."""
    from hicache.config import SECTIONS

    cls = SECTIONS.get("storage")
    if cls is None:
        return {}
    return {f"storage.{f.name}": getattr(cls(), f.name) for f in fields(cls)}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StudyError(f"{path}: cannot read: {e}") from None


def _load_run(path: Path, shown: str, sweep: str | None = None) -> Run:
    for name in ("config.json", "summary.json", "requests.parquet"):
        if not (path / name).is_file():
            raise StudyError(f"{shown}: not a complete run directory (no {name})")
    return Run(
        path, shown, _read_json(path / "config.json"), _read_json(path / "summary.json"), sweep
    )


def load_runs(dirs: Sequence[str | Path]) -> ReportData:
    """Runs and sweeps from directories (sorted, duplicates dropped): a directory with
    ``results.parquet`` is a sweep (its ``ok`` jobs become runs, in grid order), one with
    ``summary.json`` a run. Labels, series and the x axis are derived here. Raises
    ``ValueError`` (one line) for a directory that is neither, or a sweep without runs."""
    import pandas as pd

    runs: list[Run] = []
    sweeps: list[Sweep] = []
    seen: set[Path] = set()
    if not dirs:
        raise StudyError("no run or sweep directory given")
    for d in sorted({str(x): Path(x) for x in dirs}.values(), key=str):
        if (d / "results.parquet").is_file():
            meta = _read_json(d / "sweep.json") if (d / "sweep.json").is_file() else {}
            results = pd.read_parquet(d / "results.parquet")
            grid = d / "grid.toml"
            sweep = Sweep(
                d,
                str(d),
                str(meta.get("name") or d.name),
                str(meta.get("description", "")),
                grid.read_text() if grid.is_file() else "",
                list(meta.get("columns", [])),
                results,
            )
            sweeps.append(sweep)
            for _, row in results[results["status"] == "ok"].iterrows():
                p = d / str(row["run_dir"])
                if p.resolve() not in seen:
                    seen.add(p.resolve())
                    runs.append(_load_run(p, str(p), sweep.name))
        elif (d / "summary.json").is_file():
            if d.resolve() not in seen:
                seen.add(d.resolve())
                runs.append(_load_run(d, str(d)))
        elif d.is_dir():
            raise StudyError(
                f"{d}: neither a run directory (summary.json) nor a sweep "
                "directory (results.parquet)"
            )
        else:
            raise StudyError(f"{d}: no such directory")
    if not runs:
        raise StudyError(f"{', '.join(map(str, dirs))}: no finished runs to report")
    return describe_runs(runs, sweeps)


def describe_runs(runs: list[Run], sweeps: Sequence[Sweep] = ()) -> ReportData:
    """Label the runs and choose the grouping: the keys that differ between runs label them
    (sweep axes first); the series leaves out the x-axis keys; the x axis is the KV capacity,
    or the request rate when only the rate varies. Labels are made unique."""
    data = ReportData(runs, list(sweeps), _varying_keys(runs, sweeps), "capacity")
    caps = {r.capacity for r in runs}
    rates = {r.config.get("workload.rate_scale") for r in runs}
    data.x = "rate" if len(caps) == 1 and len(rates) > 1 else "capacity"
    # a pd.* setting the PD runs share labels none of them (the other runs have no PD)
    pd_values = [{json.dumps(r.value(k)) for r in runs if r.is_pd} for k in data.varying]
    keys = [
        k
        for k, vals in zip(data.varying, pd_values, strict=True)
        if not k.startswith(PD_PREFIX) or k == "pd.enabled" or len(vals) > 1
    ]
    series_keys = [k for k in keys if k not in data.x_keys]
    for r in runs:
        r.label = _label(r, keys) or Path(r.shown).name
        r.series = _label(r, series_keys) or "all runs"
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:  # the same config twice (two inputs): tell them apart by directory
        if counts[r.label] > 1:
            r.label = f"{r.label} ({Path(r.shown).name})"
    return data


def config_key_order() -> list[str]:
    from hicache.config import SECTIONS

    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]


def _varying_keys(runs: Sequence[Run], sweeps: Sequence[Sweep]) -> list[str]:
    """Keys with more than one value among the runs: sweep axes first, then config order."""
    keys = ["trace", *config_key_order()]
    for r in runs:
        keys.extend(k for k in sorted(r.config) if k not in keys)
    varying = [k for k in keys if len({json.dumps(r.value(k), sort_keys=True) for r in runs}) > 1]
    first = [c for s in sweeps for c in s.columns if c in varying]
    return list(dict.fromkeys([*first, *varying]))


def _label(run: Run, keys: Iterable[str]) -> str:
    """``"write_back · ratio=4"``: the run's values of ``keys`` (strings bare, numbers named;
    host-only keys dropped for a run without a host tier, which reads "no host tier"; the
    storage backend as "L3 mooncake", nothing for a run without an L3 tier (whose other
    ``storage.*`` keys are dropped too) unless that leaves its label empty: "no L3")."""
    parts = []
    host = bool(run.config.get("cache.enable_host", True))
    backend = run.config.get("storage.backend") or "none"
    for k in keys:
        if k.startswith(PD_PREFIX):
            parts.extend(_pd_label(run, k))
            continue
        if not host and (k in HOST_ONLY_KEYS or k.startswith(STORAGE_ONLY_PREFIX)):
            continue
        if k == "cache.enable_host":
            if not host:
                parts.append("no host tier")
            continue
        if k == "storage.backend":
            if backend != "none":
                parts.append(f"L3 {backend}")
            continue
        if k.startswith(STORAGE_ONLY_PREFIX) and backend == "none":
            continue
        if k == "storage.prefetch_policy":
            parts.append(f"prefetch {run.config.get(k)}")
            continue
        if k == "trace":
            parts.append(Path(str(run.conf.get("trace", ""))).name.split(".")[0] or "trace")
            continue
        v = run.config.get(k)
        if k == "sglang.version":
            parts.append(f"SGLang {v}")
            continue
        if k == "cache.hicache_ratio" and not v:
            parts.append("ratio default")  # 0: not given (SGLang's default, maybe auto-sized)
            continue
        if k == "run.profile":
            parts.append(Path(str(v)).stem if v else "default profile")
        elif isinstance(v, str) and not v:
            continue  # an empty setting ("" = not set) says nothing
        elif isinstance(v, str) and not k.startswith(STORAGE_ONLY_PREFIX):
            parts.append(v)
        elif isinstance(v, str):
            parts.append(f"{_SHORT.get(k, k.partition('.')[2])}={v}")
        else:
            short = _SHORT.get(k, k.partition(".")[2])
            parts.append(f"{short}={v:g}" if isinstance(v, float) else f"{short}={v}")
    if not parts and host and backend == "none" and "storage.backend" in keys:
        parts.append("no L3")  # only the L3 tier tells it from the others
    return " · ".join(parts)


def _pd_label(run: Run, key: str) -> list[str]:
    """The label parts of a ``pd.*`` key: "single server" / "PD 2P+4D" for ``pd.enabled``
    (the instance counts with it), the other keys short and only for a PD run."""
    c = run.config
    if key == "pd.enabled":
        if not run.is_pd:
            return ["single server"]
        return [f"PD {c.get('pd.prefill_instances')}P+{c.get('pd.decode_instances')}D"]
    if not run.is_pd or key in ("pd.prefill_instances", "pd.decode_instances"):
        return []
    v = c.get(key)
    if key == "pd.decode_radix_cache":
        return ["decode radix cache" if v else "no decode radix cache"]
    name = key.partition(".")[2]
    if key.endswith("_set"):
        return [f"{name.removesuffix('_set')}: {v}"] if v else []
    if isinstance(v, str):
        return [f"{name.replace('_', ' ')} {v}"] if v else []
    return [f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}"]
