"""Write the server flags an installed SGLang wheel accepts, as ``hicache/data/sglang_flags/``.

    .venv-conformance-0.5.23/bin/python -m conformance.sglang_flags \\
        hicache/data/sglang_flags/0.5.23.txt

Run with the Python of a venv that has the ``sglang`` wheel (``conformance/make_venv.sh``). It
builds SGLang's own launch parser (``ServerArgs.add_cli_args`` on an empty
``argparse.ArgumentParser``, what ``sglang.launch_server`` does) and writes every ``--`` option
string it registered, aliases included: one per line, ``--name`` for a flag that takes a value,
``--name switch`` for one that takes none (``nargs == 0``: store_true and the like) and
``--name list`` for one that takes one or more (``nargs`` ``+``/``*``). Names and arity only
(facts about the wheel's command line), no help text.

The wheel is installed without its dependency tree, so importing ``sglang.srt.server_args``
fails on what it imports: each module whose import fails is replaced by an inert stand-in
(:mod:`conformance.import_stubs`) and the import is retried. ``server_args`` itself and the
argument helpers are never replaced (the run fails instead), so the flags are the wheel's.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from conformance import import_stubs

#: never replaced: the flags must come from these
_REAL = ("sglang.srt.server_args", "sglang.srt.arg_groups.arg_utils")
_MAX_TRIES = 200


class _AnyAttr(type):
    """A stand-in class whose every class attribute is a placeholder (``Parser.Map.keys()``
    in a dynamic ``choices=``: the choices are not what is extracted)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return import_stubs.Placeholder()


class _StandIn(import_stubs.StubModule):
    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        if isinstance(value, type):
            value = _AnyAttr(name, (value,), {"__module__": self.__name__})
            setattr(self, name, value)
        return value


class _Finder(import_stubs._Finder):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module


def _module_of(filename: str) -> str | None:
    """``.../site-packages/sglang/srt/x/y.py`` -> ``sglang.srt.x.y`` (None outside sglang)."""
    parts = Path(filename).with_suffix("").parts
    if "sglang" not in parts:
        return None
    mod = list(parts[len(parts) - 1 - parts[::-1].index("sglang") :])
    if mod[-1] == "__init__":
        mod.pop()
    return ".".join(mod)


def _culprit(exc: BaseException) -> str:
    """The module to replace for an import that failed with ``exc``: the one
    ``sglang.srt.server_args`` (or the first sglang module on the stack) was importing."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("sglang"):
        return exc.name.split(".")[0]
    frames = [_module_of(f.filename) for f in traceback.extract_tb(exc.__traceback__)]
    chain = [m for m in frames if m is not None]
    if "sglang.srt.server_args" in chain:
        chain = chain[len(chain) - chain[::-1].index("sglang.srt.server_args") :]
    if isinstance(exc, ModuleNotFoundError) and exc.name and not chain:
        return exc.name
    if not chain or chain[0] in _REAL:
        raise RuntimeError("sglang.srt.server_args itself failed to import") from exc
    return chain[0]


def server_parser() -> argparse.ArgumentParser:
    """SGLang's launch parser, built by the installed wheel."""
    finder = _Finder(["triton"])
    sys.meta_path.insert(0, finder)
    for _ in range(_MAX_TRIES):
        try:
            server_args: Any = importlib.import_module("sglang.srt.server_args")
            break
        except Exception as e:
            stub = _culprit(e)
            if stub in finder.roots:
                raise
            print(f"stand-in: {stub}", file=sys.stderr)
            finder.roots = (*finder.roots, stub)
            for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[name]  # a half-imported package would fail the retry
    else:
        raise RuntimeError(f"sglang.srt.server_args did not import in {_MAX_TRIES} tries")
    parser = argparse.ArgumentParser(add_help=False)
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def _arity(action: argparse.Action) -> str:
    """``switch`` (takes no value), ``list`` (one or more) or ``""`` (one value, maybe optional)."""
    if action.nargs == 0:
        return "switch"
    if action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
        return "list"
    return ""


def flag_lines(parser: argparse.ArgumentParser) -> list[str]:
    """``--name [switch|list]`` for every long option of ``parser``, sorted."""
    lines = []
    for name, action in parser._option_string_actions.items():
        if name.startswith("--"):
            lines.append(f"{name} {_arity(action)}".rstrip())
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the file to write (hicache/data/sglang_flags/V.txt)")
    args = ap.parse_args(argv)
    version = importlib.metadata.version("sglang")
    lines = flag_lines(server_parser())
    header = [
        f"# SGLang {version} server flags: the long option strings (aliases included) that",
        f"# ServerArgs.add_cli_args registers in the sglang-{version} wheel; 'switch': takes no",
        "# value, 'list': one or more. Names and arity only. Regenerate with that wheel's venv:",
        f"#   python -m conformance.sglang_flags {args.out}",
    ]
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("\n".join([*header, *lines]) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"{args.out}: {len(lines)} flags of sglang {version}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
