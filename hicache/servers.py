"""Servers: what the GPUs of one machine share on the host side, and what each rank gets of it.

Under tensor parallelism every rank copies its own slice of the KV cache at the same moment
(HiCache issues the same load or backup on all ranks), so a rank's copy bandwidth is not its
GPU's link but its share of what the ranks have in common (HARDWARE.md C8): the PCIe switch
uplink that several GPUs sit behind, and the DRAM bandwidth of the CPU socket their host pool
lives on. A :class:`ServerSpec` says how a machine is wired; :func:`rank_link_share` turns it
into the fraction of the per-GPU link bandwidth each of ``tp`` ranks gets when they all copy at
once.

Ranks are placed on GPUs 0..tp-1 (what ``CUDA_VISIBLE_DEVICES`` unset gives); GPUs fill the
switches in order (GPUs 0-1 behind switch 0, ...), and the switches split evenly between the
sockets. Each rank's host pool is on the socket its GPU hangs off (SGLang pins host memory
from the rank's process; NUMA binding to the local socket is the recommended setup).

Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSpec:
    """How one server's GPUs reach host memory.

    ``gpus``: GPUs in the server. ``gpus_per_uplink``: GPUs behind one PCIe switch whose x16
    uplink to the CPU they share (1 = every GPU has its own path to the root complex).
    ``uplink_Bps``: usable bandwidth of one such uplink, per direction (``inf`` = no limit
    beyond the GPU's own link). ``sockets``: CPU sockets, the GPUs split evenly between them.
    ``socket_mem_Bps``: DRAM bandwidth of one socket that host<->device copies can use, both
    directions together (``inf`` = not a limit). ``source``: where the figures come from.
    ``dram_bytes``: the server's system memory.
    """

    name: str
    gpus: int
    gpus_per_uplink: int
    uplink_Bps: float
    sockets: int
    socket_mem_Bps: float
    source: str
    dram_bytes: float = math.inf
    """System memory of the whole server (``inf``: not a limit, the ``single`` assumption).
    SGLang 0.5.21+ sizes its default host pool from what is free of it (``hicache.pools``)."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_uplink < 1 or self.sockets < 1:
            raise ValueError(f"server {self.name}: gpus, gpus_per_uplink, sockets must be >= 1")
        if self.gpus % self.sockets or self.gpus % self.gpus_per_uplink:
            raise ValueError(
                f"server {self.name}: {self.gpus} GPUs do not split evenly into "
                f"{self.sockets} sockets and uplinks of {self.gpus_per_uplink}"
            )
        if not (self.uplink_Bps > 0 and self.socket_mem_Bps > 0):
            raise ValueError(f"server {self.name}: bandwidths must be > 0")


def rank_link_share(server: ServerSpec, link_Bps: float, tp: int) -> float:
    """The fraction (0, 1] of one GPU's link bandwidth ``link_Bps`` each of ``tp`` ranks gets
    when they all copy in one direction at once.

    A rank is limited by its own link, by its switch uplink divided among the ranks behind it,
    and by its socket's DRAM bandwidth divided among the ranks on that socket. All ranks finish
    an op together only when the slowest has, so the busiest switch and socket decide: with
    ranks on GPUs 0..tp-1, ``min(gpus_per_uplink, tp)`` share the first uplink and
    ``min(gpus / sockets, tp)`` the first socket. Raises ``ValueError`` when ``tp`` exceeds the
    server's GPUs (a model split across servers is not modelled).
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if tp > server.gpus:
        raise ValueError(
            f"tp={tp} needs more GPUs than server {server.name!r} has ({server.gpus}); "
            "choose a larger server preset"
        )
    if link_Bps <= 0:
        raise ValueError(f"link bandwidth must be > 0, got {link_Bps}")
    per_uplink = min(server.gpus_per_uplink, tp)
    per_socket = min(server.gpus // server.sockets, tp)
    rate = min(link_Bps, server.uplink_Bps / per_uplink, server.socket_mem_Bps / per_socket)
    return rate / link_Bps


#: Sapphire Rapids socket: 8 DDR5 channels at 4,400 MT/s with 2 DIMMs per channel (Dell InfoHub,
#: "Memory bandwidth for next-gen PowerEdge servers ... Sapphire Rapids") x 8 bytes = 281.6 GB/s
_SPR_2DPC_Bps = 8 * 4400e6 * 8
#: AMD EPYC 7742 (Rome) socket: 8 DDR4-3200 channels x 8 bytes = 204.8 GB/s (AMD datasheet)
_ROME_Bps = 8 * 3200e6 * 8
#: **[model]** share of a socket's theoretical DRAM bandwidth that bulk host<->device copies
#: can use (STREAM-class copies reach ~70-80 % of theoretical on these parts)
_USABLE_DRAM = 0.75

#: DGX H100 / H200 system memory: 32 x 64 GB DDR5 DIMMs = 2 TB (DGX BasePOD RA "Core
#: Components"; the DGX H100 datasheet's "System Memory 2TB")
_DGX_H100_DRAM = 32 * 64 * 1024**3

_DGX_H100_SOURCE = (
    "DGX H100 User Guide 1.2.3 'Network Modules' (Table 6): CPU 0 serves GPUs 0-3 and CPU 1 "
    "GPUs 4-7, each GPU paired with one ConnectX-7 whose integrated PCIe Gen5 switch it sits "
    "behind (no GPU shares a switch; the GTC 2022 block diagram shows CPU -> CX7 -> H100); 2x "
    "Xeon 8480C, 32x 64 GB DDR5 (DGX BasePOD RA 'Core Components'; MLPerf Inference v4.1 "
    "H200-SXM-141GBx8 system JSON: PCIe Gen5 x16 per GPU). [model]: the switch uplink width is "
    "not documented and taken as no narrower than the GPU's own x16 (no uplink limit); 2 DIMMs "
    "per channel run at DDR5-4400, 281.6 GB/s per socket, 75 % usable for copies"
)


def both_ways_eta(server: ServerSpec, d2h_Bps: float, h2d_Bps: float, tp: int, eta: float) -> float:
    """The coupling factor (the link's ``eta``) once both directions share a socket's DRAM.

    ``d2h_Bps`` / ``h2d_Bps`` are a rank's rates after :func:`rank_link_share`. While both
    directions copy, each runs at ``rate * eta``; the socket's usable DRAM bandwidth, divided
    among the ranks on it, bounds their sum, so ``eta`` is at most ``socket share / (d2h +
    h2d)``. Returns ``min(eta, that bound)``; ``eta`` itself when memory is not a limit.
    """
    per_socket = min(server.gpus // server.sockets, tp)
    share = server.socket_mem_Bps / per_socket
    return min(eta, share / (d2h_Bps + h2d_Bps))


SERVERS: dict[str, ServerSpec] = {
    s.name: s
    for s in (
        ServerSpec(
            name="single",
            gpus=8,
            gpus_per_uplink=1,
            uplink_Bps=math.inf,
            sockets=1,
            socket_mem_Bps=math.inf,
            source=(
                "[model] assumption, not a machine: every rank owns a full host link and host "
                "memory is never the bottleneck (what the simulator did before servers existed)"
            ),
        ),
        ServerSpec(
            name="dgx-h100",
            gpus=8,
            gpus_per_uplink=1,
            uplink_Bps=math.inf,
            sockets=2,
            socket_mem_Bps=_SPR_2DPC_Bps * _USABLE_DRAM,
            source=_DGX_H100_SOURCE,
            dram_bytes=_DGX_H100_DRAM,
        ),
        ServerSpec(
            name="dgx-h200",
            gpus=8,
            gpus_per_uplink=1,
            uplink_Bps=math.inf,
            sockets=2,
            socket_mem_Bps=_SPR_2DPC_Bps * _USABLE_DRAM,
            source="the DGX H100 design with H200 GPUs (MLPerf Inference v4.1 NVIDIA "
            "H200-SXM-141GBx8 system JSON: dual 8480C, 32x 64 GB, PCIe Gen5 x16 per GPU). "
            + _DGX_H100_SOURCE,
            dram_bytes=_DGX_H100_DRAM,
        ),
        ServerSpec(
            name="dgx-a100",
            gpus=8,
            gpus_per_uplink=2,
            uplink_Bps=25e9,
            sockets=2,
            socket_mem_Bps=_ROME_Bps * _USABLE_DRAM,
            source=(
                "DGX A100: four PCIe Gen4 switches, two GPUs behind each switch's single x16 "
                "uplink to the CPU (DGX A100 system architecture; `nvidia-smi topo -m` on A100 "
                "boards shows PXB GPU pairs, NVIDIA/nvbandwidth issue #53); 2x AMD EPYC 7742, "
                "8 DDR4-3200 channels per socket. uplink 25 GB/s per direction = the Gen4 x16 "
                "pinned-copy figure of HARDWARE.md C2; [model] 75 % of DRAM usable for copies; "
                "1 TB system memory (DGX A100 datasheet, the 320 GB system; 640 GB: 2 TB)"
            ),
            dram_bytes=1024**4,
        ),
        ServerSpec(
            name="hgx-h100-paired",
            gpus=8,
            gpus_per_uplink=2,
            uplink_Bps=53e9,
            sockets=2,
            socket_mem_Bps=_SPR_2DPC_Bps * _USABLE_DRAM,
            source=(
                "[model] what-if, no Hopper source: the DGX A100 wiring (two GPUs behind one "
                "switch uplink) with Gen5 parts, for boards that pair GPUs behind a switch; "
                "uplink 53 GB/s = HARDWARE.md C2's large-copy Gen5 x16 figure; DRAM as DGX H100"
            ),
            dram_bytes=_DGX_H100_DRAM,
        ),
    )
}

#: the server a GPU preset usually comes in (``gpu.server`` "" picks it)
DEFAULT_SERVER = {
    "h100-sxm": "dgx-h100",
    "h200": "dgx-h200",
    "a100-80gb": "dgx-a100",
    # one Grace Hopper superchip per node: its own NVLink-C2C link and LPDDR5X
    "gh200": "single",
}


def get_server(name: str) -> ServerSpec:
    """The preset called ``name``; ``ValueError`` listing the choices otherwise."""
    try:
        return SERVERS[name]
    except KeyError:
        raise ValueError(
            f"unknown server {name!r}; choices: {', '.join(sorted(SERVERS))}"
        ) from None
