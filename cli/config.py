"""``hicache-sim config``: ``keys`` (every config key, its default and meaning) and ``sglang``
(a resolved config as SGLang launch flags); and :func:`resolve_config`, how every command turns
``--config``, ``--sglang-args`` and ``--set`` into one validated config.

Precedence, lowest first: the defaults, the ``--config`` TOML file, ``--sglang-args`` (an SGLang
launch command, :mod:`hicache.sglang_args`), then each ``--set`` in order (so ``--set`` wins).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cli.errors import UserError
from hicache.versions import SGLANG_VERSIONS

__all__ = ["Resolved", "add_config_options", "register", "resolve_config"]

SGLANG_ARGS_HELP = (
    "an SGLang launch command's flags, quoted as one argument (e.g. \"--page-size 64 "
    '--enable-hierarchical-cache --hicache-ratio 2"), read as the chosen SGLang version '
    "(sglang.version) parses them: a flag it does not have is refused (see --lenient); every "
    "flag the simulator models sets its config key, the others are listed as ignored; --set "
    "wins over it (a single flag: --sglang-args=--enable-hierarchical-cache)"
)
LENIENT_HELP = (
    "accept SGLang flags the chosen SGLang version does not know (listed as ignored) and skip "
    "malformed trace lines (counted)"
)


def add_config_options(p: argparse.ArgumentParser, *, profile_flag: bool = False) -> None:
    """``--config``, ``--sglang-args``, ``--set``, ``--sglang-version``, ``--lenient`` (and
    ``--allow-profile-mismatch``) on ``p``."""
    p.add_argument(
        "--config", type=Path, metavar="FILE",
        help="TOML config file of [section] key = value (every key, its default and meaning: "
        "hicache-sim config keys)",
    )  # fmt: skip
    p.add_argument("--sglang-args", metavar="'FLAGS'", help=SGLANG_ARGS_HELP)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. --set cache.write_policy=write_back; "
        "keys: hicache-sim config keys",
    )  # fmt: skip
    p.add_argument(
        "--sglang-version", metavar="V",
        help="the SGLang release whose cache decides (sglang.version; choices: "
        f"{', '.join(SGLANG_VERSIONS)}; what differs: hicache-sim config keys)",
    )  # fmt: skip
    p.add_argument("--lenient", action="store_true", help=LENIENT_HELP)
    p.add_argument(
        "--allow-host-overcommit", action="store_true",
        help="run a configuration whose host pools (every rank on a server, plus SGLang's "
        "reserve) exceed the server's DRAM anyway, with a warning (gpu.allow_host_overcommit "
        "= true); without it such a configuration is refused with the figures",
    )  # fmt: skip
    if profile_flag:
        p.add_argument(
            "--allow-profile-mismatch", action="store_true",
            help="use a --profile measured on another machine (CPU tensors, another GPU) "
            "anyway, with a warning (run.allow_profile_mismatch = true)",
        )  # fmt: skip


@dataclass
class Resolved:
    """A resolved config and the notes to print once the command's inputs are all checked (a
    command that fails prints its one error line and nothing else)."""

    cfg: Any
    notes: list[str]

    def print_notes(self) -> None:
        for line in self.notes:
            print(line, file=sys.stderr)


def resolve_config(args: argparse.Namespace, extra: Sequence[tuple[str, str]] = ()) -> Resolved:
    """The validated :class:`hicache.config.SimConfig` of ``args.config``,
    ``args.sglang_args`` and ``args.overrides``, then ``extra``: ``(section.key=value, the
    option it came from)`` pairs, e.g. ``("run.seed=3", "--seed 3")``; with its notes (the
    SGLang flags that were ignored, a profile used despite its machine). ``UserError`` (one
    line naming the file, flag, option or ``--set`` item) otherwise."""
    from hicache.config import ConfigError, load_config, profile_mismatch
    from hicache.sglang_args import SglangArgs, parse_sglang_args

    mapped = SglangArgs()
    if getattr(args, "sglang_args", None):
        try:
            mapped = parse_sglang_args(
                args.sglang_args,
                version=_version_before_flags(args),
                lenient=getattr(args, "lenient", False),
            )
        except ValueError as e:
            raise UserError(f"--sglang-args: {e}") from None
    given = dict(extra)
    if getattr(args, "sglang_version", None):
        given[f"sglang.version={args.sglang_version}"] = f"--sglang-version {args.sglang_version}"
    if getattr(args, "allow_profile_mismatch", False):
        given["run.allow_profile_mismatch=true"] = "--allow-profile-mismatch"
    if getattr(args, "allow_host_overcommit", False):
        given["gpu.allow_host_overcommit=true"] = "--allow-host-overcommit"
    shown = {
        item: f"--sglang-args {mapped.origin[item.partition('=')[0]]}" for item in mapped.overrides
    }
    shown.update(given)
    try:
        cfg = load_config(args.config, [*mapped.overrides, *args.overrides, *given])
    except ConfigError as e:
        for item, where in shown.items():
            if e.source == f"--set {item}":
                raise UserError(str(ConfigError(e.field, e.problem, where))) from None
        if e.source is None:  # a rule across keys: blame the item that set a key it names
            for item in reversed([*mapped.overrides, *args.overrides, *given]):
                key = item.partition("=")[0].strip()
                short = key.rpartition(".")[2]
                if key and re.search(rf"\b{re.escape(short)}\b", e.problem):
                    where = shown.get(item, f"--set {item}")
                    raise UserError(str(ConfigError(e.field, e.problem, where))) from None
        raise UserError(str(e)) from None
    notes = [f"note: --sglang-args: ignored {flag}: {why}" for flag, why in mapped.ignored]
    notes += [f"note: --sglang-args: {text}" for text in mapped.notes]
    from hicache.config import auto_size, resolve_pools

    device, _, bpt = resolve_pools(cfg)
    sized = auto_size(cfg, device, bpt)
    if sized is not None and sized.shrunk:
        notes.append(f"note: {sized.describe()}")
    st = cfg.storage
    if st.enabled and cfg.sglang.version != "0.5.14" and st.prefetch_timeout_max != -1:
        notes.append(
            f"note: storage.prefetch_timeout_max ignored: SGLang {cfg.sglang.version} caps no "
            "prefetch timeout (the cap is 0.5.14's)"
        )
    from hicache.config import host_memory

    host = host_memory(cfg)
    if host is not None and host.over:  # allowed, or the config would have been refused
        notes.append(
            f"warning: {host.describe()}; run anyway (--allow-host-overcommit): the server "
            "could not pin this much"
        )
    problem = profile_mismatch(cfg)
    if problem:  # allowed, or the config would have been refused
        notes.append(
            f"warning: {cfg.run.profile}: {problem}; used anyway (--allow-profile-mismatch): "
            "absolute times are not this GPU's"
        )
    return Resolved(cfg, notes)


def _version_before_flags(args: argparse.Namespace) -> str:
    """The ``sglang.version`` whose flags ``--sglang-args`` is read with, as the config will
    resolve it: ``--sglang-version``, else the last ``--set sglang.version=``, else the
    ``--config`` file's, else the default. A bad value gives the default here; loading the
    config then names it."""
    import tomllib

    from hicache.versions import DEFAULT_SGLANG_VERSION

    version: Any = getattr(args, "sglang_version", None)
    for item in reversed(getattr(args, "overrides", None) or []):
        key, _, value = item.partition("=")
        if version is None and key.strip() == "sglang.version":
            version = value.strip().strip("'\"")
    if version is None and getattr(args, "config", None):
        try:
            data = tomllib.loads(Path(args.config).read_text(encoding="utf-8"))
            version = data.get("sglang", {}).get("version")
        except (OSError, tomllib.TOMLDecodeError, AttributeError):
            version = None
    return version if version in SGLANG_VERSIONS else DEFAULT_SGLANG_VERSION


# --- config keys / config sglang -------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``config`` (``keys``, ``sglang``) to ``hicache-sim``'s sub-parsers."""
    p = subparsers.add_parser(
        "config",
        help="list the config keys, or print a config as SGLang launch flags",
        description="Config files, --set and --sglang-args all set the same keys: `config "
        "keys` lists them; `config sglang` prints a resolved config as SGLang flags.",
    )
    sub = p.add_subparsers(dest="config_command", metavar="COMMAND")
    sub.required = True
    k = sub.add_parser(
        "keys",
        help="every config key with its default and meaning",
        description="Every config key (section.key), its default, type and meaning, and the "
        "SGLang flag that sets it; from the config's own dataclasses. Then the SGLang versions "
        "sglang.version takes and what differs between them.",
    )
    k.add_argument("--json", action="store_true", help="one JSON object per key, in a list")
    k.set_defaults(func=_cmd_keys)
    s = sub.add_parser(
        "sglang",
        help="a resolved config as SGLang launch flags",
        description="Resolve --config, --sglang-args and --set as `run` does and print the "
        "SGLang launch command it stands for, so a what-if can be pasted back.",
    )
    add_config_options(s)
    s.set_defaults(func=_cmd_sglang)


def _cmd_keys(args: argparse.Namespace) -> int:
    from hicache.config.keys import format_keys, key_docs
    from hicache.sglang_args import key_flags

    flags = key_flags()
    if args.json:
        rows = [asdict(d) | {"sglang_flag": flags.get(d.dotted)} for d in key_docs()]
        print(json.dumps(rows, indent=1))
    else:
        print(format_keys(flags))
        print(f"\n{format_versions()}")
    return 0


def format_versions(width: int = 100) -> str:
    """``sglang.version``'s choices and what each one changes, wrapped to ``width``."""
    import textwrap

    lines = ["SGLang versions (sglang.version, --sglang-version):"]
    for version, (core, what) in SGLANG_VERSIONS.items():
        lines += textwrap.wrap(f"{version}: {what} [{core}]", width, initial_indent="  ",
                               subsequent_indent="      ")  # fmt: skip
    return "\n".join(lines)


def _cmd_sglang(args: argparse.Namespace) -> int:
    from hicache.sglang_args import format_sglang_command

    resolved = resolve_config(args)
    resolved.print_notes()
    print(format_sglang_command(resolved.cfg))
    return 0
