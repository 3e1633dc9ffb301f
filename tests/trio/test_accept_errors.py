"""Out of file descriptors, trio's accept loop logs one line per 10 s, not a traceback per
retry: ``configure_console`` throttles the ``trio.serve_listeners`` logger. Trio's own
``serve_listeners`` runs against a listener whose ``accept`` always fails with ``EMFILE``,
on the autojump clock."""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterator
from typing import final

import pytest
import trio
import trio.testing

from llamaswap.observability.logs import configure_console


@final
class ExhaustedListener(trio.abc.Listener[trio.SocketStream]):
    """A listener in a process that has no file descriptor left."""

    def __init__(self) -> None:
        self.accepts = 0

    async def accept(self) -> trio.SocketStream:
        await trio.lowlevel.checkpoint()
        self.accepts += 1
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@final
class Lines(logging.Handler):
    """What the logger's handlers get, with the Trio time each arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((trio.current_time(), record))


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("trio.serve_listeners")
    root = logging.getLogger()
    level, handlers, filters = root.level, root.handlers[:], logger.filters[:]
    handler = Lines()
    logger.addHandler(handler)
    configure_console("info", "none", None)  # as llamaswap starts
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = filters
        root.handlers[:] = handlers
        root.setLevel(level)


async def test_exhausted_descriptors_log_one_line_per_interval(
    autojump_clock: trio.testing.MockClock, lines: Lines
) -> None:
    listener = ExhaustedListener()
    with trio.move_on_after(25.0):
        await trio.serve_listeners(trio.sleep_forever, [listener])  # type: ignore[arg-type]
    assert 240 < listener.accepts < 260  # a retry every 0.1 s
    times = [time for time, _ in lines.lines]
    assert len(times) == 3
    assert times[0] == 0.0
    assert 10.0 <= times[1] < 10.2
    assert 20.0 <= times[2] < 20.2
    assert all(record.exc_info is None for _, record in lines.lines)
    messages = [record.getMessage() for _, record in lines.lines]
    first = "accept returned EMFILE (Too many open files); retrying in 0.1 seconds"
    assert messages[0] == f"{first} (logged at most once every 10 s)"
    for message in messages[1:]:
        found = re.fullmatch(
            rf"{re.escape(first)} \((\d+) more since the last; logged at most once every 10 s\)",
            message,
        )
        assert found is not None, message
        assert 98 <= int(found[1]) <= 101
