"""CORS: which web pages' scripts may call llamaswap from a browser (``corsOrigins``).

A browser asks first (a *preflight*: ``OPTIONS`` with ``Access-Control-Request-Method``)
before a cross-origin request with an API key or a JSON body. llamaswap answers every
preflight itself, without asking for the API key (browsers never send one with it): a
preflight carries no body, so the model a chat request names is not known yet, and
answering must not load or queue anything. With ``corsOrigins = []`` llamaswap does
neither: preflights are routed like any request, and answers pass unchanged.

**llamaswap never widens what a model server allows.** A model server's answer (it
carries ``X-LlamaSwap-Upstream``) keeps its own ``Access-Control-Allow-Origin``, narrowed
by ``corsOrigins`` (taken out when the page is not allowed, its ``*`` made the page's
origin when ``corsOrigins`` lists origins); one that sent none gets none, as with
llama-swap. llamaswap's own answers (the model list, its errors, the management API) name
the page when ``corsOrigins`` allows it.

Which origins a route's answers name is ``site.cors_origins``'s decision (``"*"`` counts
on the inference routes only); which requests are served at all, ``site.refusal``'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hypercorn.typing import ASGISendCallable, ASGISendEvent, HTTPScope

from llamaswap.http.headers import UPSTREAM_HEADER

__all__ = [
    "MAX_AGE",
    "allow_origin",
    "answer_preflight",
    "is_preflight",
    "narrowed",
    "with_origin",
]

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
    """``send``, applying ``origins`` to the answer's CORS fields when the request came
    from a page (it has ``Origin``): see ``narrowed``. With a list of origins, every answer
    depends on ``Origin`` and says so (``Vary: Origin``), so that a shared cache never
    gives one page's answer to another, or to a request without one."""
    origin = _header(scope, b"origin")
    vary = bool(origins) and "*" not in origins
    if not origins or (origin is None and not vary):
        return send
    allowed = None if origin is None else allow_origin(origins, origin)

    async def send_with_origin(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            headers = list(message["headers"])
            if origin is not None:
                headers = narrowed(headers, allowed)
            if vary:
                headers.append((b"vary", b"Origin"))
            message = {**message, "headers": headers}
        await send(message)

    return send_with_origin


_ALLOW_ORIGIN = b"access-control-allow-origin"
_ALLOW_CREDENTIALS = b"access-control-allow-credentials"


def narrowed(
    headers: list[tuple[bytes, bytes]], allowed: bytes | None
) -> list[tuple[bytes, bytes]]:
    """An answer's fields with ``Access-Control-Allow-Origin`` saying no more than
    ``allowed`` (what ``corsOrigins`` grants the page; None: nothing). llamaswap's own
    answer names ``allowed``. A model server's keeps what it said when that is within
    ``allowed``: its ``*`` becomes ``allowed`` (without its credentials flag, which ``*``
    never carried), and it names nothing where it named nothing or ``allowed`` is None."""
    theirs = None
    if any(name == UPSTREAM_HEADER for name, _ in headers):
        theirs = next((v for k, v in headers if k.lower() == _ALLOW_ORIGIN), None)
        if theirs is None:
            return headers
        if allowed is not None and (theirs.strip() != b"*" or allowed == b"*"):
            return headers
    kept = [(k, v) for k, v in headers if k.lower() != _ALLOW_ORIGIN]
    if theirs is not None:  # a model server's, taken out or made the page's: no credentials
        kept = [(k, v) for k, v in kept if k.lower() != _ALLOW_CREDENTIALS]
    return kept if allowed is None else [*kept, (_ALLOW_ORIGIN, allowed)]
