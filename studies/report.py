"""Reports: one self-contained HTML file (and optionally a PDF) from runs and sweeps.

``build_report(dirs, out)`` reads run directories (``summary.json``, ``config.json``, the
Parquet tables of :mod:`sim.metrics`) and sweep directories (``results.parquet`` + job run
directories, :mod:`studies.sweep`) and writes:

- figures, inline as SVG, each with the numbers it shows beside it and, for tools and tests,
  the exact plotted data as JSON (``<script type="application/json" class="figure-data"
  data-figure="ID">``): hit rate vs capacity (device and host parts stacked), TTFT CDF, TTFT
  p50/p90/p99 vs capacity (or request rate), the TTFT breakdown (queueing / load stall /
  prefill compute / other), HBM and host occupancy over time, PCIe busy fraction and
  throughput per direction over time, and tokens written to vs loaded back from the host;
- a comparison table with the best value of each metric highlighted;
- the configurations: what all runs share, what differs, each run's ``config.json`` and each
  sweep's grid file and failed jobs.

Runs are grouped automatically: the config keys whose values differ between runs label them.
Keys that size the pools (device tokens, host ratio/size) form the capacity axis; the others
(write policy, eviction, ...) form the series ("policy"). When only the request rate varies,
the rate is the x axis instead.

Output is deterministic: inputs are sorted, there are no timestamps, matplotlib's SVG ids use
a fixed salt and its date metadata is left out, so the same inputs give byte-identical files.
Matplotlib is used through the object-oriented API on the Agg canvas only.
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
_SHORT = {
    "gpu.device_tokens": "device",
    "cache.hicache_ratio": "ratio",
    "cache.hicache_size_gb": "host GB",
    "cache.page_size": "page",
    "workload.rate_scale": "rate",
    "workload.max_requests": "requests",
}
#: Runs drawn in the per-run time-series figures (more would be unreadable).
MAX_TIMELINE_RUNS = 6
#: Panels of the TTFT CDF figure (one per capacity or rate).
MAX_CDF_PANELS = 6
CDF_POINTS = 200
TIME_POINTS = 200  # occupancy bins
PCIE_BINS = 120
_SALT = "hicache-sim-report"
_RC: Any = {  # Any: matplotlib types rc keys as literals
    "svg.fonttype": "none",  # text stays text: small files, selectable and searchable
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "legend.fontsize": 8,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "pdf.fonttype": 42,
}
_D2H_COLOR, _H2D_COLOR = "#d95f02", "#1b9e77"
_PART_COLORS = {
    "queueing": "#9e9e9e",
    "load stall": "#e31a1c",
    "prefill compute": "#1f78b4",
    "other": "#cab2d6",
}


# --- inputs ----------------------------------------------------------------------------------


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
        """The resolved config, flat: ``{"section.key": value}``."""
        return {f"{s}.{k}": v for s, body in self.conf["config"].items() for k, v in body.items()}

    def value(self, key: str) -> Any:
        """A config value, or the trace (its checksum when known) for ``"trace"``."""
        if key == "trace":
            return self.conf.get("trace_sha256") or self.conf.get("trace")
        return self.config.get(key)

    @property
    def device_tokens(self) -> int:
        return int(self.conf["device_tokens"])

    @property
    def host_tokens(self) -> int:
        return int(self.conf["host_tokens"])

    @property
    def page_size(self) -> int:
        return int(self.conf["config"]["cache"]["page_size"])

    @property
    def capacity(self) -> tuple[int, int]:
        return (self.device_tokens, self.host_tokens)

    def table(self, name: str) -> pd.DataFrame:
        """``requests``, ``timeline`` or ``transfers`` as a DataFrame (cached)."""
        import pandas as pd

        if name not in self._tables:
            self._tables[name] = pd.read_parquet(self.path / f"{name}.parquet")
        df: pd.DataFrame = self._tables[name]
        return df

    def finished(self) -> pd.DataFrame:
        """Requests that finished (rejected ones have ``finish_s`` -1)."""
        req = self.table("requests")
        return req[req["finish_s"] >= 0]


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
            return _capacity_text(run.capacity)
        return f"rate × {run.config['workload.rate_scale']:g}"

    def series_order(self) -> list[str]:
        return list(dict.fromkeys(r.series for r in self.runs))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from None


def _load_run(path: Path, shown: str, sweep: str | None = None) -> Run:
    for name in ("config.json", "summary.json", "requests.parquet"):
        if not (path / name).is_file():
            raise ValueError(f"{shown}: not a complete run directory (no {name})")
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
        raise ValueError("no run or sweep directory given")
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
            raise ValueError(
                f"{d}: neither a run directory (summary.json) nor a sweep "
                "directory (results.parquet)"
            )
        else:
            raise ValueError(f"{d}: no such directory")
    if not runs:
        raise ValueError(f"{', '.join(map(str, dirs))}: no finished runs to report")
    return describe_runs(runs, sweeps)


def describe_runs(runs: list[Run], sweeps: Sequence[Sweep] = ()) -> ReportData:
    """Label the runs and choose the grouping: the keys that differ between runs label them
    (sweep axes first); the series leaves out the x-axis keys; the x axis is the KV capacity,
    or the request rate when only the rate varies. Labels are made unique."""
    data = ReportData(runs, list(sweeps), _varying_keys(runs, sweeps), "capacity")
    caps = {r.capacity for r in runs}
    rates = {r.config.get("workload.rate_scale") for r in runs}
    data.x = "rate" if len(caps) == 1 and len(rates) > 1 else "capacity"
    series_keys = [k for k in data.varying if k not in data.x_keys]
    for r in runs:
        r.label = _label(r, data.varying) or Path(r.shown).name
        r.series = _label(r, series_keys) or "all runs"
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r in runs:  # the same config twice (two inputs): tell them apart by directory
        if counts[r.label] > 1:
            r.label = f"{r.label} ({Path(r.shown).name})"
    return data


def _config_key_order() -> list[str]:
    from hicache.config import SECTIONS

    return [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)]


def _varying_keys(runs: Sequence[Run], sweeps: Sequence[Sweep]) -> list[str]:
    """Keys with more than one value among the runs: sweep axes first, then config order."""
    keys = ["trace", *_config_key_order()]
    for r in runs:
        keys.extend(k for k in sorted(r.config) if k not in keys)
    varying = [k for k in keys if len({json.dumps(r.value(k), sort_keys=True) for r in runs}) > 1]
    first = [c for s in sweeps for c in s.columns if c in varying]
    return list(dict.fromkeys([*first, *varying]))


def _label(run: Run, keys: Iterable[str]) -> str:
    """``"write_back · ratio=4"``: the run's values of ``keys`` (strings bare, numbers named;
    host-only keys dropped for a run without a host tier, which reads "no host tier")."""
    parts = []
    host = bool(run.config.get("cache.enable_host", True))
    for k in keys:
        if not host and k in HOST_ONLY_KEYS:
            continue
        if k == "cache.enable_host":
            if not host:
                parts.append("no host tier")
            continue
        if k == "trace":
            parts.append(Path(str(run.conf.get("trace", ""))).name.split(".")[0] or "trace")
            continue
        v = run.config.get(k)
        if k == "run.profile":
            parts.append(Path(str(v)).stem if v else "default profile")
        elif isinstance(v, str):
            parts.append(v)
        else:
            short = _SHORT.get(k, k.partition(".")[2])
            parts.append(f"{short}={v:g}" if isinstance(v, float) else f"{short}={v}")
    return " · ".join(parts)


# --- formatting ------------------------------------------------------------------------------


def _tokens(n: float) -> str:
    """16384 -> '16.4K', 2_000_000 -> '2M' (for ticks and titles)."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"


