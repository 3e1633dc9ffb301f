"""Scraping the nodes, and following ``endpoints.yaml``.

One task per endpoint reads its ``/gateway/metrics`` every scrape interval, and its
``/v1/models`` each second (sooner when its figures name a model it did not list). A
failed scrape (refused, timed out, an answer that is not the figures) counts against the
node on the board; a good one replaces its entry. The endpoints file is looked at each
second and read again when it changed: scrapers start for new endpoints and stop for
removed ones; a file that is not valid leaves the list as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

from llamaswap.errors import ConfigError

from .board import Board
from .endpoints import load_endpoints
from .nodes import Endpoint, parse_figures, parse_models

__all__ = ["follow_endpoints", "scrape"]

log = logging.getLogger("llamaswap.gateway")

#: How often a node's model list is read again.
MODELS_EVERY = 1.0
#: A scrape that takes longer than this has failed.
SCRAPE_TIMEOUT = 1.0
#: How often the endpoints file is looked at.
FILE_EVERY = 1.0


async def scrape(
    endpoint: Endpoint, board: Board, client: httpx.AsyncClient, interval: float
) -> None:
    """Scrape ``endpoint`` every ``interval`` seconds until cancelled."""
    models: frozenset[str] | None = None
    models_at = -MODELS_EVERY
    while True:
        started = trio.current_time()
        try:
            with trio.fail_after(SCRAPE_TIMEOUT):
                answer = await client.get(endpoint.metrics_url)
                answer.raise_for_status()
                figures = parse_figures(answer.text)
                named = figures.resident | figures.loading
                if models is None or started - models_at >= MODELS_EVERY or named - models:
                    listed = await client.get(endpoint.url + "/v1/models")
                    listed.raise_for_status()
                    models, models_at = parse_models(listed.json()), started
        except (httpx.HTTPError, ValueError, trio.TooSlowError) as exc:
            board.failed(endpoint, str(exc) or type(exc).__name__)
        else:
            board.scraped(endpoint, figures, models)
        await trio.sleep_until(started + interval)


async def follow_endpoints(
    path: Path,
    endpoints: Sequence[Endpoint],
    board: Board,
    interval: float,
    *,
    node_key: str | None = None,
) -> None:
    """Scrape ``endpoints`` (read from ``path``), and the list ``path`` holds whenever it
    changes, until cancelled; ``node_key``: the API key the nodes want, if any."""
    headers = {"authorization": f"Bearer {node_key}"} if node_key else {}
    scrapers: dict[Endpoint, trio.CancelScope] = {}
    client = httpx.AsyncClient(headers=headers, timeout=SCRAPE_TIMEOUT)
    async with client, trio.open_nursery() as nursery:

        def follow(listed: Sequence[Endpoint]) -> None:
            board.set_endpoints(listed)
            for gone in scrapers.keys() - set(listed):
                scrapers.pop(gone).cancel()
            for endpoint in listed:
                if endpoint not in scrapers:
                    scrapers[endpoint] = scope = trio.CancelScope()
                    nursery.start_soon(_scoped, scope, endpoint, board, client, interval)

        follow(endpoints)
        stamp = await _stamp(path)
        while True:
            await trio.sleep(FILE_EVERY)
            now = await _stamp(path)
            if now == stamp:
                continue
            stamp = now
            try:
                listed = await trio.to_thread.run_sync(load_endpoints, path)
            except ConfigError as exc:
                log.error("the endpoints file changed but is not valid; the list stays:\n%s", exc)
                continue
            log.info("endpoints: %s", ", ".join(e.name for e in listed) or "none")
            follow(listed)


async def _scoped(
    scope: trio.CancelScope, endpoint: Endpoint, board: Board, client: httpx.AsyncClient,
    interval: float,
) -> None:  # fmt: skip
    with scope:
        await scrape(endpoint, board, client, interval)


async def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file does (a rename over it included)."""
    try:
        stat = await trio.Path(path).stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)
