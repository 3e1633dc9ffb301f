"""What llamaswap changes in hypercorn's handler of one connection (its trio worker).

hypercorn builds each connection's handler from ``hypercorn.trio.run.TCPServer``, its
task group from ``hypercorn.trio.tcp_server.TaskGroup``, and its HTTP/1.1 side from
``hypercorn.protocol.H11Protocol``; importing this module installs :class:`TCPServer`,
:class:`TaskGroup` and :class:`H11Protocol` there. The first point and the last two change
what a client sees; the others make a small request more than a quarter cheaper
(docs/performance.md, fifth pass):

* **once nothing more can be read, the idle timer stops**: the connection closes as soon
  as the answer being sent, if any, is over. hypercorn read the connection until end of
  file, then waited for its tasks (the idle timer among them) before closing the socket,
  so a client that closed a kept-alive connection between requests left it in CLOSE-WAIT
  for the whole keep-alive timeout (75 s): at 14 such connections a second, a
  1024-descriptor limit was reached and no client could connect;
* **the idle timer is one task per connection, whose deadline moves** (:class:`IdleTimer`;
  it closes a connection that waits too long for its next request: the keep-alive timeout,
  and the bound on a slow request head). hypercorn (0.17, 0.18) started a timer task each
  time an answer ended and cancelled it when the next request arrived;
* **no trip through Trio's scheduler that does nothing**: hypercorn's writes took one to
  acquire a free lock, one for the empty write that ends an answer of known length, and
  one for every write, even when the kernel took it all at once; handing a request's
  messages to the application took one each, even when its queue had room. Each trip is
  a pass of Trio's run loop (about 40 k instructions);
* **the application is told the moment its client leaves**: the request's
  ``llamaswap.client_left`` scope extension (``ClientLeft``) is called as its
  ``http.disconnect`` is handed over, so that no task has to wait for that message;
* **a request h11 cannot read is refused with llamaswap's JSON error** (SPEC §4.3): 431
  ``request_head_too_large`` for a head over ``h11_max_incomplete_size``, 400
  ``invalid_request`` for one that is not HTTP/1.1. hypercorn's refusal had no body;
* **``100 Continue`` goes out when the application first asks for the body**, so that a
  client that sent ``Expect: 100-continue`` is refused (401, 404, 413...) before it sends
  its body. hypercorn said it as soon as it had read the request's head;
* **the shutdown's last cancel reaches every write** (:func:`abandon_writes`): hypercorn
  shields each write from cancellation, so that none is cut in half, and a write to a
  client that does not read held the process until that client left.
"""

from __future__ import annotations

import importlib.metadata
import math
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import h11
import hypercorn.config
import hypercorn.protocol.h11
import hypercorn.trio.run
import hypercorn.trio.task_group
import hypercorn.trio.tcp_server
import hypercorn.typing
import trio
from hypercorn.events import Closed, Event, RawData
from hypercorn.trio.task_group import _handle

from llamaswap.errors import BadRequest, HeadTooLarge, RequestError

from .asgi import CLIENT_LEFT_EXTENSION, ClientLeft, Inbox
from .client import send_now
from .errors import error_response

__all__ = ["H11Protocol", "IdleTimer", "TCPServer", "TaskGroup", "abandon_writes"]


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


class TaskGroup(hypercorn.trio.task_group.TaskGroup):
    """hypercorn's task group of one connection, whose ``app_put`` (how the request's
    messages reach the application: its body, its end, the client leaving) takes no trip
    through Trio's scheduler while the application's queue has room, and which calls the
    request's ``ClientLeft`` (the scope's ``CLIENT_LEFT_EXTENSION``) as it hands over an
    ``http.disconnect``, so that no task of the application has to wait for that
    message."""

    async def spawn_app(
        self,
        app: hypercorn.typing.AppWrapper,
        config: hypercorn.config.Config,
        scope: hypercorn.typing.Scope,
        send: Callable[[hypercorn.typing.ASGISendEvent | None], Awaitable[None]],
    ) -> Callable[[hypercorn.typing.ASGIReceiveEvent], Awaitable[None]]:
        told = ClientLeft()
        if scope["type"] == "http":
            scope["extensions"][CLIENT_LEFT_EXTENSION] = told  # type: ignore[assignment]
        to_app, inbox = trio.open_memory_channel[hypercorn.typing.ASGIReceiveEvent](
            config.max_app_queue_size
        )
        assert self._nursery is not None  # inside the connection's ``async with``
        self._nursery.start_soon(
            _handle,
            app,
            config,
            scope,
            Inbox(inbox),
            send,
            trio.to_thread.run_sync,
            trio.from_thread.run,
        )
        return partial(_put, to_app, told)


