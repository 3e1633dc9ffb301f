"""Captures: what recent requests sent and what they were answered, kept in memory to look
back at (``capture = true``; ``GET /api/captures/{id}``, the dashboard's Activity tab).

A capture is taken as the request passes, never by reading anything again: the forwarder
gives a :class:`CaptureTap` the request's head and body as the client sent them, then the
answer's head and each piece of its body as they go out to the client (so a loading-state
stream, an error llamaswap answered, a translated Messages answer: what the client got).
Each body is kept up to ``captureMaxBytes`` and the rest only counted, so a generation
that streams for an hour costs one bounded buffer; a request that is not captured costs
one ``is None`` test per piece.

When the request ends, the recorder files the capture under its activity record's ID in
:class:`Captures`, which keeps the newest while their bytes fit in ``captureBuffer``.

Captures hold prompts and answers: they are off unless the config turns them on, and they
never hold the credentials a request or an answer carries (``SECRET_FIELDS``).
"""

from __future__ import annotations

import base64
import codecs
import collections
from collections.abc import Callable, Iterable
from typing import Any, final

import attrs

__all__ = [
    "SECRET_FIELDS",
    "Capture",
    "CaptureTap",
    "CapturedBody",
    "Captures",
    "CapturesStatistics",
]

#: Header fields a capture never keeps: credentials and cookies, either way.
SECRET_FIELDS = frozenset(
    {b"authorization", b"proxy-authorization", b"x-api-key", b"cookie", b"set-cookie"}
)

Headers = tuple[tuple[str, str], ...]


@attrs.frozen
class CapturedBody:
    """The first ``len(kept)`` bytes of a body of ``size`` bytes."""

    kept: bytes
    size: int

    def to_json(self) -> dict[str, Any]:
        """``text`` when what was kept is UTF-8 (its last character may have been cut in
        two: that part is left out), else ``base64``."""
        document: dict[str, Any] = {"size": self.size, "kept": len(self.kept)}
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            document["text"] = decoder.decode(self.kept, final=self.size == len(self.kept))
        except UnicodeDecodeError:  # binary, or compressed
            document["base64"] = base64.b64encode(self.kept).decode("ascii")
        return document


@attrs.frozen
class Capture:
    """One request and its answer; ``status`` and ``response_headers`` are None when no
    answer was sent (the client left first)."""

    id: int  # the activity record's
    method: str
    path: str
    query: str
    request_headers: Headers
    request_body: CapturedBody
    status: int | None
    response_headers: Headers | None
    response_body: CapturedBody

    @property
    def size(self) -> int:
        """Roughly the bytes it holds: what ``captureBuffer`` counts."""
        heads = (self.request_headers, self.response_headers or ())
        fields = sum(len(name) + len(value) for head in heads for name, value in head)
        texts = len(self.path) + len(self.query) + fields
        return texts + len(self.request_body.kept) + len(self.response_body.kept)

    def to_json(self) -> dict[str, Any]:
        response = None
        if self.status is not None:
            response = {
                "status": self.status,
                "headers": [list(field) for field in self.response_headers or ()],
                "body": self.response_body.to_json(),
            }
        return {
            "id": self.id,
            "request": {
                "method": self.method,
                "path": self.path,
                "query": self.query,
                "headers": [list(field) for field in self.request_headers],
                "body": self.request_body.to_json(),
            },
            "response": response,
        }


@final
class _BodyTap:
    """The first ``limit`` bytes of a body, and how many there were."""

    __slots__ = ("_kept", "_limit", "_size")

    def __init__(self, limit: int) -> None:
        self._kept = bytearray()
        self._limit = limit
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if (room := self._limit - len(self._kept)) > 0:
            self._kept += chunk[:room]

    def body(self) -> CapturedBody:
        return CapturedBody(bytes(self._kept), self._size)


@final
class CaptureTap:
    """Takes one request's capture as it passes (see the module docstring); each body is
    kept up to ``limit`` bytes."""

    def __init__(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        limit: int,
    ) -> None:
        self._method = method
        self._path = path
        self._query = query.decode("latin-1")
        self._request_headers = _kept_fields(headers)
        self._request_body = _BodyTap(limit)
        self._status: int | None = None
        self._response_headers: Headers | None = None
        self._response_body = _BodyTap(limit)

    def request_body(self, chunk: bytes) -> None:
        self._request_body.feed(chunk)

    def response_start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self._status = status
        self._response_headers = _kept_fields(headers)

    def response_body(self, chunk: bytes) -> None:
        self._response_body.feed(chunk)

    def finish(self, id: int) -> Capture:
        """What was taken, as the capture of the activity record ``id``."""
        return Capture(
            id=id,
            method=self._method,
            path=self._path,
            query=self._query,
            request_headers=self._request_headers,
            request_body=self._request_body.body(),
            status=self._status,
            response_headers=self._response_headers,
            response_body=self._response_body.body(),
        )


def _kept_fields(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    return tuple(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in SECRET_FIELDS
    )


@attrs.frozen
class CapturesStatistics:
    captures: int
    bytes: int


@final
class Captures:
    """The newest captures, by their activity record's ID, while their bytes fit in
    ``budget()`` (``captureBuffer``, read at each addition: a reload applies at the next)."""

    def __init__(self, budget: Callable[[], int]) -> None:
        self._budget = budget
        self._captures: collections.OrderedDict[int, Capture] = collections.OrderedDict()
        self._bytes = 0

    def add(self, capture: Capture) -> None:
        """Keep ``capture``, forgetting the oldest until the rest fit (``capture`` too, if
        it alone does not)."""
        self._captures[capture.id] = capture
        self._bytes += capture.size
        budget = self._budget()
        while self._bytes > budget:
            _, oldest = self._captures.popitem(last=False)
            self._bytes -= oldest.size

    def get(self, id: int) -> Capture | None:
        return self._captures.get(id)

    def statistics(self) -> CapturesStatistics:
        return CapturesStatistics(captures=len(self._captures), bytes=self._bytes)