def _capacity_text(cap: tuple[int, int]) -> str:
    device, host = cap
    return f"{_tokens(device)} HBM + {_tokens(host)} host" if host else f"{_tokens(device)} HBM"


def _round(x: float, digits: int = 6) -> float | None:
    """``digits`` significant digits (compact JSON); None for NaN/inf (valid JSON)."""
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _pct(x: Any) -> str:
    return "–" if _missing(x) else f"{100 * float(x):.2f} %"


def _ms(x: Any) -> str:
    return "–" if _missing(x) else f"{1e3 * float(x):,.1f}"


def _num(x: Any, digits: int = 2) -> str:
    return "–" if _missing(x) else f"{float(x):,.{digits}f}"


def _int(x: Any) -> str:
    return "–" if _missing(x) else f"{int(x):,}"


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


# --- figures ---------------------------------------------------------------------------------


@dataclass
class ReportFigure:
    """One figure: the matplotlib Figure, the data it plots (JSON-ready), and the numbers shown
    beside it. Displays itself in Jupyter (``_repr_svg_``)."""

    id: str
    title: str
    caption: str = field(repr=False)
    figure: Figure = field(repr=False)
    data: dict[str, Any] = field(repr=False)
    numbers: pd.DataFrame = field(repr=False)

    def to_svg(self) -> str:
        """The figure as an ``<svg>`` element (no XML prolog), deterministic."""
        import matplotlib

        buf = io.StringIO()
        with matplotlib.rc_context({**_RC, "svg.hashsalt": f"{_SALT}-{self.id}"}):
            self.figure.savefig(buf, format="svg", metadata={"Date": None})
        text = buf.getvalue()
        return text[text.index("<svg") :]

    def _repr_svg_(self) -> str:
        return self.to_svg()


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _colors(data: ReportData) -> dict[str, Any]:
    from matplotlib import colormaps

    order = data.series_order()
    cmap = colormaps["tab10" if len(order) <= 10 else "tab20"]
    return {s: cmap(i % cmap.N) for i, s in enumerate(order)}


def _series_legend(fig: Figure, data: ReportData, extra: Sequence[Any] = ()) -> None:
    from matplotlib.patches import Patch

    colors = _colors(data)
    handles = [Patch(color=colors[s], label=s) for s in data.series_order()]
    fig.legend(handles=[*handles, *extra], loc="outside right upper", title="series")


def _token_axis(ax: Axes, axis: str = "x") -> None:
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _pos: _tokens(v))
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_formatter(fmt)


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows, columns=list(columns))


