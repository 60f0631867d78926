"""Operations, configurations and the random sequence generator.

An :class:`Op` is side-independent data (JSON-able): a kind and its arguments. Arguments never
name a node or a page directly; they name *keys* (token lists) and *slots* (an index into the
driver's list of held locks or host pins, taken modulo its length), so the same op means the
same thing on both sides as long as they agree, and a sequence stays valid when ops are removed
from it (which the minimiser relies on).

Operation kinds are registered as :class:`OpSpec` s with a weight and an argument generator;
:data:`L1L2_OPS` is the device + host set. A later tier adds its own specs (and the matching
driver handlers) without touching these.
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


@dataclass(frozen=True)
class Config:
    """One cache configuration: what both sides are built with."""

    write_policy: str
    page_size: int
    strategy: str
    device_pages: int
    host_pages: int

    @property
    def combo(self) -> str:
        return f"{self.write_policy}/p{self.page_size}/{self.strategy}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "write_policy": self.write_policy,
            "page_size": self.page_size,
            "strategy": self.strategy,
            "device_pages": self.device_pages,
            "host_pages": self.host_pages,
        }


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


def generate(
    rng: random.Random, cfg: Config, steps: int, specs: Sequence[OpSpec] = L1L2_OPS
) -> list[Op]:
    """A random sequence of ``steps`` ops for ``cfg`` (only specs valid for its write policy)."""
    usable = [s for s in specs if cfg.write_policy in s.policies]
    weights = [s.weight for s in usable]
    kg = KeyGen(rng, cfg.page_size)
    out: list[Op] = []
    for _ in range(steps):
        spec = rng.choices(usable, weights)[0]
        out.append(Op(spec.kind, spec.make_args(rng, kg, cfg)))
    return out
