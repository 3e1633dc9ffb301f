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
import datetime
import heapq
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import TYPE_CHECKING, final

import attrs
import trio

from llamaswap.process import LogLine, LogRing
from llamaswap.process.supervisor import output_logger
from llamaswap.router.events import ModelOutput, RouterEvent

from .feed import Feed, Feeds
from .throttle import throttle_accept_errors

if TYPE_CHECKING:
    from llamaswap.router import Router

__all__ = [
    "LOG_FORMAT",
    "ConsoleFormatter",
    "Logs",
    "RingHandler",
    "SourcedLine",
    "capture_logs",
    "configure_console",
    "log_time",
]

#: The format of llamaswap's own log lines (the console's and ``/logs``).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Lines of llamaswap's own log kept in memory.
OWN_LOG_LINES = 1000
#: Characters of one of llamaswap's own log records kept in memory (a model's output line
#: is at most 16 KiB too): a message may quote what a client sent, up to a request body.
OWN_LINE = 16 * 1024
#: Lines a log follower may fall behind before lines are dropped.
FOLLOWER_BUFFER = 1000

Sink = Callable[["SourcedLine"], None]


#: ``logTimeFormat`` names (Go's time layouts, as llama-swap spells them) as strftime formats;
#: the rfc3339 and stamp* ones with fractions are built in ``log_time``.
_LAYOUTS = {
    "ansic": "%a %b %e %H:%M:%S %Y",
    "unixdate": "%a %b %e %H:%M:%S %Z %Y",
    "rubydate": "%a %b %d %H:%M:%S %z %Y",
    "rfc822": "%d %b %y %H:%M %Z",
    "rfc822z": "%d %b %y %H:%M %z",
    "rfc850": "%A, %d-%b-%y %H:%M:%S %Z",
    "rfc1123": "%a, %d %b %Y %H:%M:%S %Z",
    "rfc1123z": "%a, %d %b %Y %H:%M:%S %z",
    "kitchen": "%-I:%M%p",
    "stamp": "%b %e %H:%M:%S",
}
_STAMP_DIGITS = {"stampmilli": 3, "stampmicro": 6, "stampnano": 9}


def log_time(name: str, moment: datetime.datetime) -> str:
    """``moment`` (aware) as the ``logTimeFormat`` called ``name`` shows it."""
    if name in ("rfc3339", "rfc3339nano"):
        text = moment.isoformat(timespec="microseconds" if name == "rfc3339nano" else "seconds")
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if name in _STAMP_DIGITS:  # Python keeps microseconds: nanoseconds end in 000
        fraction = f"{moment.microsecond:06d}000"[: _STAMP_DIGITS[name]]
        return f"{moment.strftime(_LAYOUTS['stamp'])}.{fraction}"
    return moment.strftime(_LAYOUTS[name])


@final
class ConsoleFormatter(logging.Formatter):
    """``LOG_FORMAT``, with the timestamp ``logTimeFormat`` names (``""``: none; ``None``:
    logging's own, ``2026-12-01 07:30:24,123``)."""

    def __init__(self, time_format: str | None) -> None:
        super().__init__(LOG_FORMAT if time_format != "" else LOG_FORMAT.split(" ", 1)[1])
        self._time_format = time_format

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if not self._time_format:
            return super().formatTime(record, datefmt)
        moment = datetime.datetime.fromtimestamp(record.created).astimezone()
        return log_time(self._time_format, moment)


