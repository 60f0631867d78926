"""Configuration: defaults, TOML, overrides, validation, pool resolution (`hicache.config`)."""

from __future__ import annotations

import json
import math
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.config import (
    OUTPUT_MODES,
    SECTIONS,
    CacheConfig,
    ConfigError,
    HostMemoryError,
    SimConfig,
    auto_size,
    config_from_dict,
    config_to_dict,
    load_config,
    resolve_pools,
    with_overrides,
)
from hicache.hardware import get_model, weight_bytes_per_rank
from hicache.policy import STRATEGIES, WRITE_POLICIES


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_load_without_a_file() -> None:
    cfg = load_config()
    assert cfg == SimConfig()
    assert (cfg.model.name, cfg.model.tp) == ("llama-3-8b", 1)
    assert (cfg.gpu.name, cfg.gpu.mem_fraction, cfg.gpu.device_tokens) == ("h100-sxm", 0.9, 0)
    # "" resolves to the GPU's link
    assert (cfg.link.name, cfg.link.io_backend, cfg.link.mem_layout) == (
        "pcie5-x16",
        "kernel",
        "page_first",
    )
    c = cfg.cache
    # hicache_ratio 0: not given, SGLang's default (2.0; 0.5.23 may shrink it to fit DRAM)
    assert (c.page_size, c.write_policy, c.eviction, c.hicache_ratio) == (
        64,
        "write_through",
        "lru",
        0.0,
    )
    assert c.hicache_host_memory_fraction == 0.8
    assert (c.hicache_size_gb, c.enable_host, c.load_back_threshold) == (0.0, True, 10)
    s = cfg.scheduler
    assert (s.policy, s.chunked_prefill_size, s.max_prefill_tokens) == ("fcfs", 8192, 16384)
    assert (s.init_new_token_ratio, s.min_new_token_ratio_factor) == (0.7, 0.14)
    assert (s.new_token_ratio_decay_steps, s.clip_max_new_tokens, s.retract_decode_steps) == (
        600,
        4096,
        20,
    )
    assert (cfg.workload.closed_loop, cfg.workload.outputs) == ("auto", "cache")
    assert (cfg.run.seed, cfg.run.profile, cfg.run.chrome_trace) == (0, "", False)


def test_gpu_link_defaults_follow_the_gpu() -> None:
    assert load_config(None, ["gpu.name=gh200"]).link.name == "nvlink-c2c"
    assert load_config(None, ["gpu.name=a100-80gb"]).link.name == "pcie4-x16"


def test_choice_lists_match_the_policy_core_and_hitrate() -> None:
    from sim import hitrate

    assert OUTPUT_MODES == hitrate.OUTPUT_MODES
    for wp in WRITE_POLICIES:
        assert load_config(None, [f"cache.write_policy={wp}"]).cache.write_policy == wp
    for ev in STRATEGIES:
        assert load_config(None, [f"cache.eviction={ev}"]).cache.eviction == ev


def test_toml_file_and_round_trip(tmp_path: Path) -> None:
    path = _toml(
        tmp_path,
        """
[model]
name = "qwen3-8b"
[gpu]
name = "h200"
device_tokens = 1e6  # an integral float is accepted for an int key
[cache]
page_size = 32
write_policy = "write_back"
hicache_ratio = 3  # an int is accepted for a float key
enable_host = true
[scheduler]
chunked_prefill_size = -1
[run]
seed = 7
chrome_trace = true
""",
    )
    cfg = load_config(path)
    assert cfg.model.name == "qwen3-8b"
    assert cfg.gpu.device_tokens == 1_000_000 and isinstance(cfg.gpu.device_tokens, int)
    assert cfg.cache.hicache_ratio == 3.0 and isinstance(cfg.cache.hicache_ratio, float)
    assert (cfg.cache.page_size, cfg.cache.write_policy) == (32, "write_back")
    assert (cfg.scheduler.chunked_prefill_size, cfg.run.seed, cfg.run.chrome_trace) == (-1, 7, True)
    data = json.loads(json.dumps(config_to_dict(cfg)))
    assert config_from_dict(data) == cfg
    assert set(data) == set(SECTIONS)


