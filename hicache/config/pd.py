"""The ``[pd]`` section: prefill/decode disaggregation (:class:`PdConfig`, run by
:mod:`sim.pd`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hicache.config.base import ROUTER_POLICIES, _at_least, _between, _choice, _positive

#: ``pd.transfer``: how the KV goes from a prefill to a decode server (sim.pd.transfer).
PD_TRANSFERS = ("rdma", "nvlink")
#: ``pd.prefill_router`` / ``pd.decode_router``: the cluster routers (sim.routers).
PD_ROUTERS = ROUTER_POLICIES
#: ``pd.decode_retraction_backup`` (sim.pd.retraction.RETRACTION_BACKUPS)
PD_RETRACTION_BACKUPS = ("auto", "host_pool", "cpu_tensor")


@dataclass(frozen=True)
class PdConfig:
    """Prefill/decode disaggregation (SGLang ``--disaggregation-mode prefill|decode``): requests
    prefilled on prefill servers, their KV sent to decode servers, decoded there (sim.pd).

    Each role is the run's configuration with its own ``--set`` items applied
    (``prefill_set``, ``decode_set``: ``section.key=value`` separated by ``;``), so model TP,
    GPU and cache differ per role. Transfer constants are per rank (each rank sends its KV
    slice over its own NIC). Defaults of SGLang 0.5.23 are cited where they are its own.
    """

    section: ClassVar[str] = "pd"

    # run prefill and decode on separate servers (off: one kind of server, as without PD)
    enabled: bool = False
    # prefill servers (SGLang --disaggregation-mode prefill)
    prefill_instances: int = 1
    # decode servers (SGLang --disaggregation-mode decode)
    decode_instances: int = 1
    # the prefill role's own --set items, ';'-separated (e.g. "model.tp=2;gpu.name=h200")
    prefill_set: str = ""
    # the decode role's own --set items, ';'-separated (e.g. "gpu.device_tokens=400000")
    decode_set: str = ""
    # which prefill server gets a request (the gateway's --prefill-policy). The gateway's PD
    # mode applies its --policy (default cache_aware) to a role whose own policy is unset
    # (its start-up log: "prefill_policy: None, decode_policy: None | policy: CacheAware"),
    # each role with its own prefix tree; router.* holds the policies' settings
    prefill_router: str = "cache_aware"
    # which decode server gets a request (the gateway's --decode-policy; see prefill_router)
    decode_router: str = "cache_aware"
    # the KV link: rdma (between nodes) or nvlink (prefill and decode in one node)
    transfer: str = "rdma"
    # GB/s per rank over RDMA: Mooncake Transfer Engine README, 190 GB/s on 8 x 400 Gb/s RoCE
    # (40 GB transfers) = 23.75 GB/s per 400 Gb/s NIC, one NIC per GPU as on a DGX H100
    rdma_gbps: float = 23.75
    # seconds per transfer op over RDMA (one batch_transfer_sync per prefill chunk:
    # submit, completion, the done message) [estimate]
    rdma_latency_s: float = 20e-6
    # GB/s per rank over NVLink 4 within a node: 80 % of the H100's 450 GB/s per direction
    # [estimate]
    nvlink_gbps: float = 360.0
    # seconds per transfer op over NVLink (a cudaMemcpy launch is 3.5-4 us, HARDWARE.md C3)
    # [estimate]
    nvlink_latency_s: float = 5e-6
    # seconds from the decode server's pre-allocation to the prefill server seeing the request
    # bootstrapped (KVPoll.WaitingForInput: the ZMQ message with the KV indices) [estimate]
    bootstrap_s: float = 0.5e-3
    # seconds the first request of each prefill/decode pair adds (the decode side fetches the
    # prefill's bootstrap info over HTTP once, then caches it) [estimate]
    handshake_s: float = 5e-3
    # decode tokens reserved per request at pre-allocation (--num-reserved-decode-tokens,
    # SGLang 0.5.23 default 512, arg_groups/fields/disagg.py:109-112)
    num_reserved_decode_tokens: int = 512
    # a radix tree on the decode servers (--disaggregation-decode-enable-radix-cache, SGLang
    # 0.5.23 default off, arg_groups/fields/disagg.py:88-91): each decode server matches a
    # request's prompt in its own tree and the prefill server sends only the KV past that
    # prefix; with the decode role's cache.enable_host (--enable-hierarchical-cache on the
    # decode server, scheduler.py:520-523) host hits are loaded back there (sim.pd.decode_cache).
    # sglang.version 0.5.23 only
    decode_radix_cache: bool = False
    # the decode servers offload decoded KV to L3 (--disaggregation-decode-enable-offload-kvcache,
    # SGLang 0.5.23 default off, arg_groups/fields/disagg.py:92-94; needs a storage backend,
    # arg_groups/kv_cache_hook.py:399-405): the whole strides past the page-aligned prompt,
    # through the manager's own host pool, under the prefill side's page keys (sim.pd.offload)
    decode_offload_kvcache: bool = False
    # SGLANG_HICACHE_DECODE_OFFLOAD_STRIDE in tokens: 0 = the page size (its default), else
    # rounded down to whole pages, at least one (decode_kvcache_offload_manager.py:61-68)
    decode_offload_stride: int = 0
    # --disaggregation-decode-retraction-backup: where a retracted request's KV waits (auto =
    # SGLang 0.5.23's default: host_pool, or cpu_tensor with the decode radix cache or the
    # offload manager, mem_cache/kv_cache_builder.py:228-241); both copy synchronously
    # (sim.pd.retraction)
    decode_retraction_backup: str = "auto"

    def __post_init__(self) -> None:
        _between("pd.prefill_instances", self.prefill_instances, 1, 4096)
        _between("pd.decode_instances", self.decode_instances, 1, 4096)
        _choice("pd.prefill_router", self.prefill_router, PD_ROUTERS)
        _choice("pd.decode_router", self.decode_router, PD_ROUTERS)
        _at_least("pd.decode_offload_stride", self.decode_offload_stride, 0)
        _choice("pd.decode_retraction_backup", self.decode_retraction_backup, PD_RETRACTION_BACKUPS)
        _choice("pd.transfer", self.transfer, PD_TRANSFERS)
        _positive("pd.rdma_gbps", self.rdma_gbps)
        _positive("pd.nvlink_gbps", self.nvlink_gbps)
        _at_least("pd.rdma_latency_s", self.rdma_latency_s, 0.0)
        _at_least("pd.nvlink_latency_s", self.nvlink_latency_s, 0.0)
        _at_least("pd.bootstrap_s", self.bootstrap_s, 0.0)
        _at_least("pd.handshake_s", self.handshake_s, 0.0)
        _at_least("pd.num_reserved_decode_tokens", self.num_reserved_decode_tokens, 0)

    def role_overrides(self, role: str) -> list[str]:
        """The ``--set`` items of ``role`` (``"prefill"`` or ``"decode"``)."""
        text = self.prefill_set if role == "prefill" else self.decode_set
        return [item.strip() for item in text.split(";") if item.strip()]
