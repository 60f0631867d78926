"""SGLang's launch flags <-> the simulator's config.

:func:`parse_sglang_args` reads the flags of an SGLang 0.5.x launch command (``python -m
sglang.launch_server --model-path ... --page-size 64 --enable-hierarchical-cache ...``) as the
chosen SGLang version's own parser would: a flag that version does not have (a typo, another
release's flag) is refused with the closest real ones, unless ``lenient`` (then it is listed as
ignored); a unique prefix stands for its flag (``--tp`` is ``--tp-size``), as argparse allows.
The flags of each version are data, extracted from its wheel (``hicache/data/sglang_flags/``,
:func:`server_flags`). It returns the ``section.key=value`` overrides they mean
(:data:`FLAGS`: every flag the simulator models, with its config key and conversion), and every
other flag with the reason it is ignored (:data:`IGNORED`, or "not modelled").
:func:`sglang_flags` goes the other way: a resolved config as the flags to paste into a launch
command.

Flags absent from the command keep the simulator's defaults (``hicache-sim config keys``), except
``--enable-hierarchical-cache``: a command without it runs SGLang's plain radix cache, so the
host tier is turned off (and the parse result says so).

Standard library only (plus the model presets of :mod:`hicache.hardware`).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hicache.hardware import MODELS
from hicache.model_config import or_list
from hicache.versions import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS, check_version

__all__ = [
    "FLAGS",
    "IGNORED",
    "MODEL_IDS",
    "Flag",
    "ModelMatch",
    "SglangArgs",
    "flag_for_key",
    "format_sglang_command",
    "key_flags",
    "match_model",
    "model_preset",
    "parse_sglang_args",
    "server_flags",
    "sglang_flags",
]


# --- the flags each SGLang version has ---------------------------------------------------------

#: ``<version>.txt``: one flag per line, ``--name`` (takes a value), ``--name switch`` (none) or
#: ``--name list`` (one or more), written from the wheel by ``conformance/sglang_flags.py``.
FLAG_DIR = Path(__file__).resolve().parent / "data" / "sglang_flags"


@functools.cache
def server_flags(version: str) -> Mapping[str, str]:
    """Every server flag SGLang ``version`` accepts (aliases included) -> its arity: ``""``
    (one value), ``"switch"`` (no value) or ``"list"`` (one or more values). ``ValueError``
    for a version that is not supported."""
    check_version(version)
    flags: dict[str, str] = {}
    for line in (FLAG_DIR / f"{version}.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, arity = line.partition(" ")
            flags[name] = arity.strip()
    return flags


#: Flags of no supported version that users still write, and what to write instead.
_RETIRED = {
    "--hicache-storage-backend-prefetch-threshold": "an older release's flag; 0.5.14 and 0.5.23 "
    "read --hicache-storage-backend-extra-config '{\"prefetch_threshold\": N}'",
}


def _closest(given: str, names: Sequence[str] | Mapping[str, str], n: int = 3) -> list[str]:
    """Up to ``n`` names closest to ``given`` (difflib's ratio, 0.6 at least), each compared
    whole and, when the first letters agree, cut to ``given``'s length, so a typo in an
    abbreviation finds its flag (``--tpp`` -> ``--tp-size``)."""
    scored = []
    for name in names:
        score = difflib.SequenceMatcher(None, given, name).ratio()
        if name[:3] == given[:3]:  # the whole name wins a tie
            cut = difflib.SequenceMatcher(None, given, name[: len(given)]).ratio()
            score = max(score, cut * 0.95)
        if score >= 0.6:
            scored.append((-score, name))
    return [name for _, name in sorted(scored)[:n]]


def _resolve_flag(given: str, version: str) -> str:
    """The flag of SGLang ``version`` that ``given`` names: itself, or the only flag it is a
    prefix of (argparse's ``allow_abbrev``, on in SGLang's parser: ``--tp`` is ``--tp-size``).
    ``ValueError`` (one line) for a flag the version does not have, with the version that has
    it or the closest names, and for a prefix of several flags (argparse refuses it too)."""
    known = server_flags(version)
    if given in known:
        return given
    starts = [name for name in known if name.startswith(given)] if len(given) > 2 else []
    if len(starts) == 1:
        return starts[0]
    if starts:
        raise ValueError(f"{given}: ambiguous in SGLang {version}: {or_list(sorted(starts)[:6])}"
                         f"{', ...' if len(starts) > 6 else ''}")  # fmt: skip
    others = [v for v in SGLANG_VERSIONS if v != version and given in server_flags(v)]
    if others:
        raise ValueError(
            f"{given}: not a flag of SGLang {version} (SGLang {or_list(others)} has it; choose "
            f"that release with --sglang-version {others[-1]})"
        )
    if given in _RETIRED:
        raise ValueError(f"{given}: not a flag of SGLang {version} ({_RETIRED[given]})")
    close = _closest(given, known)
    hint = f"; did you mean {or_list(close)}?" if close else ""
    raise ValueError(f"{given}: not a flag of SGLang {version}{hint}")


# --- conversions: the SGLang value (text) -> the --set value (text) ---------------------------


def _int(flag: str, text: str) -> str:
    try:
        return str(int(text))
    except ValueError:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if math.isfinite(x) and x.is_integer():
            return str(int(x))
    raise ValueError(f"{flag}: expected an integer, got {text!r}")


def _float(flag: str, text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ValueError(f"{flag}: expected a number, got {text!r}")
    return repr(x)


def _text(flag: str, text: str) -> str:
    if not text:
        raise ValueError(f"{flag}: expected a value")
    return text


#: ``--kv-cache-dtype`` values -> ``model.kv_dtype`` (``bfloat16`` is SGLang's alias of bf16).
KV_CACHE_DTYPES = {"auto": "auto", "bf16": "bf16", "bfloat16": "bf16", "fp8_e4m3": "fp8_e4m3",
                   "fp8_e5m2": "fp8_e5m2"}  # fmt: skip


def _kv_dtype(flag: str, text: str) -> str:
    dtype = KV_CACHE_DTYPES.get(text)
    if dtype is None:
        close = difflib.get_close_matches(text, KV_CACHE_DTYPES, n=2, cutoff=0.5)
        hint = f" (did you mean {or_list(close)}?)" if close else ""
        raise ValueError(
            f"{flag} {text}: not modelled{hint}; modelled: {', '.join(KV_CACHE_DTYPES)} (SGLang's "
            "FP4 and MX recipes keep per-block scales the simulator does not size)"
        )
    return dtype


#: ``--quantization`` methods -> the weight width (``model.weight_dtype``) they serve at. AWQ and
#: GPTQ read the width from the checkpoint: 4-bit unless its name says ``Int8``.
QUANT_WIDTHS = {
    "fp8": "fp8", "w8a8_fp8": "fp8", "modelopt_fp8": "fp8", "fbgemm_fp8": "fp8",
    "w8a8_int8": "int8",
    "awq": "", "awq_marlin": "", "gptq": "", "gptq_marlin": "", "moe_wna16": "",
}  # fmt: skip


#: SGLang storage backend names -> the preset that stands for them (STORAGE_BACKENDS).
STORAGE_PRESETS = {"file": "file", "hf3fs": "3fs", "3fs": "3fs", "mooncake": "mooncake"}

#: extra-config keys HiCache reads (STORAGE_TIER.md §6.2) -> config keys.
EXTRA_CONFIG_KEYS = {
    "prefetch_threshold": "storage.prefetch_threshold",
    "prefetch_timeout_base": "storage.prefetch_timeout_base",
    "prefetch_timeout_per_ki_token": "storage.prefetch_timeout_per_ki_token",
    "prefetch_timeout_max": "storage.prefetch_timeout_max",
}


def _storage_backend(flag: str, text: str) -> str:
    preset = STORAGE_PRESETS.get(text)
    if preset is None:
        raise ValueError(
            f"{flag}: no preset for the {text!r} backend (presets: file, hf3fs, mooncake); "
            "pick the closest with --set storage.backend=... and set its bandwidth with "
            "storage.read_gbps_override / storage.write_gbps_override"
        )
    return preset


def extra_config_overrides(flag: str, text: str) -> tuple[list[str], list[str]]:
    """``--hicache-storage-backend-extra-config``'s JSON: the overrides of the keys HiCache
    reads, and a note for each other key (the backend's own settings)."""
    if text.startswith("@"):
        raise ValueError(f"{flag}: '@file' is not read here; pass the JSON itself")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag}: not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{flag}: expected a JSON object")
    overrides, notes = [], []
    for key, value in data.items():
        dotted = EXTRA_CONFIG_KEYS.get(key)
        if dotted is None:
            notes.append(f"{flag}: {key!r} is the backend's own setting, not modelled")
            continue
        convert = _int if key == "prefetch_threshold" else _float
        overrides.append(f"{dotted}={convert(f'{flag} {key}', str(value))}")
    return overrides, notes


@dataclass(frozen=True)
class Flag:
    """An SGLang flag the simulator models: its names, the config key it sets, and how its
    value converts (``None``: a switch, which sets the key to ``true``)."""

    names: tuple[str, ...]
    key: str
    convert: Callable[[str, str], str] | None
    note: str = ""


#: Every SGLang flag the simulator models -> its config key.
FLAGS: tuple[Flag, ...] = (
    Flag(("--model-path", "--model"), "model.name", _text,
         "a Hugging Face id or local path, mapped to a model preset"),
    Flag(("--tp-size", "--tensor-parallel-size"), "model.tp", _int, "--tp: an abbreviation"),
    Flag(("--ep-size", "--expert-parallel-size", "--ep"), "model.ep", _int,
         "MoE layers, with the standard token dispatcher (--moe-a2a-backend none)"),
    Flag(("--kv-cache-dtype",), "model.kv_dtype", _kv_dtype,
         "auto, bf16/bfloat16, fp8_e4m3, fp8_e5m2"),
    Flag(("--quantization",), "model.weight_dtype", _text,
         "fp8, w8a8_fp8, modelopt_fp8: 1-byte weights; w8a8_int8; awq/gptq: the checkpoint's bits"),
    Flag(("--page-size",), "cache.page_size", _int),
    Flag(("--enable-hierarchical-cache", "--enable-hicache"), "cache.enable_host", None,
         "absent: the host tier is off, as in SGLang (--enable-hicache: 0.5.23's alias)"),
    Flag(("--hicache-ratio",), "cache.hicache_ratio", _float),
    Flag(("--hicache-size",), "cache.hicache_size_gb", _float,
         "GB per rank; > 0 wins over the ratio"),
    Flag(("--hicache-host-memory-fraction",), "cache.hicache_host_memory_fraction", _float,
         "0.5.21+: the share of free host RAM the default host pool may take"),
    Flag(("--hicache-write-policy",), "cache.write_policy", _text),
    Flag(("--hicache-host-memory-mode",), "cache.host_memory_mode", _text,
         "0.5.19+: cache (host RAM is the L2 tier) or buffer_only (it only stages L3 copies)"),
    Flag(("--hicache-io-backend",), "link.io_backend", _text),
    Flag(("--hicache-mem-layout",), "link.mem_layout", _text),
    Flag(("--radix-eviction-policy",), "cache.eviction", _text),
    Flag(("--radix-eviction-policy-config",), "cache.eviction_policy_config", _text,
         "0.5.20+: the strategy's JSON parameters (slru, tlru)"),
    Flag(("--max-total-tokens",), "gpu.device_tokens", _int,
         "the device pool exactly (rounded down to a page multiple, as SGLang does)"),
    Flag(("--mem-fraction-static",), "gpu.mem_fraction", _float),
    Flag(("--schedule-policy",), "scheduler.policy", _text),
    Flag(("--schedule-conservativeness",), "scheduler.schedule_conservativeness", _float),
    Flag(("--chunked-prefill-size",), "scheduler.chunked_prefill_size", _int),
    Flag(("--max-prefill-tokens",), "scheduler.max_prefill_tokens", _int),
    Flag(("--enable-mixed-chunk",), "scheduler.enable_mixed_chunk", None),
    Flag(("--context-length",), "workload.max_context", _int),
    Flag(("--allow-auto-truncate",), "workload.auto_truncate", None),
    Flag(("--max-running-requests",), "scheduler.max_running_requests", _int),
    Flag(("--hicache-storage-backend",), "storage.backend", _storage_backend,
         "file, hf3fs (preset 3fs) or mooncake; others have no preset"),
    Flag(("--hicache-storage-prefetch-policy",), "storage.prefetch_policy", _text),
    # a decode server's flags (they act in a PD run, pd.enabled, on its decode role)
    Flag(("--disaggregation-decode-enable-radix-cache",), "pd.decode_radix_cache", None,
         "PD decode servers: their own radix cache (0.5.23 here)"),
    Flag(("--disaggregation-decode-enable-offload-kvcache",), "pd.decode_offload_kvcache", None,
         "PD decode servers: decoded KV offloaded to L3"),
    Flag(("--disaggregation-decode-retraction-backup",), "pd.decode_retraction_backup", _text,
         "0.5.23: host_pool or cpu_tensor"),
    Flag(("--num-reserved-decode-tokens",), "pd.num_reserved_decode_tokens", _int,
         "PD decode servers: tokens reserved per request at pre-allocation"),
)  # fmt: skip

#: SGLang 0.5.19+'s host mode: ``cache`` (the default) or ``buffer_only`` (host RAM only stages
#: L3 copies), ``cache.host_memory_mode``.
HOST_MODE_FLAG = "--hicache-host-memory-mode"

#: A flag whose JSON value sets several keys (see :func:`extra_config_overrides`).
EXTRA_CONFIG_FLAG = "--hicache-storage-backend-extra-config"

_BY_NAME: dict[str, Flag] = {n: f for f in FLAGS for n in f.names}

_NO_EFFECT = "no effect on what the simulator models (cache, copies, scheduling)"
_COMPUTE = "compute times come from the latency profile, not from kernel settings"
_NOT_MODELLED = "not modelled by hicache-sim"

#: SGLang flags that are deliberately ignored -> why (any other flag of the version: "not
#: modelled").
IGNORED: dict[str, str] = {
    "--disable-radix-cache": "not modelled: the simulator always runs the radix cache",
    "--dtype": "every model is served in 16 bits (bf16 and fp16 take the same bytes); the KV "
    "and weight widths are --kv-cache-dtype and model.weight_dtype",
    "--dp-size": "one data-parallel replica is simulated",
    "--enable-dp-attention": "one data-parallel replica is simulated",
    "--pp-size": "pipeline parallelism is not modelled",
    "--random-seed": "a sampling seed: the simulator does not sample (run.seed is its own)",
    "--attention-backend": _COMPUTE,
    "--sampling-backend": _COMPUTE,
    "--cuda-graph-max-bs": _COMPUTE,
    "--disable-cuda-graph": _COMPUTE,
    "--enable-torch-compile": _COMPUTE,
    "--disable-overlap-schedule": "the overlap scheduler's CPU/GPU overlap is not modelled",
    "--disable-custom-all-reduce": _COMPUTE,
    "--host": _NO_EFFECT,
    "--port": _NO_EFFECT,
    "--api-key": _NO_EFFECT,
    "--log-level": _NO_EFFECT,
    "--log-requests": _NO_EFFECT,
    "--enable-metrics": _NO_EFFECT,
    "--enable-cache-report": _NO_EFFECT,
    "--served-model-name": _NO_EFFECT,
    "--tokenizer-path": _NO_EFFECT,
    "--trust-remote-code": _NO_EFFECT,
    "--skip-tokenizer-init": _NO_EFFECT,
    "--chat-template": _NO_EFFECT,
}

#: Model preset -> the Hugging Face id :func:`sglang_flags` prints for it.
MODEL_IDS: dict[str, str] = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "phi-2": "microsoft/phi-2",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
}

