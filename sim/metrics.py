"""Run metrics: compact columns during the run, tables and a summary at the end.

Three tables per run (Parquet): ``requests`` (one row per request), ``timeline`` (sampled at
state changes, thinned to a bounded number of rows) and ``transfers`` (one row per copy op).
``summary.json`` holds the headline figures. The per-request and per-copy rows are kept column
by column (:class:`RowTable`: 8 bytes a number), so a long trace's metrics cost about 130 bytes
a request and 60 a copy.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar, get_type_hints

from traces import fsutil
from traces.store import BuiltOnRead


class RequestRow(NamedTuple):
    """One request as recorded at its finish (times in simulated seconds; -1 = never)."""

    rid: int
    arrival_s: float
    admitted_s: float
    first_token_s: float
    finish_s: float  # -1: rejected at arrival
    prefill_s: float
    load_stall_s: float
    prompt_tokens: int
    output_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    host_hit_recomputed_tokens: int
    computed_tokens: int
    retractions: int
    storage_hit_tokens: int = 0  # of the host hit, tokens an L3 prefetch brought to the host
    # seconds admission held it back while its L3 prefetch's I/O ran (from the first pass that
    # reached it then, until the I/O ended or timed out; later waiting is queueing)
    prefetch_wait_s: float = 0.0


class TimelineRow(NamedTuple):
    """The state of the pools, queues and link at one scheduler step."""

    t_s: float
    device_free_tokens: int
    device_evictable_tokens: int
    device_protected_tokens: int
    device_request_tokens: int
    host_used_tokens: int
    waiting: int
    running: int
    d2h_busy_s: float
    h2d_busy_s: float


class TransferRow(NamedTuple):
    """One copy op on the link."""

    direction: str
    kind: str
    bytes: int
    pages: int
    runs: int
    enqueue_s: float
    start_s: float
    end_s: float


#: columns derived from a request row's times when the table is built (NaN for a rejected
#: request): ttft = first token - arrival, tpot = (finish - first token) / (outputs - 1) (NaN for
#: one output token), e2e = finish - arrival, queue = admitted - arrival
DERIVED_REQUEST_COLUMNS = ("ttft_s", "tpot_s", "e2e_s", "queue_s")
#: SGLang's per-request ``meta_info`` names (``cached_tokens`` and ``cached_tokens_details``
#: ``{device, host, storage}``), derived from the hit columns as SGLang counts them
#: (:func:`sglang_cached_tokens`); last in the table
SGLANG_CACHED_COLUMNS = (
    "cached_tokens",
    "cached_tokens_device",
    "cached_tokens_host",
    "cached_tokens_storage",
)
REQUEST_COLUMNS = (
    *RequestRow._fields[:5],
    *DERIVED_REQUEST_COLUMNS,
    *RequestRow._fields[5:],
    *SGLANG_CACHED_COLUMNS,
)
TIMELINE_COLUMNS = TimelineRow._fields
TRANSFER_COLUMNS = TransferRow._fields


R = TypeVar("R", bound=tuple[Any, ...])


class RowTable(BuiltOnRead[R], Generic[R]):
    """Rows of one ``NamedTuple`` type, stored column by column: an ``array`` of 8-byte
    numbers per ``int`` or ``float`` field, a list (of shared strings) per other field. Reads
    back as rows (index, iterate, compare with a list of rows)."""

    def __init__(self, row_type: type[R]) -> None:
        self.row_type = row_type
        hints = get_type_hints(row_type)
        fields: tuple[str, ...] = row_type._fields  # type: ignore[attr-defined]
        self.fields = fields
        self._cols: list[Any] = [
            array("q") if hints[f] is int else array("d") if hints[f] is float else []
            for f in fields
        ]
        self._n = 0

    def append(self, row: R) -> None:
        for col, value in zip(self._cols, row, strict=True):
            col.append(value)
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def _get(self, i: int) -> R:
        return self.row_type(*(col[i] for col in self._cols))

    def __iter__(self) -> Iterator[R]:
        make = self.row_type
        for values in zip(*self._cols, strict=True):
            yield make(*values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowTable | list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def columns(self, *, take: bool = False) -> dict[str, Any]:
        """Each field's values as a numpy array (numbers) or a list (other fields). ``take``:
        empty the table as it goes, each column freed once copied (a long run's tables are
        not held twice while its DataFrames are built)."""
        import numpy as np

        out: dict[str, Any] = {}
        for i, (f, col) in enumerate(zip(self.fields, self._cols, strict=True)):
            out[f] = np.array(col) if isinstance(col, array) else list(col)
            if take:
                self._cols[i] = array(col.typecode) if isinstance(col, array) else []
        if take:
            self._n = 0
        return out


def request_frame(rows: Sequence[RequestRow], *, take: bool = False) -> Any:
    """The ``requests`` table: the rows, the derived columns computed once, in
    ``REQUEST_COLUMNS`` order. ``take``: empty ``rows`` (a `RowTable`) while building."""
    import numpy as np
    import pandas as pd

    if isinstance(rows, RowTable):
        # copy=False: the fresh column arrays become the frame's own (no second copy)
        df = pd.DataFrame(rows.columns(take=take), columns=list(RequestRow._fields), copy=False)
    else:
        df = pd.DataFrame(rows, columns=list(RequestRow._fields))
    done = df["finish_s"].to_numpy() >= 0
    arrival, first, finish = (
        df[c].to_numpy(dtype=float) for c in ("arrival_s", "first_token_s", "finish_s")
    )
    out = df["output_tokens"].to_numpy()
    nan = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), nan)
    derived = {
        "ttft_s": np.where(done, first - arrival, nan),
        "tpot_s": np.where(done, tpot, nan),
        "e2e_s": np.where(done, finish - arrival, nan),
        "queue_s": np.where(done, df["admitted_s"].to_numpy(dtype=float) - arrival, nan),
    }
    columns = {**{c: df[c] for c in RequestRow._fields}, **derived, **sglang_cached_tokens(df)}
    return pd.DataFrame({c: columns[c] for c in REQUEST_COLUMNS}, copy=False)


def sglang_cached_tokens(req: Any, sglang_version: str = "0.5.23") -> dict[str, Any]:
    """The ``SGLANG_CACHED_COLUMNS`` of a requests table, as SGLang reports each request
    (``managers/schedule_batch.py``, ``prepare_for_extend``, at the first prefill chunk; a
    retraction changes nothing afterwards, as ``retracted_stain`` does).

    ``cached_tokens``: the prefix the first admission started from, device hit + loaded host
    hit (the L3-fetched part included): ``device_hit_tokens + host_hit_tokens +
    storage_hit_tokens``, in both versions. The breakdown:

    - 0.5.23 (``split_cached_prefix_by_tier`` over ``materialized_host_hit_len``): what came
      from where, ``device_hit_tokens`` / ``host_hit_tokens`` / ``storage_hit_tokens``; the
      three add up to ``cached_tokens``;
    - 0.5.14: the *matched* host hit, loaded or not (``host_total = req.host_hit_length``):
      host = ``host_hit_tokens + host_hit_recomputed_tokens``, storage =
      ``storage_hit_tokens``, device = ``max(0, cached_tokens - host_total)``. A host hit that
      was not loaded back (below ``load_back_threshold``, or no device room) is reported as
      host although it was recomputed, and taken off device (summary.json's ``D6``); there
      storage is this model's loaded L3 part (SGLang's ``min(host_total, prefetched)`` may be
      more). Without such a hit the split is the same as 0.5.23's.

    A rejected request (never admitted) has 0 everywhere."""
    import numpy as np

    dev = req["device_hit_tokens"].to_numpy()
    host = req["host_hit_tokens"].to_numpy()
    l3 = req["storage_hit_tokens"].to_numpy()
    cached = dev + host + l3
    if sglang_version == "0.5.14":
        host_total = host + l3 + req["host_hit_recomputed_tokens"].to_numpy()
        dev, host = np.maximum(0, cached - host_total), host_total - l3
    return {
        "cached_tokens": cached,
        "cached_tokens_device": dev,
        "cached_tokens_host": host,
        "cached_tokens_storage": l3,
    }


@dataclass
class Recorder:
    """Collects rows (requests and copies column by column, the timeline as tuples); builds
    DataFrames once at the end."""

    timeline_max_rows: int = 20_000
    requests: RowTable[RequestRow] = field(default_factory=lambda: RowTable(RequestRow))
    timeline: list[TimelineRow] = field(default_factory=list)
    transfers: RowTable[TransferRow] = field(default_factory=lambda: RowTable(TransferRow))
    _stride: int = 1
    _skip: int = 0

    def add_request(self, row: RequestRow) -> None:
        self.requests.append(row)

    def add_transfer(self, row: TransferRow) -> None:
        self.transfers.append(row)

    def due(self) -> bool:
        """Count one sample opportunity; True when this one is kept (every ``stride``-th), so
        a caller builds the row only then."""
        self._skip += 1
        if self._skip < self._stride:
            return False
        self._skip = 0
        return True

    def sample(self, row: TimelineRow) -> None:
        """Keep a sample that :meth:`due` allowed; when the table is full, drop every other row
        and double the stride (memory stays bounded whatever the run length)."""
        self.timeline.append(row)
        if len(self.timeline) >= self.timeline_max_rows:
            self.timeline = self.timeline[::2]
            self._stride *= 2

    # --------------------------------------------------------------------------- outputs --
    def frames(self, *, take: bool = False) -> dict[str, Any]:
        """The tables as DataFrames. ``take``: hand the rows over (the recorder is empty
        afterwards; a run's last call, so that its rows are not held twice)."""
        import pandas as pd

        transfers = self.transfers.columns(take=take)
        return {
            "requests": request_frame(self.requests, take=take),
            "timeline": pd.DataFrame(self.timeline, columns=list(TIMELINE_COLUMNS)),
            "transfers": pd.DataFrame(transfers, columns=list(TRANSFER_COLUMNS), copy=False),
        }


#: overload: the run took this much longer than the arrivals span ...
OVERLOAD_STRETCH = 1.2
#: ... and the last tenth of arrivals queued this many times longer than the first tenth, and
#: at least OVERLOAD_MIN_QUEUE_S: the queue grew over the run instead of staying level
OVERLOAD_QUEUE_GROWTH = 5.0
OVERLOAD_MIN_QUEUE_S = 1.0
#: ... or, on a long trace whose drain is short beside its span, the last tenth queued more
#: than this share of the whole arrival span: a backlog, not a burst (the conversation trace
#: on one TP2 H200 at 0.3x: 175 s -> 2,164 s of queueing while the run outlasted its arrivals
#: by only 1.19x)
OVERLOAD_BACKLOG_OF_SPAN = 0.1
#: closed loop: a turn arrives only after the previous one finished, so arrivals slow down with
#: the server and the run never outlasts them; saturation shows as queueing instead: the last
#: tenth queued at least OVERLOAD_MIN_QUEUE_S and this many times its own service time (TTFT
#: minus queueing) -- requests wait mostly for each other, not for their own prefill
CLOSED_LOOP_QUEUE_OVER_SERVICE = 10.0


def overload(req: Any, sim_duration_s: float, closed_loop: bool = False) -> dict[str, Any]:
    """Whether the offered load exceeded what the simulated server serves.

    ``arrival_rate_rps``: requests over the arrival span; ``service_rate_rps``: requests over
    the whole run (what the server managed; equal to the arrival rate when it keeps up).
    Overloaded when the run outlasts the arrivals by ``OVERLOAD_STRETCH`` *and* the queueing
    delay grew from the first tenth of arrivals to the last (a queue without bound, not one
    long request at the end). In closed loop (``closed_loop``) the arrivals follow the
    completions, so the two rates are equal by construction and the stretch never shows: there
    the queue growth alone, or a last tenth that queued ``CLOSED_LOOP_QUEUE_OVER_SERVICE``
    times its own service time, counts. ``overload_message`` says what to do (empty when not
    overloaded). The keys go into ``summary.json`` as they are (flat, for results tables).
    """
    import numpy as np

    done = req[req["finish_s"] >= 0].sort_values("arrival_s", kind="stable")
    n = len(done)
    out: dict[str, Any] = {"overloaded": False, "arrival_rate_rps": float("nan"),
                           "service_rate_rps": float("nan"), "queue_first_tenth_s": float("nan"),
                           "queue_last_tenth_s": float("nan"), "overload_message": ""}  # fmt: skip
    if n < 20:
        return out
    arrivals = done["arrival_s"].to_numpy(dtype=float)
    first, last = float(arrivals[0]), float(arrivals[-1])
    span, run = last - first, sim_duration_s - first
    if span <= 0 or run <= 0:
        return out
    queue = done["queue_s"].to_numpy(dtype=float)
    tenth = max(1, n // 10)
    q_first, q_last = float(np.median(queue[:tenth])), float(np.median(queue[-tenth:]))
    lam, mu = n / span, n / run
    grew = q_last >= OVERLOAD_MIN_QUEUE_S and q_last > OVERLOAD_QUEUE_GROWTH * max(q_first, 1e-3)
    over = grew and (run > OVERLOAD_STRETCH * span or q_last > OVERLOAD_BACKLOG_OF_SPAN * span)
    out.update(arrival_rate_rps=lam, service_rate_rps=mu, queue_first_tenth_s=q_first,
               queue_last_tenth_s=q_last, overloaded=bool(over))  # fmt: skip
    if closed_loop and not over:
        service = done["ttft_s"].to_numpy(dtype=float)[-tenth:] - queue[-tenth:]
        s_last = float(np.median(service))
        saturated = q_last >= OVERLOAD_MIN_QUEUE_S and q_last > (
            CLOSED_LOOP_QUEUE_OVER_SERVICE * max(s_last, 1e-3)
        )
        if grew or saturated:
            out["overloaded"] = True
            how = (f"grows over the run (median {q_first:.1f} s for the first tenth of "
                   f"arrivals, {q_last:.1f} s for the last)" if grew else
                   f"is {q_last:.1f} s (median, last tenth of arrivals), {q_last / s_last:.0f}x "
                   "the requests' own prefill")  # fmt: skip
            out["overload_message"] = (
                f"overloaded (closed loop): queueing {how}. In closed loop each turn arrives "
                "after the previous one finished, so arrivals slow down with the server and "
                "the arrival rate cannot show the overload; lower workload.rate_scale (fewer "
                "sessions started per second), replay fewer requests (workload.max_requests) "
                "or simulate more capacity (cluster.instances, a bigger GPU or TP)"
            )
        return out
    if over:
        out["overload_message"] = (
            f"overloaded: requests arrive at {lam:.2f}/s but the simulated server serves "
            f"{mu:.2f}/s, so the queue grows over the run (median queueing {q_first:.1f} s for "
            f"the first tenth of arrivals, {q_last:.1f} s for the last); multiply "
            f"workload.rate_scale by about {0.8 * mu / lam:.2g} to keep up, replay fewer "
            "requests (workload.max_requests) or simulate a bigger GPU"
        )
    return out


def warmup_mask(req: Any, warmup_s: float, start_s: float | None = None) -> Any:
    """Which requests of the ``requests`` table arrived in the warm-up window (before
    ``start_s``, default the table's first arrival, + ``warmup_s``), a boolean array; None
    when there is no window."""
    if warmup_s <= 0 or not len(req):
        return None
    arrival = req["arrival_s"].to_numpy(dtype=float)
    return arrival < (float(arrival.min()) if start_s is None else start_s) + warmup_s


def summarize(
    frames: dict[str, Any],
    sim_duration_s: float,
    wall_time_s: float,
    closed_loop: bool = False,
    warmup_s: float = 0.0,
    warmup_from_s: float | None = None,
) -> dict[str, Any]:
    """The headline figures of a run (``summary.json``); ``closed_loop``: the run replayed the
    trace's think times (its overload check differs: :func:`overload`).

    ``warmup_s`` (``workload.warmup_s``): the requests that arrived before the first arrival
    + ``warmup_s`` ran (they filled the caches and loaded the server) but count in no figure:
    hit rates, latencies, queueing, retractions and the overload check are over the later
    arrivals; PCIe bytes over the copies that started after the window; output throughput
    is the later arrivals' output tokens over the time from the window's end to the end of
    the run. The summary then says how many were left out (``warmup_requests``) and where the
    window ended (``warmup_end_s``); without a window it is exactly as before.
    ``warmup_from_s``: where the window starts (default: this table's first arrival; a
    fleet's instance takes the fleet's).
    """
    req = frames["requests"]
    tr = frames["transfers"]
    early = warmup_mask(req, warmup_s, warmup_from_s)
    window: dict[str, Any] = {}
    measured_s = sim_duration_s
    if early is not None:
        start = float(req["arrival_s"].min()) if warmup_from_s is None else warmup_from_s
        end = start + warmup_s
        window = {"warmup_s": warmup_s, "warmup_end_s": end, "warmup_requests": int(early.sum())}
        req = req[~early].reset_index(drop=True)
        tr = tr[tr["start_s"] >= end] if len(tr) else tr
        measured_s = sim_duration_s - end
    done = req[req["finish_s"] >= 0]
    prompt = int(done["prompt_tokens"].sum())
    dev = int(done["device_hit_tokens"].sum())
    host = int(done["host_hit_tokens"].sum())
    l3 = int(done["storage_hit_tokens"].sum())

    def q(col: str, p: float) -> float:
        s = done[col].dropna()
        return float(s.quantile(p)) if len(s) else float("nan")

    def mean(col: str) -> float:
        s = done[col].dropna()
        return float(s.mean()) if len(s) else float("nan")

    out_tokens = int(done["output_tokens"].sum())
    bytes_d2h = int(tr.loc[tr["direction"] == "d2h", "bytes"].sum()) if len(tr) else 0
    bytes_h2d = int(tr.loc[tr["direction"] == "h2d", "bytes"].sum()) if len(tr) else 0
    return {
        "requests": len(req),
        "finished_requests": len(done),
        "rejected_requests": int(len(req) - len(done)),
        "prompt_tokens": prompt,
        "hit_rate": (dev + host + l3) / prompt if prompt else 0.0,
        "device_hit_rate": dev / prompt if prompt else 0.0,
        "host_hit_rate": host / prompt if prompt else 0.0,
        "storage_hit_rate": l3 / prompt if prompt else 0.0,
        "host_hit_recomputed_tokens": int(done["host_hit_recomputed_tokens"].sum()),
        "ttft_mean_s": mean("ttft_s"),
        "ttft_p50_s": q("ttft_s", 0.5),
        "ttft_p90_s": q("ttft_s", 0.9),
        "ttft_p99_s": q("ttft_s", 0.99),
        "tpot_mean_s": mean("tpot_s"),
        "tpot_p90_s": q("tpot_s", 0.9),
        "e2e_mean_s": mean("e2e_s"),
        "queue_mean_s": mean("queue_s"),
        "load_stall_mean_s": mean("load_stall_s"),
        "throughput_output_tok_s": out_tokens / measured_s if measured_s > 0 else 0.0,
        "retractions": int(req["retractions"].sum()),
        "bytes_d2h": bytes_d2h,
        "bytes_h2d": bytes_h2d,
        "sim_duration_s": sim_duration_s,
        "wall_time_s": wall_time_s,
        "closed_loop": closed_loop,
        **window,
        **overload(req, sim_duration_s, closed_loop),
    }


def write_json_atomic(obj: Any, path: Path) -> None:
    """``summary.json`` / ``config.json``: sorted keys, one-space indent (stable diffs)."""
    fsutil.write_json_atomic(obj, path, indent=1, sort_keys=True)


def write_parquet_atomic(df: Any, path: Path) -> None:
    fsutil.write_parquet_atomic(df, path)
