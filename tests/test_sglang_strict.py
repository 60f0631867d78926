"""``--sglang-args`` in SGLang's own language: the flags of the chosen version only (per-version
lists from the wheels), ``--lenient``, argparse's abbreviations, the model-path notes and
quantized names, ``--kv-cache-dtype`` / ``model.kv_dtype`` and ``model.weight_dtype`` through to
the pools and copy sizes, and case-insensitive GPU and model names."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from cli.main import main
from hicache import hardware
from hicache.config import load_config, resolve_pools
from hicache.sglang_args import (
    FLAG_DIR,
    FLAGS,
    IGNORED,
    format_sglang_command,
    match_model,
    parse_sglang_args,
    server_flags,
)
from hicache.versions import SGLANG_VERSIONS
from sim.costs import build_costs


def call(argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def overrides(flags: str, **kw: object) -> dict[str, str]:
    parsed = parse_sglang_args(flags, **kw)  # type: ignore[arg-type]
    return dict(item.split("=", 1) for item in parsed.overrides)


# --- the flag lists ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", list(SGLANG_VERSIONS))
def test_each_version_has_its_wheels_flag_list(version: str) -> None:
    text = (FLAG_DIR / f"{version}.txt").read_text(encoding="utf-8")
    assert f"SGLang {version} server flags" in text.splitlines()[0]
    assert f"sglang-{version} wheel" in text
    flags = server_flags(version)
    assert len(flags) > 400
    assert flags["--enable-hierarchical-cache"] == "switch" and flags["--page-size"] == ""
    assert all(name.startswith("--") for name in flags)


def test_modelled_and_ignored_flags_are_real_sglang_flags() -> None:
    every = {name for v in SGLANG_VERSIONS for name in server_flags(v)}
    assert all(name in every for f in FLAGS for name in f.names), [
        n for f in FLAGS for n in f.names if n not in every
    ]
    assert all(name in every for name in IGNORED), [n for n in IGNORED if n not in every]


# --- strict by default, lenient on request ---------------------------------------------------


def test_an_unknown_flag_is_refused_with_the_closest_real_ones() -> None:
    with pytest.raises(ValueError, match=r"^--tpp: not a flag of SGLang 0\.5\.23; did you mean "
                       r"--tp-size") as e:  # fmt: skip
        parse_sglang_args("--model-path Qwen/Qwen3-32B --tpp 2")
    assert "--lenient" in str(e.value)
    with pytest.raises(ValueError, match=r"did you mean --hicache-ratio"):
        parse_sglang_args("--enable-hierarchical-cache --hicache-ration 2")


def test_lenient_lists_an_unknown_flag_as_ignored() -> None:
    parsed = parse_sglang_args("--model-path Qwen/Qwen3-32B --tpp 2", lenient=True)
    ignored = dict(parsed.ignored)
    assert ignored["--tpp 2"].startswith("not a flag of SGLang 0.5.23; did you mean --tp-size")
    assert not any(item.startswith("model.tp=") for item in parsed.overrides)


def test_a_flag_of_the_other_version_is_refused_naming_it() -> None:
    flag = "--hicache-host-memory-fraction 0.5"
    assert overrides(flag)["cache.hicache_host_memory_fraction"] == "0.5"
    with pytest.raises(ValueError, match=r"not a flag of SGLang 0\.5\.14 \(SGLang 0\.5\.23 has it"):
        parse_sglang_args(flag, version="0.5.14")
    assert overrides("--enable-hicache")["cache.enable_host"] == "true"  # 0.5.23's alias
    with pytest.raises(ValueError, match=r"0\.5\.23 has it"):
        parse_sglang_args("--enable-hicache", version="0.5.14")
    lenient = parse_sglang_args(flag, version="0.5.14", lenient=True)
    assert flag in dict(lenient.ignored)


def test_a_retired_flag_says_what_replaced_it() -> None:
    with pytest.raises(ValueError, match="extra-config"):
        parse_sglang_args("--hicache-storage-backend-prefetch-threshold 256")


def test_abbreviations_follow_argparse() -> None:
    assert overrides("--tp 4")["model.tp"] == "4"  # the only flag --tp begins
    assert overrides("--tensor-parallel-size 2")["model.tp"] == "2"
    with pytest.raises(ValueError, match=r"--pp: ambiguous in SGLang 0\.5\.23: .*--pp-size"):
        parse_sglang_args("--pp 2")


def test_known_flags_take_the_values_their_arity_says() -> None:
    parsed = parse_sglang_args(
        "--enable-mixed-chunk --cuda-graph-bs 1 2 4 --page-size 16", version="0.5.14"
    )
    ignored = dict(parsed.ignored)
    assert ignored["--cuda-graph-bs 1 2 4"] == "not modelled by hicache-sim"
    # a switch takes no value: the next flag is not swallowed
    assert "scheduler.enable_mixed_chunk=true" in parsed.overrides
    assert "cache.page_size=16" in parsed.overrides


# --- the command line --------------------------------------------------------------------------


def test_cli_refuses_an_unknown_flag_in_one_line() -> None:
    rc, out, err = call(
        ["config", "sglang", "--sglang-args", "--model-path Qwen/Qwen3-32B --tpp 2"]
    )
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "hicache-sim: --sglang-args: --tpp: not a flag of SGLang 0.5.23; did you mean --tp-size, "
        "--dtype or --ep? (--lenient: list it as ignored instead)"
    ]
    rc, out, err = call(
        ["config", "sglang", "--lenient", "--sglang-args", "--model-path Qwen/Qwen3-32B --tpp 2"]
    )
    assert rc == 0 and "--tp-size 1 " in out
    assert any(
        line.startswith("note: --sglang-args: ignored --tpp 2: ") for line in err.splitlines()
    )


def test_the_version_is_resolved_before_the_flags_are_read(tmp_path: Path) -> None:
    flag = "--hicache-host-memory-fraction 0.5"
    rc, _, err = call(["config", "sglang", "--sglang-version", "0.5.14", "--sglang-args", flag])
    assert rc == 2 and "not a flag of SGLang 0.5.14" in err
    rc, _, err = call(["config", "sglang", "--set", "sglang.version=0.5.14", "--sglang-args", flag])
    assert rc == 2 and "not a flag of SGLang 0.5.14" in err
    toml = tmp_path / "c.toml"
    toml.write_text('[sglang]\nversion = "0.5.14"\n')
    rc, _, err = call(["config", "sglang", "--config", str(toml), "--sglang-args", flag])
    assert rc == 2 and "not a flag of SGLang 0.5.14" in err
    rc, _, err = call(["config", "sglang", "--config", str(toml), "--sglang-version", "0.5.23",
                       "--sglang-args", flag])  # fmt: skip
    assert rc == 0, err


# --- model paths -------------------------------------------------------------------------------


def test_a_preset_matched_by_name_says_so() -> None:
    parsed = parse_sglang_args("--model-path /models/qwen3-32b-ft")
    assert "model.name=qwen3-32b" in parsed.overrides
    assert (
        "--model-path /models/qwen3-32b-ft: matched preset qwen3-32b by name; give a checkpoint "
        "folder with config.json for its exact shape"
    ) in parsed.notes
    exact = parse_sglang_args("--model-path Qwen/Qwen3-32B")  # the preset's own checkpoint
    assert not any("matched preset" in n for n in exact.notes)


@pytest.mark.parametrize(
    ("path", "preset", "width"),
    [
        ("Qwen/Qwen3-32B-FP8", "qwen3-32b", "fp8"),
        ("Qwen/Qwen3-32B-AWQ", "qwen3-32b", "int4"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4", "qwen2.5-72b", "int4"),
        ("Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8", "qwen2.5-72b", "int8"),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ", "qwen2.5-7b", "int4"),
        ("neuralmagic/Meta-Llama-3-8B-Instruct-FP8", "llama-3-8b", "fp8"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b", ""),
    ],
)
def test_quantized_names_keep_their_weight_width(path: str, preset: str, width: str) -> None:
    match = match_model(path)
    assert (match.model, match.weight_dtype, match.how) == (preset, width, "name")
    parsed = parse_sglang_args(["--model-path", path])
    got = dict(item.split("=", 1) for item in parsed.overrides)
    assert got.get("model.weight_dtype", "") == width
    note = next(n for n in parsed.notes if "matched preset" in n)
    assert (f"with {width} weights" in note) == bool(width)


def test_a_quantization_the_name_cannot_size_is_refused() -> None:
    with pytest.raises(ValueError, match="nvfp4 checkpoint"):
        match_model("nvidia/Qwen3-32B-NVFP4")


def test_quantization_flag_sets_the_weight_width() -> None:
    assert (
        overrides("--model-path Qwen/Qwen3-32B --quantization fp8")["model.weight_dtype"] == "fp8"
    )
    parsed = parse_sglang_args("--model-path Qwen/Qwen3-32B --quantization awq")
    assert "model.weight_dtype=int4" in parsed.overrides
    assert any("4-bit weights assumed" in n for n in parsed.notes)
    # the name's bits win over the 4-bit assumption
    got = overrides("--quantization gptq --model-path Qwen/Qwen2.5-72B-Instruct-GPTQ-Int8")
    assert got["model.weight_dtype"] == "int8"
    ignored = dict(parse_sglang_args("--quantization gguf").ignored)
    assert "not modelled" in ignored["--quantization gguf"]


# --- KV and weight dtypes through to the pools -------------------------------------------------


def test_fp8_kv_halves_the_bytes_per_token_and_doubles_the_pool() -> None:
    base = load_config(None, ["model.name=qwen3-32b", "cache.hicache_size_gb=100"])
    fp8 = load_config(
        None,
        ["cache.hicache_size_gb=100",
         *parse_sglang_args("--model-path Qwen/Qwen3-32B --kv-cache-dtype fp8_e4m3 "
                            "--enable-hierarchical-cache").overrides],
    )  # fmt: skip
    assert fp8.model.kv_dtype == "fp8_e4m3"
    dev0, host0, bpt0 = resolve_pools(base)
    dev1, host1, bpt1 = resolve_pools(fp8)
    assert bpt1 * 2 == bpt0 == hardware.kv_bytes_per_token(base.model.spec)
    # the device pool: the same free HBM over half the bytes per token
    gpu, page = hardware.get_gpu(base.gpu.name), base.cache.page_size
    raw = hardware.device_pool_tokens(fp8.model.spec, gpu, 1, base.gpu.mem_fraction, 1e9)
    assert dev1 == raw // page * page and abs(dev1 - 2 * dev0) <= 2 * page
    assert abs(host1 - 2 * host0) <= 2 * page  # 100 GB of host holds twice the tokens
    assert build_costs(fp8).bytes_per_page * 2 == build_costs(base).bytes_per_page


def test_fp8_weights_free_hbm_for_the_kv_pool() -> None:
    base = load_config(None, ["model.name=qwen3-32b"])
    fp8 = load_config(None, parse_sglang_args("--model-path Qwen/Qwen3-32B-FP8").overrides)
    assert fp8.model.weight_dtype == "fp8"
    assert resolve_pools(fp8)[2] == resolve_pools(base)[2]  # KV stays bf16 (auto)
    w0 = hardware.weight_bytes_per_rank(base.model.spec)
    w1 = hardware.weight_bytes_per_rank(fp8.model.spec)
    emb = base.model.spec.embedding_params * 2  # embeddings stay 16-bit
    assert math.isclose(w1 - emb, (w0 - emb) / 2)
    gained = (resolve_pools(fp8)[0] - resolve_pools(base)[0]) * resolve_pools(base)[2]
    assert abs(gained - (w0 - w1)) < 2 * 64 * resolve_pools(base)[2]


def test_kv_dtype_values_and_the_flags_printed_back() -> None:
    assert overrides("--kv-cache-dtype bfloat16")["model.kv_dtype"] == "bf16"
    with pytest.raises(ValueError, match=r"--kv-cache-dtype fp8: not modelled \(did you mean "):
        parse_sglang_args("--kv-cache-dtype fp8")
    with pytest.raises(ValueError, match="not modelled"):
        parse_sglang_args("--kv-cache-dtype fp4_e2m1")
    cfg = load_config(None, ["model.kv_dtype=fp8_e5m2", "model.weight_dtype=fp8"])
    line = format_sglang_command(cfg).splitlines()[0]
    assert "--kv-cache-dtype fp8_e5m2" in line and "--quantization fp8" in line
    again = load_config(None, parse_sglang_args(line).overrides)
    assert again.model == cfg.model
    plain = format_sglang_command(load_config()).splitlines()[0]
    assert "--kv-cache-dtype" not in plain and "--quantization" not in plain
    int4 = format_sglang_command(load_config(None, ["model.weight_dtype=int4"]))
    assert "model.weight_dtype=int4: serve a checkpoint quantized to it" in int4


def test_config_keys_document_the_dtypes() -> None:
    rc, out, _ = call(["config", "keys"])
    assert rc == 0
    assert 'model.kv_dtype = "auto"  (str; SGLang --kv-cache-dtype)' in out
    assert 'model.weight_dtype = "auto"' in out


# --- GPU and model names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "name"), [("H200", "h200"), ("h100", "h100-sxm"), ("H100", "h100-sxm"),
                        ("A100", "a100-80gb"), ("GH200", "gh200")],
)  # fmt: skip
def test_gpu_names_ignore_case(given: str, name: str) -> None:
    assert load_config(None, [f"gpu.name={given}"]).gpu.name == name
    assert hardware.get_gpu(given).name == name


def test_unknown_names_get_suggestions() -> None:
    with pytest.raises(ValueError, match=r"gpu\.name: unknown gpu 'b200'; did you mean h200"):
        load_config(None, ["gpu.name=b200"])
    with pytest.raises(ValueError, match=r"unknown model 'qwen3-33b'; did you mean qwen3-32b"):
        load_config(None, ["model.name=qwen3-33b"])
    assert load_config(None, ["model.name=Qwen3-32B"]).model.name == "qwen3-32b"