def test_overrides_parse_by_type_and_win_over_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[cache]\npage_size = 32\n")
    cfg = load_config(
        path,
        [
            "cache.page_size=16",  # int
            "gpu.device_tokens=1e6",  # integral float text for an int
            "cache.hicache_ratio=2.5",  # float
            "gpu.mem_fraction=1",  # int text for a float
            "cache.enable_host=false",  # bool
            "run.chrome_trace=1",  # bool as 1
            "workload.closed_loop=off",  # str
            "run.profile='my profile.json'",  # quoted str
            "scheduler.chunked_prefill_size=-1",  # negative int
            " workload.rate_scale = 2 ",  # spaces
        ],
    )
    assert cfg.cache.page_size == 16
    assert cfg.gpu.device_tokens == 1_000_000
    assert cfg.cache.hicache_ratio == 2.5
    assert cfg.gpu.mem_fraction == 1.0
    assert cfg.cache.enable_host is False
    assert cfg.run.chrome_trace is True
    assert cfg.workload.closed_loop == "off"
    assert cfg.run.profile == "my profile.json"
    assert cfg.scheduler.chunked_prefill_size == -1
    assert cfg.workload.rate_scale == 2.0
    for text, expected in [("TRUE", True), ("0", False), ("False", False)]:
        assert load_config(None, [f"run.chrome_trace={text}"]).run.chrome_trace is expected


def test_with_overrides() -> None:
    base = load_config(None, ["cache.page_size=32"])
    cfg = with_overrides(base, ["cache.write_policy=write_back"])
    assert (cfg.cache.page_size, cfg.cache.write_policy) == (32, "write_back")
    with pytest.raises(ConfigError, match=r"--set cache.page_size=0: cache.page_size"):
        with_overrides(base, ["cache.page_size=0"])


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("cache.pagesize=64", "--set cache.pagesize=64: cache.pagesize: unknown key; cache has:"),
        ("cahce.page_size=64", "cahce.page_size: unknown section 'cahce'; choices: model"),
        ("cache.page_size", "cache.page_size: expected section.key=value"),
        ("page_size=64", "page_size: expected section.key"),
        ("cache.page_size=abc", "cache.page_size: expected an integer, got 'abc'"),
        ("cache.page_size=1.5", "cache.page_size: expected an integer, got '1.5'"),
        ("cache.hicache_ratio=lots", "cache.hicache_ratio: expected a number"),
        ("cache.hicache_ratio=inf", "cache.hicache_ratio: expected a finite number"),
        ("cache.enable_host=yes", "cache.enable_host: expected true/false/1/0"),
    ],
)
def test_bad_overrides_name_the_key(item: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cache]\npagesize = 64\n", "run.toml: cache.pagesize: unknown key"),
        ("[caches]\npage_size = 64\n", "run.toml: caches: unknown section; choices:"),
        ("seed = 1\n", "run.toml: seed: unknown section"),
        ("[cache]\npage_size = '64'\n", "run.toml: cache.page_size: expected an integer"),
        ("[cache]\npage_size = true\n", "run.toml: cache.page_size: expected an integer"),
        ("[cache]\nenable_host = 1\n", "run.toml: cache.enable_host: expected true or false"),
        ("[model]\nname = 8\n", "run.toml: model.name: expected a string"),
        ("[cache]\npage_size = 0\n", "run.toml: cache.page_size: must be >= 1, got 0"),
        ("[cache\n", "run.toml: invalid TOML"),
    ],
)
def test_bad_toml_names_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_toml(tmp_path, text))
    assert message in str(e.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"nope.toml: cannot read config"):
        load_config("nope.toml")