def configure_console(level: str, to_stdout: str, time_format: str | None) -> None:
    """Log to the console (standard error) what ``logToStdout`` says, with trio's accept
    errors (out of file descriptors) throttled to one line per 10 s (``throttle.py``).

    Args:
        level: ``logLevel`` (``"debug"``, ``"info"``, ``"warn"``, ``"error"``).
        to_stdout: ``"proxy"``: llamaswap's own log, which at debug level holds a copy of
            each model's output; ``"upstream"``: only the models' output, at any level;
            ``"both"``: both, the models' output at any level; ``"none"``: nothing.
        time_format: ``logTimeFormat``, or ``None`` when the config does not set it.
    """
    root = logging.getLogger()
    root.setLevel(logging.WARNING if level == "warn" else level.upper())
    throttle_accept_errors()  # out of descriptors, trio would log a traceback every 0.1 s
    if to_stdout == "none":
        return
    if to_stdout in ("upstream", "both"):
        output_logger.setLevel(logging.DEBUG)  # at every level, not only debug
    own = to_stdout in ("proxy", "both")

    def wanted(record: logging.LogRecord) -> bool:
        return record.name == output_logger.name or own

    handler = logging.StreamHandler()
    handler.setFormatter(ConsoleFormatter(time_format))
    handler.addFilter(wanted)
    root.addHandler(handler)


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
        if len(text) > OWN_LINE:
            text = f"{text[:OWN_LINE]}… ({len(text)} characters)"
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
    """llamaswap's own log (``own``) and every model's output: their history is in their
    rings (``models()``, read each time, so it follows the configuration), and their new
    lines come from ``own`` and ``model_line`` (``Logs.of`` feeds it the router's
    ``ModelOutput`` events)."""

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
        self._everything: list[Sink] = []  # every new line goes to these
        self._by_model: dict[str, list[Sink]] = {}  # and one model's lines to those
        own.subscribe(partial(self._line, None))

    @classmethod
    def of(cls, own: LogRing, router: Router) -> Logs:
        """The logs of ``own`` and of ``router``'s models, those a reload adds included."""
        logs = cls(own, router.log_rings)
        router.observe(logs.on_event, ModelOutput)
        return logs

    def on_event(self, event: RouterEvent) -> None:
        """A router event: a model's line is followed (a ``Router.observe`` observer)."""
        if isinstance(event, ModelOutput):
            self.model_line(event.model, event.line)

    def models(self) -> Mapping[str, LogRing]:
        return self._models()

    def model_line(self, model: str, line: LogLine) -> None:
        """``model``'s server printed ``line`` (in its ring already)."""
        self._line(model, line)

    def history(self, model: str | None = None) -> list[SourcedLine]:
        """Every line kept, oldest first: ``model``'s, or (``None``) llamaswap's own and
        every model's, merged by time."""
        if model is not None:
            rings: dict[str | None, LogRing] = {model: self._models()[model]}
        else:
            rings = {None: self.own}
            rings.update(self._models())
        streams = [
            [(line.time, SourcedLine(source, line)) for line in ring.lines()]
            for source, ring in rings.items()
        ]
        # Stable: lines of one ring keep their order, and equal times keep ring order.
        return [line for _, line in heapq.merge(*streams, key=lambda pair: pair[0])]

    @contextmanager
    def follow(
        self, model: str | None = None
    ) -> Iterator[tuple[list[SourcedLine], Feed[SourcedLine]]]:
        """The history (as ``history``) and a feed of the lines that come after it.

        Nothing is lost or repeated between the two: both are taken at the same moment.
        The feed ends when ``close`` is called (shutdown); leaving the block unsubscribes.
        """
        past = self.history(model)
        with self._followers.open() as feed, self._sink(model, feed.put):
            yield past, feed

    @contextmanager
    def tap(self, sink: Sink) -> Iterator[None]:
        """Call ``sink`` for every new line (own and every model's) while the block runs."""
        with self._sink(None, sink):
            yield

    def close(self) -> None:
        """Shutdown: every follower's stream ends once it has read what it holds."""
        self._followers.close()

    async def drained(self) -> None:
        """Return once no follower is left (at once if none is)."""
        await self._followers.drained()

    def followers(self) -> int:
        return len(self._followers)

    @contextmanager
    def _sink(self, model: str | None, sink: Sink) -> Iterator[None]:
        """``sink`` hears ``model``'s new lines (every line, for ``None``) in the block."""
        sinks = self._everything if model is None else self._by_model.setdefault(model, [])
        sinks.append(sink)
        try:
            yield
        finally:
            sinks.remove(sink)
            if model is not None and not sinks:
                del self._by_model[model]

    def _line(self, source: str | None, line: LogLine) -> None:
        if not self._everything and source not in self._by_model:
            return
        item = SourcedLine(source, line)
        for sink in tuple(self._everything):
            sink(item)
        if source is not None:
            for sink in tuple(self._by_model.get(source, ())):
                sink(item)
