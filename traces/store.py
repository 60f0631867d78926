"""`RequestColumns`: a trace's requests held column by column, about a quarter of the memory of
a list of `Request` objects.

A `Request` read from JSON keeps its ids as a list of Python ints (36 bytes per id: the pointer
and the int object); the Mooncake conversation trace holds about 24 hash ids per request, so a
trace in memory cost about 1.1 KB per request. Here the ids of all requests sit in one flat
``array('q')`` (8 bytes per id; `validate_request` bounds every id below 2**63), lengths and
times in typed arrays, and the optional fields in lists that exist only once some request sets
them (session ids shared between the turns of a session). `read_trace` fills one; reading a
request back builds a fresh `Request` (a copy: changing it does not change the trace).
"""

from __future__ import annotations

import typing
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from traces.schema import Request

T = typing.TypeVar("T")


class BuiltOnRead(Sequence[T]):
    """A read-only sequence whose items are built when read: a subclass gives ``__len__`` and
    ``_get(i)`` for ``0 <= i < len``; indexes (negative ones too), slices (a list) and
    iteration work as on a list. What a long trace's views use so that their items exist only
    while someone holds them."""

    __slots__ = ()

    def _get(self, i: int) -> T:
        raise NotImplementedError

    @typing.overload
    def __getitem__(self, i: int) -> T: ...

    @typing.overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._get(i)

    def __iter__(self) -> Iterator[T]:
        return map(self._get, range(len(self)))


# optional fields, each a list created when the first request sets it
_OPTIONAL = ("session_id", "turn", "think_time_ms", "priority", "rid")
_HASH, _TOKEN = 0, 1


class RequestColumns(BuiltOnRead[Request]):
    """The requests of a trace in file order, stored column by column (see the module doc).

    Reads like a list of `Request` (index, slice, iterate, ``len``, compare with a list);
    `append` adds one at the end. Each read returns a new `Request` built from the columns.
    """

    __slots__ = ("_ends", "_ids", "_inp", "_kind", "_opt", "_out", "_strings", "_ts")

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._ts = array("d")
        self._inp = array("q")
        self._out = array("q")
        self._kind = bytearray()  # _HASH or _TOKEN per request
        self._ids = array("q")  # every request's ids, one after the other
        self._ends = array("q")  # where request i's ids end in _ids
        self._opt: dict[str, list[typing.Any]] = {}
        self._strings: dict[str, str] = {}  # one object per distinct session id
        for r in requests:
            self.append(r)

    def append(self, r: Request) -> None:
        """Add ``r`` (a validated request: exactly one of ``hash_ids``/``token_ids`` set)."""
        n = len(self._ts)
        self._ts.append(r.timestamp)
        self._inp.append(r.input_length)
        self._out.append(r.output_length)
        if r.hash_ids is not None:
            self._kind.append(_HASH)
            self._ids.extend(r.hash_ids)
        else:
            self._kind.append(_TOKEN)
            self._ids.extend(r.token_ids or ())
        self._ends.append(len(self._ids))
        for name in _OPTIONAL:
            value = getattr(r, name)
            col = self._opt.get(name)
            if col is None:
                if value is None:
                    continue
                col = self._opt[name] = [None] * n
            if name == "session_id" and value is not None:
                value = self._strings.setdefault(value, value)
            col.append(value)

    def __len__(self) -> int:
        return len(self._ts)

    def _get(self, i: int) -> Request:
        a = self._ends[i - 1] if i else 0
        ids = self._ids[a : self._ends[i]].tolist()
        token = self._kind[i] == _TOKEN
        opt = self._opt
        return Request(
            self._ts[i],
            self._inp[i],
            self._out[i],
            None if token else ids,
            ids if token else None,
            *(opt[name][i] if name in opt else None for name in _OPTIONAL),
        )

    def head(self, n: int) -> Iterator[Request]:
        """The first ``n`` requests (all when ``n`` <= 0), one at a time."""
        return iter(self) if n <= 0 else islice(iter(self), n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestColumns | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestColumns({len(self)} requests, {len(self._ids)} ids)"

    def nbytes(self) -> int:
        """Bytes held by the number columns (the optional fields' lists not counted)."""
        cols: Sequence[array[typing.Any]] = (self._ts, self._inp, self._out, self._ids, self._ends)
        return sum(a.itemsize * len(a) for a in cols) + len(self._kind)
