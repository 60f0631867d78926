"""The one error class of a study's input the user can fix.

A plan target or variant that does not parse, a sweep directory another sweep holds, an
executor that cannot start, a report folder without runs: each raises :class:`StudyError`,
which the command line prints as one line (:mod:`cli.errors`). It is a ``ValueError`` (as
:class:`hicache.config.ConfigError` and :class:`traces.schema.TraceError` are), so callers that
catch ``ValueError`` keep working; any other exception out of a study is a bug.
"""

from __future__ import annotations

__all__ = ["StudyError"]


class StudyError(ValueError):
    """An input of a study (targets, variants, grid, executor, run folders) the user can fix."""
