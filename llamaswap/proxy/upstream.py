"""The forwarding path's HTTP/1.1 client: keep-alive h11 connections on Trio streams.

Why not httpx here: a proxy runs its client side on every request, just like its server
side, and httpx's generality (auth and redirect flows, cookies, a pool with locks and a
state machine per connection) costs about 0.4 ms of CPU per request more than h11 driven
directly (measured side by side: docs/performance.md). A proxy needs none of it: it sends
the request it was given and relays the answer. httpx stays for health probes and tests.

The pool keeps idle connections per origin, newest first. A connection goes back only
when both sides finished the exchange cleanly; anything else (an error, a cancellation
anywhere, a response not read to its end) closes it. Before reuse, an idle connection
the server has closed (readable while idle: EOF) is dropped, and one idle longer than
``idle_timeout`` is closed, below the 5 s keep-alive of common servers (llama-server's
cpp-httplib, hypercorn, uvicorn). If a reused connection still fails before any answer
arrives (the server closed it at that very moment), a request whose body is in memory is
sent again once on a new connection.

*Cancellation*: safe at every ``await``. The connection in use is closed at once (no
graceful TLS close, no reading to the end), so the server sees the disconnect.
"""

from __future__ import annotations

import select
import ssl
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import final
from urllib.parse import urlsplit

import attrs
import h11
import trio

__all__ = ["UpstreamFailed", "UpstreamPool", "UpstreamResponse"]

#: Foreign errors that mean "the connection failed", translated to UpstreamFailed.
_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError)


class UpstreamFailed(Exception):
    """The upstream could not be reached, or broke the exchange off."""

    def __init__(self, detail: str, *, answered: bool) -> None:
        super().__init__(detail)
        self.answered = answered  # the response had started when it failed


@attrs.frozen
class _Origin:
    scheme: str
    host: str
    port: int
    host_header: bytes
    prefix: str  # a path in the base URL, e.g. "/api"


@lru_cache(maxsize=256)
def _origin(base: str) -> _Origin:
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamFailed(f"not an http(s) URL: {base!r}", answered=False)
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    header = shown if port == default else f"{shown}:{port}"
    return _Origin(parts.scheme, host, port, header.encode(), parts.path.rstrip("/"))


