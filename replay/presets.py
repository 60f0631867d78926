"""Map a CUDA device name to the ``hicache.hardware`` GPU preset it is (standard library only, so
``calibrate`` can use it without torch)."""

from __future__ import annotations


def gpu_preset_for(name: str) -> str | None:
    """The ``hicache.hardware`` GPU preset for a CUDA device name (``"NVIDIA H200"`` -> ``"h200"``),
    or None if there is none."""
    n = name.upper()
    # GH200 before H200: "GH200" contains "H200"
    for needle, preset in (
        ("GH200", "gh200"),
        ("H200", "h200"),
        ("H100", "h100-sxm"),
        ("A100", "a100-80gb"),
    ):
        if needle in n:
            return preset
    return None


__all__ = ["gpu_preset_for"]