# (pattern on the normalised last path component, preset); first match wins. Llama 3.1/3.3
# and DeepSeek-R1 have the shapes of Llama 3 and DeepSeek-V3.
_MODEL_PATTERNS = (
    (r"^llama-?3(\.\d+)?-8b", "llama-3-8b"),
    (r"^llama-?3(\.\d+)?-70b", "llama-3-70b"),
    (r"^qwen3-235b-a22b", "qwen3-235b-a22b"),
    (r"^qwen3-32b", "qwen3-32b"),
    (r"^qwen3-8b", "qwen3-8b"),
    (r"^qwen3-0\.6b", "qwen3-0.6b"),
    (r"^deepseek-(v3|r1)", "deepseek-v3"),
    (r"^llama-?2-7b", "llama-2-7b"),
    (r"^llama-?2-70b", "llama-2-70b"),
    (r"^codellama-34b", "codellama-34b"),
    (r"^phi-2", "phi-2"),
    (r"^mixtral-8x7b", "mixtral-8x7b"),
    (r"^qwen3-30b-a3b", "qwen3-30b-a3b"),
    (r"^qwen2\.5-7b", "qwen2.5-7b"),
    (r"^qwen2\.5-72b", "qwen2.5-72b"),
)


# A quantized checkpoint's name suffix -> its weight width (model.weight_dtype): FP8 (Qwen's and
# NVIDIA's -FP8, -FP8-Dynamic), 8-bit (GPTQ-Int8, W8A8) and 4-bit (AWQ, GPTQ, GPTQ-Int4, W4A16).
_QUANT_SUFFIXES = (
    (r"-fp8\b", "fp8", "FP8"),
    (r"-gptq-int8\b|-int8\b|-w8a8\b|-8bit\b", "int8", "8-bit"),
    (r"-awq\b|-gptq(-int4)?\b|-int4\b|-w4a16\b|-4bit\b", "int4", "4-bit"),
)
# quantizations whose bytes the simulator cannot size from the name (block scales, GGUF mixes)
_UNSIZED = r"-(nvfp4|mxfp4|fp4|gguf|exl2)\b"


