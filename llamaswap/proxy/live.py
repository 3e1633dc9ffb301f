"""Live routes: ``/logs``, ``/logs/stream``, ``/logs/stream/{model}`` and ``/api/events``.

Quart views whose responses are async generators: Quart sends each chunk as it is
yielded (hypercorn writes it at once, chunked), and a client that disconnects cancels
the request's task, so the generator is cancelled where it waits. **Each stream
subscribes inside its generator and unsubscribes in its ``finally``**: a disconnect, an
error or the end of the server (``Logs.close``, ``EventHub.close``, called by ``serve()``
after the models have stopped) ends it, and nothing is left subscribed. Every stream
reads a bounded feed: a slow client loses lines or events (and is told how many), it
never makes memory grow.

Authentication is the app's ``check_key``, like every other Quart route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import trio
from quart import Response, request
from quart_trio import QuartTrio

from llamaswap.errors import ModelNotFound
from llamaswap.observability import ActivityLog
from llamaswap.observability.events import EventHub, next_sse
from llamaswap.observability.feed import Dropped
from llamaswap.observability.logs import Logs, SourcedLine
from llamaswap.observability.router_events import RouterEvents
from llamaswap.process import LogRing
from llamaswap.router import Router

__all__ = ["register"]

TEXT = "text/plain; charset=utf-8"
_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
#: History is sent in pieces of about this many bytes.
_HISTORY_CHUNK = 64 * 1024
#: Lines already waiting that are sent together, at most.
_BURST_LINES = 256
_TRUE = frozenset({"", "1", "true", "yes", "on"})


def register(
    quart: QuartTrio,
    router: Router,
    activity: ActivityLog,
    *,
    hub: EventHub,
    logs: Logs | None = None,
) -> None:
    """Add the live routes to ``quart``, and publish ``router``'s events on ``hub``.

    ``serve()`` passes its running logs; without them (tests of other routes) logs with
    llamaswap's own log empty stand in.
    """
    if logs is None:
        logs = Logs.of(LogRing(), router)
    events = RouterEvents(hub, router, activity)
    events.connect()

    def model_id(name: str) -> str:
        model = router.config.resolve(name)
        if model is None or model not in logs.models():
            raise ModelNotFound(name)
        return model

    @quart.get("/logs")
    async def logs_history() -> Response:
        text = "".join(f"{line.text}\n" for line in logs.history())
        return Response(text, content_type=TEXT)

    @quart.get("/logs/stream")
    @quart.get("/logs/stream/<path:name>")
    async def logs_stream(name: str | None = None) -> Response:
        model = None if name is None else model_id(name)
        history = "no-history" not in request.args
        body = _log_stream(logs, model, history=history)
        return Response(body, content_type=TEXT, headers=_STREAM_HEADERS)

    @quart.get("/api/events")
    async def events_stream() -> Response:
        with_logs = request.args.get("logs", "0").lower() in _TRUE
        body = _event_stream(hub, events, logs if with_logs else None)
        return Response(body, content_type="text/event-stream", headers=_STREAM_HEADERS)


async def _log_stream(logs: Logs, model: str | None, *, history: bool) -> AsyncIterator[bytes]:
    """``model``'s output (or every line, prefixed, for ``None``): history, then live."""
    with logs.follow(model) as (past, feed):
        if history:
            for chunk in _chunks(_text(line, model) for line in past):
                yield chunk
        while True:
            try:
                items = await feed.receive_burst(_BURST_LINES)
            except trio.EndOfChannel:
                return
            yield "".join(_text(item, model) for item in items).encode()


async def _event_stream(
    hub: EventHub, events: RouterEvents, logs: Logs | None
) -> AsyncIterator[bytes]:
    """The snapshot, then every event (and log lines, with ``logs``), as SSE."""
    with hub.subscribe(first=events.snapshot, logs=logs) as feed:
        while (chunk := await next_sse(feed)) is not None:
            yield chunk


def _text(item: SourcedLine | Dropped, model: str | None) -> str:
    """A line of ``model``'s own stream as it is, of the mixed one with its source."""
    if isinstance(item, Dropped):
        return f"[{item.count} lines dropped: this reader is too slow]\n"
    return f"{item.line.text if model is not None else item.text}\n"


def _chunks(texts: Iterable[str]) -> Iterable[bytes]:
    piece: list[str] = []
    size = 0
    for text in texts:
        piece.append(text)
        size += len(text)
        if size >= _HISTORY_CHUNK:
            yield "".join(piece).encode()
            piece, size = [], 0
    if piece:
        yield "".join(piece).encode()
