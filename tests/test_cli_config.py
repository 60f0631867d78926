"""``hicache-sim config keys`` / ``config sglang``, ``--sglang-args`` (:mod:`hicache.sglang_args`),
and what ``run`` and ``hitrate`` now say: the resolved config as SGLang flags, the write_back
note, rounded capacities."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from cli.main import main
from hicache.config import SECTIONS, load_config
from hicache.config.keys import format_keys, key_docs
from hicache.sglang_args import (
    FLAGS,
    IGNORED,
    format_sglang_command,
    model_preset,
    parse_sglang_args,
    sglang_flags,
)
from sim.hitrate import WRITE_BACK_NOTE, write_back_ignores_hit_counts

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"
TRACE = DATA / "synthetic" / "multiturn.jsonl"

ISSUE_COMMAND = (
    "python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct --tp 8 "
    "--page-size 64 --enable-hierarchical-cache --hicache-ratio 2 --hicache-write-policy "
    "write_back --hicache-io-backend kernel --hicache-mem-layout page_first "
    "--chunked-prefill-size 8192 --max-running-requests 128 --mem-fraction-static 0.85 "
    "--host 0.0.0.0 --port 30000 --hicache-storage-backend hf3fs --enable-metrics "
    "--frobnicate 3"
)


def call(argv: Sequence[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


# --- config keys -----------------------------------------------------------------------------


def test_config_keys_lists_every_field_with_its_default_and_meaning() -> None:
    rc, out, err = call(["config", "keys"])
    assert rc == 0 and err == ""
    for name, cls in SECTIONS.items():
        assert f"[{name}]" in out
        for f in dataclasses.fields(cls):
            assert f"  {name}.{f.name} = " in out, f.name
    docs = key_docs()
    assert len(docs) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values())
    assert all(d.doc for d in docs), [d.dotted for d in docs if not d.doc]
    # the SGLang flag that sets a key is named beside it
    assert "cache.hicache_ratio = 0.0  (float; SGLang --hicache-ratio)" in out
    assert "[choices: write_through, write_through_selective, write_back]" in out.replace(
        "\n      ", " "
    )
    # then what each SGLang version changes
    tail = out.split("SGLang versions (sglang.version, --sglang-version):")[1]
    assert "0.5.14: HiRadixCache" in tail and "0.5.23: UnifiedRadixCache" in tail


def test_config_keys_json_matches_the_defaults() -> None:
    rc, out, _ = call(["config", "keys", "--json"])
    assert rc == 0
    rows = {r["section"] + "." + r["key"]: r for r in json.loads(out)}
    cfg = load_config()
    for dotted, row in rows.items():
        section, key = dotted.split(".")
        if dotted != "link.name":  # "" in the section, filled in from the GPU by SimConfig
            assert getattr(getattr(cfg, section), key) == row["default"], dotted
    assert rows["gpu.device_tokens"]["sglang_flag"] == "--max-total-tokens"
    assert rows["workload.rate_scale"]["sglang_flag"] is None
    assert format_keys().count("\n[") == len(SECTIONS) - 1


# --- SGLang flags -> config ------------------------------------------------------------------


def test_the_issue_command_maps_every_modelled_flag() -> None:
    with pytest.raises(ValueError, match=r"--frobnicate: not a flag of SGLang 0\.5\.23"):
        parse_sglang_args(ISSUE_COMMAND)
    parsed = parse_sglang_args(ISSUE_COMMAND, lenient=True)
    cfg = load_config(None, parsed.overrides)
    assert (cfg.model.name, cfg.model.tp, cfg.cache.page_size) == ("llama-3-8b", 8, 64)
    assert cfg.cache.enable_host and cfg.cache.hicache_ratio == 2.0
    assert (cfg.cache.write_policy, cfg.link.io_backend, cfg.link.mem_layout) == (
        "write_back", "kernel", "page_first",
    )  # fmt: skip
    assert cfg.scheduler.chunked_prefill_size == 8192
    assert cfg.scheduler.max_running_requests == 128
    assert cfg.gpu.mem_fraction == 0.85
    ignored = dict(parsed.ignored)
    assert ignored["python -m sglang.launch_server"] == "the launcher, not a flag"
    assert cfg.storage.backend == "3fs"  # hf3fs: the 3FS preset
    assert ignored["--frobnicate 3"] == "not a flag of SGLang 0.5.23 (--lenient)"
    assert "--enable-metrics" in ignored and "--host 0.0.0.0" in ignored


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("--max-total-tokens 123456 --page-size 32", {"gpu.device_tokens": 123456}),
        ("--max-total-tokens=1e5", {"gpu.device_tokens": 99968}),  # page 64, as SGLang rounds
        ("--hicache-size 300 --enable-hierarchical-cache", {"cache.hicache_size_gb": 300.0}),
        ("--enable-hierarchical-cache --hicache-ratio 3.5", {"cache.hicache_ratio": 3.5}),
        ("--schedule-policy lpm", {"scheduler.policy": "lpm"}),
        ("--max-prefill-tokens 4096", {"scheduler.max_prefill_tokens": 4096}),
        ("--page-size 16", {"cache.page_size": 16}),
        ("--tp-size 2", {"model.tp": 2}),
        ("--tp 4", {"model.tp": 4}),
        ("--radix-eviction-policy lfu", {"cache.eviction": "lfu"}),
        ("--chunked-prefill-size -1", {"scheduler.chunked_prefill_size": -1}),
        ("--schedule-conservativeness 0.5", {"scheduler.schedule_conservativeness": 0.5}),
        ("--page-size 64", {"cache.enable_host": False}),  # no HiCache flag: plain radix cache
    ],
)
def test_each_modelled_flag(flags: str, expected: dict[str, object]) -> None:
    cfg = load_config(None, parse_sglang_args(flags).overrides)
    for dotted, value in expected.items():
        section, key = dotted.split(".")
        assert getattr(getattr(cfg, section), key) == value, dotted


def test_every_flag_maps_to_a_real_key_and_ignored_flags_say_why() -> None:
    keys = {d.dotted for d in key_docs()}
    assert all(f.key in keys for f in FLAGS)
    assert all(why for why in IGNORED.values())
    assert "--hicache-storage-backend" not in IGNORED  # modelled since the L3 tier


def test_storage_flags_and_extra_config_round_trip() -> None:
    flags = (
        "--enable-hierarchical-cache --hicache-storage-backend mooncake "
        "--hicache-storage-prefetch-policy best_effort --hicache-storage-backend-extra-config "
        '\'{"prefetch_threshold": 512, "prefetch_timeout_max": 10, "master": "x:1"}\''
    )
    parsed = parse_sglang_args(flags)
    cfg = load_config(None, ["sglang.version=0.5.14", *parsed.overrides])  # the cap: 0.5.14's
    st = cfg.storage
    assert (st.backend, st.prefetch_policy) == ("mooncake", "best_effort")
    assert (st.prefetch_threshold, st.prefetch_timeout_max) == (512, 10.0)
    assert any("'master'" in n for n in parsed.notes)
    again = load_config(
        None,
        ["sglang.version=0.5.14",
         *parse_sglang_args(format_sglang_command(cfg).splitlines()[0]).overrides],
    )  # fmt: skip
    assert again.storage == st
    with pytest.raises(ValueError, match="no preset for the 'nixl' backend"):
        parse_sglang_args("--hicache-storage-backend nixl")
    with pytest.raises(ValueError, match="not JSON"):
        parse_sglang_args("--hicache-storage-backend-extra-config '{bad'")


@pytest.mark.parametrize(
    ("path", "preset"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b"),
        ("/models/Meta-Llama-3-70B/", "llama-3-70b"),
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"),
        ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
        ("qwen3-32b", "qwen3-32b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ],
)
def test_model_paths_map_to_presets(path: str, preset: str) -> None:
    assert model_preset(path) == preset


def test_a_local_checkpoint_is_read_from_its_config_json(tmp_path: Path) -> None:
    """`--model-path DIR` with DIR/config.json runs that model; printed back as flags, the
    config names the same folder."""
    ckpt = tmp_path / "my-model"
    ckpt.mkdir()
    src = Path(__file__).resolve().parent.parent / "hicache/model_configs/qwen3-8b.json"
    (ckpt / "config.json").write_text(src.read_text(), encoding="utf-8")
    assert model_preset(str(ckpt)) == str(ckpt)
    cfg = load_config(None, parse_sglang_args(["--model-path", str(ckpt), "--tp", "2"]).overrides)
    assert cfg.model.spec.num_layers == 36 and cfg.model.tp == 2
    flags, _, _ = sglang_flags(cfg)
    assert flags[:2] == ["--model-path", str(ckpt)]
    via_config = load_config(None, [f"model.config={ckpt / 'config.json'}"])
    assert sglang_flags(via_config)[0][:2] == ["--model-path", str(ckpt)]


def test_an_unknown_model_lists_the_presets() -> None:
    with pytest.raises(ValueError, match=r"--model-path: 'acme/Frob-7B' .*presets: .*llama-3-8b"):
        model_preset("acme/Frob-7B")


def test_set_wins_over_sglang_args_and_both_win_over_the_file(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("[cache]\npage_size = 32\nwrite_policy = 'write_back'\n")
    argv = ["config", "sglang", "--config", str(toml),
            "--sglang-args", "--page-size 16 --enable-hierarchical-cache --tp 2",
            "--set", "model.tp=4"]  # fmt: skip
    rc, out, err = call(argv)
    assert rc == 0, err
    assert "--page-size 16 " in out and "--tp-size 4 " in out
    assert "--hicache-write-policy write_back" in out  # the file's, untouched by the flags


def test_a_bad_sglang_value_names_the_flag() -> None:
    rc, _, err = call(["config", "sglang", "--sglang-args", "--page-size 64 --tp 0"])
    assert rc == 2 and err.startswith("hicache-sim: --sglang-args --tp 0: model.tp: must be >= 1")


# --- config -> SGLang flags ------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["cache.write_policy=write_back", "gpu.device_tokens=65536", "model.tp=2"],
        ["cache.enable_host=false", "scheduler.policy=lpm", "cache.page_size=16"],
        [
            "cache.hicache_size_gb=200",
            "link.io_backend=direct",
            "scheduler.max_running_requests=64",
        ],
        ["model.name=qwen3-32b", "model.tp=2", "scheduler.chunked_prefill_size=-1"],
    ],
)
def test_flags_round_trip(overrides: list[str]) -> None:
    """A config printed as SGLang flags and read back is the same config (for every key a flag
    sets), so a what-if result pastes into a launch command."""
    cfg = load_config(None, overrides)
    flags, env, _ = sglang_flags(cfg)
    again = load_config(None, parse_sglang_args(flags).overrides)
    assert again.model == cfg.model and again.link == cfg.link
    assert again.scheduler == cfg.scheduler
    assert dataclasses.replace(again.cache, hicache_size_gb=cfg.cache.hicache_size_gb) == cfg.cache
    assert again.gpu.mem_fraction == cfg.gpu.mem_fraction
    assert again.gpu.device_tokens == cfg.gpu.device_tokens
    assert env == []


def test_the_command_line_notes_what_is_not_a_flag() -> None:
    cfg = load_config(None, ["scheduler.init_new_token_ratio=0.5", "cache.load_back_threshold=4"])
    text = format_sglang_command(cfg)
    first, *notes = text.splitlines()
    assert first.startswith("SGLANG_INIT_NEW_TOKEN_RATIO=0.5 python -m sglang.launch_server")
    assert any("derived from HBM" in n for n in notes)
    assert any("load_back_threshold=4 is hard-coded" in n for n in notes)


def test_run_prints_the_config_as_sglang_flags(tmp_path: Path) -> None:
    argv = ["run", str(TRACE), "--out", str(tmp_path / "r"), "--set", "workload.max_requests=20",
            "--sglang-args", "--page-size 64 --enable-hierarchical-cache --max-total-tokens 65536 "
            "--hicache-write-policy write_back --host 0.0.0.0"]  # fmt: skip
    rc, out, err = call(argv)
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("as SGLang flags: "))
    assert "--max-total-tokens 65536" in line and "--hicache-write-policy write_back" in line
    assert err.splitlines() == [
        "note: --sglang-args: ignored --host 0.0.0.0: no effect on what the simulator models "
        "(cache, copies, scheduling)"
    ]
    conf = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert conf["gpu"]["device_tokens"] == 65536 and conf["cache"]["write_policy"] == "write_back"


# --- hitrate ---------------------------------------------------------------------------------


def test_write_back_note_when_lfu_equals_lru() -> None:
    rows = [{"eviction": "lfu", "write_policy": "write_back"}]
    assert write_back_ignores_hit_counts(rows) == WRITE_BACK_NOTE
    assert (
        write_back_ignores_hit_counts([{"eviction": "lfu", "write_policy": "write_through"}])
        is None
    )
    assert (
        write_back_ignores_hit_counts([{"eviction": "lru", "write_policy": "write_back"}]) is None
    )
    argv = ["hitrate", str(TRACE), "--device-tokens", "8192", "--eviction", "lru,lfu",
            "--write-policy", "write_back", "--json"]  # fmt: skip
    rc, out, _ = call(argv)
    data = json.loads(out)
    lru, lfu = data["rows"]
    assert rc == 0 and data["note"] == WRITE_BACK_NOTE
    assert {k: v for k, v in lru.items() if k != "eviction"} == {
        k: v for k, v in lfu.items() if k != "eviction"
    }
    rc, out, _ = call(argv[:-1])
    assert out.rstrip().endswith(f"note: {WRITE_BACK_NOTE}")
    rc, out, _ = call(["hitrate", "--help"])  # --help returns 0 in-process
    assert rc == 0 and "never counts hits" in out


def test_device_tokens_in_scientific_notation_round_down_to_pages() -> None:
    rc, out, err = call(["hitrate", str(TRACE), "--device-tokens", "1e4", "--json"])
    assert rc == 0
    assert json.loads(out)["rows"][0]["device_tokens"] == 9984
    assert (
        err
        == "note: --device-tokens 10000 rounded down to 9,984 (a multiple of the page size 64)\n"
    )