class ModelMatch(NamedTuple):
    """What ``--model-path`` stands for: the ``model.name`` value (a preset, or a checkpoint
    folder holding ``config.json``), the weight width its name implies (``""``: the model's
    own) and how it was found (``"preset"``, ``"checkpoint"`` or ``"name"``: by pattern)."""

    model: str
    weight_dtype: str
    how: str

    def note(self, path: str) -> str | None:
        """The note a user should read about this match, or None."""
        if self.how != "name":
            return None
        width = f" with {self.weight_dtype} weights (model.weight_dtype={self.weight_dtype})"
        return (
            f"--model-path {path}: matched preset {self.model} by name"
            f"{width if self.weight_dtype else ''}; give a checkpoint folder with config.json "
            "for its exact shape"
        )


def match_model(path: str, flag: str = "--model-path") -> ModelMatch:
    """The model a Hugging Face id or local path stands for: a preset by its name (any case), a
    folder holding ``config.json`` (read as is), or a preset whose name pattern matches the last
    path component (``meta-llama/Meta-Llama-3-8B-Instruct`` -> ``llama-3-8b``), with the weight
    width a quantized checkpoint's suffix gives (``Qwen/Qwen3-32B-FP8`` -> ``qwen3-32b``,
    ``fp8``; AWQ and GPTQ 4-bit, GPTQ-Int8 8-bit). ``ValueError`` listing the presets when
    there is none, or for a quantization whose bytes the name does not give."""
    if path in MODELS:
        return ModelMatch(path, "", "preset")
    local = Path(path).expanduser()
    if (local / "config.json").is_file():  # a local checkpoint: read its config.json
        return ModelMatch(str(local), "", "checkpoint")
    name = path.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    exact = {hf_id.lower(): preset for preset, hf_id in MODEL_IDS.items()}
    if path.lower() in exact:  # the checkpoint the preset's config.json is
        return ModelMatch(exact[path.lower()], "", "preset")
    if path.lower() in MODELS:
        return ModelMatch(path.lower(), "", "preset")
    name = name.removeprefix("meta-")
    preset = next((p for pattern, p in _MODEL_PATTERNS if re.search(pattern, name)), None)
    if preset is None or preset not in MODELS:
        raise ValueError(
            f"{flag}: {path!r} is not a model the simulator has a preset for; presets: "
            f"{', '.join(MODELS)} (set one with --set model.name=NAME, or a checkpoint folder "
            "with its config.json)"
        )
    unsized = re.search(_UNSIZED, name)
    if unsized:
        raise ValueError(
            f"{flag}: {path!r}: a {unsized.group(1)} checkpoint, whose weight bytes the name does "
            "not give; give its checkpoint folder (config.json), or --set "
            f"model.name={preset} and model.weight_dtype"
        )
    width = next((w for pattern, w, _ in _QUANT_SUFFIXES if re.search(pattern, name)), "")
    return ModelMatch(preset, width, "name")


