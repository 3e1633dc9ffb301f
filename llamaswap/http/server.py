"""What llamaswap changes in hypercorn's handler of one connection (its trio worker).

hypercorn builds each connection's handler from ``hypercorn.trio.run.TCPServer``, its
task group from ``hypercorn.trio.tcp_server.TaskGroup``, and its HTTP/1.1 side from
``hypercorn.protocol.H11Protocol``; :func:`install` (``serve()`` calls it) puts
:class:`TCPServer`, :class:`TaskGroup` and :class:`H11Protocol` there, once it has checked
that hypercorn is a release this module was written for. The second and third points make
a small request more than a quarter cheaper (docs/performance.md, fifth pass); the others
change what a client sees:

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
* **a write that waits is cancelled with its task, and bounded by
  ``clientWriteTimeout``**; either way the connection closes (:meth:`TCPServer.protocol_send`).
  hypercorn shielded each write, so a client that did not read held its request, and the
  shutdown, until it left;
* **HTTP/1.1 only, and nothing smuggled** (``_Connection``): HTTP/2's preface, a request
  with both ``Content-Length`` and ``Transfer-Encoding``, and a chunk announced over
  ``maxBodyBytes`` are refused as h11's own errors are;
* **one connection's failure ends that connection**, logged once (:meth:`TCPServer.run`);
  uncaught, it unwound the whole server.
"""

from __future__ import annotations

import http
import importlib.metadata
import logging
import math
import typing
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, final

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
from hypercorn.typing import H11SendableEvent

from llamaswap.config.model import MAX_BODY_BYTES, Config
from llamaswap.errors import BadRequest, BodyTooLarge, HeadTooLarge, RequestError

from .asgi import CLIENT_LEFT_EXTENSION, ClientLeft, Inbox
from .client import send_now
from .errors import error_answer

__all__ = ["H11Protocol", "IdleTimer", "ServerConfig", "TCPServer", "TaskGroup", "install"]

logger = logging.getLogger("llamaswap.http")


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


@final
class ServerConfig(hypercorn.config.Config):
    """hypercorn's settings, with what llamaswap's connections read of its own config:
    ``current()`` returns the config in force (a reload applies at once)."""

    def __init__(self, current: Callable[[], Config]) -> None:
        super().__init__()
        self.current = current


def _limits(config: hypercorn.config.Config) -> Config:
    """llamaswap's config in force for ``config``'s connections (the defaults under a
    plain hypercorn ``Config``, as in tests of the handler alone)."""
    return config.current() if isinstance(config, ServerConfig) else _UNLIMITED


#: No client write timeout, no body limit.
_UNLIMITED = Config(client_write_timeout=0.0, max_body_bytes=int(MAX_BODY_BYTES.high))


class _Stalled(Exception):
    """A write waited ``clientWriteTimeout`` for a client that read nothing."""


