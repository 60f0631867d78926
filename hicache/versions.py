"""The SGLang releases whose cache hicache-sim reproduces, and what each one selects.

One registry line per version: the policy core that decides (a folder under
``hicache/policy``) and the facts a user should know before choosing. ``sglang.version`` in the
config, ``--sglang-version`` on the command line.
"""

from __future__ import annotations

#: version -> (the policy core, what differs from the previous supported version)
SGLANG_VERSIONS: dict[str, tuple[str, str]] = {
    "0.5.14": (
        "hicache.policy.hiradix.HiRadixCache",
        "HiRadixCache (SGLang <= 0.5.18): the cache this tool was first built against; its "
        "L3 tier counts the 0.5.14 defects it avoids; the oracle eviction bound",
    ),
    "0.5.23": (
        "hicache.policy.v0523.UnifiedRadixCache",
        "UnifiedRadixCache (SGLang >= 0.5.19): eviction frees the shortfall only; write-through "
        "backs up unbacked ancestors; hits follow a per-request inserted-length watermark "
        "(write_through_selective backs up far less); finished requests split at the prompt "
        "boundary; write_back backs up and demotes one victim at a time, drops the subtree when "
        "the host is full and reclaims host duplicates first; load_back locks the whole chain; "
        "device->host writes are merged per scheduler step; the default host pool shrinks to "
        "fit the server's free DRAM (--hicache-host-memory-fraction) and may be smaller than "
        "the device pool; tlru eviction; admission picks whole, chunk or "
        "wait before loading back, and touches the waiting queue's prefixes every 32 passes "
        "under lru; L3: hit-sized host pages after the query, insertion at the completion ack, "
        "the timeout (1 s + 0.25 s per 1,024 requested tokens) from the first blocked poll, "
        "retries every 8 passes up to 8, a rate limit at half the host pool",
    ),
}

#: The version a run uses when none is given: the newest supported (what SGLang's users run).
DEFAULT_SGLANG_VERSION = "0.5.23"


def check_version(version: str) -> str:
    """``version`` if supported, else ``ValueError`` naming the choices."""
    if version not in SGLANG_VERSIONS:
        raise ValueError(
            f"unknown SGLang version {version!r}; choose one of {', '.join(SGLANG_VERSIONS)}"
        )
    return version