def model_preset(path: str, flag: str = "--model-path") -> str:
    """The ``model.name`` of a Hugging Face id or local path (:func:`match_model`'s model)."""
    return match_model(path, flag).model


@dataclass
class SglangArgs:
    """What :func:`parse_sglang_args` made of a launch command."""

    overrides: list[str] = field(default_factory=list)
    """``section.key=value`` items, in command order (the last of a repeated flag wins)."""
    origin: dict[str, str] = field(default_factory=dict)
    """config key -> the flag (with its value) that set it, for error messages."""
    ignored: list[tuple[str, str]] = field(default_factory=list)
    """(flag as given, why it is ignored)."""
    notes: list[str] = field(default_factory=list)


def _tokens(args: str | Sequence[str]) -> list[str]:
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError as e:  # an unclosed quote
            raise ValueError(f"cannot split the arguments: {e}") from None
    return list(args)


def _skip_launcher(tokens: list[str]) -> tuple[list[str], list[str]]:
    """Drop ``python -m sglang.launch_server`` (or any words before the first flag)."""
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            return tokens[:i], tokens[i:]
    return tokens, []


def _weight_width(
    widths: Mapping[str, tuple[str, str]], values: dict[str, tuple[str, str]], out: SglangArgs
) -> None:
    """``model.weight_dtype`` from ``--quantization`` (a width it names wins) and the
    checkpoint's name (which gives AWQ's and GPTQ's bits); 4-bit when neither says."""
    flag, name = widths.get("flag"), widths.get("name")
    if flag is not None and flag[0]:
        values["model.weight_dtype"] = flag
    elif name is not None:
        values["model.weight_dtype"] = name
    elif flag is not None:
        values["model.weight_dtype"] = ("int4", flag[1])
        out.notes.append(f"{flag[1]}: 4-bit weights assumed (model.weight_dtype=int4); --set "
                         "model.weight_dtype=int8 for an 8-bit checkpoint")  # fmt: skip


