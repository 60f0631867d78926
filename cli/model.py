"""``hicache-sim model``: what the simulator assumes a model costs on a GPU.

``forward`` prints one prefill pass per token count, split into layers, linear ops, attention,
all-reduce, the LM head and overheads (:mod:`hicache.forward`); ``decode`` one decode step per
batch size at a context length. ``--json`` gives the same numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.errors import UserError

__all__ = ["register"]

_PARTS = ("linear_s", "attention_s", "allreduce_s", "lm_head_s", "overhead_s", "total_s")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def _common(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", default="llama-3-8b", help="a model preset (default llama-3-8b)")
    which.add_argument("--model-config", metavar="FILE", help="a Hugging Face config.json")
    p.add_argument("--gpu", default="h100-sxm", help="a GPU preset (default h100-sxm)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree of the MoE layers (SGLang's --ep-size: 1, or "
                        "the same as --tp; default 1)")  # fmt: skip
    p.add_argument(
        "--profile", metavar="FILE",
        help="a latency profile (overheads, gemm_scale); default: the GPU's shipped one",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers: Any) -> None:
    """Add ``model`` (``forward``, ``decode``) to ``hicache-sim``'s sub-parsers."""
    p = subparsers.add_parser(
        "model",
        help="what one forward pass of a model costs on a GPU, part by part",
        description="The simulator's compute model, made visible: operator times fitted to "
        "measured H100 tables (FIDELITY.md), any model from its config.json.",
    )
    sub = p.add_subparsers(dest="model_command", metavar="COMMAND")
    sub.required = True
    f = sub.add_parser("forward", help="one prefill pass per token count")
    _common(f)
    f.add_argument(
        "--tokens", type=_ints, default=[512, 1024, 4096, 16384],
        help="new tokens per pass, comma-separated (default 512,1024,4096,16384)",
    )  # fmt: skip
    f.add_argument("--prefix", type=int, default=0, help="cached prefix tokens (default 0)")
    f.set_defaults(func=_cmd_forward)
    d = sub.add_parser("decode", help="one decode step per batch size")
    _common(d)
    d.add_argument("--batch", type=_ints, default=[1, 8, 32, 128],
                   help="batch sizes, comma-separated (default 1,8,32,128)")  # fmt: skip
    d.add_argument("--context", type=int, default=2048,
                   help="KV tokens each request holds (default 2048)")  # fmt: skip
    d.set_defaults(func=_cmd_decode)


def _forward_model(args: argparse.Namespace) -> Any:
    from hicache.config import ConfigError, ModelConfig
    from hicache.forward import forward_model
    from hicache.hardware import get_gpu, get_model
    from hicache.profile import load_profile

    try:
        model = get_model(args.model_config or args.model)
        gpu = get_gpu(args.gpu)
        if args.tp < 1:
            raise ValueError(f"--tp must be >= 1, got {args.tp}")
        if args.ep != 1:  # SGLang's rule, as the config checks it
            ModelConfig(name=args.model, config=args.model_config or "", tp=args.tp, ep=args.ep)
        prof = load_profile(args.profile, gpu.name, gpu.default_link)
        return forward_model(model, gpu, args.tp, prof, ep=args.ep)
    except (ValueError, ConfigError) as e:
        raise UserError(str(e)) from None


def _print(rows: list[dict[str, Any]], key: str, header: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print(header)
    cols = (key, "layers", *_PARTS)
    print("  ".join(f"{c:>12}" for c in cols))
    for r in rows:
        cells = [f"{r[key]:>12}", f"{r['layers']:>12}"]
        cells += [f"{r[c] * 1e3:>9.3f} ms" for c in _PARTS]
        print("  ".join(cells))


def _cmd_forward(args: argparse.Namespace) -> int:
    fm = _forward_model(args)
    if args.prefix < 0:
        raise UserError(f"--prefix must be >= 0, got {args.prefix}")
    rows = [
        {"tokens": t, "prefix": args.prefix, **fm.prefill([(t, args.prefix)]).as_dict()}
        for t in args.tokens
    ]
    head = (f"prefill pass: {fm.model.name} on {fm.gpu.name}, tp={fm.tp}, cached prefix "
            f"{args.prefix} tokens (per rank; hicache.forward)")  # fmt: skip
    _print(rows, "tokens", head, args.json)
    return 0


def _cmd_decode(args: argparse.Namespace) -> int:
    fm = _forward_model(args)
    if args.context < 0:
        raise UserError(f"--context must be >= 0, got {args.context}")
    rows = [
        {"batch": b, "context": args.context, **fm.decode(b, b * args.context).as_dict()}
        for b in args.batch
    ]
    head = (f"decode step: {fm.model.name} on {fm.gpu.name}, tp={fm.tp}, {args.context} KV "
            "tokens per request (per rank; hicache.forward)")  # fmt: skip
    _print(rows, "batch", head, args.json)
    return 0
