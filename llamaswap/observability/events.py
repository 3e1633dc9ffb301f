"""The event hub behind ``GET /api/events``: typed events, fanned out to bounded readers.

Publishers are synchronous (router listeners, the activity log, a reload) and call
``EventHub.publish(event)`` with a JSON object whose ``type`` names it. Each subscriber
reads its own bounded ``Feed``: **a slow reader loses events, counted, and is told with
an event of its own (``{"type": "dropped", "count": N}``) where they were lost; it never
makes a publisher wait or memory grow.**

Some state changes too often to send every change: a queue moves with every request.
``publish_soon(key, build)`` marks ``key`` dirty; the hub's own task (``run``, a service
started in ``serve()``'s nursery) calls ``build()`` and publishes the result at most once
per ``interval`` (100 ms): the first change is sent at once, the ones that follow within
the interval are coalesced into one event at its end.

**An event is encoded once, however many subscribers read it**: ``publish`` turns it into
its SSE bytes (``event: <type>`` and ``data: <json>``), and every subscriber's feed holds
those same bytes, so one more subscriber (a dashboard tab) costs a reference per event,
not a ``json.dumps``. Only what is one subscriber's own is encoded for it alone: its first
event (the snapshot) and a ``dropped`` notice. A subscriber that asked for log lines
(``subscribe(logs=...)``) gets them through a tap of its own, but each line is encoded
once for all the taps. ``next_sse`` reads a feed: the next bytes, or a comment line
(``: ping``) after ``heartbeat`` seconds (15) with nothing to send, so that proxies keep
the connection open.

Event shapes are documented in ``docs/api.md`` (``GET /api/events``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, final

import attrs
import trio

from .feed import Dropped, Feed, Feeds
from .logs import Logs, SourcedLine

__all__ = ["HEARTBEAT", "PING", "Event", "EventHub", "HubStatistics", "encode_sse", "next_sse"]

#: A JSON object with a ``type`` field.
Event = Mapping[str, Any]

#: Seconds without an event after which a reader is sent a comment line.
HEARTBEAT = 15.0
#: Events a reader may fall behind before events are dropped.
READER_BUFFER = 256
#: At most one coalesced event per key per this many seconds.
COALESCE_INTERVAL = 0.1

PING = b": ping\n\n"


@attrs.frozen
class HubStatistics:
    subscribers: int
    published: int
    dropped: int  # events lost by readers that are still connected


@final
class EventHub:
    """Fans events out to every subscriber; see the module docstring.

    Args:
        buffer: events each subscriber may fall behind before losing some.
        interval: seconds between two coalesced events (``publish_soon``).
    """

    def __init__(
        self, *, buffer: int = READER_BUFFER, interval: float = COALESCE_INTERVAL
    ) -> None:
        self._subscribers: Feeds[bytes] = Feeds(buffer)
        self._interval = interval
        self._pending: dict[str, Callable[[], Event | None]] = {}
        self._dirty = trio.Event()
        self._published = 0

    @property
    def active(self) -> bool:
        """Whether anyone listens: publishers may skip building events when not."""
        return bool(len(self._subscribers))

    def publish(self, event: Event) -> None:
        """Send ``event`` to every subscriber now (dropped for those whose buffer is full),
        encoded once for all of them."""
        self._published += 1
        if self._subscribers:
            self._subscribers.publish(encode_sse(event))

    def publish_soon(self, key: str, build: Callable[[], Event | None]) -> None:
        """``key``'s state changed: publish ``build()`` (unless ``None``) within ``interval``.

        Changes in quick succession make one event, built when it is sent.
        """
        if self.active:
            self._pending[key] = build
            self._dirty.set()

    def publish_reload(self, result: Mapping[str, Any]) -> None:
        """A configuration reload happened: ``{"type": "reload", **result}``, where
        ``result`` is ``{"ok": bool, "changed": {...}, "problems": [...]}``."""
        self.publish({"type": "reload", **result})

    @contextmanager
    def subscribe(
        self, first: Callable[[], Event] | None = None, *, logs: Logs | None = None
    ) -> Iterator[Feed[bytes]]:
        """A feed of every event from now on, as SSE bytes, for the duration of the block.

        ``first()``, if given, is built and queued in the same step as the subscription,
        so that nothing happens between it and the first event after it (a snapshot).
        With ``logs``, every new line of theirs is a ``log`` event among the others.
        After ``close`` the feed holds at most ``first()`` and then ends.
        """
        with self._subscribers.open() as feed:
            if first is not None:
                feed.put(encode_sse(first()))
            tap = nullcontext() if logs is None else logs.tap(lambda line: feed.put(_log(line)))
            with tap:
                yield feed

    def close(self) -> None:
        """Shutdown: every subscriber's stream ends once it has read what it holds."""
        self._subscribers.close()

    async def drained(self) -> None:
        """Return once no subscriber is left (at once if none is)."""
        await self._subscribers.drained()

    def statistics(self) -> HubStatistics:
        return HubStatistics(
            subscribers=len(self._subscribers),
            published=self._published,
            dropped=sum(feed.dropped for feed in self._subscribers),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish the coalesced events (``publish_soon``) until cancelled."""
        task_status.started()
        next_send = -math.inf
        while True:
            await self._dirty.wait()
            await trio.sleep_until(next_send)
            # Changes marked from here on wait for the next round.
            self._dirty = trio.Event()
            pending, self._pending = self._pending, {}
            for build in pending.values():
                event = build()
                if event is not None:
                    self.publish(event)
            next_send = trio.current_time() + self._interval


def encode_sse(event: Event) -> bytes:
    """``event`` as one server-sent event: ``event: <type>`` and ``data: <json>``."""
    data = json.dumps(event, separators=(",", ":"), default=str)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


@functools.lru_cache(maxsize=1)
def _log(line: SourcedLine) -> bytes:
    """``line`` as a ``log`` event. ``Logs`` hands a new line to every tap in a row, so
    keeping the last line's encoding encodes it once for every subscriber."""
    return encode_sse({"type": "log", "model": line.model, "text": line.line.text})


async def next_sse(feed: Feed[bytes], *, heartbeat: float = HEARTBEAT) -> bytes | None:
    """The next bytes of an SSE stream: the next events (those already waiting go out
    together), with a ``dropped`` event where events were lost, or ``PING`` after
    ``heartbeat`` seconds with nothing; ``None`` at the end.

    *Cancellation*: nothing is taken from the feed when cancelled.
    """
    with trio.move_on_after(heartbeat):
        try:
            items = await feed.receive_burst(READER_BUFFER)
        except trio.EndOfChannel:
            return None
        return b"".join(
            encode_sse({"type": "dropped", "count": item.count})
            if isinstance(item, Dropped)
            else item
            for item in items
        )
    return PING