def _value(tokens: list[str], i: int, arity: str | None) -> tuple[str | None, int]:
    """The value after a flag (and the next index): none for a switch, every token up to the next
    flag for a list, else the next token unless it is a flag. ``arity`` None: a flag the version
    does not know, taken to have one value when one follows."""
    if arity == "switch":
        return None, i
    j = i
    while j < len(tokens) and not tokens[j].startswith("--") and (j == i or arity == "list"):
        j += 1
    return (" ".join(tokens[i:j]) if j > i else None), j


def parse_sglang_args(
    args: str | Sequence[str],
    page_size: int | None = None,
    *,
    version: str = DEFAULT_SGLANG_VERSION,
    lenient: bool = False,
) -> SglangArgs:
    """The config overrides an SGLang launch command means (see the module docstring).

    ``args``: the flags as one string (split like a shell) or as a list; a leading launcher
    (``python -m sglang.launch_server``) is skipped. ``version``: the SGLang release whose flags
    are read (``sglang.version``); a flag it does not have raises ``ValueError`` with the
    closest ones, or with ``lenient`` is listed as ignored. ``--max-total-tokens`` is rounded
    down to a multiple of the command's ``--page-size`` (else ``page_size``, else 64).
    ``ValueError`` (one line, naming the flag) for a value that cannot be converted or a model
    without a preset; ranges are checked when the overrides are loaded (``hicache.config``).
    """
    known = server_flags(version)
    out = SglangArgs()
    launcher, tokens = _skip_launcher(_tokens(args))
    if launcher:
        out.ignored.append((" ".join(launcher), "the launcher, not a flag"))
    values: dict[str, tuple[str, str]] = {}  # key -> (value, flag text)
    widths: dict[str, tuple[str, str]] = {}  # "name" / "flag" -> (weight width, flag text)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            out.ignored.append((tok, "not a flag (a value without one?)"))
            continue
        given, eq, inline = tok.partition("=")
        try:
            name: str | None = _resolve_flag(given, version)
        except ValueError as e:
            if not lenient:
                raise ValueError(f"{e} (--lenient: list it as ignored instead)") from None
            name, why = None, str(e).removeprefix(f"{given}: ")
        else:
            why = ""
        value: str | None = inline if eq else None
        if value is None:
            value, i = _value(tokens, i, known.get(name) if name else None)
        shown = given if value is None else f"{given} {value}"
        if name is None:
            out.ignored.append((shown, f"{why} (--lenient)"))
            continue
        flag = _BY_NAME.get(name)
        if name == EXTRA_CONFIG_FLAG and value is not None:
            extra, notes = extra_config_overrides(name, value)
            for item in extra:
                key, _, text = item.partition("=")
                values[key] = (text, shown)
            out.notes += notes
            continue
        if flag is None:
            out.ignored.append((shown, IGNORED.get(name, _NOT_MODELLED)))
            continue
        if flag.convert is None:
            if value is not None and value.lower() not in ("true", "1"):
                raise ValueError(f"{given}: a switch takes no value, got {value!r}")
            values[flag.key] = ("true", given)
            continue
        if value is None:
            raise ValueError(f"{given}: expected a value")
        if flag.key == "model.name":
            match = match_model(value, given)
            values[flag.key] = (match.model, shown)
            widths.pop("name", None)
            if match.weight_dtype:
                widths["name"] = (match.weight_dtype, shown)
            note = match.note(value)
            if note:
                out.notes.append(note)
        elif flag.key == "model.weight_dtype":
            if value not in QUANT_WIDTHS:
                out.ignored.append((shown, f"the weight width of {value!r} is not modelled (set "
                                           "model.weight_dtype)"))  # fmt: skip
                continue
            widths["flag"] = (QUANT_WIDTHS[value], shown)
        else:
            values[flag.key] = (flag.convert(given, value), shown)
    _weight_width(widths, values, out)
    if "cache.enable_host" not in values:
        values["cache.enable_host"] = ("false", "(no --enable-hierarchical-cache)")
        out.notes.append(
            "no --enable-hierarchical-cache: the host tier is off (cache.enable_host=false), "
            "as in SGLang"
        )
    if "gpu.device_tokens" in values:
        text, shown = values["gpu.device_tokens"]
        page = int(values["cache.page_size"][0]) if "cache.page_size" in values else page_size
        page = page if page and page > 0 else 64
        tokens_ = int(text)
        if tokens_ < page:  # 0 would mean "derive from HBM": not what the flag says
            raise ValueError(f"{shown}: less than one page ({page} tokens)")
        if tokens_ % page:
            rounded = tokens_ // page * page
            out.notes.append(
                f"--max-total-tokens {tokens_} rounded down to {rounded} (a multiple of the page "
                f"size {page}), as SGLang does"
            )
            values["gpu.device_tokens"] = (str(rounded), shown)
    if "cache.page_size" not in values:
        out.notes.append(
            "no --page-size: SGLang would use 1; the simulator keeps cache.page_size (64 "
            "unless set)"
        )
    for key, (text, shown) in values.items():
        out.overrides.append(f"{key}={text}")
        out.origin[key] = shown
    return out


