"""Operations, configurations and the random sequence generator.

An :class:`Op` is side-independent data (JSON-able): a kind and its arguments. Arguments never
name a node or a page directly; they name *keys* (token lists) and *slots* (an index into the
driver's list of held locks or host pins, taken modulo its length), so the same op means the
same thing on both sides as long as they agree, and a sequence stays valid when ops are removed
from it (which the minimiser relies on).

Operation kinds are registered as :class:`OpSpec` s with a weight and an argument generator;
:data:`L1L2_OPS` is the device + host set, :data:`L3_OPS` adds the storage tier (request
arrivals with a prefetch, the storage stages stepped one backend call at a time, prefetch checks
at a logical time, credits, aborts, drains) to a re-weighted copy of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
PAGE_SIZES = (1, 4, 64)
#: eviction strategies both SGLang 0.5.14 and our core implement
STRATEGIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")

#: device pool size in pages, and the longest generated key in pages, per page size: small
#: enough that eviction, host pressure and load-back happen often
DEVICE_PAGES = {1: 40, 4: 12, 64: 6}
MAX_KEY_PAGES = {1: 24, 4: 6, 64: 3}
#: host pool ratios drawn per sequence (SGLang sizes the host pool as device * ratio + 1 page;
#: ratio 1.0 is the tightest SGLang accepts and puts the host tier under pressure)
HOST_RATIOS = (1.0, 1.5, 2.0)


#: L3 (storage tier) sequences: page sizes, prefetch stop policies, host pool ratios (above 1.0,
#: so that the prefetch capacity limit, int(0.8 x (host - device tokens)), lets prefetches in)
L3_PAGE_SIZES = (1, 4)
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
L3_HOST_RATIOS = (1.25, 1.5, 2.0, 3.0)
#: the L3 knobs: a prefetch threshold of 2 or 3 pages (drawn per sequence; with 3, hits of 1
#: or 2 pages are revoked), backend calls of 2 pages (SGLang's STORAGE_BATCH_SIZE patched), and
#: a timeout of 0.5 s + 1/4 s per hit page (per 1024 tokens: 256 s / page size) capped at
#: 1.25 s, i.e. at 3 pages. Dyadic numbers, so both sides compute the same floats, and the
#: clock's 1/8 s steps land on the limits (the comparison is strict).
L3_THRESHOLD_PAGES = (2, 3)
L3_BATCH_PAGES = 2
L3_TIMEOUT = (0.5, 256.0, 1.25)  # base s, s per 1024 hit tokens at page size 1, max s
#: logical seconds a ``tick`` op advances the clock by
TICKS = (0.125, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Config:
    """One cache configuration: what both sides are built with. ``prefetch_policy`` set means
    the L3 storage tier is attached (with the other ``l3_*`` / ``timeout_*`` knobs)."""

    write_policy: str
    page_size: int
    strategy: str
    device_pages: int
    host_pages: int
    prefetch_policy: str | None = None
    threshold_pages: int = L3_THRESHOLD_PAGES[0]
    batch_pages: int = L3_BATCH_PAGES
    timeout_base: float = L3_TIMEOUT[0]
    timeout_per_ki_token: float = L3_TIMEOUT[1]
    timeout_max: float = L3_TIMEOUT[2]

    @property
    def l3(self) -> bool:
        return self.prefetch_policy is not None

    @property
    def combo(self) -> str:
        base = f"{self.write_policy}/p{self.page_size}/{self.strategy}"
        return f"L3/{base}/{self.prefetch_policy}" if self.l3 else base

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "write_policy": self.write_policy,
            "page_size": self.page_size,
            "strategy": self.strategy,
            "device_pages": self.device_pages,
            "host_pages": self.host_pages,
        }
        if self.l3:
            out.update(
                prefetch_policy=self.prefetch_policy,
                threshold_pages=self.threshold_pages,
                batch_pages=self.batch_pages,
                timeout_base=self.timeout_base,
                timeout_per_ki_token=self.timeout_per_ki_token,
                timeout_max=self.timeout_max,
            )
        return out


def host_pages_for(device_pages: int, page_size: int, ratio: float) -> int:
    """SGLang's host pool size in pages: ``floor(device_tokens * ratio / page) + 1``."""
    return int(device_pages * page_size * ratio) // page_size + 1


def make_config(rng: random.Random, write_policy: str, page_size: int, strategy: str) -> Config:
    device_pages = DEVICE_PAGES[page_size]
    ratio = rng.choice(HOST_RATIOS)
    return Config(
        write_policy,
        page_size,
        strategy,
        device_pages,
        host_pages_for(device_pages, page_size, ratio),
    )