@pytest.mark.parametrize(
    ("item", "field", "fragment"),
    [
        ("model.name=gpt-5", "model.name", "unknown model 'gpt-5'; choices: codellama-34b"),
        ("model.tp=0", "model.tp", ">= 1"),
        ("model.tp=3", "model.tp", "does not split"),
        ("gpu.name=tpu", "gpu.name", "choices: a100-80gb, gh200, h100-sxm, h200"),
        ("gpu.mem_fraction=0", "gpu.mem_fraction", "in (0, 1]"),
        ("gpu.mem_fraction=1.1", "gpu.mem_fraction", "in (0, 1]"),
        ("gpu.reserve_gb=-1", "gpu.reserve_gb", ">= 0"),
        ("gpu.device_tokens=-64", "gpu.device_tokens", ">= 0"),
        ("gpu.device_tokens=1000", "gpu.device_tokens", "multiple of cache.page_size (64)"),
        ("link.name=pcie9", "link.name", "choices: nvlink-c2c, pcie4-x16, pcie5-x16"),
        ("link.name=pcie4-x16", "link.name", "no shipped latency profile"),
        ("link.io_backend=dma", "link.io_backend", "one of: kernel, direct"),
        ("link.mem_layout=page_first_kv_split", "link.mem_layout", "one of: layer_first"),
        ("link.mem_layout=page_first_direct", "link.mem_layout", "needs io_backend=direct"),
        ("cache.page_size=0", "cache.page_size", ">= 1"),
        ("cache.write_policy=write_around", "cache.write_policy", "write_through_selective"),
        ("cache.eviction=random", "cache.eviction", "lru"),
        ("cache.hicache_ratio=1", "cache.hicache_ratio", "must be > 1"),
        ("cache.hicache_ratio=-1", "cache.hicache_ratio", "must be >= 0"),
        ("cache.hicache_host_memory_fraction=0", "cache.hicache_host_memory_fraction", "0.01"),
        ("gpu.host_memory_gb=-1", "gpu.host_memory_gb", ">= 0"),
        ("cache.hicache_size_gb=-1", "cache.hicache_size_gb", ">= 0"),
        ("cache.hicache_size_gb=1", "cache.hicache_size_gb", "must be larger than the device"),
        ("cache.load_back_threshold=-1", "cache.load_back_threshold", ">= 0"),
        ("scheduler.policy=lof", "scheduler.policy", "one of: fcfs, lpm"),
        ("scheduler.chunked_prefill_size=0", "scheduler.chunked_prefill_size", "-1 (off)"),
        ("scheduler.chunked_prefill_size=32", "scheduler.chunked_prefill_size", ">= 64"),
        ("scheduler.chunked_prefill_size=100", "scheduler.chunked_prefill_size", "multiple"),
        ("scheduler.max_prefill_tokens=0", "scheduler.max_prefill_tokens", ">= 1"),
        ("scheduler.max_running_requests=-1", "scheduler.max_running_requests", ">= 0"),
        ("scheduler.init_new_token_ratio=1.5", "scheduler.init_new_token_ratio", "(0, 1]"),
        ("scheduler.min_new_token_ratio_factor=0", "scheduler.min_new_token_ratio_factor", "(0"),
        ("scheduler.new_token_ratio_decay_steps=0", "scheduler.new_token_ratio_decay_steps", "1"),
        ("scheduler.schedule_conservativeness=0", "scheduler.schedule_conservativeness", "> 0"),
        ("scheduler.clip_max_new_tokens=0", "scheduler.clip_max_new_tokens", ">= 1"),
        ("scheduler.retract_decode_steps=-1", "scheduler.retract_decode_steps", ">= 0"),
        ("workload.rate_scale=0", "workload.rate_scale", "[1e-06, 1e+06]"),
        ("workload.max_requests=-1", "workload.max_requests", ">= 0"),
        ("workload.closed_loop=maybe", "workload.closed_loop", "auto, on, off"),
        ("workload.outputs=all", "workload.outputs", "cache, skip"),
        ("run.seed=-1", "run.seed", ">= 0"),
        ("run.timeline_max_rows=-1", "run.timeline_max_rows", ">= 0"),
    ],
)
def test_range_errors_name_the_field_and_the_allowed_values(
    item: str, field: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as e:
        # 0.5.14's rules (a host pool larger than the device); 0.5.23's are tested below
        load_config(None, ["sglang.version=0.5.14", item])
    assert e.value.field == field
    assert str(e.value).startswith(f"--set {item}: {field}: ")
    assert fragment in str(e.value)
    assert isinstance(e.value, ValueError)


def test_direct_io_turns_page_first_into_page_first_direct() -> None:
    # SGLang's _handle_hicache does the same
    cfg = load_config(None, ["link.io_backend=direct"])
    assert (cfg.link.io_backend, cfg.link.mem_layout) == ("direct", "page_first_direct")
    assert config_from_dict(config_to_dict(cfg)) == cfg
    layer = load_config(None, ["link.io_backend=direct", "link.mem_layout=layer_first"])
    assert layer.link.mem_layout == "layer_first"


def test_a_calibrated_profile_allows_any_link() -> None:
    cfg = load_config(None, ["link.name=pcie4-x16", "run.profile=calib.json"])
    assert cfg.link.name == "pcie4-x16"


def test_sections_validate_on_construction_too() -> None:
    with pytest.raises(ConfigError, match=r"cache.page_size"):
        CacheConfig(page_size=0)
    with pytest.raises(ConfigError, match=r"gpu.device_tokens"):
        SimConfig(gpu=load_config().gpu.__class__(device_tokens=100))


# --- pools -------------------------------------------------------------------------------------


def test_resolve_pools_explicit_device_tokens() -> None:
    cfg = load_config(None, ["gpu.device_tokens=100032"])  # 1563 pages of 64
    device, host, bpt = resolve_pools(cfg)
    assert (device, bpt) == (100_032, 131_072)
    # SGLang: floor(100032 * 2 / 64) + 1 pages
    assert host == (200_064 // 64 + 1) * 64 == 200_128


def test_resolve_pools_sglang_examples() -> None:
    # POLICY_CORE.md §4.2: 100,000-token pool, ratio 2, page 1 -> 200,001 host tokens
    cfg = load_config(None, ["cache.page_size=1", "gpu.device_tokens=100000"])
    assert resolve_pools(cfg)[:2] == (100_000, 200_001)
    # --hicache-size 100 for Llama-3-8B -> 762,939 + 1 tokens
    cfg = load_config(None, ["cache.page_size=1", "cache.hicache_size_gb=100"])
    assert resolve_pools(cfg)[1] == 762_940


def test_resolve_pools_derived_from_hbm() -> None:
    device, host, bpt = resolve_pools(load_config())
    w8 = weight_bytes_per_rank(get_model("llama-3-8b"))  # 2 x 8,030,261,248 params
    raw = math.floor((81559 * 2**20 * 0.9 - w8 - 1e9) / 131_072)  # H100: 81,559 MiB
    assert device == raw // 64 * 64 == 457_024
    assert host == (2 * device // 64 + 1) * 64
    assert bpt == 131_072
    # TP8 70B: 40 KiB/token per rank
    device70, _, bpt70 = resolve_pools(load_config(None, ["model.name=llama-3-70b", "model.tp=8"]))
    assert bpt70 == 40 * 1024
    w70 = weight_bytes_per_rank(get_model("llama-3-70b"), 8)
    assert device70 == math.floor((81559 * 2**20 * 0.9 - w70 - 1e9) / bpt70) // 64 * 64


def test_resolve_pools_without_host_tier() -> None:
    cfg = load_config(None, ["cache.enable_host=false", "cache.hicache_ratio=0.5"])
    assert resolve_pools(cfg)[1] == 0


def test_pool_that_cannot_be_sized_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"gpu.device_tokens: derived from HBM: .*no KV cache"):
        load_config(None, ["model.name=llama-3-70b"])
    # setting the pool explicitly is the way out
    cfg = load_config(None, ["model.name=llama-3-70b", "gpu.device_tokens=6400"])
    assert resolve_pools(cfg)[0] == 6400


def test_config_and_errors_pickle() -> None:
    # sweeps ship configs to worker processes and errors back
    cfg = load_config(None, ["cache.page_size=32"])
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    err = ConfigError("cache.page_size", "must be >= 1", "--set cache.page_size=0")
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.problem, back.source, str(back)) == (
        err.field,
        err.problem,
        err.source,
        str(err),
    )


def test_config_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"config.json: cache.colour: unknown key"):
        config_from_dict({"cache": {"colour": "red"}}, source="config.json")


