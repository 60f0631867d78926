"""``sweep --seeds K``: every configuration of a grid run K times over resampled traces
(:mod:`sim.seeds`), and the table of medians and intervals per configuration.

The replicas are an ordinary axis, ``seed`` (its label the replica's ``run.seed``; each value
sets :func:`sim.seeds.replica_settings`), so they are ordinary jobs: resumable, in
``results.csv`` one row each, a finished replica reused when the sweep is rerun with more
seeds. :func:`seed_table` then folds each configuration's replicas into one row.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hicache.config import ConfigError, load_config
from sim.seeds import SEED_INTERVAL, SEED_METRICS, replica_settings, seed_intervals
from studies.sweep.grid import Axis, AxisValue, Grid, resolve_path

if TYPE_CHECKING:
    import pandas as pd

#: the axis ``--seeds`` adds
SEED_AXIS = "seed"
#: keys the replicas set, which the grid may therefore not vary itself
_SEED_KEYS = ("run.seed", "router.seed", "workload.resample_sessions")


def with_seeds(grid: Grid, k: int) -> Grid:
    """``grid`` with a :data:`SEED_AXIS` axis of ``k`` replicas, counted from the base
    config's ``run.seed`` and ``router.seed``, and each ``[[include]]`` job ``k`` times, one
    per replica. Raises :class:`ConfigError` when the grid
    already varies one of the keys a replica sets."""
    if k < 1:
        raise ConfigError("--seeds", f"must be >= 1, got {k}", grid.source)
    clash = [a.name for a in grid.axes if a.name in (SEED_AXIS, *_SEED_KEYS)]
    if clash:
        raise ConfigError(
            clash[0], "--seeds varies run.seed and router.seed itself; drop this axis", grid.source
        )
    path = None if grid.config is None else resolve_path(grid.root, grid.config)
    base = load_config(path, list(grid.overrides))
    run_seed, router_seed = base.run.seed, base.router.seed
    values = tuple(
        AxisValue(run_seed + i, tuple(replica_settings(run_seed, router_seed, i).items()))
        for i in range(k)
    )
    # every [[include]] job (a baseline, say) is replicated too, picking the axis's values
    include = tuple((*inc, (SEED_AXIS, v.label)) for inc in grid.include for v in values)
    return replace(grid, axes=(*grid.axes, Axis(SEED_AXIS, values)), include=include)


def seed_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration of a ``--seeds`` sweep's results (``df``, with a
    :data:`SEED_AXIS` column): its other axis values, ``seeds`` (finished replicas),
    ``overloaded_seeds``, and per :data:`sim.seeds.SEED_METRICS` figure the median (the
    figure's own name) and the :data:`sim.seeds.SEED_INTERVAL` ends (``<figure>_lo``,
    ``<figure>_hi``). Failed replicas are left out (``results.csv`` names them)."""
    import pandas as pd

    cols = list(df.columns)
    axes = [c for c in cols[3 : cols.index("device_tokens")] if c != SEED_AXIS]
    ok = df[df["status"] == "ok"]
    metrics = [m for m in SEED_METRICS if m in ok.columns]
    rows: list[dict[str, Any]] = []
    groups = ok.groupby(axes, dropna=False, sort=False) if axes else [((), ok)]
    for values, part in groups:
        key = values if isinstance(values, tuple) else (values,)
        row: dict[str, Any] = dict(zip(axes, key, strict=True))
        row["seeds"] = len(part)
        if "overloaded" in part.columns:
            row["overloaded_seeds"] = int(part["overloaded"].fillna(False).astype(bool).sum())
        summaries: list[dict[str, Any]] = part[metrics].to_dict("records")  # type: ignore[assignment]
        for m, iv in seed_intervals(summaries, metrics).items():
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = iv["median"], iv["lo"], iv["hi"]
        rows.append(row)
    return pd.DataFrame(rows)


def interval_note() -> str:
    """What the ``_lo`` / ``_hi`` columns are, for the reader of the printed table."""
    lo, hi = (round(q * 100) for q in SEED_INTERVAL)
    return f"median over seeds [p{lo} - p{hi}]"


__all__ = ["SEED_AXIS", "interval_note", "seed_table", "with_seeds"]
