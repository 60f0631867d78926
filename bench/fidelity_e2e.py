"""End-to-end fidelity: the published SGLang measurements of REFERENCES.md section E, each
rebuilt as a scenario under ``bench/fidelity/`` and run through the timed simulator.

    .venv/bin/python bench/fidelity_e2e.py            # print the table (bench/fidelity.py
                                                      # includes it in FIDELITY.md)
    .venv/bin/python bench/fidelity_e2e.py --only E6  # one scenario

A scenario file (``bench/fidelity/<id>.toml``) holds the source, the settings that had to be
assumed, one trace (``[trace]``), named configurations (``[variants.NAME] set = [...]``, the
same ``SECTION.KEY=VALUE`` overrides as ``hicache-sim run --set``, on top of ``[base]``) and
the rows (``[[rows]]``): a reference value, the metric to compare, and for a ratio the variant
pair whose metric is divided (``variant`` / ``over``, or two metrics of one run:
``metric`` / ``over_metric``). Nothing is fitted here: the runs use the shipped presets and
profiles, and a scenario states every setting the source left out.

Trace kinds (``[trace] kind``):

- ``probe``: one prompt of ``length`` tokens on an idle server, then fillers that push it out of
  the device pool (``evict = "device"``) or out of device and host (``"host"``: what a
  ``/flush_cache`` leaves, the prompt then only in L3), then the same prompt again. Turns of one
  closed-loop session ``think_ms`` apart, so each starts on an idle server. Metrics
  ``ttft_first`` (the cold prompt: a full recompute) and ``ttft_last`` (the repeat: a hit in the
  tier the fillers left it in).
- ``closed``: ``clients`` closed-loop sessions of ``requests`` unique prompts each
  (``input``/``output`` tokens, no think time): bench_serving at ``--max-concurrency clients``
  on random prompts. ``repeat = true`` sends every prompt of a session a second time after the
  session's last (``flush`` between the passes as for ``probe``: fillers are not used, so give
  the run a device pool smaller than the working set).
- ``passes``: a warm pass and a measured pass of the same ``clients`` x ``requests`` unique
  prompts (``input``/``output`` tokens, closed loop, no think time), with fillers between them
  that push the prompts out of device and host (what ``/flush_cache`` leaves: a hit can only
  come from L3) or, with ``flush = "device"``, out of the device only (host hits). The measured
  pass starts one second after the warm pass and the fillers end (a first run finds that time).
  Metrics ``pass2_ttft_mean_s``, ``pass2_duration_s`` (first arrival to last finish),
  ``pass2_input_tok_s`` and ``pass1_input_tok_s``; the run checks that pass 2 hit the tier the
  flush left (``expect`` as for ``probe``).
- ``multiturn``: ``traces.generate.multiturn`` with the table's keyword arguments.
- ``rounds``: ``sessions`` conversations behind a round barrier (``rounds_trace``): the
  ``prompts`` lengths per round, each the previous prompt, its ``answer`` and ``new`` tokens;
  round k arrives at ``k * gap_s`` (the run checks each round ended before the next).

Metrics (``metric``): the summary's keys (``ttft_mean_s``, ``ttft_p50_s``, ...,
``throughput_output_tok_s``), ``throughput_input_tok_s`` (prompt tokens over the run),
``ttft_first`` / ``ttft_last`` (probe), and ``hit_rate``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache.config import load_config, resolve_pools
from hicache.hardware import get_model, kv_bytes_per_token
from sim.engine import run_simulation
from traces.generate import multiturn
from traces.schema import Request, Trace, TraceHeader

SCENARIOS = Path(__file__).resolve().parent / "fidelity"
#: Done-when targets of issue 25: median absolute error per kind of row
TARGETS = {"ratio": 0.15, "absolute": 0.25}


@dataclass(frozen=True)
class Row:
    """One compared figure: reference, prediction and what they are."""

    ref_id: str
    setting: str
    kind: str  # "ratio" | "absolute"
    reference: float
    prediction: float
    unit: str
    note: str

    @property
    def error(self) -> float:
        return self.prediction / self.reference - 1


def load_scenarios(only: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every ``bench/fidelity/*.toml`` (or those whose ``id`` is in ``only``), by file name."""
    out = []
    for path in sorted(SCENARIOS.glob("*.toml")):
        with path.open("rb") as f:
            sc = tomllib.load(f)
        sc["file"] = path.name
        if not only or sc["id"] in only:
            out.append(sc)
    return out