def test_config_imports_no_heavy_modules() -> None:
    code = (
        "import sys, hicache.config, hicache.hardware, hicache.latency\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = set(out.stdout.split())
    assert not loaded & {"simpy", "numpy", "pandas", "torch", "pyarrow", "matplotlib", "traces"}


def test_config_imports_keep_the_key_docs_and_sglang_flags_light() -> None:
    code = (
        "import sys, hicache.config.keys, hicache.sglang_args\n"
        "print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert not set(out.stdout.split()) & {"simpy", "numpy", "pandas", "torch", "traces"}


def test_a_binary_config_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match=r"c.toml: cannot read config: not a UTF-8 text"):
        load_config(path)


def test_a_pool_too_large_to_hold_is_a_config_error() -> None:
    from hicache.config import MAX_POOL_PAGES

    with pytest.raises(ConfigError, match=r"gpu.device_tokens: a pool of .* use a larger"):
        load_config(None, [f"gpu.device_tokens={(MAX_POOL_PAGES + 1) * 64}"])
    with pytest.raises(ConfigError, match=r"cache.hicache_ratio: a pool of"):
        load_config(None, ["gpu.device_tokens=6400", "cache.hicache_ratio=1e9"])


def _profile(tmp_path: Path, **provenance: str) -> Path:
    from hicache.latency import PROFILE_DIR

    data = json.loads((PROFILE_DIR / "h100-sxm-pcie5-x16-default.json").read_text())
    data["provenance"] = {"source": "test", **provenance}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("provenance", "problem"),
    [
        ({"measured_on": "cpu"}, "measured on CPU tensors"),
        ({"machine_device": "cpu"}, "measured on CPU tensors"),  # written before measured_on
        ({"measured_on": "h200"}, "measured on h200, not on h100-sxm"),
        ({"measured_on": "cuda:NVIDIA L4"}, "measured on cuda:NVIDIA L4"),
        ({"measured_on": "h100-sxm"}, None),
        ({}, None),  # an estimate: nothing was measured anywhere
    ],
)
def test_a_profile_measured_elsewhere_needs_the_flag(
    tmp_path: Path, provenance: dict[str, str], problem: str | None
) -> None:
    from hicache.config import profile_mismatch

    path = _profile(tmp_path, **provenance)
    if problem is None:
        assert profile_mismatch(load_config(None, [f"run.profile={path}"])) is None
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"run.profile={path}"])
    assert problem in str(e.value) and "--allow-profile-mismatch" in str(e.value)
    assert str(e.value).startswith(f"--set run.profile={path}: run.profile: ")
    cfg = load_config(None, [f"run.profile={path}", "run.allow_profile_mismatch=true"])
    assert problem in (profile_mismatch(cfg) or "")


