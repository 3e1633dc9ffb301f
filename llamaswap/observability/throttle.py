"""One log line per interval for a message that repeats: trio's accept errors.

When the process runs out of file descriptors, ``trio.serve_listeners`` (hypercorn's accept
loop) logs ``accept returned EMFILE ...`` with a traceback and retries every 0.1 s: ten
tracebacks a second, each the same, burying everything else in the log and in ``/logs``.
``Throttle`` is a ``logging.Filter`` for such a logger: it lets one record through per
interval, without its traceback, and says on it how many it held back since the last.
The first sign of trouble is logged at once; a count that stops growing means it is over.

Time is ``trio.current_time()`` (or an injected clock), so a test on the mock clock sees
exactly which records pass. Outside a Trio run there is no clock, and every record passes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import final

import trio

__all__ = ["ACCEPT_ERRORS_INTERVAL", "ACCEPT_LOGGER", "Throttle", "throttle_accept_errors"]

#: The logger of trio's accept loop (``trio._highlevel_serve_listeners.LOGGER``).
ACCEPT_LOGGER = "trio.serve_listeners"
#: Seconds between two of its lines at most.
ACCEPT_ERRORS_INTERVAL = 10.0


@final
class Throttle(logging.Filter):
    """Lets through one record per ``interval`` seconds, without its traceback.

    A record that passes after others were held back says how many (``(29 more since the
    last; ...)``). Put it on a logger (not a handler) to throttle every handler's copy alike.
    """

    def __init__(self, interval: float, *, clock: Callable[[], float] = trio.current_time) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._next = -math.inf
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            now = self._clock()
        except RuntimeError:  # not in a Trio run: nothing to measure an interval by
            return True
        if now < self._next:
            self._held += 1
            return False
        self._next = now + self._interval
        every = f"logged at most once every {self._interval:g} s"
        suffix = f"{self._held} more since the last; {every}" if self._held else every
        self._held = 0
        record.msg = f"{record.msg} ({suffix})"
        record.exc_info = None
        record.exc_text = None
        return True


def throttle_accept_errors(interval: float = ACCEPT_ERRORS_INTERVAL) -> Throttle:
    """Put a ``Throttle`` on trio's accept-loop logger, instead of any earlier one."""
    logger = logging.getLogger(ACCEPT_LOGGER)
    for old in [item for item in logger.filters if isinstance(item, Throttle)]:
        logger.removeFilter(old)
    throttle = Throttle(interval)
    logger.addFilter(throttle)
    return throttle
