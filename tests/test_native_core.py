"""The optional compiled policy core (``hicache.policy.native``): when a build is used, and
that a build decides exactly as the interpreted sources do."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hicache.policy import _loader
from hicache.policy._loader import (
    GROUPS,
    MODULES,
    PACKAGES,
    NativeStatus,
    activate,
    source_hashes,
    unusable_reason,
)

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def fake_build(where: Path, **changes: object) -> Path:
    """A build folder with the layout and manifest of a real one (empty extension files)."""
    for m in MODULES:
        package, _, stem = m.rpartition(".")
        folder = where.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}{SUFFIX}").write_bytes(b"")
    (where / f"abc__mypyc{SUFFIX}").write_bytes(b"")
    manifest: dict[str, object] = {
        "platform": _loader.platform_tag(),
        "sources": source_hashes(),
        "shared": "abc__mypyc",
    }
    manifest.update(changes)
    (where / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return where


def test_every_package_with_compiled_modules_asks_the_loader() -> None:
    for package, names in GROUPS.items():
        init = ROOT.joinpath(*package.split("."), "__init__.py").read_text(encoding="utf-8")
        assert "_activate(__path__, __name__)" in init, package
        for name in names:
            assert ROOT.joinpath(*package.split("."), f"{name}.py").is_file()


def test_a_matching_build_is_usable(tmp_path: Path) -> None:
    assert unusable_reason(fake_build(tmp_path)) is None


def test_a_missing_build_says_how_to_make_one(tmp_path: Path) -> None:
    why = unusable_reason(tmp_path / "nothing")
    assert why is not None and "not built" in why and "make native" in why


def test_an_edited_source_makes_the_build_stale(tmp_path: Path) -> None:
    sources = source_hashes()
    sources["hicache/policy/hiradix.py"] = "0" * 64
    sources["sim/scheduler.py"] = "1" * 64
    why = unusable_reason(fake_build(tmp_path, sources=sources))
    assert why == (
        "stale: hicache/policy/hiradix.py, sim/scheduler.py changed since the build; rebuild"
    )


def test_any_source_the_build_was_checked_against_counts(tmp_path: Path) -> None:
    """Not only the compiled modules: an edited, added or deleted source anywhere in the
    packages they import makes the build stale (mypyc built in what it knew of them)."""
    root = tmp_path / "src"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("_native", "__pycache__"))  # fmt: skip
    build = fake_build(tmp_path / "build", sources=source_hashes(root))
    assert unusable_reason(build, root) is None
    (root / "traces" / "schema.py").write_text("# edited\n", encoding="utf-8")
    (root / "sim" / "new_module.py").write_text("", encoding="utf-8")
    (root / "hicache" / "servers.py").unlink()
    (root / "sim" / "routers.py").write_text("# edited\n", encoding="utf-8")
    assert unusable_reason(build, root) == (
        "stale: hicache/servers.py, sim/new_module.py, sim/routers.py and 1 more changed since "
        "the build; rebuild"
    )


def test_a_build_for_another_interpreter_is_refused(tmp_path: Path) -> None:
    why = unusable_reason(fake_build(tmp_path, platform="cpython-312-aarch64"))
    assert why is not None and "cpython-312-aarch64" in why


def test_a_build_missing_a_module_is_refused(tmp_path: Path) -> None:
    build = fake_build(tmp_path)
    (build / "sim" / f"link{SUFFIX}").unlink()
    assert unusable_reason(build) == "the build has no compiled sim.link; rebuild"
    build = fake_build(tmp_path / "b")
    (build / f"abc__mypyc{SUFFIX}").unlink()
    assert unusable_reason(build) == "the build's shared library is missing; rebuild"


def test_a_broken_manifest_is_refused(tmp_path: Path) -> None:
    build = fake_build(tmp_path)
    (build / "manifest.json").write_text("{not json", encoding="utf-8")
    why = unusable_reason(build)
    assert why is not None and why.startswith("unreadable manifest")


def _fresh(monkeypatch: pytest.MonkeyPatch, build: Path, mode: str) -> None:
    """A process that has not decided yet, with ``build`` and ``HICACHE_NATIVE=mode``."""
    monkeypatch.setattr(_loader, "BUILD_DIR", build)
    monkeypatch.setattr(_loader, "_decided", None)
    monkeypatch.setenv("HICACHE_NATIVE", mode)


def test_activate_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = fake_build(tmp_path / "good")
    monkeypatch.setattr(sys, "path", list(sys.path))

    _fresh(monkeypatch, build, "off")
    path: list[str] = ["pkg"]
    assert activate(path, "sim") == NativeStatus(False, "interpreted (HICACHE_NATIVE=off)")
    assert path == ["pkg"]

    _fresh(monkeypatch, build, "auto")
    status = activate(path, "hicache.policy")
    assert status.active and path == [str(build / "hicache" / "policy"), "pkg"]
    assert str(build) in sys.path  # for the modules' shared library
    sim_path = ["sim-src"]
    assert activate(sim_path, "sim") is status  # decided once per process
    assert sim_path == [str(build / "sim"), "sim-src"]
    with pytest.raises(ValueError, match="'traces' has no compiled modules"):
        activate([], "traces")

    _fresh(monkeypatch, tmp_path / "none", "auto")
    path = ["pkg"]
    status = activate(path, "hicache")
    assert not status.active and "not built" in status.reason and path == ["pkg"]
    _fresh(monkeypatch, tmp_path / "none", "require")
    with pytest.raises(ImportError, match=r"HICACHE_NATIVE=require.*not built"):
        activate(path, "hicache")
    _fresh(monkeypatch, build, "fast")
    with pytest.raises(ImportError, match="choose one of auto, off, require"):
        activate(path, "hicache")


# ------------------------------------------------------------------ compiled == interpreted --

#: The child: the cache-only replay and the timed simulator (one server, an L3 tier, two
#: servers behind a router) over the head of the bundled conversation trace, in configurations
#: that reach the compiled modules' branches; prints every result that a decision, a clock
#: value or a page id could change.
CHILD = r"""
import json, sys
from hicache.config import load_config
from hicache.policy import NATIVE
from hicache.policy.native import MODULES, compiled_modules
from sim.engine import run_simulation
from sim.hitrate import CacheReplay, CacheReplay0523, HitRateConfig, requests_for
import hicache.lifecycle_v0523, hicache.policy.v0523.cache  # the 0.5.23 core: loaded on use
from traces.io import read_trace