# ---------------------------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------------------------


def _blocks(start: int, tokens: int, bs: int) -> list[int]:
    return list(range(start, start + math.ceil(tokens / bs)))


def probe_trace(spec: dict[str, Any], device: int, host: int, page: int) -> Trace:
    """See the module docstring: prompt, fillers, the prompt again, one closed-loop session."""
    bs = page
    length = int(spec["length"])
    think = float(spec.get("think_ms", 5000.0))
    # a filler fits the device pool with two pages to spare, so that it pushes the prompt out
    per = (device - 2 * page) // bs * bs
    if per < page:
        raise ValueError(f"probe: device pool {device} tokens too small for fillers")
    if spec.get("evict", "device") == "device":
        if length <= 2 * page:
            raise ValueError("probe: the prompt must be longer than two pages")
        n_fill = 1  # prompt + filler > device pool; the host keeps the prompt
    else:
        n_fill = math.ceil((host + length) / per) + 1  # every filler backed up: host overflows
    out = int(spec.get("output", 1))
    prompt = _blocks(0, length, bs)
    turns = [(length, prompt)]
    nxt = 1 << 30
    for _ in range(n_fill):
        turns.append((per, _blocks(nxt, per, bs)))
        nxt += per
    turns.append((length, prompt))
    reqs = [
        Request(
            timestamp=0.0,
            input_length=n,
            output_length=out,
            hash_ids=ids,
            session_id="probe",
            turn=k,
            think_time_ms=think if k else None,
        )
        for k, (n, ids) in enumerate(turns)
    ]
    return Trace(reqs, TraceHeader(block_size=bs))


def closed_trace(spec: dict[str, Any], page: int) -> Trace:
    """``clients`` sessions of ``requests`` unique prompts each, closed loop, no think time."""
    clients, n = int(spec["clients"]), int(spec["requests"])
    inp, out = int(spec["input"]), int(spec["output"])
    passes = 2 if spec.get("repeat") else 1
    reqs = []
    for c in range(clients):
        prompts = [_blocks((c * n + k) << 20, inp, page) for k in range(n)]
        for k, ids in enumerate(prompts * passes):
            reqs.append(
                Request(
                    timestamp=0.0,
                    input_length=inp,
                    output_length=out,
                    hash_ids=ids,
                    session_id=f"c{c}",
                    turn=k,
                    think_time_ms=0.0 if k else None,
                )
            )
    return Trace(reqs, TraceHeader(block_size=page))


def rounds_trace(spec: dict[str, Any]) -> Trace:
    """``sessions`` conversations of ``len(prompts)`` rounds behind a round barrier
    (``bench_multiturn --enable-round-barrier``): every session's round k arrives at
    ``k * gap_s``. Round k's prompt is round k - 1's prompt, its ``answer`` output tokens and
    ``new`` tokens (``prompts`` must grow by ``answer + new``); with
    ``workload.output_reuse = next_turn`` the answers are the next prompt's tokens there."""
    sessions, gap = int(spec["sessions"]), float(spec["gap_s"])
    prompts, answer, new = list(spec["prompts"]), int(spec["answer"]), int(spec["new"])
    bs = int(spec.get("block", 512))
    reqs = []
    for k, n in enumerate(prompts):
        if n != new + k * (answer + new):
            raise ValueError(f"rounds: prompt {k} ({n}) is not new + k * (answer + new)")
        for c in range(sessions):
            reqs.append(
                Request(
                    timestamp=k * gap * 1000.0,
                    input_length=n,
                    output_length=answer,
                    hash_ids=_blocks(c << 20, n, bs),
                    session_id=f"s{c}",
                    turn=k,
                )
            )
    return Trace(reqs, TraceHeader(block_size=bs))


