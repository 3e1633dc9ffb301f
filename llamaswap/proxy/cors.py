"""CORS: which web pages' scripts may call llamaswap from a browser (``corsOrigins``).

A browser asks first (a *preflight*: ``OPTIONS`` with ``Access-Control-Request-Method``)
before a cross-origin request with an API key or a JSON body. llamaswap answers every
preflight itself, without asking for the API key (browsers never send one with it), and
adds ``Access-Control-Allow-Origin`` to the answers of requests that carry an ``Origin``,
in place of whatever a model server said. With ``corsOrigins = []`` llamaswap does
neither: preflights are routed like any request, and answers pass unchanged.

Which origins a route's answers name is ``site.cors_origins``'s decision (``"*"`` counts
on the inference routes only); which requests are served at all, ``site.refusal``'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hypercorn.typing import ASGISendCallable, ASGISendEvent, HTTPScope

__all__ = ["MAX_AGE", "allow_origin", "answer_preflight", "is_preflight", "with_origin"]

#: Seconds a browser may remember a preflight's answer.
MAX_AGE = 86_400
_METHODS = b"GET, POST, PUT, PATCH, DELETE, OPTIONS"
#: Allowed when the preflight names no headers.
_HEADERS = b"Content-Type, Authorization, X-Api-Key, Accept, X-Requested-With"
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _header(scope: HTTPScope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k.lower() == name), None)


def allow_origin(origins: Sequence[str], origin: bytes) -> bytes | None:
    """The ``Access-Control-Allow-Origin`` value for a request from ``origin``, if allowed."""
    if "*" in origins:
        return b"*"
    page = origin.decode("latin-1").lower()
    listed = any(page == allowed.lower().removesuffix("/") for allowed in origins)
    return origin if listed else None


def is_preflight(scope: HTTPScope) -> bool:
    return (
        scope["method"] == "OPTIONS"
        and _header(scope, b"origin") is not None
        and _header(scope, b"access-control-request-method") is not None
    )


async def answer_preflight(
    origins: Sequence[str], scope: HTTPScope, send: ASGISendCallable
) -> None:
    """204, with the CORS headers when the origin is allowed (else none: the browser then
    refuses the request)."""
    headers: list[tuple[bytes, bytes]] = [(b"vary", b"Origin")]
    allowed = allow_origin(origins, _header(scope, b"origin") or b"")
    if allowed is not None:
        asked = _header(scope, b"access-control-request-headers")
        if asked is not None:  # echo the header names asked for, if they are names
            names = [part.strip() for part in asked.split(b",")]
            allow_headers = b", ".join(name for name in names if _TOKEN.fullmatch(name))
        else:
            allow_headers = _HEADERS
        headers += [
            (b"access-control-allow-origin", allowed),
            (b"access-control-allow-methods", _METHODS),
            (b"access-control-allow-headers", allow_headers),
            (b"access-control-max-age", str(MAX_AGE).encode()),
        ]
    await send(
        {"type": "http.response.start", "status": 204, "headers": headers, "trailers": False}
    )
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def with_origin(
    origins: Sequence[str], scope: HTTPScope, send: ASGISendCallable
) -> ASGISendCallable:
    """``send``, adding ``Access-Control-Allow-Origin`` to the response (replacing a model
    server's) when the request came from a page (it has ``Origin``). With a list of
    origins, every answer depends on ``Origin`` and says so (``Vary: Origin``), so that a
    shared cache never gives one page's answer to another, or to a request without one."""
    origin = _header(scope, b"origin")
    vary = bool(origins) and "*" not in origins
    if not origins or (origin is None and not vary):
        return send
    allowed = None if origin is None else allow_origin(origins, origin)

    async def send_with_origin(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            headers = list(message["headers"])
            if origin is not None:
                headers = [
                    (k, v) for k, v in headers if k.lower() != b"access-control-allow-origin"
                ]
                if allowed is not None:
                    headers.append((b"access-control-allow-origin", allowed))
            if vary:
                headers.append((b"vary", b"Origin"))
            message = {**message, "headers": headers}
        await send(message)

    return send_with_origin
