"""Whole-trace cache-only check: the real 0.5.23 ``UnifiedRadixCache`` against ours.

``python -m conformance.v0523.trace_check TRACE [--device-tokens 1e6 --host-tokens 4e6 ...]``
(inside ``.venv-conformance-0.5.23``) serves every request of a trace, one at a time, through the
real class with the steps of ``sim.hitrate.CacheReplay0523`` (admission match with the
``input_len-1`` limit, the load-back under the admission's locks, the extend allocation with
``evict_for_alloc`` of the shortfall, the prefill checkpoint, the decode allocation, the final
checkpoint with the prompt-boundary split, the release; copies finish at once, as the replay's
``ImmediateController``), and compares the device and host hit rates with
``hicache-sim hitrate --sglang-version 0.5.23`` on the same configuration. Exit 1 when a rate
differs by more than ``--tolerance`` (default 0.002).

Page symbols become tokens: a page with symbol ``s`` is ``page_size`` copies of ``s``, so two
pages compare equal exactly when their symbols do; output pages get fresh symbols past every
prompt symbol, so they never hit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

from sim.hitrate import HitRateConfig, replay, requests_for
from traces.io import read_trace


def _tokens(symbols: Any, page_size: int) -> list[int]:
    out: list[int] = []
    for s in symbols:
        out += [int(s)] * page_size
    return out


class RealReplay:
    """The steps of ``CacheReplay0523.step`` on the real class (see the module docstring)."""

    def __init__(self, cfg: HitRateConfig, core: str) -> None:
        from conformance.v0523.sglang_side import (
            EvictParams,
            InitLoadBackParams,
            InsertParams,
            MatchPrefixParams,
            RealUnifiedCache,
        )

        self.P = SimpleNamespace(
            evict=EvictParams, init=InitLoadBackParams, insert=InsertParams, match=MatchPrefixParams
        )
        ps = cfg.page_size
        self.ps = ps
        self.side = RealUnifiedCache(
            page_size=ps,
            device_pages=cfg.device_tokens // ps,
            host_pages=cfg.host_tokens // ps,
            write_policy=cfg.write_policy,
            eviction_policy=cfg.eviction,
            core=core,
        )
        self.cache = self.side.cache
        self.alloc = self.side.allocator
        self.device_hit = self.host_hit = self.prompt = 0
        self.uniq = 1 << 60  # output symbols: past every prompt symbol

    def _evict_to_free(self, num_tokens: int) -> None:
        short = num_tokens - self.alloc.available_size()
        if short > 0:
            self.cache.evict_for_alloc(self.P.evict(num_tokens=short))

    def _events(self) -> None:
        self.cache.flush_pending_backups()
        self.side.finish_writes(None)
        self.cache.check_hicache_events()

    def _checkpoint(self, st: dict[str, Any], key_tokens: list[int], prompt_tokens: int) -> None:
        import torch

        cache = self.cache
        n = len(key_tokens)
        values = torch.tensor(st["kv"][:n], dtype=torch.int64)
        r = cache.insert(
            self.P.insert(
                key=self.side._key(key_tokens),
                value=values,
                prev_prefix_len=st["protected"],
                inserted_len=st["inserted"],
                priority=0,
            )
        )
        st["inserted"] = max(st["inserted"], n)
        if 0 < prompt_tokens < n:
            cache.insert(
                self.P.insert(
                    key=self.side._key(key_tokens[:prompt_tokens]),
                    value=values[:prompt_tokens],
                    prev_prefix_len=prompt_tokens,
                    inserted_len=prompt_tokens,
                    priority=1,
                )
            )
        new = cache.path_device_indices(r.last_device_node).tolist()
        assert len(new) == n
        st["kv"][st["protected"] : n] = new[st["protected"] :]
        cache.unlock(st["lock"])
        st["lock"] = cache.lock(r.last_device_node)
        st["protected"] = n

    def step(self, r: Any) -> None:
        cache, ps = self.cache, self.ps
        self.prompt += r.input_length
        n_prompt = r.input_length // ps
        tokens = _tokens(r.symbols[:n_prompt], ps)
        limit = max(0, (r.input_length - 1) // ps) * ps
        m = cache.match_prefix(self.P.match(key=self.side._key(tokens, min(limit, len(tokens)))))
        prefix = cache.path_device_indices(m.last_device_node).tolist()
        dev = len(prefix)
        last = m.last_device_node
        loaded = 0
        if m.host_hit_length > 0:
            req = SimpleNamespace(
                rid="r",
                last_node=last,
                swa_host_hit_length=0,
                mamba_host_hit_length=0,
                kv=SimpleNamespace(mamba_pool_idx=None),
            )
            best = m.best_match_node
            hl = cache.inc_host_lock_ref(best).to_dec_params()
            tl = cache.lock(best)
            got = cache.init_load_back(
                self.P.init(best_match_node=best, host_hit_length=int(m.host_hit_length), req=req)
            )
            cache.unlock(tl)
            cache.dec_host_lock_ref(best, hl)
            loaded, node = got
            if loaded:
                prefix += self.side.tree.collect_full_device_indices(node, last).tolist()
                last = node
        st: dict[str, Any] = {"kv": prefix, "protected": len(prefix), "inserted": 0,
                              "lock": cache.lock(last)}  # fmt: skip
        if loaded:  # launched and done; the ack is drained with the step's events below
            cache.ready_to_load_host_cache()
            self.side.finish_loads(None)
        self.device_hit += dev
        self.host_hit += loaded
        # the prompt's pages (extend estimate: one page more when paged)
        need = -(-r.input_length // ps) - len(prefix) // ps
        if need > 0:
            self._evict_to_free(r.input_length - len(prefix) + (ps if ps > 1 else 0))
            slots = self.alloc.alloc(need * ps)
            if slots is None:
                self._release(st)
                return
            st["kv"] += slots.tolist()
        self._checkpoint(st, tokens, len(tokens))
        self._events()
        kv_tokens = r.input_length + max(1, r.output_length) - 1
        need = -(-kv_tokens // ps) - len(st["kv"]) // ps
        if need > 0:
            if self.alloc.available_size() >= need * ps:
                st["kv"] += self.alloc.alloc(need * ps).tolist()
            else:
                for _ in range(need):
                    self._evict_to_free(ps)
                    slots = self.alloc.alloc(ps)
                    if slots is None:
                        self._release(st)
                        return
                    st["kv"] += slots.tolist()
        full = kv_tokens // ps
        out = []
        for _ in range(max(0, full - n_prompt)):
            self.uniq += 1
            out += [self.uniq] * ps
        self._checkpoint(st, tokens + out, len(tokens))
        self._release(st)
        self._events()

    def _release(self, st: dict[str, Any]) -> None:
        import torch

        tail = st["kv"][st["protected"] :]
        if tail:
            self.alloc.free(torch.tensor(tail, dtype=torch.int64))
        self.cache.unlock(st["lock"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--device-tokens", type=float, default=1e6)
    ap.add_argument("--host-tokens", type=float, default=4e6)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--write-policies", default="write_through,write_through_selective,write_back")
    ap.add_argument("--eviction", default="lru")
    ap.add_argument("--core", default="python", choices=("python", "rust"))
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--tolerance", type=float, default=0.002)
    args = ap.parse_args(argv)
    ps = args.page_size
    reqs = requests_for(read_trace(args.trace), ps)
    if args.limit:
        reqs = reqs[: args.limit]
    dev = int(args.device_tokens) // ps * ps
    host = int(args.host_tokens) // ps * ps
    bad = 0
    rows = []
    for wp in args.write_policies.split(","):
        cfg = HitRateConfig(
            device_tokens=dev,
            host_tokens=host,
            page_size=ps,
            eviction=args.eviction,
            write_policy=wp,
            sglang_version="0.5.23",
        )
        ours = replay(reqs, cfg)
        t0 = time.perf_counter()
        real = RealReplay(cfg, args.core)
        for r in reqs:
            real.step(r)
        secs = time.perf_counter() - t0
        p = max(1, real.prompt)
        row = {
            "write_policy": wp,
            "device_tokens": dev,
            "host_tokens": host,
            "real_device": real.device_hit / p,
            "ours_device": ours.device_hit_rate,
            "real_host": real.host_hit / p,
            "ours_host": ours.host_hit_rate,
            "real_seconds": round(secs, 1),
        }
        ok = (
            abs(row["real_device"] - row["ours_device"]) <= args.tolerance
            and abs(row["real_host"] - row["ours_host"]) <= args.tolerance
        )
        bad += not ok
        rows.append(row)
        print(
            f"{wp:>24} device real {row['real_device']:.4f} ours {row['ours_device']:.4f}  "
            f"host real {row['real_host']:.4f} ours {row['ours_host']:.4f}  "
            f"{'ok' if ok else 'DIFFERS'} ({secs:.0f} s)",
            flush=True,
        )
    print(json.dumps({"trace": args.trace, "core": args.core, "rows": rows}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