def _fillers(
    device: int, host: int, page: int, flush: str, start: int, size: int
) -> list[list[int]]:
    """Prompts of at most ``size`` tokens that push everything before them out of the device
    pool (``flush="device"``: one filler as large as the pool, so that the host keeps the
    prompts) or out of device and host (``"host"``: every filler is backed up, the host
    overflows; short fillers keep that flush's prefill linear in the pools' size)."""
    if flush == "device":  # one filler that leaves two pages: the host keeps what it had
        size = device
    per = min(device - 2 * page, size) // page * page
    if per < page:
        raise ValueError(f"device pool {device} tokens too small for fillers")
    n = 1 if flush == "device" else math.ceil((host + device) / per) + 1
    return [_blocks(start + k * (per + page), per, page) for k in range(n)]


def passes_trace(spec: dict[str, Any], device: int, host: int, page: int, t2: float) -> Trace:
    """See the module docstring; ``t2`` is the measured pass's start (0: warm pass only)."""
    clients, n = int(spec["clients"]), int(spec["requests"])
    inp, out = int(spec["input"]), int(spec["output"])
    prompts = [[_blocks((c * n + k) << 20, inp, page) for k in range(n)] for c in range(clients)]
    reqs = []

    def session(sid: str, t0: float, items: list[tuple[int, list[int]]]) -> None:
        for k, (length, ids) in enumerate(items):
            reqs.append(
                Request(
                    timestamp=t0 * 1000.0,  # the trace's clock is in ms
                    input_length=length,
                    output_length=out,
                    hash_ids=ids,
                    session_id=sid,
                    turn=k,
                    think_time_ms=0.0 if k else None,
                )
            )

    fill = _fillers(device, host, page, spec.get("flush", "host"), 1 << 40, max(inp, 8192))
    for c in range(clients):
        items = [(inp, ids) for ids in prompts[c]]
        if c == 0:  # the fillers follow the warm pass of the first client, one at a time
            items += [(len(ids) * page, ids) for ids in fill]
        session(f"w{c}", 0.0, items)
        if t2 > 0:
            session(f"m{c}", t2, [(inp, ids) for ids in prompts[c]])
    return Trace(reqs, TraceHeader(block_size=page))


def build_trace(spec: dict[str, Any], cfg: Any) -> Trace:
    device, host, _ = resolve_pools(cfg)
    page = cfg.cache.page_size
    kind = spec["kind"]
    if kind == "probe":
        return probe_trace(spec, device, host, page)
    if kind == "closed":
        return closed_trace(spec, page)
    if kind == "multiturn":
        params = {k: v for k, v in spec.items() if k != "kind"}
        return multiturn(**params)
    if kind == "rounds":
        return rounds_trace(spec)
    raise ValueError(f"unknown trace kind {kind!r} (probe, closed, multiturn, rounds)")


# ---------------------------------------------------------------------------------------------
# runs and rows
# ---------------------------------------------------------------------------------------------


def run_passes(spec: dict[str, Any], cfg: Any, label: str) -> dict[str, Any]:
    """Both passes of a ``passes`` trace: the warm run fixes the measured pass's start."""
    device, host, _ = resolve_pools(cfg)
    page = cfg.cache.page_size
    warm = run_simulation(cfg, passes_trace(spec, device, host, page, 0.0), None, progress=False)
    t2 = float(warm["sim_duration_s"]) + 1.0
    frames: dict[str, Any] = {}
    s = run_simulation(
        cfg, passes_trace(spec, device, host, page, t2), None, progress=False, frames_out=frames
    )
    req = frames["requests"]
    p1 = req[(req["arrival_s"] < t2) & (req["prompt_tokens"] == int(spec["input"]))]
    p2 = req[req["arrival_s"] >= t2]
    s["pass2_ttft_mean_s"] = float(p2["ttft_s"].mean())
    s["pass2_duration_s"] = float(p2["finish_s"].max() - t2)
    s["pass2_input_tok_s"] = float(p2["prompt_tokens"].sum()) / s["pass2_duration_s"]
    s["pass1_input_tok_s"] = float(p1["prompt_tokens"].sum()) / float(p1["finish_s"].max())
    flush = spec.get("flush", "host")
    default = (
        "host" if flush == "device" else "storage" if cfg.storage.backend != "none" else "none"
    )
    expect = spec.get("expect", default)
    prompt = float(p2["prompt_tokens"].sum())
    share = {
        "host": p2["host_hit_tokens"].sum() / prompt,
        "storage": p2["storage_hit_tokens"].sum() / prompt,
        "none": 1
        - (p2["host_hit_tokens"] + p2["storage_hit_tokens"] + p2["device_hit_tokens"]).sum()
        / prompt,
    }[expect]
    if not share >= 0.5:  # NaN (an empty pass) fails too
        raise RuntimeError(
            f"{label}: the measured pass should hit {expect}, but only {share:.0%} of its prompt "
            "tokens did: the flush did not leave the prompts where the row assumes"
        )
    s["pass2_hit_share"] = float(share)
    return s


