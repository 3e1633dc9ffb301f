"""Readiness probes: is the model server answering 200 on its check endpoint?"""

from __future__ import annotations

from typing import Protocol, final

import httpx

__all__ = ["HttpProbe", "Probe"]


class Probe(Protocol):
    async def __call__(self, url: str) -> bool:
        """True when ``url`` answers 200; False on any other answer or connection error."""


@final
class HttpProbe:
    """Probes over a shared ``httpx.AsyncClient`` (one connection pool for all models)."""

    def __init__(self, client: httpx.AsyncClient, *, timeout: float = 5.0) -> None:
        self._client = client
        self._timeout = timeout

    async def __call__(self, url: str) -> bool:
        try:
            response = await self._client.get(url, timeout=self._timeout)
        except httpx.HTTPError:
            return False
        return response.status_code == 200