def fig_hitrate(data: ReportData) -> ReportFigure:
    """Hit rate vs KV capacity: one bar per run, grouped by capacity, coloured by series;
    the device (HBM) part solid, the host (DRAM) part hatched on top."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import PercentFormatter

    groups = sorted({r.capacity for r in data.runs}, key=lambda c: (c[0] + c[1], c[0]))
    rows: list[dict[str, Any]] = []
    for cap in groups:
        for run in data.runs:
            if run.capacity == cap:
                s = run.summary
                rows.append(
                    {
                        "run": run.label,
                        "dir": run.shown,
                        "series": run.series,
                        "device_tokens": cap[0],
                        "host_tokens": cap[1],
                        "device_hit_rate": s["device_hit_rate"],
                        "host_hit_rate": s["host_hit_rate"],
                        "hit_rate": s["hit_rate"],
                    }
                )
    colors = _colors(data)
    per_group = max(
        sum(1 for r in rows if (r["device_tokens"], r["host_tokens"]) == g) for g in groups
    )
    fig = _figure(max(7.0, min(14.0, 2.0 + 0.35 * len(rows))), 4.6)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / per_group
    for gi, cap in enumerate(groups):
        members = [r for r in rows if (r["device_tokens"], r["host_tokens"]) == cap]
        for j, r in enumerate(members):
            x = gi + (j - (len(members) - 1) / 2) * width
            c = colors[r["series"]]
            ax.bar(x, r["device_hit_rate"], width * 0.9, color=c, edgecolor=c)
            ax.bar(
                x,
                r["host_hit_rate"],
                width * 0.9,
                bottom=r["device_hit_rate"],
                color=c,
                alpha=0.45,
                hatch="//",
                edgecolor=c,
            )
    ax.set_xticks(range(len(groups)), [_capacity_text(g).replace(" + ", "\n+ ") for g in groups])
    ax.set_xlabel("KV capacity: device (HBM) + host (DRAM) pool [tokens]")
    ax.set_ylabel("prompt tokens served from cache [%]")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    top = max((r["hit_rate"] for r in rows), default=1.0)
    ax.set_ylim(0, min(1.0, top * 1.15 + 0.02))
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Hit rate vs capacity")
    parts = [
        Patch(facecolor="#777777", label="device (HBM) hits"),
        Patch(facecolor="#bbbbbb", hatch="//", edgecolor="#777777", label="host (DRAM) hits"),
    ]
    _series_legend(fig, data, parts)
    numbers = _frame(
        [
            {
                "run": r["run"],
                "capacity": _capacity_text((r["device_tokens"], r["host_tokens"])),
                "device": _pct(r["device_hit_rate"]),
                "host": _pct(r["host_hit_rate"]),
                "total": _pct(r["hit_rate"]),
            }
            for r in rows
        ],
        ["run", "capacity", "device", "host", "total"],
    )
    return ReportFigure(
        "fig-hitrate",
        "Hit rate vs capacity",
        "Share of prompt tokens served from the cache instead of recomputed, per run: the "
        "device (HBM) part solid, the host (DRAM) part hatched on top. Bars are grouped by the "
        "KV capacity of the run (device pool + host pool, in tokens).",
        fig,
        {"rows": rows},
        numbers,
    )


def _quantile_grid() -> list[float]:
    return [k / CDF_POINTS for k in range(1, CDF_POINTS + 1)]


def _ttft_quantiles(run: Run) -> list[float]:
    """TTFT at probabilities k/CDF_POINTS (k = 1..CDF_POINTS) over finished requests,
    nearest rank (numpy ``inverted_cdf``): every point is a measured TTFT."""
    import numpy as np

    ttft = run.finished()["ttft_s"].dropna().to_numpy(dtype=float)
    if not len(ttft):
        return []
    q = np.quantile(ttft, _quantile_grid(), method="inverted_cdf")
    return [_round(float(v)) or 0.0 for v in q]


def _pick(values: Sequence[Any], n: int) -> list[Any]:
    """At most ``n`` of ``values``, evenly spread, first and last kept."""
    if len(values) <= n:
        return list(values)
    idx = sorted({round(i * (len(values) - 1) / (n - 1)) for i in range(n)})
    return [values[i] for i in idx]


def fig_ttft_cdf(data: ReportData) -> ReportFigure:
    """TTFT CDF per series, one panel per capacity (or request rate)."""
    panels_all = sorted({data.x_value(r) for r in data.runs})
    panels = _pick(panels_all, MAX_CDF_PANELS)
    colors = _colors(data)
    lines: list[dict[str, Any]] = []
    for xv in panels:
        for r in data.runs:
            if data.x_value(r) == xv:
                lines.append(
                    {
                        "run": r.label,
                        "dir": r.shown,
                        "series": r.series,
                        "panel": data.x_title(r),
                        "ttft_s": _ttft_quantiles(r),
                    }
                )
    probs = _quantile_grid()
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = _figure(4.0 * ncols + 2.2, 3.2 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    every = [v for ln in lines for v in ln["ttft_s"]]
    log = bool(every) and min(every) > 0 and max(every) / min(every) > 20
    titles = list(dict.fromkeys(ln["panel"] for ln in lines))
    for i, title in enumerate(titles):
        ax = axes[i // ncols][i % ncols]
        for ln in lines:
            if ln["panel"] == title and ln["ttft_s"]:
                ax.plot(
                    ln["ttft_s"], probs, drawstyle="steps-post", color=colors[ln["series"]], lw=1.4
                )
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if log:
            ax.set_xscale("log")
        if i // ncols == nrows - 1 or i + ncols >= len(titles):
            ax.set_xlabel("TTFT [s]")
        if i % ncols == 0:
            ax.set_ylabel("requests with TTFT ≤ x [fraction]")
    for j in range(len(titles), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    _series_legend(fig, data)
    fig.suptitle("TTFT distribution (CDF)")
    what = "capacities" if data.x == "capacity" else "rates"
    shown = (
        ""
        if len(panels) == len(panels_all)
        else f" {len(panels)} of the {len(panels_all)} {what} are shown (evenly spread)."
    )
    numbers = _frame(
        [
            {
                "run": r.label,
                "p50 [ms]": _ms(r.summary["ttft_p50_s"]),
                "p90 [ms]": _ms(r.summary["ttft_p90_s"]),
                "p99 [ms]": _ms(r.summary["ttft_p99_s"]),
                "mean [ms]": _ms(r.summary["ttft_mean_s"]),
            }
            for r in data.runs
        ],
        ["run", "p50 [ms]", "p90 [ms]", "p99 [ms]", "mean [ms]"],
    )
    return ReportFigure(
        "fig-ttft-cdf",
        "TTFT distribution",
        "Fraction of finished requests whose time to first token is at most x, one line per "
        f"series, one panel per {'KV capacity' if data.x == 'capacity' else 'request rate'}."
        + shown,
        fig,
        {"probabilities": probs, "lines": lines},
        numbers,
    )


def fig_ttft_percentiles(data: ReportData) -> ReportFigure:
    """TTFT p50 / p90 / p99 vs capacity (or request rate), one line per series."""
    from matplotlib.ticker import NullFormatter

    colors = _colors(data)
    rows: list[dict[str, Any]] = [
        {
            "run": r.label,
            "dir": r.shown,
            "series": r.series,
            "x": data.x_value(r),
            "ttft_p50_s": r.summary["ttft_p50_s"],
            "ttft_p90_s": r.summary["ttft_p90_s"],
            "ttft_p99_s": r.summary["ttft_p99_s"],
        }
        for r in data.runs
    ]
    rows.sort(key=lambda r: (data.series_order().index(r["series"]), r["x"]))
    fig = _figure(13.0, 3.9)
    axes = fig.subplots(1, 3)
    xs = [r["x"] for r in rows]
    log = min(xs) > 0 and max(xs) / min(xs) >= 4
    for ax, p in zip(axes, (50, 90, 99), strict=True):
        for s in data.series_order():
            pts = [r for r in rows if r["series"] == s]
            ax.plot(
                [r["x"] for r in pts],
                [r[f"ttft_p{p}_s"] for r in pts],
                marker="o",
                color=colors[s],
                lw=1.4,
                ms=4,
            )
        ax.set_title(f"TTFT p{p}")
        ax.set_ylabel("TTFT [s]")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        if log:
            ax.set_xscale("log")
        # ticks at the measured x values: log-scale minor labels would be unreadable
        ticks = _pick(sorted(set(xs)), 8)
        if data.x == "capacity":
            ax.set_xticks(ticks, [_tokens(t) for t in ticks])
            ax.set_xlabel("KV capacity, device + host [tokens]")
        else:
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.set_xlabel("request rate [× the trace's rate]")
        ax.xaxis.set_minor_formatter(NullFormatter())
    _series_legend(fig, data)
    numbers = _frame(
        [
            {
                "run": r["run"],
                "x": _tokens(r["x"]) if data.x == "capacity" else f"{r['x']:g}",
                "p50 [ms]": _ms(r["ttft_p50_s"]),
                "p90 [ms]": _ms(r["ttft_p90_s"]),
                "p99 [ms]": _ms(r["ttft_p99_s"]),
            }
            for r in rows
        ],
        ["run", "x", "p50 [ms]", "p90 [ms]", "p99 [ms]"],
    ).rename(columns={"x": "capacity [tokens]" if data.x == "capacity" else "rate ×"})
    what = "KV capacity (device + host pool, tokens)" if data.x == "capacity" else "request rate"
    return ReportFigure(
        "fig-ttft-percentiles",
        f"TTFT percentiles vs {'capacity' if data.x == 'capacity' else 'request rate'}",
        f"Median, 90th and 99th percentile time to first token against the {what}, one line "
        "per series (percentiles interpolated between requests, as in summary.json).",
        fig,
        {"x": data.x, "rows": rows},
        numbers,
    )


BREAKDOWN_PARTS = ("queueing", "load stall", "prefill compute", "other")


def ttft_breakdown(run: Run) -> dict[str, float]:
    """Mean seconds per finished request: queueing (arrival to admission), load stall
    (waiting for host->device loads), prefill compute, and other (the rest of the TTFT:
    waiting between prefill chunks and for batch slots); plus the mean TTFT."""
    req = run.finished()
    if not len(req):
        return {p: math.nan for p in (*BREAKDOWN_PARTS, "ttft")}
    q, stall, pre, ttft = (
        float(req[c].mean()) for c in ("queue_s", "load_stall_s", "prefill_s", "ttft_s")
    )
    return {
        "queueing": q,
        "load stall": stall,
        "prefill compute": pre,
        "other": max(0.0, ttft - q - stall - pre),
        "ttft": ttft,
    }


def fig_ttft_breakdown(data: ReportData) -> ReportFigure:
    """Mean TTFT split into its parts, one horizontal stacked bar per run."""
    rows: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **{k: _round(v) for k, v in ttft_breakdown(r).items()}}
        for r in data.runs
    ]
    fig = _figure(11.0, 1.3 + 0.3 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    left = [0.0] * len(rows)
    ys = list(range(len(rows)))
    for part in BREAKDOWN_PARTS:
        vals = [1e3 * (r[part] or 0.0) for r in rows]
        ax.barh(ys, vals, 0.7, left=left, color=_PART_COLORS[part], label=part)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(ys, [r["run"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per request [ms]")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Where TTFT goes")
    fig.legend(loc="outside right upper")
    numbers = _frame(
        [
            {
                "run": r["run"],
                **{f"{p} [ms]": _ms(r[p]) for p in BREAKDOWN_PARTS},
                "TTFT [ms]": _ms(r["ttft"]),
            }
            for r in rows
        ],
        ["run", *(f"{p} [ms]" for p in BREAKDOWN_PARTS), "TTFT [ms]"],
    )
    return ReportFigure(
        "fig-ttft-breakdown",
        "TTFT breakdown",
        "Mean time to first token per request, split into queueing (arrival to admission), "
        "load stall (waiting for host-to-device loads), prefill compute, and other (waits "
        "between prefill chunks and for batch slots).",
        fig,
        {"parts": list(BREAKDOWN_PARTS), "rows": rows},
        numbers,
    )


def timeline_runs(data: ReportData) -> list[Run]:
    """The runs drawn over time: all if few; else one per series (at that series' median
    capacity or rate), at most MAX_TIMELINE_RUNS."""
    if len(data.runs) <= MAX_TIMELINE_RUNS:
        return list(data.runs)
    picked = []
    for s in data.series_order()[:MAX_TIMELINE_RUNS]:
        members = sorted((r for r in data.runs if r.series == s), key=data.x_value)
        picked.append(members[(len(members) - 1) // 2])
    return picked


def _edges(run: Run, bins: int) -> Any:
    """``bins + 1`` equal bin edges over the simulated time (one empty bin if it is 0)."""
    import numpy as np

    end = float(run.summary["sim_duration_s"])
    return np.linspace(0.0, end, bins + 1) if end > 0 else np.zeros(2)


def occupancy(run: Run, bins: int = TIME_POINTS) -> dict[str, list[float | None]]:
    """Pool occupancy, time-averaged over ``bins`` equal bins of the simulated time (bin
    start ``t_s``, width ``width_s``). The timeline is a step function: each sample holds
    until the next (the last one to the end), nothing is used before the first. HBM parts are
    fractions of the device pool, host use a fraction of the host pool ([] without one).
    Averages, not point samples: a fast-changing pool does not alias into spikes."""
    import numpy as np

    tl = run.table("timeline")
    edges = _edges(run, bins)
    width = np.diff(edges)
    t = tl["t_s"].to_numpy(dtype=float)
    # integral of the step function from 0 to each edge: the whole segments before the edge
    # (cumulative) plus the part of the segment the edge falls in
    idx = np.searchsorted(t, edges, side="right") - 1
    dt = np.diff(t, append=t[-1] if len(t) else 0.0)

    def mean_per_bin(col: str) -> Any:
        v = tl[col].to_numpy(dtype=float)
        before = np.concatenate(([0.0], np.cumsum(v * dt)))
        k = np.maximum(idx, 0)
        area = np.where(idx >= 0, before[k] + v[k] * (edges - t[k]) if len(t) else 0.0, 0.0)
        return np.diff(area) / np.where(width > 0, width, 1.0)

    dev = float(run.device_tokens)
    host = float(run.host_tokens)
    out: dict[str, list[float | None]] = {
        "t_s": [_round(float(x)) for x in edges[:-1]],
        "width_s": [_round(float(w)) for w in width],
    }
    for key, col in (
        ("requests", "device_request_tokens"),
        ("locked", "device_protected_tokens"),
        ("evictable", "device_evictable_tokens"),
    ):
        out[key] = [_round(float(v) / dev) for v in mean_per_bin(col)]
    out["host"] = (
        [_round(float(v) / host) for v in mean_per_bin("host_used_tokens")] if host else []
    )
    return out


def _steps(s: Mapping[str, Any], key: str) -> tuple[list[float], list[float]]:
    """Bin starts + the final edge, and per-bin values + the last repeated: a "post" step
    line that covers the last bin too."""
    xs = [*s["t_s"], s["t_s"][-1] + s["width_s"][-1]]
    ys = [v or 0.0 for v in s[key]]
    return xs, [*ys, ys[-1]] if ys else ys


def fig_occupancy(data: ReportData) -> ReportFigure:
    """HBM (stacked: running requests, locked, evictable cache) and host pool use over time."""
    from matplotlib.ticker import PercentFormatter

    picked = timeline_runs(data)
    series: list[dict[str, Any]] = [
        {"run": r.label, "dir": r.shown, **occupancy(r)} for r in picked
    ]
    fig = _figure(12.0, 0.7 + 2.0 * len(picked))
    axes = fig.subplots(len(picked), 2, squeeze=False, sharex="row")
    for i, (r, s) in enumerate(zip(picked, series, strict=True)):
        left, right = axes[i]
        xs = _steps(s, "requests")[0]
        ys = [_steps(s, k)[1] for k in ("requests", "locked", "evictable")]
        left.stackplot(
            xs,
            ys,
            labels=("running requests", "locked (in use, in flight)", "cached, evictable"),
            colors=("#1f78b4", "#fdbf6f", "#b2df8a"),
            step="post",
        )
        left.set_title(f"{r.label}: HBM KV pool ({_tokens(r.device_tokens)} tokens)", fontsize=9)
        left.set_ylabel("% of pool")
        if s["host"]:
            right.step(*_steps(s, "host"), where="post", color="#6a3d9a")
            right.set_title(f"host KV pool ({_tokens(r.host_tokens)} tokens)", fontsize=9)
        else:
            right.text(
                0.5, 0.5, "no host tier", ha="center", va="center", transform=right.transAxes
            )
        for ax in (left, right):
            ax.set_ylim(0, 1.02)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.grid(True, alpha=0.3)
        if i == len(picked) - 1:
            left.set_xlabel("simulated time [s]")
            right.set_xlabel("simulated time [s]")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    numbers = _frame(
        [
            {
                "run": s["run"],
                "HBM used, mean": _pct(_mean_used(s)),
                "HBM used, peak": _pct(_peak_used(s)),
                "host used, peak": _pct(max((v or 0.0 for v in s["host"]), default=math.nan)),
            }
            for s in series
        ],
        ["run", "HBM used, mean", "HBM used, peak", "host used, peak"],
    )
    return ReportFigure(
        "fig-occupancy",
        "HBM and host occupancy over time",
        "Left: the device (HBM) KV pool, stacked: tokens of running requests, locked cache "
        "(in use by a request or a copy in flight), and evictable cached tokens; the rest is "
        "free. Right: the host (DRAM) pool in use." + _picked_note(data, picked),
        fig,
        {"runs": series},
        numbers,
    )


def _used(s: Mapping[str, Any]) -> list[float]:
    return [
        sum(s[k][i] or 0.0 for k in ("requests", "locked", "evictable"))
        for i in range(len(s["t_s"]))
    ]


def _mean_used(s: Mapping[str, Any]) -> float:
    u = _used(s)
    return sum(u) / len(u) if u else math.nan


def _peak_used(s: Mapping[str, Any]) -> float:
    return max(_used(s), default=math.nan)


def _picked_note(data: ReportData, picked: Sequence[Run]) -> str:
    if len(picked) == len(data.runs):
        return ""
    return (
        f" {len(picked)} of {len(data.runs)} runs are shown: one per series, at its "
        f"median {'capacity' if data.x == 'capacity' else 'rate'}."
    )


def pcie(run: Run, bins: int = PCIE_BINS) -> dict[str, list[float | None]]:
    """Per direction, over ``bins`` equal time bins of the simulated time: the busy fraction
    (time a copy was in service / bin width) and throughput (GB/s, 1 GB = 1e9 B; a copy's
    bytes spread evenly over its service time, all at once if it took no time)."""
    import numpy as np

    tr = run.table("transfers")
    edges = _edges(run, bins)
    width = np.diff(edges)
    out: dict[str, list[float | None]] = {
        "t_s": [_round(float(t)) for t in edges[:-1]],
        "width_s": [_round(float(w)) for w in width],
    }
    for d in ("d2h", "h2d"):
        sel = tr[tr["direction"] == d]
        start = sel["start_s"].to_numpy(dtype=float)
        dur = sel["end_s"].to_numpy(dtype=float) - start
        nbytes = sel["bytes"].to_numpy(dtype=float)
        busy = np.zeros(len(edges))
        moved = np.zeros(len(edges))
        for lo in range(0, len(start), 4096):  # bounded memory: edges x 4096 at a time
            s, du, b = start[lo : lo + 4096], dur[lo : lo + 4096], nbytes[lo : lo + 4096]
            elapsed = np.clip(edges[:, None] - s[None, :], 0.0, du[None, :])
            busy += elapsed.sum(axis=1)
            frac = np.where(
                du[None, :] > 0,
                elapsed / np.where(du > 0, du, 1.0)[None, :],
                (edges[:, None] >= s[None, :]).astype(float),
            )
            moved += (frac * b[None, :]).sum(axis=1)
        safe = np.where(width > 0, width, 1.0)
        out[f"{d}_busy"] = [_round(float(v)) for v in np.diff(busy) / safe]
        out[f"{d}_gb_s"] = [_round(float(v)) for v in np.diff(moved) / safe / 1e9]
    return out


def fig_pcie(data: ReportData) -> ReportFigure:
    """PCIe busy fraction and throughput per direction over time."""
    from matplotlib.ticker import PercentFormatter

    picked = timeline_runs(data)
    series: list[dict[str, Any]] = [{"run": r.label, "dir": r.shown, **pcie(r)} for r in picked]
    fig = _figure(12.0, 0.7 + 2.0 * len(picked))
    axes = fig.subplots(len(picked), 2, squeeze=False, sharex="row")
    names = {"d2h": "device → host (writes)", "h2d": "host → device (loads)"}
    colors = {"d2h": _D2H_COLOR, "h2d": _H2D_COLOR}
    for i, (r, s) in enumerate(zip(picked, series, strict=True)):
        busy_ax, rate_ax = axes[i]
        for d in ("d2h", "h2d"):
            busy_ax.step(
                *_steps(s, f"{d}_busy"), where="post", color=colors[d], label=names[d], lw=1.1
            )
            rate_ax.step(*_steps(s, f"{d}_gb_s"), where="post", color=colors[d], lw=1.1)
        if not r.host_tokens:
            for ax in (busy_ax, rate_ax):
                ax.text(0.5, 0.5, "no host tier", ha="center", va="center", transform=ax.transAxes)
        busy_ax.set_title(f"{r.label}: link busy", fontsize=9)
        busy_ax.set_ylabel("busy [% of time]")
        # a link is rarely saturated: scale to the peak (at least 5 %) so bursts stay visible
        peak = max((v or 0.0 for d in ("d2h", "h2d") for v in s[f"{d}_busy"]), default=0.0)
        busy_ax.set_ylim(0, min(1.02, max(0.05, peak * 1.15)))
        busy_ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        rate_ax.set_title("throughput", fontsize=9)
        rate_ax.set_ylabel("[GB/s]")
        rate_ax.set_ylim(bottom=0)
        for ax in (busy_ax, rate_ax):
            ax.grid(True, alpha=0.3)
        if i == len(picked) - 1:
            busy_ax.set_xlabel("simulated time [s]")
            rate_ax.set_xlabel("simulated time [s]")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    rows = []
    for r in picked:
        tr = r.table("transfers")
        end = float(r.summary["sim_duration_s"])
        row: dict[str, Any] = {"run": r.label}
        for d in ("d2h", "h2d"):
            sel = tr[tr["direction"] == d]
            busy = float((sel["end_s"] - sel["start_s"]).sum())
            row[f"{d} busy"] = _pct(busy / end if end > 0 else math.nan)
            row[f"{d} GB"] = _num(float(sel["bytes"].sum()) / 1e9)
        rows.append(row)
    numbers = _frame(rows, ["run", "d2h busy", "d2h GB", "h2d busy", "h2d GB"])
    return ReportFigure(
        "fig-pcie",
        "PCIe traffic over time",
        f"Per direction of the host link, in {PCIE_BINS} equal time bins: the fraction of time "
        "a copy was in service, and the throughput (a copy's bytes spread over its service "
        "time). Device → host are write-through/back copies, host → device are load-backs."
        + _picked_note(data, picked),
        fig,
        {"bins": PCIE_BINS, "runs": series},
        numbers,
    )


def write_traffic(run: Run) -> dict[str, Any]:
    """Tokens copied to the host (D2H pages x page size), loaded back (H2D), the write
    amplification (written / loaded; None when nothing was loaded) and the excess writes
    (written - loaded: a lower bound on copies that were never read back)."""
    tr = run.table("transfers")
    written = int(tr.loc[tr["direction"] == "d2h", "pages"].sum()) * run.page_size
    loaded = int(tr.loc[tr["direction"] == "h2d", "pages"].sum()) * run.page_size
    return {
        "tokens_written": written,
        "tokens_loaded": loaded,
        "write_amplification": written / loaded if loaded else None,
        "excess_writes": max(0, written - loaded),
    }


def fig_writes(data: ReportData) -> ReportFigure:
    """Tokens written to the host vs loaded back, per run."""
    rows = [
        {"run": r.label, "dir": r.shown, "host": r.host_tokens > 0, **write_traffic(r)}
        for r in data.runs
    ]
    fig = _figure(11.0, 1.3 + 0.36 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(rows)))
    ax.barh(
        [y - 0.19 for y in ys],
        [r["tokens_written"] for r in rows],
        0.38,
        color=_D2H_COLOR,
        label="written to host (D2H)",
    )
    ax.barh(
        [y + 0.19 for y in ys],
        [r["tokens_loaded"] for r in rows],
        0.38,
        color=_H2D_COLOR,
        label="loaded back (H2D)",
    )
    for y, r in zip(ys, rows, strict=True):
        amp = r["write_amplification"]
        note = (
            "no host tier"
            if not r["host"]
            else f"× {amp:.2f}"
            if amp is not None
            else "nothing loaded back"
        )
        ax.annotate(
            note,
            (max(r["tokens_written"], r["tokens_loaded"]), y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(ys, [r["run"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    _token_axis(ax)
    ax.set_xlabel("tokens copied [tokens]")
    ax.margins(x=0.12)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("Write amplification: tokens written to the host vs loaded back")
    fig.legend(loc="outside right upper")
    numbers = _frame(
        [
            {
                "run": r["run"],
                "written": _int(r["tokens_written"]),
                "loaded": _int(r["tokens_loaded"]),
                "written / loaded": _num(r["write_amplification"]),
                "excess writes": _int(r["excess_writes"]),
            }
            for r in rows
        ],
        ["run", "written", "loaded", "written / loaded", "excess writes"],
    )
    return ReportFigure(
        "fig-writes",
        "Tokens written vs loaded back",
        "Tokens copied from HBM to the host pool and from the host back to HBM. The number "
        "beside the bars is the write amplification, tokens written per token loaded back; "
        "excess writes (written − loaded) bound from below the copies never read back.",
        fig,
        {"rows": rows},
        numbers,
    )


#: The figures of a report, in order.
FIGURES: tuple[Callable[[ReportData], ReportFigure], ...] = (
    fig_hitrate,
    fig_ttft_cdf,
    fig_ttft_percentiles,
    fig_ttft_breakdown,
    fig_occupancy,
    fig_pcie,
    fig_writes,
)


def report_figures(data: ReportData) -> list[ReportFigure]:
    """Every figure of the report for ``data`` (see :data:`FIGURES`)."""
    import matplotlib

    with matplotlib.rc_context(_RC):
        return [make(data) for make in FIGURES]


# --- tables ----------------------------------------------------------------------------------

#: Comparison columns: (title, summary/derived key, formatter, best is "max" | "min" | None).
COMPARISON: tuple[tuple[str, str, Callable[[Any], str], str | None], ...] = (
    ("HBM pool [tokens]", "device_tokens", _int, None),
    ("host pool [tokens]", "host_tokens", _int, None),
    ("hit rate", "hit_rate", _pct, "max"),
    ("device hits", "device_hit_rate", _pct, "max"),
    ("host hits", "host_hit_rate", _pct, "max"),
    ("TTFT mean [ms]", "ttft_mean_s", _ms, "min"),
    ("TTFT p50 [ms]", "ttft_p50_s", _ms, "min"),
    ("TTFT p90 [ms]", "ttft_p90_s", _ms, "min"),
    ("TTFT p99 [ms]", "ttft_p99_s", _ms, "min"),
    ("TPOT mean [ms]", "tpot_mean_s", _ms, "min"),
    ("E2E mean [s]", "e2e_mean_s", _num, "min"),
    ("queueing mean [ms]", "queue_mean_s", _ms, "min"),
    ("output [tok/s]", "throughput_output_tok_s", lambda x: _num(x, 0), "max"),
    ("D2H [GB]", "gb_d2h", _num, None),
    ("H2D [GB]", "gb_h2d", _num, None),
    ("written / loaded", "write_amplification", _num, "min"),
    ("retractions", "retractions", _int, "min"),
    ("rejected", "rejected_requests", _int, "min"),
)


def comparison_table(data: ReportData) -> pd.DataFrame:
    """One row per run (index: its label), the raw numbers of :data:`COMPARISON`."""
    import pandas as pd

    rows = []
    for r in data.runs:
        s = r.summary
        row: dict[str, Any] = {"device_tokens": r.device_tokens, "host_tokens": r.host_tokens}
        row.update({k: s.get(k) for _, k, _, _ in COMPARISON if k in s})
        row["gb_d2h"] = s["bytes_d2h"] / 1e9
        row["gb_h2d"] = s["bytes_h2d"] / 1e9
        row["write_amplification"] = write_traffic(r)["write_amplification"]
        rows.append(row)
    return pd.DataFrame(
        rows, index=[r.label for r in data.runs], columns=[k for _, k, _, _ in COMPARISON]
    )


def best_cells(table: pd.DataFrame) -> dict[str, set[str]]:
    """For each metric with a direction, the run labels holding its best value (ties all
    count); nothing when there is only one run."""
    out: dict[str, set[str]] = {}
    if len(table) < 2:
        return out
    for _, key, _, how in COMPARISON:
        if how is None:
            continue
        col = table[key].astype(float)
        col = col[col.notna()]
        if len(col) and col.nunique() > 1:
            target = col.max() if how == "max" else col.min()
            out[key] = {str(i) for i in col.index[col == target]}
    return out


def _html_table(df: pd.DataFrame, best: Mapping[str, set[str]] | None = None, cls: str = "") -> str:
    """A DataFrame as an HTML table (cells already formatted as text; index as first column
    when named). Cells listed in ``best`` (column -> index labels) get class ``best``."""
    best = best or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    index = df.index.name is not None
    if index:
        head = f"<th>{html.escape(str(df.index.name))}</th>" + head
    body = []
    for label, row in df.iterrows():
        cells = [f'<th scope="row">{html.escape(str(label))}</th>'] if index else []
        for c in df.columns:
            mark = ' class="best" title="best"' if str(label) in best.get(str(c), ()) else ""
            cells.append(f"<td{mark}>{html.escape(str(row[c]))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _comparison_html(data: ReportData) -> str:
    import pandas as pd

    raw = comparison_table(data)
    best = best_cells(raw)
    shown = pd.DataFrame(
        {title: [fmt(v) for v in raw[key]] for title, key, fmt, _ in COMPARISON},
        index=pd.Index(raw.index, name="run"),
    )
    by_title = {title: best[key] for title, key, _, _ in COMPARISON if key in best}
    return _html_table(shown, by_title, "comparison")


def _config_html(data: ReportData) -> str:
    import pandas as pd

    keys = _config_key_order()
    flat0 = data.runs[0].config
    common = [(k, flat0[k]) for k in keys if k in flat0 and k not in data.varying]
    parts = ["<h3>Shared by all runs</h3>"]
    traces = sorted(
        {(str(r.conf.get("trace")), str(r.conf.get("trace_sha256"))) for r in data.runs}
    )
    t = pd.DataFrame(
        {"value": [_show(v) for _, v in common]}, index=pd.Index([k for k, _ in common], name="key")
    )
    parts.append(_html_table(t, cls="config"))
    parts.append("<h3>Traces</h3>")
    parts.append(
        _html_table(
            pd.DataFrame(
                {"sha256": [s for _, s in traces]},
                index=pd.Index([p for p, _ in traces], name="trace"),
            )
        )
    )
    if data.varying:
        parts.append("<h3>What differs</h3>")
        cols = [k for k in data.varying if k != "trace"]
        v = pd.DataFrame(
            {
                **{k: [_show(r.config.get(k)) for r in data.runs] for k in cols},
                "HBM pool [tokens]": [_int(r.device_tokens) for r in data.runs],
                "host pool [tokens]": [_int(r.host_tokens) for r in data.runs],
                "directory": [r.shown for r in data.runs],
            },
            index=pd.Index([r.label for r in data.runs], name="run"),
        )
        if "trace" in data.varying:
            v.insert(0, "trace", [str(r.conf.get("trace")) for r in data.runs])
        parts.append(_html_table(v, cls="config"))
    parts.append("<h3>Each run's config.json</h3>")
    for r in data.runs:
        text = json.dumps(r.conf, indent=1, sort_keys=True)
        parts.append(
            f"<details><summary>{html.escape(r.label)} — {html.escape(r.shown)}"
            f"</summary><pre>{html.escape(text)}</pre></details>"
        )
    return "\n".join(parts)


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _sweeps_html(data: ReportData) -> str:
    import pandas as pd

    parts = []
    for s in data.sweeps:
        res = s.results
        failed = res[res["status"] != "ok"]
        ok = int((res["status"] == "ok").sum())
        desc = f"<p>{html.escape(s.description)}</p>" if s.description else ""
        parts.append(
            f"<h3>{html.escape(s.name)} <small>({html.escape(s.shown)})</small></h3>"
            f"{desc}<p>{len(res)} jobs: {ok} finished, {len(failed)} failed.</p>"
        )
        if len(failed):
            t = pd.DataFrame(
                {
                    "status": failed["status"].astype(str).tolist(),
                    "error": [str(e) for e in failed["error"]],
                },
                index=pd.Index(failed["job"].astype(str).tolist(), name="job"),
            )
            parts.append(_html_table(t, cls="failed"))
        if s.grid_text:
            parts.append(
                f"<details><summary>grid file</summary><pre>{html.escape(s.grid_text)}"
                "</pre></details>"
            )
    return "\n".join(parts)


# --- the document ----------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1500px;padding:1rem 1.5rem;color:#222;line-height:1.4}
h1{font-size:1.6rem;margin:.2rem 0}h2{font-size:1.25rem;margin-top:2rem;
border-bottom:1px solid #ddd}h3{font-size:1.05rem}
nav a{margin-right:1rem}
.row{display:flex;flex-wrap:wrap;gap:1.2rem;align-items:flex-start}
figure{flex:3 1 640px;margin:0;min-width:0}figure svg{width:100%;height:auto}
figcaption{font-size:.9rem;color:#444;margin-top:.3rem}
.numbers{flex:2 1 360px;max-height:640px;overflow:auto}
table{border-collapse:collapse;font-size:.82rem;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.2rem .45rem;text-align:right;white-space:nowrap}
th{background:#f4f4f4}tbody th{text-align:left;font-weight:normal}
td.best{background:#c8efd2;font-weight:600}
.wide{overflow-x:auto}pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;font-size:.8rem}
small{color:#666;font-weight:normal}
"""


