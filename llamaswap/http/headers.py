"""Which header fields cross the proxy: the hop-by-hop fields each hop keeps to itself
(RFC 9110 §7.6.1), the fields llamaswap reads from a request, and the one it adds to an
answer relayed from a model server."""

from __future__ import annotations

from collections.abc import Iterable

from hypercorn.typing import HTTPScope

from .client import UpstreamResponse

__all__ = [
    "UPSTREAM_HEADER",
    "downstream_headers",
    "has_body",
    "header_map",
    "upstream_headers",
]

#: On every response relayed from a model server (or peer), naming it.
UPSTREAM_HEADER = b"x-llamaswap-upstream"
# RFC 9110 §7.6.1 connection-specific fields, plus Host (the upstream pool sets its own)
# and Expect (hypercorn has already answered ``100 Continue`` to the client).
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"expect",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)


def header_map(scope: HTTPScope, wanted: frozenset[bytes]) -> dict[str, str]:
    """The request fields named in ``wanted`` (lowercase), by lowercase name; the first
    occurrence wins. Reading only those spares decoding the dozen more an SDK sends
    (``x-stainless-*``)."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        lower = name.lower()
        if lower in wanted:
            headers.setdefault(lower.decode("latin-1"), value.decode("latin-1"))
    return headers


def upstream_headers(scope: HTTPScope, *, strip_auth: bool) -> list[tuple[bytes, bytes]]:
    headers = []
    connection = False  # a Connection field: the fields it names are this hop's own too
    for name, value in scope["headers"]:
        lower = name.lower()
        if lower in _HOP_BY_HOP:
            connection = connection or lower == b"connection"
        elif not (strip_auth and lower in (b"authorization", b"x-api-key")):
            headers.append((lower, value))
    if connection:
        named = _named_in_connection(scope["headers"])
        headers = [(k, v) for k, v in headers if k not in named]
    return headers


def _named_in_connection(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The fields a ``Connection`` header names: this hop's own (RFC 9110 §7.6.1)."""
    named = [v for k, v in headers if k.lower() == b"connection"]
    if not named:
        return frozenset()
    return frozenset(t.strip().lower() for v in named for t in v.split(b",") if t.strip())


#: Response fields hypercorn sets itself, and the one llamaswap sets (a peer llamaswap's
#: gives way to ours). A model server's ``Server`` comes back as sent: llamaswap names
#: no server of its own (``_serve.py``).
_OURS = _HOP_BY_HOP | {b"date", UPSTREAM_HEADER}


def downstream_headers(
    response: UpstreamResponse, content_type: str, model: str
) -> list[tuple[bytes, bytes]]:
    """The upstream's response fields, and ``X-LlamaSwap-Upstream`` naming who answered:
    an error with it is the model server's, one without it llamaswap's own."""
    dropped = _OURS
    if response.header(b"connection"):  # the fields it names are this hop's own too
        dropped = dropped | _named_in_connection(response.headers)
    if response.header(b"transfer-encoding"):  # the body's length was its chunks'
        dropped = dropped | {b"content-length"}
    headers = [(k, v) for k, v in response.headers if k not in dropped]
    headers.append((UPSTREAM_HEADER, model.encode()))
    if content_type.startswith("text/event-stream") and not response.header(b"x-accel-buffering"):
        headers.append((b"x-accel-buffering", b"no"))  # a peer llamaswap's has it already
    return headers


def has_body(headers: dict[str, str]) -> bool:
    """Whether the client's request (``headers``: ``header_map``) has a body to stream
    through. (h11 refuses a request whose Content-Length fields disagree.)"""
    return "transfer-encoding" in headers or headers.get("content-length", "0") != "0"
