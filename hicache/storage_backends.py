"""L3 storage backend presets: what one backend call of SGLang's HiCache storage threads costs.

SGLang 0.5.14 talks to its L3 backend in calls of up to 128 pages (``STORAGE_BATCH_SIZE``):
``batch_exists`` (query stage), ``batch_get``/``batch_get_v1`` (read stage) and
``batch_set``/``batch_set_v1`` (backup stage); STORAGE_TIER.md §5 proposes one cost shape for all
backends, which :meth:`StorageBackendSpec.call_seconds` implements::

    seconds = call latency + pages x per-page cost [+ page bytes / host memcpy bandwidth]
              + pages x page bytes x ranks / bandwidth

* The per-call latency covers RPCs to a metadata service, request set-up and the first-byte
  latency of the medium; the per-page cost covers per-page work on the storage thread
  (file-system calls, per-key bookkeeping). Both are paid once per call: every TP rank runs its
  own storage threads in parallel.
* The memcpy term exists only on the generic (not zero-copy) path: SGLang reads each page into
  a temporary flat page and copies it into the host pool (writes copy it out first). Each rank
  copies its own page, in parallel, so it is per-rank bytes.
* The last term is the bytes crossing the store's link: ``ranks`` is how many ranks move their
  own shard of each page (every TP rank for MHA models; MLA-type models back up from rank 0
  only). A query moves no bytes.

Each preset says where its figures come from (``sources``) and which of them are estimates
(``note``); none was measured by us (``measured=False``). A calibration on the real backend
should replace them; until then ``storage.read_gbps_override`` / ``write_gbps_override`` replace
the bandwidths (:func:`with_overrides`, :func:`backend_for`).

Standard library only. Seconds, bytes; GB = 1e9 bytes, GiB = 2**30 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hicache.config.sections import StorageConfig

#: Kinds of backend call, one per storage stage.
CALL_KINDS = ("query", "read", "write")

GiB = float(2**30)


@dataclass(frozen=True)
class StorageBackendSpec:
    """One storage backend as the simulator charges it (see the module docstring).

    ``read_gbps`` / ``write_gbps``: bandwidth between one instance's host DRAM and the store, GB/s,
    all its ranks together. ``*_call_s``: fixed latency of one ``batch_*`` call; ``*_page_s``:
    cost per page of a call. ``zero_copy``: the backend reads and writes the host pool in place
    (SGLang's ``*_v1`` calls); otherwise every page also goes through a host memcpy at
    ``copy_gbps`` (per rank). ``query_stops_at_miss``: existence is tested key by key up to the
    first missing page (SGLang's default ``batch_exists``), so a query pays the per-page cost only
    for the hit pages plus one; otherwise every page of the call is charged. ``shared``: one
    store serves every instance of a cluster by default (``storage.shared`` decides).
    """

    name: str
    read_gbps: float
    write_gbps: float
    query_call_s: float
    read_call_s: float
    write_call_s: float
    query_page_s: float
    read_page_s: float
    write_page_s: float
    zero_copy: bool
    shared: bool
    sources: tuple[str, ...]
    copy_gbps: float = 0.0
    query_stops_at_miss: bool = False
    measured: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        if not (self.read_gbps > 0 and self.write_gbps > 0):
            raise ValueError(f"storage backend {self.name}: bandwidths must be > 0")
        if not self.zero_copy and not self.copy_gbps > 0:
            raise ValueError(f"storage backend {self.name}: a copying backend needs copy_gbps > 0")
        costs = (
            self.query_call_s,
            self.read_call_s,
            self.write_call_s,
            self.query_page_s,
            self.read_page_s,
            self.write_page_s,
        )
        if min(costs) < 0:
            raise ValueError(f"storage backend {self.name}: latencies must be >= 0")
        if not self.sources:
            raise ValueError(f"storage backend {self.name}: a preset needs its sources")

    # ----------------------------------------------------------------------------- costs --
    def link_Bps(self, kind: str) -> float:
        """Bytes per second of the store link in the direction of a ``read`` or ``write``."""
        if kind == "read":
            return self.read_gbps * 1e9
        if kind == "write":
            return self.write_gbps * 1e9
        raise ValueError(f"only read and write calls move bytes, got {kind!r}")

    def stage_seconds(self, kind: str, pages: int, page_bytes: int) -> float:
        """The part of a call spent on the storage thread, off the link: call latency, per-page
        cost and (generic path) the host memcpy of ``page_bytes`` (one rank's page) per page.
        Zero for ``pages`` <= 0: SGLang makes no backend call for an empty batch."""
        _check_kind(kind)
        if pages <= 0:
            return 0.0
        if kind == "query":
            return self.query_call_s + pages * self.query_page_s
        if kind == "read":
            fixed = self.read_call_s + pages * self.read_page_s
        else:
            fixed = self.write_call_s + pages * self.write_page_s
        if not self.zero_copy:
            fixed += pages * page_bytes / (self.copy_gbps * 1e9)
        return fixed

    def query_pages_charged(self, pages: int, hits: int) -> int:
        """Pages whose per-page cost an existence query over ``pages`` pages pays when the
        first ``hits`` are stored: all, except for a key-by-key backend, which stops after the
        first missing page."""
        return min(pages, hits + 1) if self.query_stops_at_miss else pages

    def call_seconds(self, kind: str, pages: int, page_bytes: int, ranks: int = 1) -> float:
        """Seconds of one ``kind`` call over ``pages`` pages of ``page_bytes`` bytes per rank,
        ``ranks`` ranks moving their shard over an otherwise idle link: per-call latency +
        pages x per-page cost (+ per-rank memcpy on the generic path) + link bytes / bandwidth,
        with link bytes = pages x page_bytes x ranks. A query moves no bytes; zero pages cost 0.
        """
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        fixed = self.stage_seconds(kind, pages, page_bytes)
        if kind == "query" or pages <= 0:
            return fixed
        return fixed + pages * page_bytes * ranks / self.link_Bps(kind)


def _check_kind(kind: str) -> None:
    if kind not in CALL_KINDS:
        raise ValueError(f"unknown storage call kind {kind!r}; choices: {', '.join(CALL_KINDS)}")


# ---------------------------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------------------------

# Mooncake master RPC: LMCache's Mooncake integration reports lookups to the master at 1-2 ms
# once optimised (LMCache PR #934); SGLang's backend sends one batch RPC per call, so we take
# the low end. An estimate for an unloaded master on the same network.
_MOONCAKE_RPC_S = 1.0e-3
# hf3fs metadata service: with a store shared by several instances SGLang uses its HTTP
# metadata server (``mini_3fs_metadata_server``); a Python-to-Python HTTP round trip inside a
# data centre is a few hundred microseconds. Estimate.
_HF3FS_META_RPC_S = 0.5e-3
# First-byte latency of a NAND read on a storage server, charged once per 3FS call (the 16
# usrbio clients read the pages of a call in parallel). Estimate: TLC NAND page reads take tens
# of microseconds, plus the RDMA round trip of ~5-10 us measured by ib_read_lat (maknee.github.io,
# 3FS Performance Journal 3).
_HF3FS_MEDIUM_S = 0.1e-3

BACKENDS: dict[str, StorageBackendSpec] = {
    b.name: b
    for b in (
        StorageBackendSpec(
            name="file",
            # one enterprise PCIe 4.0 U.2 SSD, Samsung PM9A3: 6.5 GB/s sequential read, 3.5 GB/s
            # sequential write, 900K random-read IOPS (Samsung's figures in heise.de/-4720224
            # and computerbase.de 2020-05). A page is one file of MBs, read or written whole, so
            # the sequential figures apply.
            read_gbps=6.5,
            write_gbps=3.5,
            # batch_exists/batch_get/batch_set are Python loops in the calling thread: no RPC
            query_call_s=0.0,
            read_call_s=0.0,
            write_call_s=0.0,
            # one stat (os.path.exists) of a page file whose inode is cached: ~1-2 us of syscall
            # plus per-key Python (suffix, path join). Estimate.
            query_page_s=5e-6,
            # open + readinto + close of an existing file: below the 32 us measured for fopen +
            # fclose *creating* a file on a local ext3 (foddex.net blog 46). Estimate.
            read_page_s=20e-6,
            # exists check + create a temp file + write + close + rename: about that 32 us
            # create plus a rename of similar cost. Estimate.
            write_page_s=60e-6,
            # the generic path copies every page between the host pool and a temporary flat page:
            # 1,073.74 MB took 0.198 s of "copy time" in one HiCacheFile prefetch (sglang issue
            # #21880), i.e. 5.4 GB/s; its 0.129 s of "alloc time" is left out (pinned buffers
            # are reused by torch's caching host allocator after warm-up)
            copy_gbps=5.4,
            zero_copy=False,
            query_stops_at_miss=True,  # default batch_exists: exists() key by key, stops at a miss
            shared=False,  # a local directory: one store per instance
            sources=(
                "Samsung PM9A3 U.2 (PCIe 4.0) datasheet figures: 6,500 MB/s seq. read, "
                "3,500 MB/s seq. write, 900K IOPS random read (heise.de/-4720224; "
                "computerbase.de/2020-05/samsung-pm9a3-e1.s-pcie-4.0-ssd)",
                "Samsung PM1743 (PCIe 5.0) for a Gen5 server: 13,000 MB/s read, 6,600 MB/s "
                "write, 2.5M / 250K IOPS (computerbase.de/2021-12/samsung-pm1743-pcie-5.0-ssd-"
                "mit-13-gb-s-und-2.5-mio.-iops-fuer-server); set "
                "storage.read_gbps_override=13, write_gbps_override=6.6 to use it",
                "sglang issue #21880 (HiCacheFile prefetch: 1,073.74 MB, io 0.247 s = 4.3 GB/s, "
                "copy 0.198 s = 5.4 GB/s, alloc 0.129 s)",
                "sglang issue #26886 (HiCacheFile on Llama-3.1-8B: iostat read > 1,200 MB/s)",
                "foddex.net blog 46: fopen+fclose of a new file on local ext3, 0.0317 ms",
            ),
            note="bandwidths are the SSD vendor's sequential figures (an upper bound: the file "
            "backend reads one page at a time; sglang #21880 saw 4.3 GB/s of io); the memcpy "
            "rate is one published measurement; per-page file-system costs are estimates "
            "(warm dentry/inode caches; a cold stat or open adds one NAND read, tens of us); "
            "writes may land in the page cache first, which this ignores",
        ),
        StorageBackendSpec(
            name="3fs",
            # 3FS README: KVCache clients with one 400 Gbps NIC each read at up to 40 GiB/s peak
            # (DeepSeek's open-infra-index says "40+ GiB/s per client node"), near the NIC's
            # 50 GB/s line rate
            read_gbps=40 * GiB / 1e9,
            # no published KVCache write figure: half the read figure, as enterprise NAND SSDs
            # write at about half their read rate (PM9A3 3.5 vs 6.5 GB/s, PM1743 6.6 vs 13) and
            # CRAQ replicates every write along a chain. Estimate.
            write_gbps=20 * GiB / 1e9,
            query_call_s=_HF3FS_META_RPC_S,  # one metadata exists() call for the batch
            # get_page_indices RPC, then the batch is split over the client pool (16 usrbio
            # clients, 8 pages each) that read in parallel: one medium latency per call
            read_call_s=_HF3FS_META_RPC_S + _HF3FS_MEDIUM_S,
            # reserve_and_allocate_page_indices + confirm_write RPCs around the parallel writes
            write_call_s=2 * _HF3FS_META_RPC_S + _HF3FS_MEDIUM_S,
            # per-key list building and JSON (de)serialisation on the storage thread. Estimate.
            query_page_s=1e-6,
            read_page_s=2e-6,
            write_page_s=2e-6,
            zero_copy=True,
            shared=True,
            sources=(
                "deepseek-ai/3FS README, KVCache: read throughput of KVCache clients "
                "(1x400 Gbps NIC/node), peak up to 40 GiB/s; 6.6 TiB/s aggregate on 180 "
                "storage nodes (2x200 Gbps IB, 16 NVMe each)",
                "sglang storage_hf3fs.py: numjobs=16 usrbio clients, entries=8 pages per client "
                "batch, metadata calls get_page_indices / reserve_and_allocate_page_indices / "
                "confirm_write / exists",
                "maknee.github.io 3FS Performance Journal 3: ib_read latency 5-10 us up to 64 KB",
            ),
            note="read bandwidth is 3FS's published KVCache peak; write bandwidth, metadata RPC "
            "latency and per-page costs are estimates",
        ),
        StorageBackendSpec(
            name="mooncake",
            # Mooncake Transfer Engine: up to 87 GB/s on 4x200 Gbps RoCE (190 GB/s on 8x400), for
            # 40 GB transfers; 4x200 Gbps is the node of the FAST'25 paper's testbed (8x A800,
            # four 200 Gbps RDMA NICs). RDMA moves the same bytes either way: write = read
            # (the published figure does not separate them). Partly an estimate.
            read_gbps=87.0,
            write_gbps=87.0,
            query_call_s=_MOONCAKE_RPC_S,  # one batch_is_exist RPC to the master
            read_call_s=_MOONCAKE_RPC_S,  # one batch query of replica locations, then RDMA
            # batch_set_v1: existence query, put_start, put_end: three master RPCs
            write_call_s=3 * _MOONCAKE_RPC_S,
            query_page_s=1e-6,  # per-key string building and master lookup. Estimate.
            # an MHA page is two objects (K and V), each a transfer request the engine submits
            # and polls; a few us of CPU each. Estimate.
            read_page_s=5e-6,
            write_page_s=5e-6,
            zero_copy=True,
            shared=True,
            sources=(
                "kvcache-ai/Mooncake README, Transfer Engine: up to 87 GB/s and 190 GB/s on "
                "4x200 Gbps and 8x400 Gbps RoCE (40 GB of data), 2.4x and 4.6x TCP",
                "Qin et al., Mooncake, FAST'25: testbed nodes of 8x A800-SXM4-80GB with four "
                "200 Gbps RDMA NICs",
                "LMCache PR #934: Mooncake lookup latency 1-2 ms after optimisation",
            ),
            note="bandwidth is the Transfer Engine's published figure for 4x200 Gbps RoCE "
            "(use read/write_gbps_override=190 for 8x400 Gbps nodes); master RPC latency and "
            "per-page costs are estimates",
        ),
    )
}


def get_backend(name: str) -> StorageBackendSpec:
    """The preset called ``name``; ``ValueError`` listing the choices otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown storage backend {name!r}; choices: {', '.join(sorted(BACKENDS))}"
        ) from None


def with_overrides(
    spec: StorageBackendSpec, *, read_gbps: float = 0.0, write_gbps: float = 0.0
) -> StorageBackendSpec:
    """``spec`` with its bandwidths replaced where an override is > 0 (0 keeps the preset's)."""
    if read_gbps < 0 or write_gbps < 0:
        raise ValueError("bandwidth overrides must be >= 0 (0 keeps the preset's)")
    if read_gbps > 0:
        spec = replace(spec, read_gbps=read_gbps)
    if write_gbps > 0:
        spec = replace(spec, write_gbps=write_gbps)
    return spec


def backend_for(cfg: StorageConfig) -> StorageBackendSpec | None:
    """The backend a ``[storage]`` section asks for, overrides applied; None when L3 is off."""
    if cfg.backend == "none":
        return None
    return with_overrides(
        get_backend(cfg.backend),
        read_gbps=cfg.read_gbps_override,
        write_gbps=cfg.write_gbps_override,
    )


__all__ = [
    "BACKENDS",
    "CALL_KINDS",
    "StorageBackendSpec",
    "backend_for",
    "get_backend",
    "with_overrides",
]
