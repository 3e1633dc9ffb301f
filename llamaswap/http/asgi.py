"""What llamaswap's server and its application share about one ASGI request: the moment
its client leaves (``ClientLeft``), its queue of messages (``Inbox``), its body as the
application reads it (``RequestBody``), and how an error is answered (``send_error``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import cast, final

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    HTTPScope,
)

from llamaswap.errors import BodyTooLarge, RequestError

from .errors import error_answer

__all__ = [
    "CLIENT_LEFT_EXTENSION",
    "ClientLeft",
    "Inbox",
    "RequestBody",
    "client_left",
    "send_error",
]

#: The ASGI scope extension through which llamaswap's server (``llamaswap/http/server.py``)
#: tells the application that its client has left, the moment it does: a ``ClientLeft``.
CLIENT_LEFT_EXTENSION = "llamaswap.client_left"


@final
class ClientLeft:
    """A request's ``CLIENT_LEFT_EXTENSION``. The server calls it as it hands the
    application the request's ``http.disconnect`` (the client left, or the response is
    over); the application names what to call then with ``on_leave``, which calls it at
    once if that has happened already (before the application's task first ran)."""

    __slots__ = ("_functions", "left")

    def __init__(self) -> None:
        self.left = False
        self._functions: list[Callable[[], None]] = []

    def on_leave(self, function: Callable[[], None]) -> None:
        """Call ``function`` (which must not raise) when the client leaves."""
        if self.left:
            function()
        else:
            self._functions.append(function)

    def __call__(self) -> None:
        self.left = True
        for function in self._functions:
            function()


def client_left(scope: HTTPScope) -> ClientLeft | None:
    """The server's ``CLIENT_LEFT_EXTENSION``, if it offers one."""
    extension = (scope.get("extensions") or {}).get(CLIENT_LEFT_EXTENSION)
    return cast("ClientLeft | None", extension)


@final
class RequestBody:
    """The request body, read by the request task; then the client's leaving is watched.

    hypercorn delivers ``http.disconnect`` after the body's messages, so whoever reads the
    body sees a disconnect first: the request task while it reads (or, for a body streamed
    through after the grant, ``prefetch`` while the request waits). Once the body is in,
    llamaswap's server calls ``gone`` as the client leaves (``CLIENT_LEFT_EXTENSION``);
    under another ASGI server (``watch``), a watcher task started in the request's nursery
    waits for the ``http.disconnect``. Each calls ``on_disconnect``.
    """

    def __init__(
        self,
        receive: ASGIReceiveCallable,
        limit: int,
        nursery: trio.Nursery,
        on_disconnect: Callable[[], None],
        *,
        expected: bool,
        watch: bool,
    ) -> None:
        self._receive = receive
        self._limit = limit
        self._nursery = nursery
        self._on_disconnect = on_disconnect
        self._watch_needed = watch
        self._received = 0
        self._buffered: collections.deque[bytes] = collections.deque()
        self.expected = expected  # the request says it has a body
        self.tee: Callable[[bytes], None] | None = None  # given each piece as it arrives
        self.disconnected = False
        self.complete = False  # the whole body has arrived (or is being dropped)

    @property
    def unread(self) -> bool:
        """Whether some of the body the client sends has not been read."""
        return self.expected and not self.complete

    async def _next(self) -> bytes | None:
        """The next chunk from the client; None once the body is complete."""
        while not self.complete:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone()
                await trio.lowlevel.checkpoint()  # on_disconnect cancelled us: raise here
                return None
            if message["type"] == "http.request":
                if not message.get("more_body", False):
                    self.complete = True
                    if self._watch_needed:
                        self._nursery.start_soon(self._watch)
                if chunk := message.get("body", b""):
                    self._received += len(chunk)
                    if self._received > self._limit:
                        raise BodyTooLarge(self._limit)
                    if self.tee is not None:
                        self.tee(chunk)
                    return chunk
        return None

    def __aiter__(self) -> RequestBody:
        # An iterator object rather than an async generator: the pool may stop reading
        # it half-way (an early answer, a cancel), and a generator would then be left to
        # the garbage collector to finalise.
        return self

    async def __anext__(self) -> bytes:
        if self._buffered:
            return self._buffered.popleft()
        chunk = await self._next()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def prefetch(self, _: object) -> None:
        """While the request waits, read ahead into memory (at most ``maxBodyBytes``): a
        client that leaves while queued is then noticed, and never causes a load."""
        while (chunk := await self._next()) is not None:
            self._buffered.append(chunk)

    def drop_rest(self) -> None:
        """An answer goes out before the whole body has been read (an error, a model
        server's early 413): the connection closes after it, and until then the rest of the
        body is read and dropped by the watcher. **Nobody may leave the body unread**:
        hypercorn hands it over through a queue of ten messages and, once that is full,
        waits for room before anything else, even before the ``http.disconnect`` it queues
        when the answer ends, so the answer's last send would never return."""
        self.complete = True
        self._nursery.start_soon(self._watch)

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone()

    def gone(self) -> None:
        self.disconnected = True
        self._on_disconnect()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])


@final
class Inbox:
    """A request's messages (its body, its end, the client leaving) as llamaswap's server
    queues them for the application: its ASGI ``receive``, which the application may also
    ask without waiting (``nowait``)."""

    __slots__ = ("_channel",)

    def __init__(self, channel: trio.MemoryReceiveChannel[ASGIReceiveEvent]) -> None:
        self._channel = channel

    async def __call__(self) -> ASGIReceiveEvent:
        return await self._channel.receive()

    def nowait(self) -> ASGIReceiveEvent | None:
        """The next message if it has arrived already, else None."""
        try:
            return self._channel.receive_nowait()
        except trio.WouldBlock:
            return None


async def send_error(
    send: ASGISendCallable, error: RequestError, *, close: bool = False, message_only: bool = False
) -> None:
    """Answer ``error`` with its status and JSON body (SPEC §4.3); ``close``: the
    connection closes after it (the rest of the request may still come); ``message_only``:
    as ``error_answer``."""
    status, raw, body = error_answer(error, close=close, message_only=message_only)
    await send(
        {"type": "http.response.start", "status": status, "headers": raw, "trailers": False}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