# --- config -> flags -------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else repr(x)


#: scheduler keys SGLang reads from environment variables (name, config key).
_ENV = (
    ("SGLANG_INIT_NEW_TOKEN_RATIO", "init_new_token_ratio"),
    ("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", "min_new_token_ratio_factor"),
    ("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "new_token_ratio_decay_steps"),
    ("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "clip_max_new_tokens"),
    ("SGLANG_RETRACT_DECODE_STEPS", "retract_decode_steps"),
)


def _dtype_flags(m: Any, comments: list[str]) -> list[str]:
    """``--kv-cache-dtype`` and ``--quantization`` for ``model.kv_dtype`` / ``weight_dtype``
    (a ``hicache.config.ModelConfig``); a note for a width no flag gives."""
    from hicache.hardware import WEIGHT_DTYPE_BYTES, get_model

    flags = [] if m.kv_dtype == "auto" else ["--kv-cache-dtype", m.kv_dtype]
    native = get_model(m.config or m.name).weight_dtype_bytes
    if m.weight_dtype == "auto" or WEIGHT_DTYPE_BYTES[m.weight_dtype] == native:
        return flags
    if m.weight_dtype == "fp8":
        return [*flags, "--quantization", "fp8"]  # SGLang quantizes the weights at load
    comments.append(
        f"model.weight_dtype={m.weight_dtype}: serve a checkpoint quantized to it (AWQ/GPTQ; "
        "SGLang reads the width from the checkpoint, no flag)"
    )
    return flags


def sglang_flags(cfg: Any) -> tuple[list[str], list[str], list[str]]:
    """A resolved ``hicache.config.SimConfig`` as ``(flags, env, comments)``: the SGLang
    launch flags it stands for, the ``NAME=value`` environment settings of scheduler knobs
    that differ from SGLang's defaults, and notes on what is not a flag (hardware, a derived
    device pool, hard-coded constants)."""
    from hicache.config import SchedulerConfig

    m, c, s, g, lk = cfg.model, cfg.cache, cfg.scheduler, cfg.gpu, cfg.link
    source = m.config or m.name
    path = str(Path(source).parent) if source.endswith(".json") else source
    flags = ["--model-path", MODEL_IDS.get(path, path), "--tp-size", str(m.tp)]
    if m.ep > 1:
        flags += ["--ep-size", str(m.ep)]
    comments = [f"hardware: {g.name} over {lk.name} (not a flag)"]
    flags += _dtype_flags(m, comments)
    flags += ["--page-size", str(c.page_size), "--mem-fraction-static", _num(g.mem_fraction)]
    if g.device_tokens:
        flags += ["--max-total-tokens", str(g.device_tokens)]
    else:
        from hicache.config import resolve_pools

        device, _, _ = resolve_pools(cfg)
        comments.append(
            f"device pool derived from HBM: {device:,} tokens (an estimate; SGLang sizes its "
            f"own, add --max-total-tokens {device} to pin it)"
        )
    if c.enable_host:
        flags += ["--enable-hierarchical-cache"]
        if c.hicache_ratio > 0:
            flags += ["--hicache-ratio", _num(c.hicache_ratio)]
        if cfg.sglang.version != "0.5.14" and c.hicache_host_memory_fraction != 0.8:
            flags += ["--hicache-host-memory-fraction", _num(c.hicache_host_memory_fraction)]
        if c.hicache_size_gb > 0:
            flags += ["--hicache-size", _num(c.hicache_size_gb)]
        if c.host_memory_mode != "cache":
            flags += [HOST_MODE_FLAG, c.host_memory_mode]
        from hicache.config import auto_size, resolve_pools

        device, _, bpt = resolve_pools(cfg)
        sized = auto_size(cfg, device, bpt)
        if sized is not None:
            comments.append(sized.describe())
        flags += [
            "--hicache-write-policy", c.write_policy,
            "--hicache-io-backend", lk.io_backend,
            "--hicache-mem-layout", lk.mem_layout,
        ]  # fmt: skip
    flags += ["--radix-eviction-policy", c.eviction, "--schedule-policy", s.policy]
    if c.eviction_policy_config.strip():
        flags += ["--radix-eviction-policy-config", c.eviction_policy_config]
    flags += ["--chunked-prefill-size", str(s.chunked_prefill_size)]
    flags += ["--max-prefill-tokens", str(s.max_prefill_tokens)]
    if s.enable_mixed_chunk:
        flags += ["--enable-mixed-chunk"]
    w = cfg.workload
    if w.max_context:
        flags += ["--context-length", str(w.max_context)]
        if w.auto_truncate:
            flags += ["--allow-auto-truncate"]
    if s.max_running_requests:
        flags += ["--max-running-requests", str(s.max_running_requests)]
    if s.schedule_conservativeness != 1.0:
        flags += ["--schedule-conservativeness", _num(s.schedule_conservativeness)]
    default = SchedulerConfig()
    env = [
        f"{name}={_num(getattr(s, key))}"
        for name, key in _ENV
        if getattr(s, key) != getattr(default, key)
    ]
    st = cfg.storage
    if st.enabled:
        backend = {"3fs": "hf3fs"}.get(st.backend, st.backend)
        flags += ["--hicache-storage-backend", backend]
        flags += ["--hicache-storage-prefetch-policy", st.prefetch_policy]
        extra = {
            name: getattr(st, key.split(".")[1])
            for name, key in EXTRA_CONFIG_KEYS.items()
            if getattr(st, key.split(".")[1]) != getattr(type(st)(), key.split(".")[1])
        }
        if extra:
            flags += [EXTRA_CONFIG_FLAG, json.dumps(extra, separators=(",", ":"))]
        comments.append(
            f"storage: the {st.backend} preset's figures stand for your backend (unmeasured; "
            "hicache.storage_backends)"
        )
    pd = cfg.pd
    if pd.enabled:  # what a decode server's command line adds
        dec = ["--disaggregation-mode", "decode",
               "--num-reserved-decode-tokens", str(pd.num_reserved_decode_tokens)]  # fmt: skip
        if pd.decode_radix_cache:
            dec += ["--disaggregation-decode-enable-radix-cache"]
        if pd.decode_offload_kvcache:
            dec += ["--disaggregation-decode-enable-offload-kvcache"]
        if pd.decode_retraction_backup != "auto":
            dec += ["--disaggregation-decode-retraction-backup", pd.decode_retraction_backup]
        comments.append("decode servers add: " + " ".join(dec))
    if c.load_back_threshold != 10:
        comments.append(
            f"cache.load_back_threshold={c.load_back_threshold} is hard-coded (10) in SGLang "
            "0.5.14: no flag"
        )
    return flags, env, comments


def format_sglang_command(cfg: Any, prefix: str = "python -m sglang.launch_server") -> str:
    """:func:`sglang_flags` as one pasteable line (environment settings first), followed by
    its notes as ``#`` comment lines."""
    flags, env, comments = sglang_flags(cfg)
    line = " ".join([*env, prefix, *(shlex.quote(f) for f in flags)])
    return "\n".join([line, *(f"# {c}" for c in comments)])


def flag_for_key(key: str) -> str | None:
    """The SGLang flag that sets config key ``key`` (``cache.hicache_ratio`` ->
    ``--hicache-ratio``), or None."""
    for f in FLAGS:
        if f.key == key:
            return f.names[0]
    return None


def key_flags() -> Mapping[str, str]:
    """Config key -> the SGLang flag that sets it."""
    return {f.key: f.names[0] for f in FLAGS}
