"""The device KV tensor and the host KV tensor, in SGLang's layouts, sized to fit the machine.

Geometry (one rank). A token holds ``token_layer_bytes`` of KV per layer, split into ``parts``
equal buffers: K and V (``parts=2``) for MHA/GQA models, one latent (``parts=1``) for MLA. Pages
hold ``page_size`` tokens and are the unit the policy core allocates; page ``p`` of a pool is
what the core calls page id ``p``.

* Device (SGLang's ``MHATokenToKVPool``: one K and one V buffer per layer, tokens contiguous):
  ``(parts, layers, device_pages, page_size * e)``.
* Host ``layer_first`` (``(2, layers, size, heads, dim)`` in SGLang):
  ``(parts, layers, host_pages, page_size * e)``: per layer, a page run is one contiguous block.
* Host ``page_first`` (SGLang 0.5.14's default, ``(2, size, layers, heads, dim)``: token-major):
  ``(parts, host_pages, page_size, layers, e)``: all layers of a page are one contiguous block.

``e`` counts elements of the pool dtype per token, layer and part. The dtype is the widest
integer type dividing the per-part token bytes: copies do not care about the type, and wide
elements make the index kernels move fewer, larger items. Sizes are bytes, exactly.

Scaling. A real pool is tens of GB on the device and more on the host; the replay keeps the
model's per-token geometry (so every copy has the real shape) and shrinks the *number of pages*
by one common factor until both pools fit their memory budgets (:func:`size_pools`). Optional
overrides shrink the layer count or the bytes per token as well. Every change is written into
:attr:`PoolSizing.notes`, which the CLI prints and the run directory keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hicache.latency import count_runs
from replay.runtime import Runtime

LAYOUTS = ("layer_first", "page_first")
_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


def split_runs(
    device_pages: Sequence[int], host_pages: Sequence[int]
) -> list[tuple[int, int, int]]:
    """The runs of :func:`count_runs` as ``(first device page, first host page, length)``."""
    n = len(device_pages)
    if n != len(host_pages):
        raise ValueError(f"page lists differ in length: {n} device vs {len(host_pages)} host")
    out: list[tuple[int, int, int]] = []
    i = 0
    while i < n:
        d0, h0, k = device_pages[i], host_pages[i], 1
        while i + k < n and device_pages[i + k] == d0 + k and host_pages[i + k] == h0 + k:
            k += 1
        out.append((d0, h0, k))
        i += k
    return out


@dataclass(frozen=True)
class PoolSpec:
    """Shape of the two pools (see the module docstring). ``host_pages`` may be 0 (no host
    tier: then there is no host tensor)."""

    num_layers: int
    token_layer_bytes: int
    """KV bytes of one token in one layer, all parts together (K + V)."""
    page_size: int
    device_pages: int
    host_pages: int
    layout: str = "page_first"
    parts: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "token_layer_bytes", "page_size", "device_pages", "parts"):
            if getattr(self, name) < 1:
                raise ValueError(f"pool {name} must be >= 1, got {getattr(self, name)}")
        if self.host_pages < 0:
            raise ValueError(f"pool host_pages must be >= 0, got {self.host_pages}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.token_layer_bytes % self.parts:
            raise ValueError(
                f"token_layer_bytes {self.token_layer_bytes} does not split into {self.parts} "
                "equal parts"
            )

    @property
    def part_token_bytes(self) -> int:
        """Bytes of one token, one layer, one part (K or V)."""
        return self.token_layer_bytes // self.parts

    @property
    def dtype(self) -> torch.dtype:
        for dt in _DTYPES:
            if self.part_token_bytes % dt.itemsize == 0:
                return dt
        raise AssertionError("uint8 divides everything")

    @property
    def elems(self) -> int:
        """``e``: elements of :attr:`dtype` per token, layer and part."""
        return self.part_token_bytes // self.dtype.itemsize

    @property
    def layer_page_bytes(self) -> int:
        """One page in one layer, all parts."""
        return self.page_size * self.token_layer_bytes

    @property
    def page_bytes(self) -> int:
        """One page, all layers and parts: what a one-page write or load moves."""
        return self.layer_page_bytes * self.num_layers

    @property
    def device_bytes(self) -> int:
        return self.page_bytes * self.device_pages

    @property
    def host_bytes(self) -> int:
        return self.page_bytes * self.host_pages

    def device_shape(self) -> tuple[int, int, int, int]:
        return (self.parts, self.num_layers, self.device_pages, self.page_size * self.elems)

    def host_shape(self) -> tuple[int, ...]:
        if self.layout == "layer_first":
            return (self.parts, self.num_layers, self.host_pages, self.page_size * self.elems)
        return (self.parts, self.host_pages, self.page_size, self.num_layers, self.elems)


@dataclass(frozen=True)
class PoolSizing:
    """A :class:`PoolSpec` and how it was derived from the requested pools."""

    spec: PoolSpec
    requested_device_tokens: int
    requested_host_tokens: int
    factor: float
    """Pages kept / pages requested (1.0 = not scaled)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def device_tokens(self) -> int:
        return self.spec.device_pages * self.spec.page_size

    @property
    def host_tokens(self) -> int:
        return self.spec.host_pages * self.spec.page_size


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def size_pools(
    *,
    num_layers: int,
    token_layer_bytes: int,
    page_size: int,
    device_tokens: int,
    host_tokens: int,
    device_budget_bytes: int,
    host_budget_bytes: int,
    layout: str = "page_first",
    parts: int = 2,
    scale: float = 1.0,
    notes: Sequence[str] = (),
) -> PoolSizing:
    """Pools of the requested sizes (tokens; rounded down to pages), shrunk by one common factor
    ``f = min(scale, device budget / device bytes, host budget / host bytes, 1)`` so both fit.

    The common factor keeps the host/device ratio, which is what shapes the policy's behaviour.
    A host pool is kept strictly larger than the device pool (SGLang refuses to start
    otherwise). ``ValueError`` if not even one device page (plus a larger host pool) fits.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    if device_tokens < page_size:
        raise ValueError(f"device pool of {device_tokens} tokens is less than one page")
    probe = PoolSpec(num_layers, token_layer_bytes, page_size, 1, 0, layout, parts)
    pb = probe.page_bytes
    dev_pages = device_tokens // page_size
    host_pages = host_tokens // page_size
    # whole pages each budget holds: the binding one decides the factor, exactly
    dev_cap, host_cap = device_budget_bytes // pb, host_budget_bytes // pb
    f = min(1.0, scale, dev_cap / dev_pages)
    if host_pages:
        f = min(f, host_cap / host_pages)
    out_notes = list(notes)
    if f < 1.0:
        eps = 1e-9  # 1000 * (128 / 1000) must give 128, not 127
        new_dev = max(1, min(dev_cap, int(dev_pages * f + eps)))
        new_host = min(host_cap, max(new_dev + 1, int(host_pages * f + eps))) if host_pages else 0
        why = (
            "--scale"
            if f == scale
            else (
                f"the budgets (device {_gib(device_budget_bytes)}, host {_gib(host_budget_bytes)})"
            )
        )
        out_notes.append(
            f"pools scaled by {f:.4g} to fit {why}: device {dev_pages * page_size:,} -> "
            f"{new_dev * page_size:,} tokens, host {host_pages * page_size:,} -> "
            f"{new_host * page_size:,} tokens; per-token geometry unchanged "
            f"({num_layers} layers x {token_layer_bytes:,} B, page {page_size})"
        )
        dev_pages, host_pages = new_dev, new_host
    spec = PoolSpec(num_layers, token_layer_bytes, page_size, dev_pages, host_pages, layout, parts)
    if spec.device_bytes > device_budget_bytes:
        raise ValueError(
            f"one device page ({_gib(pb)}) does not fit the device budget "
            f"{_gib(device_budget_bytes)}"
        )
    if spec.host_bytes > host_budget_bytes:
        raise ValueError(
            f"the host pool ({host_pages} pages, {_gib(spec.host_bytes)}) does not fit the host "
            f"budget {_gib(host_budget_bytes)}"
        )
    return PoolSizing(
        spec, device_tokens, host_tokens, dev_pages / (device_tokens // page_size), tuple(out_notes)
    )


def model_pools(
    model_name: str,
    *,
    tp: int,
    page_size: int,
    device_tokens: int,
    host_tokens: int,
    device_budget_bytes: int,
    host_budget_bytes: int,
    layout: str = "page_first",
    scale: float = 1.0,
    num_layers: int | None = None,
    token_layer_bytes: int | None = None,
) -> PoolSizing:
    """:func:`size_pools` for a ``hicache.hardware`` model preset on one rank of ``tp``.

    ``num_layers`` / ``token_layer_bytes`` override the model's geometry (to shrink a replay
    further, e.g. in tests); each override is recorded in the notes.
    """
    from hicache.hardware import get_model, kv_bytes_per_token

    model = get_model(model_name)
    layers = model.num_layers
    tlb = kv_bytes_per_token(model, tp) // layers
    parts = 1 if model.mla else 2
    notes = []
    if num_layers is not None and num_layers != layers:
        notes.append(f"layers overridden: {model_name} has {layers}, the replay uses {num_layers}")
        layers = num_layers
    if token_layer_bytes is not None and token_layer_bytes != tlb:
        notes.append(
            f"bytes per token per layer overridden: {model_name} has {tlb:,} (tp={tp}), the "
            f"replay uses {token_layer_bytes:,}"
        )
        tlb = token_layer_bytes
    return size_pools(
        num_layers=layers,
        token_layer_bytes=tlb,
        page_size=page_size,
        device_tokens=device_tokens,
        host_tokens=host_tokens,
        device_budget_bytes=device_budget_bytes,
        host_budget_bytes=host_budget_bytes,
        layout=layout,
        parts=parts,
        scale=scale,
        notes=notes,
    )


class KVPools:
    """The two tensors of a :class:`PoolSpec`, allocated through a :class:`Runtime` (device
    memory on CUDA, a page-locked host pool when CUDA is present, plain CPU tensors otherwise).

    Both start zeroed (so no copy pays first-touch page faults); :meth:`fill_pattern` writes a
    value that identifies every element, for tests.
    """

    def __init__(self, spec: PoolSpec, runtime: Runtime) -> None:
        self.spec = spec
        self.runtime = runtime
        self.device = runtime.device_empty(spec.device_shape(), spec.dtype)
        self.host: torch.Tensor | None = (
            runtime.host_pool(spec.host_shape(), spec.dtype) if spec.host_pages else None
        )
        # touch every page now: a first write into fresh memory page-faults, and that would be
        # timed as part of whichever copy happens to reach the page first
        self.device.zero_()
        if self.host is not None:
            self.host.zero_()
        # per (part, layer) views of the device pool, (pages, page elems): built once because
        # the direct backend slices them in its inner loop
        self.device_views = [
            [self.device[p, layer] for layer in range(spec.num_layers)] for p in range(spec.parts)
        ]
        self.host_views: list[list[torch.Tensor]] = []
        if self.host is not None and spec.layout == "layer_first":
            h = self.host
            self.host_views = [
                [h[p, layer] for layer in range(spec.num_layers)] for p in range(spec.parts)
            ]

    def close(self) -> None:
        """Drop the host pool (unlocking its pages on CUDA); the pools are unusable after."""
        if self.host is not None:
            self.runtime.free_host_pool(self.host)
            self.host = None
            self.host_views = []

    @property
    def host_pinned(self) -> bool:
        return self.host is not None and self.runtime.pinned

    def describe(self) -> dict[str, object]:
        s = self.spec
        return {
            "layout": s.layout,
            "num_layers": s.num_layers,
            "token_layer_bytes": s.token_layer_bytes,
            "parts": s.parts,
            "page_size": s.page_size,
            "page_bytes": s.page_bytes,
            "device_pages": s.device_pages,
            "host_pages": s.host_pages,
            "device_bytes": s.device_bytes,
            "host_bytes": s.host_bytes,
            "dtype": str(s.dtype).removeprefix("torch."),
            "device_shape": list(s.device_shape()),
            "host_shape": list(s.host_shape()),
            "host_pinned": self.host_pinned,
        }

    # -- canonical views (tests and verification) ---------------------------------------------
    def device_pages_view(self, pages: Sequence[int]) -> torch.Tensor:
        """Device KV of ``pages`` as ``(parts, layers, n, page_size, e)`` (a copy)."""
        s = self.spec
        idx = torch.tensor(list(pages), dtype=torch.int64, device=self.device.device)
        g = self.device.index_select(2, idx)
        return g.view(s.parts, s.num_layers, len(pages), s.page_size, s.elems)

    def host_pages_view(self, pages: Sequence[int]) -> torch.Tensor:
        """Host KV of ``pages`` in the same canonical shape as :meth:`device_pages_view`."""
        if self.host is None:
            raise ValueError("no host pool")
        s = self.spec
        idx = torch.tensor(list(pages), dtype=torch.int64)
        if s.layout == "layer_first":
            g = self.host.index_select(2, idx)
            return g.view(s.parts, s.num_layers, len(pages), s.page_size, s.elems)
        g = self.host.index_select(1, idx)  # (parts, n, page_size, layers, e)
        return g.permute(0, 3, 1, 2, 4)

    def fill_pattern(self) -> None:
        """Give every device element a value naming (part, layer, page, token, element) and set
        the host pool to -1, so a misplaced byte shows up in a comparison."""
        s = self.spec
        shape = (s.parts, s.num_layers, s.device_pages, s.page_size, s.elems)
        n = 1
        for d in shape:
            n *= d
        vals = torch.arange(n, dtype=torch.int64) % _value_modulus(s.dtype)
        self.device.copy_(vals.view(s.device_shape()).to(s.dtype))
        if self.host is not None:
            self.host.fill_(-1 if s.dtype != torch.uint8 else 255)

    def stamp_device(self, pages: Sequence[int], values: Sequence[int]) -> None:
        """Fill every element of each device page with its value (modulo the dtype's range):
        the replay's stand-in for the KV a prefill computes, checked after loads."""
        if not pages:
            return
        s = self.spec
        dev = self.device
        idx = torch.tensor(list(pages), dtype=torch.int64, device=dev.device)
        mod = _value_modulus(s.dtype)
        v = torch.tensor([x % mod for x in values], dtype=s.dtype, device=dev.device)
        dev[:, :, idx] = v.view(1, 1, -1, 1)  # broadcast: no page-sized source tensor

    def device_stamps_ok(self, pages: Sequence[int], values: Sequence[int]) -> bool:
        """True when every element of each device page equals its stamp (see
        :meth:`stamp_device`)."""
        if not pages:
            return True
        s = self.spec
        mod = _value_modulus(s.dtype)
        g = self.device_pages_view(pages)
        v = torch.tensor([x % mod for x in values], dtype=s.dtype, device=g.device)
        return bool((g == v.view(1, 1, -1, 1, 1)).all())


def _value_modulus(dtype: torch.dtype) -> int:
    # keep pattern values positive and representable in the pool dtype
    return {torch.int64: 1 << 62, torch.int32: 1 << 30, torch.int16: 1 << 14}.get(dtype, 1 << 7)


__all__ = [
    "LAYOUTS",
    "KVPools",
    "PoolSizing",
    "PoolSpec",
    "count_runs",
    "model_pools",
    "size_pools",
    "split_runs",
]
