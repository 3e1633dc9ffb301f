"""A bounded ring of output lines, with live subscribers."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import final

import attrs

__all__ = ["LogLine", "LogRing"]


@attrs.frozen
class LogLine:
    time: float
    text: str


@final
class LogRing:
    """The last ``capacity`` lines a model (or llamaswap) printed.

    Subscribers are plain callables run synchronously for every new line; they must not
    block (a live log stream puts lines on a memory channel with ``send_nowait``).
    """

    def __init__(self, capacity: int = 1000) -> None:
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._subscribers: list[Callable[[LogLine], None]] = []
        self.appended = 0  # lines ever appended: a position that survives the ring's turns

    def append(self, time: float, text: str) -> None:
        line = LogLine(time, text)
        self._lines.append(line)
        self.appended += 1
        for subscriber in tuple(self._subscribers):
            subscriber(line)

    def lines(self) -> list[LogLine]:
        return list(self._lines)

    def tail(self, count: int, *, since: int = 0) -> list[str]:
        """The text of the last ``count`` lines, oldest first; only lines appended after
        position ``since`` (an earlier value of ``appended``)."""
        count = min(count, self.appended - since, len(self._lines))
        start = len(self._lines) - max(0, count)
        return [self._lines[i].text for i in range(start, len(self._lines))]

    def subscribe(self, subscriber: Callable[[LogLine], None]) -> Callable[[], None]:
        """Call ``subscriber`` for each new line; returns the function that unsubscribes."""
        self._subscribers.append(subscriber)
        return lambda: self._subscribers.remove(subscriber)