async def _put(
    channel: trio.MemorySendChannel[hypercorn.typing.ASGIReceiveEvent],
    told: ClientLeft,
    message: hypercorn.typing.ASGIReceiveEvent,
) -> None:
    if message["type"] == "http.disconnect":
        told()
    try:
        channel.send_nowait(message)
    except trio.WouldBlock:
        await channel.send(message)


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
        self._shield = True
        self._writing: trio.CancelScope | None = None
        _OPEN.add(self)

    async def protocol_send(self, event: Event) -> None:
        """hypercorn's, without trips through Trio's scheduler that wait for nothing: the
        empty write that ends an answer of known length, and the write itself when the
        kernel takes it all at once (``send_now``; Trio waits only for what it did not
        take). The send lock (it keeps two writers' bytes apart) is taken only to wait.
        A write that waits is shielded from cancellation, as hypercorn's are (none is cut
        in half), until :meth:`abandon_writes`."""
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        data = event.data
        if not data:
            return
        stream: trio.abc.Stream = self.stream  # hypercorn types it as TLS only
        try:
            if self.send_lock.locked():
                await self.send_lock.acquire()  # after the other writer's bytes
                sent = 0
            else:
                sent = (
                    send_now(stream.socket, data) if isinstance(stream, trio.SocketStream) else 0
                )
                if sent == len(data):
                    return
                self.send_lock.acquire_nowait()
            try:
                with trio.CancelScope(shield=self._shield) as self._writing:
                    await stream.send_all(memoryview(data)[sent:])
            finally:
                self._writing = None
                self.send_lock.release()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())

    def abandon_writes(self) -> None:
        """From now on a write that waits is cancelled with the task that makes it, the
        one waiting now too: the shutdown's last cancel must not wait for a client that
        does not read."""
        self._shield = False
        if self._writing is not None:
            self._writing.shield = False

    async def _read_data(self) -> None:
        timer: IdleTimer = self.idle_task  # type: ignore[assignment]
        self._task_group.spawn(timer.run)
        try:
            await super()._read_data()
        finally:
            timer.end()


#: Every connection being served, for :func:`abandon_writes`.
_OPEN: weakref.WeakSet[TCPServer] = weakref.WeakSet()


def abandon_writes(config: hypercorn.config.Config) -> None:
    """Let the shutdown's last cancel reach every write of the server that ``config``
    configures (:meth:`TCPServer.abandon_writes`): a write waiting for a client that does
    not read would hold the process until that client leaves."""
    for server in list(_OPEN):
        if server.config is config:
            server.abandon_writes()


class _Connection(h11.Connection):
    """h11's server side, on which hypercorn says ``100 Continue`` only once the
    application has asked for the body (``body_wanted``)."""

    body_wanted = False

    @property
    def they_are_waiting_for_100_continue(self) -> bool:
        return self.body_wanted and super().they_are_waiting_for_100_continue

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.body_wanted = False


class H11Protocol(hypercorn.protocol.h11.H11Protocol):
    """hypercorn's HTTP/1.1 side of a connection, which says ``100 Continue`` when the
    application first asks for the body, and refuses a request h11 cannot read with
    llamaswap's JSON error."""

    def __init__(self, app: hypercorn.typing.AppWrapper, *args: Any, **kwargs: Any) -> None:
        super().__init__(partial(self._call, app), *args, **kwargs)
        self.connection = _Connection(
            h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size
        )

    async def _call(
        self,
        app: hypercorn.typing.AppWrapper,
        scope: hypercorn.typing.Scope,
        receive: hypercorn.typing.ASGIReceiveCallable,
        *args: Any,
    ) -> None:
        """The application, whose first ``receive`` says ``100 Continue`` first if the
        client waits for it."""
        connection = self.connection
        if isinstance(connection, _Connection) and connection.client_is_waiting_for_100_continue:
            receive = partial(self._continue, connection, receive)
        await app(scope, receive, *args)

    async def _continue(
        self, connection: _Connection, receive: hypercorn.typing.ASGIReceiveCallable
    ) -> hypercorn.typing.ASGIReceiveEvent:
        if not connection.body_wanted:
            connection.body_wanted = True
            if connection.they_are_waiting_for_100_continue:  # not answered meanwhile
                headers = self.config.response_headers("h11")
                await self._send_h11_event(
                    h11.InformationalResponse(status_code=100, headers=headers)
                )
        return await receive()

    async def _send_error_response(self, status_code: int) -> None:
        """hypercorn's answer to a request h11 cannot read (``status_code``: h11's hint,
        431 for a head too large, else 400), with llamaswap's JSON error body; the
        connection closes after it, as hypercorn's did."""
        error: RequestError
        if status_code == 431:
            error = HeadTooLarge(self.config.h11_max_incomplete_size)
        else:
            error = BadRequest("the request is not valid HTTP/1.1")
        _, headers, body = error_response(error)
        fields = [(name.encode(), value.encode()) for name, value in headers]
        fields += [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        fields += self.config.response_headers("h11")
        await self._send_h11_event(h11.Response(status_code=status_code, headers=fields))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


#: The hypercorn releases whose internals this module was written against.
HYPERCORN_VERSIONS = ("0.17.", "0.18.")


def install() -> None:
    """Make hypercorn's trio worker use :class:`TCPServer`, :class:`TaskGroup` and
    :class:`H11Protocol` for every connection (``serve()`` calls it before serving).

    Raises:
        RuntimeError: the installed hypercorn is not one this module was written for.
    """
    version = importlib.metadata.version("hypercorn")
    if not version.startswith(HYPERCORN_VERSIONS):
        raise RuntimeError(
            f"llamaswap's HTTP server changes hypercorn's internals as of hypercorn "
            f"{' and '.join(v + 'x' for v in HYPERCORN_VERSIONS)}; hypercorn {version} is "
            "installed: install a supported one (pip install 'hypercorn<0.19')"
        )
    hypercorn.protocol.H11Protocol = H11Protocol  # type: ignore[attr-defined]
    hypercorn.trio.run.TCPServer = TCPServer  # type: ignore[attr-defined]
    hypercorn.trio.tcp_server.TaskGroup = TaskGroup  # type: ignore[attr-defined]
