"""Prefetch: the model the queue will load next has its weights read ahead of its load.

While the GPU serves one model, the disk is idle. When the queue shows which model loads
next (the first waiting request, in the scheduler's own order, whose model is stopped),
its weight files (``files``, or the ``-m`` of its llama-server ``cmd``:
``process/prefetch.weight_files``) are read into the page cache (``process/prefetch.py``,
bounded by free memory), so that its load reads from memory.

One task (``run``, in the router's nursery) owns it. The router ``poke``s it after each
batch of decisions and each model state change (setting an event: nothing else on the
request path); it then looks at the queue, at most every ``THROTTLE`` seconds, and when
the next load differs from the one being read, cancels that read and starts the new one.
**At most one prefetch runs, and it is for the model the plan names now**: a read whose
model starts loading, or is no longer next, is cancelled (within one chunk).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import final

import trio

from llamaswap.config.model import ModelConfig
from llamaswap.process.prefetch import PrefetchResult, prefetch, weight_files
from llamaswap.resources import format_size

__all__ = ["THROTTLE", "Prefetcher"]

logger = logging.getLogger("llamaswap.prefetch")

#: Seconds between two looks at the queue, at most.
THROTTLE = 0.2


@final
class Prefetcher:
    """See the module docstring.

    Args:
        next_load: the model the queue will load next, or None.
        definition: a model's definition (where its files are named).
        read: reads files into the page cache (``process/prefetch.prefetch``).
    """

    def __init__(
        self,
        next_load: Callable[[], str | None],
        definition: Callable[[str], ModelConfig],
        read: Callable[[tuple[str, ...]], Awaitable[PrefetchResult]] = prefetch,
    ) -> None:
        self._next_load = next_load
        self._definition = definition
        self._prefetch = read
        self._wake = trio.Event()
        #: The model being read, and the scope of its read.
        self.current: str | None = None
        self._scope: trio.CancelScope | None = None

    def poke(self) -> None:
        """Something changed that may change the next load."""
        self._wake.set()

    async def run(self) -> None:
        """Follow the plan until cancelled (a read in progress stops with it)."""
        async with trio.open_nursery() as nursery:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                target = self._next_load()
                if target is not None and not weight_files(self._definition(target)):
                    target = None  # nothing to read for it
                if target != self.current:
                    if self._scope is not None:
                        self._scope.cancel(reason="the next load changed")
                    self.current, self._scope = target, None
                    if target is not None:
                        self._scope = trio.CancelScope()
                        nursery.start_soon(self._read, target, self._scope)
                await trio.sleep(THROTTLE)

    async def _read(self, model: str, scope: trio.CancelScope) -> None:
        files = weight_files(self._definition(model))
        with scope:
            result = await self._prefetch(files)
            skipped = "".join(f"; {s.path}: {s.reason}" for s in result.skipped)
            logger.info(
                "prefetched %s of %r's weights in %.1fs%s",
                format_size(result.bytes_read),
                model,
                result.seconds,
                skipped,
            )
        if scope.cancelled_caught:
            logger.debug("prefetch of %r cancelled: %s", model, "the next load changed")
        if self._scope is scope:
            self._scope = None  # done; ``current`` stays, so it is not read again