def make_l3_config(
    rng: random.Random, write_policy: str, page_size: int, prefetch_policy: str
) -> Config:
    """An L3 configuration: the eviction strategy, host ratio and prefetch threshold are drawn
    per sequence."""
    device_pages = DEVICE_PAGES[page_size]
    strategy = rng.choice(STRATEGIES)
    ratio = rng.choice(L3_HOST_RATIOS)
    threshold = rng.choice(L3_THRESHOLD_PAGES)
    return Config(
        write_policy,
        page_size,
        strategy,
        device_pages,
        host_pages_for(device_pages, page_size, ratio),
        prefetch_policy=prefetch_policy,
        threshold_pages=threshold,
        timeout_per_ki_token=L3_TIMEOUT[1] / page_size,
    )


@dataclass(frozen=True)
class Op:
    """One step of a sequence: ``kind`` names a driver handler, ``args`` are plain data."""

    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        for k, v in self.args.items():
            if k == "tokens":
                parts.append(f"tokens={run_length(v)}")
            else:
                parts.append(f"{k}={v!r}")
        return f"{self.kind}({', '.join(parts)})"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "args": dict(self.args)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Op:
        return Op(str(d["kind"]), dict(d.get("args", {})))


def run_length(tokens: Sequence[int]) -> str:
    """``[1,1,1,2]`` -> ``"1x3,2"``: short, readable and unambiguous labels for keys."""
    out: list[str] = []
    i = 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        out.append(f"{tokens[i]}x{j - i}" if j - i > 1 else str(tokens[i]))
        i = j
    return ",".join(out)


class KeyGen:
    """Token sequences that share prefixes often.

    Pages are filled from a small alphabet (a page is one symbol repeated, sometimes with its
    last token changed, so a page boundary is not the only place two keys diverge), and most
    keys extend a cut of an earlier key -- cut anywhere, also inside a page, so that SGLang's
    page-rounded match and node splits are exercised.
    """

    def __init__(self, rng: random.Random, page_size: int, alphabet: int = 3) -> None:
        self.rng = rng
        self.page_size = page_size
        self.alphabet = alphabet
        self.history: list[list[int]] = []

    def _page(self) -> list[int]:
        """One page; at page size 1 a run of 2..6 equal tokens, so that keys are long and
        branch every few tokens, not at every one (host hits reach the load-back threshold)."""
        s = self.rng.randrange(self.alphabet)
        page = [s] * (self.page_size if self.page_size > 1 else self.rng.randint(2, 6))
        if self.page_size > 1 and self.rng.random() < 0.15:
            page[-1] = self.alphabet + self.rng.randrange(2)
        return page

    def key(self) -> list[int]:
        rng, ps = self.rng, self.page_size
        max_tokens = MAX_KEY_PAGES[ps] * ps
        base: list[int] = []
        if self.history and rng.random() < 0.75:
            prev = rng.choice(self.history)
            base = prev[: rng.randint(0, len(prev))]
        tokens = list(base)
        for _ in range(rng.randint(0 if base else 1, 3)):
            tokens += self._page()
        tokens = tokens[:max_tokens]
        if ps > 1 and rng.random() < 0.2:
            tokens = tokens + [rng.randrange(self.alphabet)] * rng.randint(1, ps - 1)
        if len(tokens) >= ps:
            self.history.append(tokens)
            if len(self.history) > 24:
                self.history.pop(0)
        return tokens

    def known_key(self) -> list[int]:
        """Mostly an earlier key as it was (what a returning conversation sends), so that
        matches find host-only copies to load back; otherwise a fresh :meth:`key`."""
        if self.history and self.rng.random() < 0.8:
            return list(self.rng.choice(self.history))
        return self.key()


ArgGen = Callable[[random.Random, KeyGen, Config], dict[str, Any]]


@dataclass(frozen=True)
class OpSpec:
    """A registered operation kind: how often it is drawn and how its arguments are made."""

    kind: str
    weight: float
    make_args: ArgGen
    policies: tuple[str, ...] = WRITE_POLICIES


def _key_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    args: dict[str, Any] = {"tokens": kg.key()}
    if rng.random() < 0.05:
        args["extra_key"] = "lora"
    return args


def _known_key_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    args: dict[str, Any] = {"tokens": kg.known_key()}
    if rng.random() < 0.05:
        args["extra_key"] = "lora"
    return args


def _match_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    args = _known_key_args(rng, kg, cfg)
    if rng.random() < 0.15 and args["tokens"]:
        args["limit"] = rng.randint(0, len(args["tokens"]))
    return args


def _insert_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    args = _key_args(rng, kg, cfg)
    if rng.random() < 0.15:
        args["chunked"] = True
    if cfg.strategy == "priority" or rng.random() < 0.1:
        args["priority"] = rng.randrange(4)
    return args