want = sys.argv[1] == "native"
assert NATIVE.active == want, NATIVE
assert compiled_modules() == (list(MODULES) if want else []), compiled_modules()
trace = read_trace("traces/data/mooncake/conversation_trace.jsonl")
out = {}
for page in (64, 16, 1):
    reqs = requests_for(trace, page)[:400]
    for policy, evict, outputs, storage in (
        ("write_through", "lru", "cache", False),
        ("write_through_selective", "slru", "skip", False),
        ("write_back", "lfu", "cache", False),
        ("write_through", "priority", "cache", True),
    ):
        dev = 40_000 // page * page
        cfg = HitRateConfig(device_tokens=dev, host_tokens=3 * dev, page_size=page,
                            eviction=evict, write_policy=policy, outputs=outputs,
                            storage=storage, storage_tokens=8 * dev if storage else 0)
        rp = CacheReplay(cfg)
        hits = [rp.step(r) for r in reqs]
        res = rp.finish()
        out[f"replay {page} {policy} {evict} {outputs} {storage}"] = {
            "hits": hits, "result": {k: v for k, v in vars(res).items()},
            "device_free": rp.device.free_pages_snapshot(),
            "host_free": rp.host.free_pages_snapshot(),
            "clock": rp.cache._clock,
        }
    for policy, evict in (
        ("write_through", "lru"), ("write_through_selective", "slru"), ("write_back", "fifo"),
    ):
        dev = 40_000 // page * page
        cfg = HitRateConfig(device_tokens=dev, host_tokens=3 * dev, page_size=page,
                            eviction=evict, write_policy=policy, sglang_version="0.5.23")
        rp = CacheReplay0523(cfg)
        hits = [rp.step(r) for r in reqs]
        res = rp.finish()
        out[f"replay 0.5.23 {page} {policy} {evict}"] = {
            "hits": hits, "result": {k: v for k, v in vars(res).items()},
            "device_free": rp.device.free_pages_snapshot(),
            "host_free": rp.host.free_pages_snapshot(),
            "clock": rp.cache.tree._time,
        }
for overrides in (
    [],
    ["scheduler.chunked_prefill_size=512"],
    ["cache.write_policy=write_back", "cache.eviction=lfu"],
    ["cache.page_size=1"],
    ["storage.backend=mooncake", "workload.rate_scale=0.5"],
    ["cluster.instances=2", "router.policy=cache_aware"],
):
    cfg = load_config(None, ["workload.max_requests=400", *overrides])
    s = run_simulation(cfg, trace, None, progress=False)
    s.pop("wall_time_s", None)
    out["timed " + " ".join(overrides)] = s
print(json.dumps(out, sort_keys=True, default=str))
"""


def _have_mypyc() -> bool:
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return False
    return shutil.which("cc") is not None or shutil.which("gcc") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _have_mypyc(), reason="needs mypyc (mypy) and a C compiler")
def test_the_compiled_core_decides_exactly_as_the_interpreted_one(tmp_path: Path) -> None:
    from hicache.policy.native import BUILD_DIR, build

    # the project's build when it was made from these very sources (`make test` builds first)
    where = BUILD_DIR if unusable_reason() is None else build(tmp_path / "native", quiet=True)

    def run(mode: str) -> object:
        env = dict(os.environ, HICACHE_NATIVE_DIR=str(where))
        env["HICACHE_NATIVE"] = "require" if mode == "native" else "off"
        res = subprocess.run(
            [sys.executable, "-c", CHILD, mode],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    native, interpreted = run("native"), run("interpreted")
    assert isinstance(native, dict) and len(native) == 27
    for name, got in native.items():
        assert got == interpreted[name], name