def _json_script(fig_id: str, payload: Any) -> str:
    text = json.dumps(_clean(payload), sort_keys=True, separators=(",", ":"), allow_nan=False)
    text = text.replace("</", "<\\/")  # never closes the script element
    return (
        f'<script type="application/json" class="figure-data" data-figure="{fig_id}">'
        f"{text}</script>"
    )


def _clean(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, numpy scalars -> Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if hasattr(x, "item"):
        return _clean(x.item())
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return x


def render_html(data: ReportData, figures: Sequence[ReportFigure], title: str) -> str:
    """The report as one HTML document (no external resources)."""
    from hicache import __version__

    nav = " ".join(f'<a href="#{f.id}">{html.escape(f.title)}</a>' for f in figures)
    nav += ' <a href="#comparison">Comparison</a> <a href="#configs">Configurations</a>'
    inputs = sorted({r.sweep or r.shown for r in data.runs})
    sections = []
    for f in figures:
        sections.append(
            f'<section id="{f.id}"><h2>{html.escape(f.title)}</h2><div class="row">'
            f"<figure>{f.to_svg()}<figcaption>{html.escape(f.caption)}</figcaption></figure>"
            f'<div class="numbers">{_html_table(f.numbers)}</div></div>'
            f"{_json_script(f.id, f.data)}</section>"
        )
    sweeps = _sweeps_html(data)
    versions = ", ".join(sorted({str(r.conf.get("version", "?")) for r in data.runs}))
    body = [
        f"<header><h1>{html.escape(title)}</h1>",
        f"<p>{len(data.runs)} runs from {html.escape(', '.join(inputs))}. Simulated with "
        f"hicache-sim {html.escape(versions)}"
        f"; report by hicache-sim {__version__}.</p>",
        f"<nav>{nav}</nav></header>",
        *sections,
        '<section id="comparison"><h2>Comparison</h2><p>One row per run; the best value of '
        "each metric is highlighted (highest hit rates and throughput, lowest latencies, "
        "write amplification, retractions and rejections).</p>"
        f'<div class="wide">{_comparison_html(data)}</div></section>',
        f'<section id="configs"><h2>Configurations</h2>{_config_html(data)}'
        + (f"<h3>Sweeps</h3>{sweeps}" if sweeps else "")
        + "</section>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _pdf(data: ReportData, figures: Sequence[ReportFigure], title: str, path: Path) -> None:
    """Figures one per page, then the comparison table as text pages."""
    import matplotlib
    import pandas as pd
    from matplotlib.backends.backend_pdf import PdfPages

    raw = comparison_table(data)
    text = pd.DataFrame(
        {title_: [fmt(v) for v in raw[key]] for title_, key, fmt, _ in COMPARISON},
        index=raw.index,
    ).to_string()
    lines = text.splitlines()
    meta = {"Title": title, "Creator": "hicache-sim", "CreationDate": None}
    with matplotlib.rc_context(_RC), PdfPages(path, metadata=meta) as pdf:
        for f in figures:
            pdf.savefig(f.figure)
        per_page = 60
        for start in range(0, len(lines), per_page):
            page = _figure(16.5, 11.7)
            page.text(
                0.01,
                0.99,
                "\n".join(lines[start : start + per_page]),
                family="monospace",
                fontsize=6,
                va="top",
            )
            pdf.savefig(page)


def build_report(dirs: list[Path], out: Path, pdf: bool = False) -> Path:
    """Write the HTML report of ``dirs`` (run and/or sweep directories) to ``out`` and, with
    ``pdf``, the same figures as ``out`` with suffix ``.pdf``. Returns ``out``. Same inputs
    give byte-identical files. Raises ``ValueError`` (one line) for unusable inputs."""
    data = load_runs(dirs)
    names = [s.name for s in data.sweeps]
    title = "hicache-sim report" + (f": {', '.join(names)}" if names else "")
    figures = report_figures(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(data, figures, title), encoding="utf-8")
    if pdf:
        _pdf(data, figures, title, out.with_suffix(".pdf"))
    return out
