"""One reader's bounded buffer, for the live streams (``/logs/stream``, ``/api/events``).

Publishers are synchronous (a log line, a scheduler decision) and must never wait for a
reader, and a reader may be as slow as its network. So each reader gets a ``Feed``: a
bounded Trio memory channel that publishers fill with ``send_nowait``. **When it is full,
items are dropped and counted, never queued: memory per reader is bounded by the
feed's capacity, however slow the reader.** The reader learns what it lost from a
``Dropped(count)`` item placed exactly where the lost items were: before the next item
that fits, or, if nothing comes after them, as soon as the reader has caught up.

``Feeds`` keeps the open feeds of one publisher, so that shutdown can end every reader
(``close``) and wait until they have all left (``drained``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Generic, TypeVar, final

import attrs
import trio

__all__ = ["Dropped", "Feed", "Feeds"]

T = TypeVar("T")


@attrs.frozen
class Dropped:
    """``count`` items were lost here: the reader was too slow."""

    count: int


@final
class Feed(Generic[T]):
    """A bounded buffer between synchronous publishers and one reader.

    ``put`` never blocks; ``receive`` returns the items in order, a ``Dropped`` where
    items were lost, and raises ``trio.EndOfChannel`` once the feed is closed and drained.
    """

    def __init__(self, capacity: int) -> None:
        self._send, self._receive = trio.open_memory_channel[T | Dropped](capacity)
        #: Items lost since the last ``Dropped`` went into the channel (or to the reader).
        self._lost = 0
        #: Items lost in all.
        self.dropped = 0
        self._closed = False

    def put(self, item: T) -> None:
        """Hand ``item`` to the reader, or drop it (and count it) if the buffer is full.

        Once the feed is closed, items are discarded without counting.
        """
        if self._closed:
            return
        if self._lost:
            if not self._offer(Dropped(self._lost)):
                self._lose()
                return
            self._lost = 0
        if not self._offer(item):
            self._lose()

    def close(self) -> None:
        """No more items: the reader gets what is buffered, then ``EndOfChannel``."""
        self._closed = True
        self._send.close()

    def discard(self) -> None:
        """The reader has gone: close both ends and free what is buffered."""
        self._closed = True
        self._send.close()
        self._receive.close()

    def receive_nowait(self) -> T | Dropped:
        """The next item, or ``Dropped(n)`` where ``n`` items were lost, if there is one.

        Raises:
            trio.WouldBlock: nothing to receive yet.
            trio.EndOfChannel: the feed is closed and everything in it was received.
        """
        try:
            return self._receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            # The channel is empty: if items were lost, nothing came after them.
            if not self._lost:
                raise
        lost, self._lost = self._lost, 0
        return Dropped(lost)

    async def receive(self) -> T | Dropped:
        """Wait for ``receive_nowait`` to have something; ``trio.EndOfChannel`` at the end.

        *Cancellation*: nothing is taken from the feed when cancelled.
        """
        await trio.lowlevel.checkpoint()
        try:
            return self.receive_nowait()
        except trio.WouldBlock:
            return await self._receive.receive()

    async def receive_burst(self, limit: int) -> list[T | Dropped]:
        """The next item and those already waiting behind it, at most ``limit``: a reader
        that sends on what it receives sends a burst in one piece. ``trio.EndOfChannel`` at
        the end.

        *Cancellation*: nothing is taken from the feed when cancelled.
        """
        items = [await self.receive()]
        with suppress(trio.WouldBlock, trio.EndOfChannel):
            while len(items) < limit:
                items.append(self.receive_nowait())
        return items

    def _offer(self, item: T | Dropped) -> bool:
        try:
            self._send.send_nowait(item)
        except trio.WouldBlock:
            return False
        return True

    def _lose(self) -> None:
        self._lost += 1
        self.dropped += 1


@final
class Feeds(Generic[T]):
    """The open feeds of one publisher, each with ``capacity`` items of buffer."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._feeds: set[Feed[T]] = set()
        self._closed = False
        self._empty = trio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._feeds)

    def __iter__(self) -> Iterator[Feed[T]]:
        return iter(self._feeds)

    @contextmanager
    def open(self) -> Iterator[Feed[T]]:
        """A new feed, registered until the block ends (closed at once after ``close``)."""
        feed = Feed[T](self._capacity)
        if self._closed:
            feed.close()
        else:
            if not self._feeds:
                self._empty = trio.Event()
            self._feeds.add(feed)
        try:
            yield feed
        finally:
            feed.discard()
            if feed in self._feeds:
                self._feeds.remove(feed)
                if not self._feeds:
                    self._empty.set()

    def publish(self, item: T) -> None:
        for feed in self._feeds:
            feed.put(item)

    def close(self) -> None:
        """End every reader (after what is buffered for it); later feeds start closed."""
        self._closed = True
        for feed in self._feeds:
            feed.close()

    async def drained(self) -> None:
        """Return once no feed is open."""
        await self._empty.wait()
