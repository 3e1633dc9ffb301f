"""Log history and live log streams: llamaswap's own log and every model's output.

Each model's supervisor keeps its output in a ``LogRing`` (``process/logring.py``).
llamaswap's own log gets one too: ``capture_logs`` installs a ``logging.Handler`` on the
root logger that appends each formatted record to it, for as long as ``serve()`` runs.
``Logs`` reads them all: the merged history (``/logs``) and live followers
(``/logs/stream``, the ``log`` events of ``/api/events``).

Model lines are prefixed with their model (``[chat] ...``) wherever they are mixed with
others; llamaswap's own lines are its formatted records (time, level, logger, message).
**A log follower never blocks a writer and never grows without bound**: it reads a
bounded ``Feed``, and lines it is too slow for are dropped and counted.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import final

import attrs
import trio

from llamaswap.process import LogLine, LogRing
from llamaswap.process.supervisor import output_logger

from .feed import Feed, Feeds

__all__ = ["LOG_FORMAT", "Logs", "RingHandler", "SourcedLine", "capture_logs"]

#: The format of llamaswap's own log lines (the console's and ``/logs``).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Lines of llamaswap's own log kept in memory.
OWN_LOG_LINES = 1000
#: Lines a log follower may fall behind before lines are dropped.
FOLLOWER_BUFFER = 1000


@attrs.frozen
class SourcedLine:
    """A log line and whose it is: a model's ID, or ``None`` for llamaswap's own."""

    model: str | None
    line: LogLine

    @property
    def text(self) -> str:
        """The line as mixed logs show it: a model's prefixed with ``[model] ``."""
        if self.model is None:
            return self.line.text
        return f"[{self.model}] {self.line.text}"


@final
class RingHandler(logging.Handler):
    """Appends each formatted record to ``ring`` (llamaswap's own log).

    Records logged from another thread (Trio's worker threads) are appended by the Trio
    thread, through ``token``: a ring's subscribers are not thread-safe.
    """

    def __init__(self, ring: LogRing, token: trio.lowlevel.TrioToken) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self._ring = ring
        self._token = token
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        # A model's output, copied to our log at debug level, is already in its own ring.
        if record.name == output_logger.name:
            return False
        return super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if threading.get_ident() == self._thread:
            self._append(text)
            return
        with contextlib.suppress(trio.RunFinishedError):  # then nobody reads the ring
            self._token.run_sync_soon(self._append, text)

    def _append(self, text: str) -> None:
        self._ring.append(trio.current_time(), text)


@asynccontextmanager
async def capture_logs(ring: LogRing) -> AsyncIterator[RingHandler]:
    """Copy every record the root logger handles into ``ring`` while the block runs.

    It records the Trio run's token and thread; the handler is removed when the block
    ends. (Asynchronous only to sit among ``serve()``'s other ``async with`` services.)
    """
    handler = RingHandler(ring, trio.lowlevel.current_trio_token())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        handler.close()


@final
class Logs:
    """llamaswap's own log (``own``) and every model's output (``models()``, read each
    time, so it follows the configuration)."""

    def __init__(
        self,
        own: LogRing,
        models: Callable[[], Mapping[str, LogRing]],
        *,
        buffer: int = FOLLOWER_BUFFER,
    ) -> None:
        self.own = own
        self._models = models
        self._followers: Feeds[SourcedLine] = Feeds(buffer)

    def models(self) -> Mapping[str, LogRing]:
        return self._models()

    def history(self, model: str | None = None) -> list[SourcedLine]:
        """Every line kept, oldest first: ``model``'s, or (``None``) llamaswap's own and
        every model's, merged by time."""
        return [line for _, line in self._sources(model)[1]]

    @contextmanager
    def follow(
        self, model: str | None = None
    ) -> Iterator[tuple[list[SourcedLine], Feed[SourcedLine]]]:
        """The history (as ``history``) and a feed of the lines that come after it.

        Nothing is lost or repeated between the two: both are taken at the same moment.
        The feed ends when ``close`` is called (shutdown); leaving the block unsubscribes.
        """
        rings, lines = self._sources(model)
        with self._followers.open() as feed, _subscribed(rings, feed.put):
            yield [line for _, line in lines], feed

    @contextmanager
    def tap(self, sink: Callable[[SourcedLine], None]) -> Iterator[None]:
        """Call ``sink`` for every new line (own and every model's) while the block runs."""
        rings, _ = self._sources(None, history=False)
        with _subscribed(rings, sink):
            yield

    def close(self) -> None:
        """Shutdown: every follower's stream ends once it has read what it holds."""
        self._followers.close()

    async def drained(self) -> None:
        """Return once no follower is left (at once if none is)."""
        await self._followers.drained()

    def followers(self) -> int:
        return len(self._followers)

    def _sources(
        self, model: str | None, *, history: bool = True
    ) -> tuple[dict[str | None, LogRing], list[tuple[float, SourcedLine]]]:
        if model is not None:
            rings: dict[str | None, LogRing] = {model: self._models()[model]}
        else:
            rings = {None: self.own}
            rings.update(self._models())
        if not history:
            return rings, []
        streams = [
            [(line.time, SourcedLine(source, line)) for line in ring.lines()]
            for source, ring in rings.items()
        ]
        # Stable: lines of one ring keep their order, and equal times keep ring order.
        return rings, list(heapq.merge(*streams, key=lambda pair: pair[0]))


@contextmanager
def _subscribed(
    rings: Mapping[str | None, LogRing], sink: Callable[[SourcedLine], None]
) -> Iterator[None]:
    unsubscribes: list[Callable[[], None]] = []
    try:
        for source, ring in rings.items():

            def deliver(line: LogLine, source: str | None = source) -> None:
                sink(SourcedLine(source, line))

            unsubscribes.append(ring.subscribe(deliver))
        yield
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()