def l3_read_override(sets: list[str], spec: dict[str, Any], ratio: float) -> str:
    """``storage.read_gbps_override`` that reads L3 at ``ratio`` times this configuration's own
    prefill rate: the simulated recompute of one ``input``-token prompt on an idle server
    (no L3), in tokens/s, as bytes on the store's link (every TP rank reads its page; an MLA
    page is replicated, so each rank reads all of it). For a stand-in model or GPU the source's
    measured L3-to-prefill speed ratio is what carries over, not its GB/s."""
    base = load_config(None, [*sets, "storage.backend=none"])
    tokens = int(spec["input"])
    one = Trace(
        [Request(timestamp=0.0, input_length=tokens, output_length=1, hash_ids=[0])],
        TraceHeader(block_size=base.cache.page_size),
    )
    frames: dict[str, Any] = {}
    run_simulation(base, one, None, progress=False, frames_out=frames)
    rate = tokens / float(frames["requests"]["ttft_s"].iloc[0])
    model = get_model(base.model.name)
    per_rank = kv_bytes_per_token(model) / (1 if model.mla else base.model.tp)
    return f"storage.read_gbps_override={ratio * rate * per_rank * base.model.tp / 1e9:.6g}"


def run_variant(sc: dict[str, Any], name: str) -> dict[str, Any]:
    """The summary of one variant, plus the probe's first and last TTFT."""
    sets = [*sc.get("base", {}).get("set", []), *sc["variants"][name].get("set", [])]
    spec = sc["variants"][name].get("trace", sc["trace"])
    if "l3_read_vs_prefill" in sc["variants"][name]:
        ratio = float(sc["variants"][name]["l3_read_vs_prefill"])
        sets.append(l3_read_override(sets, spec, ratio))
    cfg = load_config(None, sets)
    if spec["kind"] == "passes":
        return run_passes(spec, cfg, f"{sc['id']}/{name}")
    trace = build_trace(spec, cfg)
    frames: dict[str, Any] = {}
    s = run_simulation(cfg, trace, None, progress=False, frames_out=frames)
    req = frames["requests"]
    if "ttft_s" in req:  # a PD run's requests table has both roles' times instead
        s["ttft_first"] = float(req["ttft_s"].iloc[0])
        s["ttft_last"] = float(req["ttft_s"].iloc[-1])
        s["last_host_hit_tokens"] = int(req["host_hit_tokens"].iloc[-1])
        s["last_storage_hit_tokens"] = int(req["storage_hit_tokens"].iloc[-1])
    if spec["kind"] == "rounds":
        check_rounds(spec, req, f"{sc['id']}/{name}")
    s["throughput_input_tok_s"] = s["prompt_tokens"] / s["sim_duration_s"]
    if spec["kind"] == "probe":
        check_probe(spec, cfg, s, f"{sc['id']}/{name}")
    return s