def test_an_unreadable_profile_is_left_to_the_loader(tmp_path: Path) -> None:
    from hicache.config import profile_mismatch

    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\x00")
    cfg = load_config(None, [f"run.profile={bad}"])  # reading it reports the problem later
    assert profile_mismatch(cfg) is None


# --- SGLang 0.5.23's host pool auto-sizing (hicache.config.pools) ---------------------------


def test_0523_shrinks_the_default_host_pool_to_the_free_host_memory() -> None:
    """Llama-3-8B (131,072 B/token per rank), 640,000 device tokens = 83.9 GB; 100 GB free:
    budget (100e9 - 10 GiB) x 0.8 = 71.4 GB, ratio 71.4 x 0.95 / 83.9 = 0.809 -- a host pool
    smaller than the device pool, which 0.5.23 allows; 0.5.14 keeps 2 x device + 1 page."""
    base = ["gpu.device_tokens=640000", "gpu.host_memory_gb=100"]
    # 0.5.14 sizes 2 x device without looking: 168 GB of 100 free, which SGLang refuses at
    # start-up ("Not enough host memory available", 0.5.14 memory_pool_host.py) and so do we
    with pytest.raises(HostMemoryError, match="host pools need 179 GB on one instance"):
        load_config(None, [*base, "sglang.version=0.5.14"])
    over = [*base, "sglang.version=0.5.14", "gpu.allow_host_overcommit=true"]
    old = resolve_pools(load_config(None, over))
    cfg = load_config(None, [*base, "sglang.version=0.5.23"])
    new = resolve_pools(cfg)
    assert old[1] == 1_280_064
    assert abs(new[1] / 640_000 - 0.8087) < 1e-3 and new[1] < new[0]
    sized = auto_size(cfg, new[0], new[2])
    assert sized is not None and sized.shrunk and sized.ranks == 1
    assert "instead of 2" in sized.describe()


