"""What llamaswap changes in hypercorn's handler of one connection (its trio worker).

hypercorn builds each connection's handler from ``hypercorn.trio.run.TCPServer``;
importing this module installs :class:`TCPServer` there. Two changes, both to the idle
timer, which closes a connection that waits too long for its next request (the
keep-alive timeout, and the bound on a slow request head):

* **the timer is one task per connection, whose deadline moves** (:class:`IdleTimer`).
  hypercorn (0.17, 0.18) starts a new timer task each time an answer ends and cancels it
  when the next request arrives: a task spawned, started and cancelled per request, which
  was 14 % of the instructions of a small proxied request;
* **once nothing more can be read, the timer stops**: the connection closes as soon as the
  answer being sent, if any, is over. hypercorn read the connection until end of file,
  then waited for its tasks (the idle timer among them) before closing the socket, so a
  client that closed a kept-alive connection between requests left it in CLOSE-WAIT for
  the whole keep-alive timeout (75 s): at 14 such connections a second, a 1024-descriptor
  limit was reached and no client could connect.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio.run
import hypercorn.trio.tcp_server
import hypercorn.typing
import trio

__all__ = ["IdleTimer", "TCPServer"]


class IdleTimer:
    """A connection's idle timer: ``close`` runs once the connection has been idle for
    ``timeout`` seconds, or at once if it is idle when the server is ``terminated``.

    hypercorn calls :meth:`restart` when the connection becomes idle (it opened, or an
    answer ended) and :meth:`stop` when a request starts; both only move the deadline of
    :meth:`run`, the one task that waits. **A request being answered is never cut by the
    timer**: when the server terminates meanwhile, the connection closes once the answer
    is over.
    """

    def __init__(
        self,
        timeout: float,
        terminated: hypercorn.typing.Event,
        close: Callable[[], Awaitable[None]],
    ) -> None:
        self._timeout = timeout
        self._terminated = terminated
        self._close = close
        self._scope = trio.CancelScope(deadline=math.inf)
        self._ended = False

    async def restart(self, task_group: object = None, action: object = None) -> None:
        """The connection is idle (hypercorn's signature; the arguments are not used)."""
        delay = 0.0 if self._terminated.is_set() else self._timeout
        self._scope.deadline = trio.current_time() + delay

    async def stop(self) -> None:
        """A request has started."""
        self._scope.deadline = math.inf

    def end(self) -> None:
        """Nothing more can come: :meth:`run` returns without closing (the connection's
        handler closes it once its answer, if any, is over)."""
        self._ended = True
        self._scope.cancel()

    async def run(self) -> None:
        """Wait for the deadline, or for the server to terminate while idle; then close."""
        with self._scope:
            await self._terminated.wait()
            if self._scope.deadline == math.inf:  # busy: close when the answer is over
                await trio.sleep_forever()
        if not self._ended:
            with trio.CancelScope(shield=True):
                await self._close()


class TCPServer(hypercorn.trio.tcp_server.TCPServer):
    """hypercorn's handler of one connection, with :class:`IdleTimer` as its idle timer,
    which stops once nothing more can be read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = IdleTimer(  # type: ignore[assignment]
            self.config.keep_alive_timeout,
            self.context.terminated,
            self._initiate_server_close,
        )

    async def _read_data(self) -> None:
        timer: IdleTimer = self.idle_task  # type: ignore[assignment]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            await super()._read_data()
            timer.end()


hypercorn.trio.run.TCPServer = TCPServer  # type: ignore[attr-defined]
