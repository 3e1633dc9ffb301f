"""Readiness probes: is the model server answering 200 on its check endpoint?

A probe goes through the forwarding path's ``UpstreamPool``, so it reaches a model exactly
as a request does: the same connections (a probe's kept-alive connection serves the first
request), and the same rules, in particular no ``HTTP(S)_PROXY``/``ALL_PROXY`` from the
environment (with one set and no ``NO_PROXY``, an environment-honouring client would ask
the proxy for ``127.0.0.1`` and find no model ever ready).
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Protocol, final
from urllib.parse import urlsplit

import trio

from llamaswap.http.client import UpstreamFailed, UpstreamPool

__all__ = ["HttpProbe", "Probe"]

#: The most of a check endpoint's body a probe reads: an answer that ends within it
#: leaves its connection for the first request; a longer one (a stream, a file) is not
#: read further, and its connection is closed.
MAX_PROBE_BODY = 64 * 1024


class Probe(Protocol):
    async def __call__(self, url: str) -> bool:
        """True when ``url`` answers 200; False on any other answer or connection error."""


@final
class HttpProbe:
    """A GET of the check URL through the shared ``UpstreamPool``; 200 means ready.

    Args:
        pool: the pool the forwarder uses.
        timeout: seconds for one probe, connecting included; past it the answer is False.

    *Cancellation*: safe; the connection of a probe cut short is closed, not pooled.
    """

    def __init__(self, pool: UpstreamPool, *, timeout: float = 5.0) -> None:
        self._pool = pool
        self._timeout = timeout

    async def __call__(self, url: str) -> bool:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with trio.move_on_after(self._timeout):
            try:
                base = f"{parts.scheme}://{parts.netloc}"
                async with (
                    self._pool.request("GET", base, target, [], None) as response,
                    aclosing(response.chunks()) as chunks,
                ):
                    read = 0
                    async for chunk in chunks:
                        read += len(chunk)
                        if read > MAX_PROBE_BODY:
                            break
                    return response.status == 200
            except UpstreamFailed:
                return False
        return False