def test_0523_auto_size_applies_only_without_a_ratio_or_size() -> None:
    base = [
        "gpu.device_tokens=640000",
        "gpu.host_memory_gb=100",
        "sglang.version=0.5.23",
        "gpu.allow_host_overcommit=true",
    ]  # a given size is not fitted: 168-200 GB > 100
    for given in ("cache.hicache_ratio=2", "cache.hicache_size_gb=200"):
        cfg = load_config(None, [*base, given])
        d, h, b = resolve_pools(cfg)
        assert auto_size(cfg, d, b) is None and h > 1_000_000
    # a server preset without a DRAM figure: nothing to fit, the default ratio
    cfg = load_config(None, ["gpu.device_tokens=640000", "gpu.server=single",
                             "sglang.version=0.5.23"])  # fmt: skip
    assert resolve_pools(cfg)[1] == 1_280_064


def test_0523_auto_size_divides_the_server_among_its_instances_and_ranks() -> None:
    """dgx-h200 (2 TiB): 8 instances of TP1 get 275 GB each; 4 of TP2 get 550 GB for 2
    ranks, the same per rank."""
    for tp in (1, 2):
        cfg = load_config(None, ["gpu.name=h200", f"model.tp={tp}", "sglang.version=0.5.23"])
        d, _, b = resolve_pools(cfg)
        sized = auto_size(cfg, d, b)
        assert sized is not None and sized.ranks == tp
        assert sized.free_bytes == 2 * 1024**4 / (8 // tp)


def test_0523_no_host_memory_left_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"gpu\.host_memory_gb: .*10 GiB reserve"):
        load_config(None, ["gpu.host_memory_gb=10", "sglang.version=0.5.23"])


def test_eviction_policy_config_is_checked_and_0523_only() -> None:
    cfg = load_config(None, ["sglang.version=0.5.23", "cache.eviction=tlru",
                             'cache.eviction_policy_config={"threshold": 1024}'])  # fmt: skip
    assert cfg.cache.eviction_params() == {"threshold": 1024}
    for bad, problem in (
        ('{"threshold": "x"}', "expected an integer"),
        ('{"protected_threshold": 3}', "eviction tlru reads threshold, next_prompt_estimate"),
        ("[1]", "expected a JSON object"),
        ("{", "not JSON"),
    ):
        with pytest.raises(ConfigError, match=re.escape(problem)):
            load_config(None, ["sglang.version=0.5.23", "cache.eviction=tlru",
                               f"cache.eviction_policy_config={bad}"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"since 0\.5\.20"):
        load_config(
            None,
            ["sglang.version=0.5.14", "cache.eviction=slru",
             'cache.eviction_policy_config={"protected_threshold": 3}'],
        )  # fmt: skip


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["model.ep=2"], "model.ep: llama-3-8b has no MoE layers"),
        (["model.name=qwen3-30b-a3b", "model.tp=4", "model.ep=2"],
         "SGLang needs --ep-size equal to --tp-size"),
        (["model.name=qwen3-30b-a3b", "model.ep=0"], "model.ep: must be >= 1"),
    ],
)  # fmt: skip
def test_expert_parallelism_follows_sglangs_rule(items: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, items)
    assert message in str(e.value)
    ok = load_config(None, ["model.name=qwen3-30b-a3b", "model.tp=4", "model.ep=4"])
    assert ok.model.ep == 4


def test_ep_size_flag_round_trips() -> None:
    """``--ep-size`` (and its aliases) sets ``model.ep``; the flags a config stands for name it
    back when it is on."""
    from hicache.sglang_args import parse_sglang_args, sglang_flags

    for flag in ("--ep-size", "--expert-parallel-size", "--ep"):
        got = parse_sglang_args(f"--model-path Qwen/Qwen3-30B-A3B --tp 4 {flag} 4")
        assert "model.ep=4" in got.overrides and not got.ignored
    cfg = load_config(None, ["model.name=qwen3-30b-a3b", "model.tp=4", "model.ep=4"])
    flags, _, _ = sglang_flags(cfg)
    assert flags[flags.index("--ep-size") + 1] == "4"
    assert "--ep-size" not in sglang_flags(load_config(None, []))[0]
