"""``hicache-sim``: the command line, one argparse tree assembled from the command modules.

=============  ==========================================================
``run``        timed simulation of one config (:mod:`cli.run`)
``hitrate``    cache-only hit-rate grid (:mod:`cli.run`)
``demo``       the demo job (:mod:`cli.demo`)
``sweep``      a grid of timed runs (:mod:`cli.sweep`)
``plan``       instances (GPUs) needed to meet latency targets (:mod:`cli.plan`)
``report``     HTML/PDF report of runs and sweeps (:mod:`cli.report`)
``trace``      inspect, convert, generate, validate traces (:mod:`cli.traces`)
``replay``     real copies with torch (:mod:`cli.replay`)
``config``     config keys, a config as SGLang flags (:mod:`cli.config`)
``model``      a model's prefill/decode cost on a GPU, part by part (:mod:`cli.model`)
``advise``     a verdict first: will HiCache help, how big, which policy (:mod:`cli.advise`)
``compare-metrics``  a run beside a real server's /metrics scrapes (:mod:`cli.compare_metrics`)
=============  ==========================================================

User errors (bad arguments, unreadable or malformed inputs) print one line and exit 2 (see
:mod:`cli.errors`; argument errors too: every parser is a :class:`cli.errors.Parser`); a
traceback means a bug. Heavy modules are imported inside the commands, so
``--help`` stays fast and works without torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cli.errors import EXIT_USER_ERROR, Parser, UserError, parse_args, run_command

__all__ = ["EXIT_USER_ERROR", "UserError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole ``hicache-sim`` parser; each parsed command has ``func`` (and may have
    ``user_errors`` / ``error_prefix``, see :func:`cli.errors.run_command`)."""
    from cli import (
        advise,
        compare_metrics,
        config,
        demo,
        model,
        plan,
        replay,
        report,
        run,
        sweep,
        traces,
    )
    from hicache import __version__

    parser = Parser(
        prog="hicache-sim",
        description="Simulate SGLang HiCache (0.5.23's UnifiedRadixCache and 0.5.14's "
        "HiRadixCache, decision for decision): hit rates, TTFT, policies, fleets, capacity.",
    )
    parser.add_argument("--version", action="version", version=f"hicache-sim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    run.register(sub)
    advise.register(sub)
    demo.register(sub)
    sweep.register(sub)
    plan.register(sub)
    report.register(sub)
    traces.register(sub)
    # replay needs torch (the `replay` extra); its module imports torch only inside commands
    replay.register(sub)
    config.register(sub)
    model.register(sub)
    compare_metrics.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments), run the command, return its exit
    code; the one place a user error is printed (:func:`cli.errors.run_command`)."""
    args = parse_args(build_parser(), argv)
    if isinstance(args, int):  # an argument error (printed), or --help / --version
        return args
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
