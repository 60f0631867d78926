"""Trace formats, readers, generators and statistics.

Importing `traces` loads only the standard library: pandas/pyarrow/numpy are imported by the
functions that need them (Parquet I/O, reuse distances), so the policy core can use
`page_symbols` without paying for them.
"""

from traces.io import iter_requests, read_trace, write_trace
from traces.keys import page_symbols, token_ids_of
from traces.resample import resample_sessions
from traces.schema import (
    Request,
    Trace,
    TraceError,
    TraceHeader,
    TraceParamError,
    validate_request,
)

__all__ = [
    "Request",
    "Trace",
    "TraceError",
    "TraceHeader",
    "TraceParamError",
    "iter_requests",
    "page_symbols",
    "read_trace",
    "resample_sessions",
    "token_ids_of",
    "validate_request",
    "write_trace",
]