class TCPServer(hypercorn.trio.tcp_server.TCPServer):
    """hypercorn's handler of one connection, with :class:`IdleTimer` as its idle timer,
    which stops once nothing more can be read; whose writes a cancellation reaches and
    ``clientWriteTimeout`` bounds; and whose failure ends it alone, never the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = IdleTimer(  # type: ignore[assignment]
            self.config.keep_alive_timeout,
            self.context.terminated,
            self._initiate_server_close,
        )

    async def run(self) -> None:
        """hypercorn's, where an error of llamaswap's or hypercorn's in this connection's
        handling is logged once and ends this connection only: uncaught, it unwound the
        whole server (one HTTP/2 client's burst of streams did)."""
        try:
            await super().run()
        except BaseException as exc:
            failed, rest = _split_errors(exc)
            if failed is not None:
                logger.error(
                    "a connection from %s failed (it is closed; the server goes on)",
                    _peer(self.stream),
                    exc_info=failed,
                )
            if rest is not None:
                raise rest from None

    async def protocol_send(self, event: Event) -> None:
        """hypercorn's, without trips through Trio's scheduler that wait for nothing: the
        empty write that ends an answer of known length, and the write itself when the
        kernel takes it all at once (``send_now``; Trio waits only for what it did not
        take). The send lock (it keeps two writers' bytes apart) is taken only to wait.

        **A write that waits is cancelled with the task that makes it** (its client left,
        an operator cancelled it, its model was unloaded, the shutdown's last cancel), and
        gives up after ``clientWriteTimeout`` without progress: either way the connection is
        closed at once, since an answer cut short cannot be followed by another. (hypercorn
        shielded every write, so a client that did not read held its request for good.)"""
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
                await _send_rest(stream, memoryview(data)[sent:], self._write_timeout())
            finally:
                self.send_lock.release()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())
        except _Stalled:
            logger.info(
                "client %s read nothing for %g s (clientWriteTimeout): its connection is closed",
                _peer(stream),
                self._write_timeout(),
            )
            await trio.aclose_forcefully(stream)
            await self.protocol.handle(Closed())
        except BaseException:  # cancelled: what was written may end mid-answer
            await trio.aclose_forcefully(stream)
            raise

    def _write_timeout(self) -> float:
        return _limits(self.config).client_write_timeout or math.inf

    async def _close(self) -> None:
        """hypercorn's, shielded: a cancellation at its first checkpoint (the EOF's) left the
        socket open, and a client told ``Connection: close`` waited for an end that never
        came (an unload racing the end of an answer)."""
        with trio.CancelScope(shield=True):
            await super()._close()

    async def _read_data(self) -> None:
        timer: IdleTimer = self.idle_task  # type: ignore[assignment]
        self._task_group.spawn(timer.run)
        try:
            await super()._read_data()
        finally:
            timer.end()


async def _send_rest(stream: trio.abc.Stream, data: memoryview, patience: float) -> None:
    """Write ``data``, waiting at most ``patience`` seconds for each bit of progress.

    Raises:
        _Stalled: the client took nothing for ``patience`` seconds.
    """
    if not isinstance(stream, trio.SocketStream):
        with trio.move_on_after(patience) as waited:
            await stream.send_all(data)
        if waited.cancelled_caught:
            raise _Stalled
        return
    sock = stream.socket
    while data:
        with trio.move_on_after(patience) as waited:
            sent = await sock.send(data)
        if waited.cancelled_caught:
            raise _Stalled
        data = data[sent:]


def _split_errors(
    exc: BaseException,
) -> tuple[BaseException | None, BaseException | None]:
    """``exc`` as the errors in it (``Exception``) and the rest (a cancellation, a
    KeyboardInterrupt), either None where there is none."""
    split = getattr(exc, "split", None)  # an exception group's (Python 3.10: the backport's)
    if split is not None:
        return typing.cast("tuple[BaseException | None, BaseException | None]", split(Exception))
    return (exc, None) if isinstance(exc, Exception) else (None, exc)


def _peer(stream: object) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return "(unknown)"
    return f"{host}:{port}"


#: Each status code's reason phrase (RFC 9110's, as llama-server and most servers send).
_REASONS = {status.value: status.phrase.encode() for status in http.HTTPStatus}