@final
class _Connection:
    def __init__(self, stream: trio.abc.Stream, tcp: trio.SocketStream) -> None:
        self.stream = stream
        self._tcp = tcp
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
        self.idle_since = 0.0

    async def send(self, event: h11.Event) -> None:
        data = self.h11.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(bytes(await self.stream.receive_some(65536)))
                continue
            return event  # type: ignore[return-value]  # h11 types its sentinels loosely

    def stale(self) -> bool:
        """Whether the server closed this idle connection (it is readable: EOF or junk)."""
        poll = select.poll()
        poll.register(self._tcp.socket.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    def close(self) -> None:
        """Close at once, without a graceful TLS close (which could wait)."""
        self._tcp.socket.close()


@final
class UpstreamResponse:
    """A response whose body has not been read yet."""

    def __init__(self, connection: _Connection, head: h11.Response) -> None:
        self._connection = connection
        self.status = head.status_code
        self.headers: list[tuple[bytes, bytes]] = list(head.headers)  # names in lowercase

    def header(self, name: bytes) -> str:
        """The first value of ``name`` (lowercase), or ``""``."""
        return next((v.decode("latin-1") for k, v in self.headers if k == name), "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives. Raises UpstreamFailed if it breaks off."""
        try:
            while True:
                event = await self._connection.next_event()
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    return
                else:  # ConnectionClosed before the end: h11 only says so for framed bodies
                    raise UpstreamFailed("connection closed mid-body", answered=True)
        except _BROKEN as exc:
            raise UpstreamFailed(_describe(exc), answered=True) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


@final
class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to the servers llamaswap forwards to."""

    def __init__(
        self,
        *,
        connect_timeout: float = 10.0,
        idle_timeout: float = 4.0,
        max_idle_per_origin: int = 64,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle_per_origin
        self._ssl_context = ssl_context
        self._idle: dict[_Origin, list[_Connection]] = {}

    @asynccontextmanager
    async def request(
        self,
        method: str,
        base: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes] | None,
    ) -> AsyncIterator[UpstreamResponse]:
        """Send ``method base+target`` and yield the response once its head has arrived.

        ``body``: bytes (sent with a Content-Length), an async iterable (sent with the
        Content-Length in ``headers``, else chunked), or None (no body). ``headers`` must
        not carry Host or connection-specific fields. Raises UpstreamFailed.
        """
        origin = _origin(base)
        head = [(b"host", origin.host_header), *headers]
        if isinstance(body, bytes):
            head = [(k, v) for k, v in head if k != b"content-length"]
            head.append((b"content-length", str(len(body)).encode()))
        elif body is not None and not any(k == b"content-length" for k, _ in head):
            head.append((b"transfer-encoding", b"chunked"))
        try:
            request = h11.Request(method=method, target=origin.prefix + target, headers=head)
        except h11.LocalProtocolError as exc:  # e.g. a header value with a line break
            raise UpstreamFailed(f"cannot send this request: {exc}", answered=False) from exc
        connection, reused = self._checkout(origin)
        try:
            if connection is None:
                connection = await self._connect(origin)
            try:
                response = await _exchange(connection, request, body)
            except UpstreamFailed:
                if not (reused and isinstance(body, bytes)):
                    raise
                connection.close()  # the server closed it as we sent: once more, anew
                connection = await self._connect(origin)
                response = await _exchange(connection, request, body)
            yield response
        finally:
            if connection is not None:
                self._checkin(origin, connection)

    def _checkout(self, origin: _Origin) -> tuple[_Connection | None, bool]:
        idle = self._idle.get(origin)
        expired_before = trio.current_time() - self._idle_timeout
        while idle:
            connection = idle.pop()
            if connection.idle_since >= expired_before and not connection.stale():
                return connection, True
            connection.close()
        return None, False

    def _checkin(self, origin: _Origin, connection: _Connection) -> None:
        state = connection.h11
        idle = self._idle.setdefault(origin, [])
        done = state.our_state is h11.DONE and state.their_state is h11.DONE
        if done and len(idle) < self._max_idle:
            state.start_next_cycle()
            connection.idle_since = trio.current_time()
            idle.append(connection)
        else:
            connection.close()

    async def _connect(self, origin: _Origin) -> _Connection:
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await trio.open_tcp_stream(origin.host, origin.port)  # TCP_NODELAY on
                if origin.scheme == "http":
                    return _Connection(tcp, tcp)
                if self._ssl_context is None:
                    self._ssl_context = ssl.create_default_context()
                tls = trio.SSLStream(tcp, self._ssl_context, server_hostname=origin.host)
                try:
                    await tls.do_handshake()
                except BaseException:
                    tcp.socket.close()
                    raise
                return _Connection(tls, tcp)
        except trio.TooSlowError as exc:
            where = f"{origin.host}:{origin.port}"
            detail = f"no connection to {where} within {self._connect_timeout:g} s"
            raise UpstreamFailed(detail, answered=False) from exc
        except _BROKEN as exc:
            raise UpstreamFailed(_describe(exc), answered=False) from exc

    async def __aenter__(self) -> UpstreamPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


async def _exchange(
    connection: _Connection, request: h11.Request, body: bytes | AsyncIterable[bytes] | None
) -> UpstreamResponse:
    """Send the request and wait for the response's head."""
    try:
        if isinstance(body, bytes):  # the whole request in one write
            h11_send = connection.h11.send
            data = h11_send(request) or b""
            if body:
                data += h11_send(h11.Data(data=body)) or b""
            await connection.stream.send_all(data + (h11_send(h11.EndOfMessage()) or b""))
        else:
            await connection.send(request)
            if body is not None:
                async for chunk in body:
                    await connection.send(h11.Data(data=chunk))
            await connection.send(h11.EndOfMessage())
        while True:
            event = await connection.next_event()
            if isinstance(event, h11.Response):
                return UpstreamResponse(connection, event)
            if not isinstance(event, h11.InformationalResponse):  # 100 Continue: read on
                raise UpstreamFailed("connection closed before an answer", answered=False)
    except _BROKEN as exc:
        raise UpstreamFailed(_describe(exc), answered=False) from exc


def _describe(exc: BaseException) -> str:
    # trio wraps the OSError saying what happened (ECONNRESET, EPIPE) in BrokenResourceError.
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