def check_rounds(spec: dict[str, Any], req: Any, label: str) -> None:
    """The barrier held: every round finished before the next arrived."""
    sessions, gap = int(spec["sessions"]), float(spec["gap_s"])
    ends = req.groupby(req["rid"] // sessions)["finish_s"].max()
    late = [k for k in range(len(ends) - 1) if ends[k] > (k + 1) * gap]
    if late:
        raise SystemExit(f"{label}: rounds {late} had not finished when the next arrived")


def check_probe(spec: dict[str, Any], cfg: Any, s: dict[str, Any], label: str) -> None:
    """The repeat must hit the tier the fillers left the prompt in (``expect``: ``host``,
    ``storage`` or ``none``; by default ``host`` after ``evict = "device"``, ``storage`` after
    ``"host"`` when L3 is on, ``none`` otherwise): a row that compares the wrong hit is an error,
    not a figure."""
    evict = spec.get("evict", "device")
    default = (
        "host" if evict == "device" else "storage" if cfg.storage.backend != "none" else "none"
    )
    expect = spec.get("expect", default)
    host, storage = s["last_host_hit_tokens"], s["last_storage_hit_tokens"]
    length = int(spec["length"])
    ok = {
        "host": host >= length // 2 and storage == 0,
        "storage": storage >= length // 2,
        "none": host == 0 and storage == 0,
    }[expect]
    if not ok:
        raise RuntimeError(
            f"{label}: the repeated prompt should hit {expect}, got host {host} and storage "
            f"{storage} tokens of {length}: the fillers did not leave it where the row assumes"
        )


def scenario_rows(sc: dict[str, Any]) -> list[Row]:
    cache: dict[str, dict[str, Any]] = {}

    def value(variant: str, metric: str) -> float:
        if variant not in cache:
            cache[variant] = run_variant(sc, variant)
        return float(cache[variant][metric])

    rows = []
    for r in sc["rows"]:
        metric = r["metric"]
        if r["kind"] == "ratio":
            over = r.get("over", r["variant"])
            pred = value(r["variant"], metric) / value(over, r.get("over_metric", metric))
        else:
            pred = value(r["variant"], metric) * float(r.get("scale", 1.0))
        rows.append(
            Row(
                sc["id"],
                r["setting"],
                r["kind"],
                float(r["reference"]),
                pred,
                r.get("unit", ""),
                r.get("note", ""),
            )
        )
    return rows


def _fmt(v: float, unit: str) -> str:
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "ms":
        return f"{v:,.1f} ms"
    if unit == "s":
        return f"{v:,.2f} s"
    return f"{v:,.3g} {unit}".strip()


def section(only: Sequence[str] = ()) -> str:
    """The FIDELITY.md section: the table, the medians against the targets, each scenario's
    assumptions."""
    scs = load_scenarios(only)
    rows = [row for sc in scs for row in scenario_rows(sc)]
    lines = [
        "## End to end: published SGLang measurements (REFERENCES.md section E)",
        "",
        "Each reference rebuilt as a scenario (`bench/fidelity/<id>.toml`: the trace, the "
        "configurations, the settings the source leaves out) and run through the timed "
        "simulator with the shipped presets and default profiles (none measured: see "
        "`hicache/profiles/README.md`). Ratios compare two runs of one scenario (hit against "
        "miss, with against without a tier); absolute rows are TTFT or throughput as the "
        "source measured it. Regenerate: `python bench/fidelity_e2e.py` (or the whole file "
        "with `python bench/fidelity.py`).",
        "",
        "| reference | setting | kind | reference | prediction | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.ref_id} | {r.setting} | {r.kind} | {_fmt(r.reference, r.unit)} | "
            f"{_fmt(r.prediction, r.unit)} | {r.error * 100:+.1f} % |"
        )
    lines.append("")
    for kind, target in TARGETS.items():
        errs = [abs(r.error) for r in rows if r.kind == kind]
        if errs:
            med = statistics.median(errs)
            verdict = "within" if med <= target else "**outside**"
            lines.append(
                f"- {kind} rows: {len(errs)}, median |error| {med * 100:.1f} % "
                f"({verdict} the {target * 100:.0f} % target)"
            )
    lines.append("")
    for sc in scs:
        lines.append(
            f"**{sc['id']}. {sc['title']}** (`{sc['source']}`; `bench/fidelity/{sc['file']}`)"
        )
        for a in sc.get("assumed", []):
            lines.append(f"- assumed: {a}")
        for m in sc.get("notes", []):
            lines.append(f"- {m}")
        for m in sc.get("misses", []):
            lines.append(f"- miss: {m}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="scenario id (repeatable)")
    args = ap.parse_args(argv)
    print(section(args.only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