def _slot(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    return {"slot": rng.randrange(1 << 16)}


def _count(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    return {"count": None if rng.random() < 0.4 else rng.randint(1, 3)}


def _tokens_amount(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    ps = cfg.page_size
    n = rng.randint(1, max(1, cfg.device_pages // 2)) * ps
    if ps > 1 and rng.random() < 0.2:
        n -= rng.randint(1, ps - 1)  # SGLang callers pass raw token counts too
    return {"num_tokens": n}


def _no_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    return {}


#: The device (L1) + host (L2) operations and their weights.
L1L2_OPS: tuple[OpSpec, ...] = (
    OpSpec("serve", 18, _insert_args),
    OpSpec("insert", 5, _insert_args),
    OpSpec("match", 6, _match_args),
    OpSpec("lock", 4, _known_key_args),
    OpSpec("unlock", 14, _slot),
    OpSpec("admit", 7, _known_key_args),
    OpSpec("admit_host", 8, _slot),
    OpSpec("start_loading", 8, _no_args),
    OpSpec("finish_writes", 6, _count),
    OpSpec("finish_loads", 6, _count),
    OpSpec("writing_check", 4, _no_args),
    OpSpec("loading_check", 4, _no_args),
    OpSpec("events", 10, _no_args),
    OpSpec("evict", 7, _tokens_amount),
    OpSpec("evict_host", 4, _tokens_amount),
    OpSpec("protect_host", 2, _known_key_args),
    OpSpec("release_host", 3, _slot),
    OpSpec("write_back_wait", 1, _no_args, policies=("write_back",)),
    OpSpec("flush", 0.4, _no_args),
)


def _arrive_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    """A request arriving: mostly an earlier key as it was or extended (returning
    conversations find their prefix in L2 or L3), otherwise a fresh one; rarely an extra key."""
    tokens = kg.known_key() if rng.random() < 0.7 else kg.key()
    if tokens and rng.random() < 0.6:
        tokens = [*tokens, rng.randrange(kg.alphabet)]  # input - 1 then covers the last page
    args: dict[str, Any] = {"tokens": tokens}
    if rng.random() < 0.03:
        args["extra_key"] = "lora"
    return args


def _l3_put_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    """Pages another engine sharing the storage wrote: an earlier key, or a fresh one that a
    later key may extend."""
    return {"tokens": kg.known_key() if rng.random() < 0.4 else kg.key()}


def _steps(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    return {"count": rng.randint(1, 4)}


def _tick(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    return {"dt": rng.choice(TICKS)}


def _flush_args(rng: random.Random, kg: KeyGen, cfg: Config) -> dict[str, Any]:
    """Mostly a flush of an engine idle long enough for the storage stages to be idle too."""
    return {"settle": True} if rng.random() < 0.8 else {}


_L3_ARGS: dict[str, ArgGen] = {"flush": _flush_args}
_L1L2_L3_WEIGHTS = {
    "flush": 3.0,
    "evict_host": 6.0,
    "evict": 8.0,
    "serve": 14.0,
    "admit": 4.0,
    "unlock": 12.0,
    "finish_writes": 9.0,
    "events": 6.0,
}

#: The L3 set: the L1/L2 ops, a few re-weighted (more flushes, evictions and finished writes,
#: so that L3 fills and holds what L1/L2 lost; fewer ``events``, so that revokes and slot
#: releases wait for a drain as they do between two scheduler passes), plus the storage tier's.
L3_OPS: tuple[OpSpec, ...] = (
    *(
        OpSpec(
            s.kind,
            _L1L2_L3_WEIGHTS.get(s.kind, s.weight),
            _L3_ARGS.get(s.kind, s.make_args),
            s.policies,
        )
        for s in L1L2_OPS
    ),
    OpSpec("arrive", 12, _arrive_args),
    OpSpec("l3_put", 5, _l3_put_args),
    OpSpec("tick", 16, _tick),
    OpSpec("query", 10, _steps),
    OpSpec("read", 10, _steps),
    OpSpec("backup", 12, _steps),
    OpSpec("stages", 3, _no_args),
    OpSpec("settle", 3, _no_args),
    OpSpec("check", 4, _slot),
    OpSpec("check_admit", 7, _slot),
    OpSpec("pop", 2, _slot),
    OpSpec("abort", 2, _slot),
    OpSpec("drain", 3, _no_args),
)


def generate(
    rng: random.Random, cfg: Config, steps: int, specs: Sequence[OpSpec] | None = None
) -> list[Op]:
    """A random sequence of ``steps`` ops for ``cfg`` (only specs valid for its write policy;
    by default :data:`L3_OPS` for an L3 configuration, :data:`L1L2_OPS` otherwise)."""
    if specs is None:
        specs = L3_OPS if cfg.l3 else L1L2_OPS
    usable = [s for s in specs if cfg.write_policy in s.policies]
    weights = [s.weight for s in usable]
    kg = KeyGen(rng, cfg.page_size)
    out: list[Op] = []
    for _ in range(steps):
        spec = rng.choices(usable, weights)[0]
        out.append(Op(spec.kind, spec.make_args(rng, kg, cfg)))
    return out