class _Connection(h11.Connection):
    """h11's server side, on which hypercorn says ``100 Continue`` only once the
    application has asked for the body (``body_wanted``), and which refuses, as h11
    refuses what it cannot read (``h11.RemoteProtocolError``, answered by hypercorn before
    the connection closes), a request that h11 would take:

    * one with both ``Content-Length`` and ``Transfer-Encoding`` (RFC 9112 §6.1: a front
      proxy reading the length sees one request where llamaswap would see two);
    * HTTP/2's prior-knowledge preface (``PRI * HTTP/2.0``): llamaswap speaks HTTP/1.1;
    * a chunk announced larger than what is left of ``max_body_bytes``, at its size line.

    ``refusal`` is the error that the answer then says.
    """

    def __init__(self, *, max_incomplete_event_size: int, max_body_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_incomplete_event_size)
        self.max_body_bytes = max_body_bytes
        self.body_wanted = False
        self.refusal: RequestError | None = None
        self._chunked = False  # this request's body is chunked
        self._received = 0  # body bytes of this request so far (a chunked one's)

    @property
    def they_are_waiting_for_100_continue(self) -> bool:
        return self.body_wanted and super().they_are_waiting_for_100_continue

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = BadRequest(f"the request is not valid HTTP/1.1: {exc}")
            raise
        if self._chunked:
            if type(event) is h11.Data:
                self._received += len(event.data)
            # h11 has read the size line of a chunk whose data it has not all handed over.
            announced = getattr(self._reader, "_bytes_in_chunk", 0)
            if announced and self._received + announced > self.max_body_bytes:
                self._refuse(BodyTooLarge(self.max_body_bytes), 413)
        elif type(event) is h11.Request:
            self._check(event)
        return event

    def _check(self, request: h11.Request) -> None:
        if request.method == b"PRI" and request.http_version == b"2.0":
            self._refuse(
                BadRequest("llamaswap speaks HTTP/1.1 only: send HTTP/1.1 requests, not HTTP/2")
            )
        names = {name for name, _ in request.headers}
        self._chunked = b"transfer-encoding" in names
        if self._chunked and b"content-length" in names:
            self._refuse(
                BadRequest(
                    "the request has both Content-Length and Transfer-Encoding "
                    "(RFC 9112 §6.1): send one"
                )
            )

    def _refuse(self, error: RequestError, status: int = 400) -> typing.NoReturn:
        self.refusal = error
        raise h11.RemoteProtocolError(str(error), error_status_hint=status)

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.body_wanted = False
        self._chunked = False
        self._received = 0


class H11Protocol(hypercorn.protocol.h11.H11Protocol):
    """hypercorn's HTTP/1.1 side of a connection, which says ``100 Continue`` when the
    application first asks for the body, refuses a request h11 cannot read with
    llamaswap's JSON error, and says each answer's reason phrase (``200 OK``: ASGI
    carries none, and hypercorn sent the code alone)."""

    def __init__(self, app: hypercorn.typing.AppWrapper, *args: Any, **kwargs: Any) -> None:
        super().__init__(partial(self._call, app), *args, **kwargs)
        self.connection = _Connection(
            max_incomplete_event_size=self.config.h11_max_incomplete_size,
            max_body_bytes=_limits(self.config).max_body_bytes,
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

    async def _send_h11_event(self, event: H11SendableEvent) -> None:
        if type(event) is h11.Response and not event.reason:
            reason = _REASONS.get(event.status_code, b"")
            event = h11.Response(
                status_code=event.status_code, headers=event.headers, reason=reason,
                http_version=event.http_version,
            )  # fmt: skip
        await super()._send_h11_event(event)

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

    async def _check_protocol(self, event: h11.Request) -> None:
        """Nothing: llamaswap speaks HTTP/1.1 only (no route or edge rule of its own would
        apply on HTTP/2). ``Upgrade: h2c`` is ignored, as a server may (RFC 9110 §7.8); the
        prior-knowledge preface is refused (``_Connection``)."""

    async def _send_error_response(self, status_code: int) -> None:
        """hypercorn's answer to a request that is refused as it is read (``status_code``:
        h11's hint), with llamaswap's JSON error body; the connection closes after it, as
        hypercorn's did. A head too large is 431, what ``_Connection`` refuses says why,
        anything else h11 cannot read is a 400 (h11's hint for a transfer coding other
        than chunked is 501, but the request is at fault)."""
        connection = self.connection
        error: RequestError
        if status_code == 431:
            error = HeadTooLarge(self.config.h11_max_incomplete_size)
        elif isinstance(connection, _Connection) and connection.refusal is not None:
            error = connection.refusal
        else:
            error = BadRequest("the request is not valid HTTP/1.1")
        status, fields, body = error_answer(error, close=True)
        fields += self.config.response_headers("h11")
        await self._send_h11_event(h11.Response(status_code=status, headers=fields))
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
