"""The forwarding path's HTTP/1.1 client: keep-alive h11 connections on Trio streams.

Why not httpx here: a proxy runs its client side on every request, just like its server
side, and httpx's generality (auth and redirect flows, cookies, a pool with locks and a
state machine per connection) costs about 0.4 ms of CPU per request more than h11 driven
directly (measured side by side: docs/performance.md). A proxy needs none of it: it sends
the request it was given and relays the answer. Readiness probes use this pool too, so a
probe reaches a model exactly as a request does (no ``HTTP(S)_PROXY`` from the environment).

What it keeps of httpcore's habits, as rules:

* A connection goes back to the pool only when both sides finished the exchange cleanly
  (h11 says DONE for both, no write failed, the server did not say ``Connection: close``);
  anything else (an error, a cancellation anywhere, a response not read to its end) closes
  it at once. So does anything at all after the answer's end (a second answer to one
  request, buggy or hostile: the next client would get it): what h11, the chunked
  decoder or the TLS layer read beyond it at the checkin, and what reached the socket
  since, polled at the checkout (the moment of reuse).
* Idle connections are bounded by age (``timeouts.idleConn``, by default 4 s: below the
  5 s keep-alive of llama-server's cpp-httplib, hypercorn and uvicorn) and by count
  (``max_idle_per_origin``, the oldest go first). Expired ones are closed, not just
  forgotten: the checkout sweeps its origin, the checkin every origin. A checked-out
  connection the server has closed (readable while idle: EOF) is closed and the next one
  tried. ``close_idle(base)`` closes every idle connection to a server that is gone (a
  model that stopped): with ``idleConn = 0`` nothing else would, once its address is
  never used again. An origin left with no idle connection loses its entry at the next
  checkin.
* Timeouts are the model's or peer's ``timeouts`` (connect, TLS handshake, response head,
  idle, TCP keep-alive); a request that gets no response head in time is never sent again.
* A write that fails is not the end: the server may have answered early (413 to a large
  upload) and closed, and that answer is what the caller gets. h11 reads a response while
  our side is mid-body; the connection is never reused after it. (Not over TLS: trio's
  TLS stream is broken by a failed write, so there the write's error is the failure.)
* A request is sent again, once, on a new connection, only if it failed on a reused
  connection before any answer and either no byte of it reached the socket, or it is
  idempotent (RFC 9110 §9.2.2: GET, HEAD, OPTIONS, TRACE, PUT, DELETE) with its body in
  memory. So a POST that may have reached the server is never sent twice (Go's net/http
  Transport, which llama-swap uses, has this rule, replaying only GET, HEAD, OPTIONS and
  TRACE). Over TLS a failed write counts as written: the TLS layer hides how far it got.
* TLS is ``https_compatible``: a server closing without close_notify ends a body delimited
  by the connection's end (RFC 2818 §2.2: HTTP's own framing detects truncation).
* h11 does the rest: HEAD responses have no body whatever their Content-Length, 1xx interim
  responses are skipped, ``Connection: close`` from the server ends the connection.
* Except a chunked body (every token stream): ``_Chunked`` decodes it, as h11 would but
  several times cheaper per chunk, and refuses what h11 refuses. The connection is reused
  after it on the rules h11 applies (HTTP/1.1, no ``Connection: close``, nothing after the
  body), with a fresh h11 for the next exchange.

No background task: expiry happens on the requests' own checkouts and checkins, so with no
traffic an expired connection waits for the next one (or ``close()``).

*Cancellation*: safe at every ``await``. The connection in use is closed at once (no
graceful TLS close, no reading to the end), so the server sees the disconnect.
"""

from __future__ import annotations

import math
import os
import re
import select
import socket
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from functools import lru_cache
from typing import final
from urllib.parse import urlsplit

import attrs
import h11
import trio

from llamaswap.config.model import Timeouts

__all__ = ["UpstreamFailed", "UpstreamPool", "UpstreamResponse"]

#: Foreign errors that mean "the connection failed", translated to UpstreamFailed.
_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError)

#: A request body up to this size goes out in the same write as the request's head.
_ONE_WRITE = 64 * 1024
#: The most read from a socket at once.
_READ = 64 * 1024
#: The longest response head, chunk-size line or trailer line.
_MAX_LINE = 64 * 1024

#: RFC 9110 §9.2.2: sending these twice has the effect of sending them once.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class UpstreamFailed(Exception):
    """The upstream could not be reached, or broke the exchange off."""

    def __init__(self, detail: str, *, answered: bool, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.answered = answered  # the response had started when it failed
        self.timed_out = timed_out  # no answer within responseHeader: never sent again


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
    """One connection: its stream, h11's view of both sides, and what this exchange wrote."""

    def __init__(self, stream: trio.abc.Stream, tcp: trio.SocketStream) -> None:
        self.stream = stream
        self._tcp = tcp
        self._tls = stream if isinstance(stream, trio.SSLStream) else None
        self.h11 = _h11_client()
        self.idle_until = 0.0  # when an idle connection expires (trio time)
        self.written = 0  # bytes of this exchange the socket took (TLS: every byte tried)
        self.broken = False  # a write failed: h11 may say DONE, the stream is not reusable
        self.recycled = False  # h11 was replaced by a fresh one (a chunked body: _Chunked)
        self._drained = True  # the last read took all there was: the next one waits first

    async def write(self, data: bytes) -> None:
        if self.stream is not self._tcp:
            self.written += len(data)
            await self.stream.send_all(data)
            return
        # trio's SocketStream.send_all, counting: a send that raises wrote nothing.
        socket = self._tcp.socket
        view = memoryview(data)
        while view:
            sent = send_now(socket, view) or await socket.send(view)
            self.written += sent
            view = view[sent:]

    async def receive(self) -> bytes:
        """What has arrived (at least one byte), or b"" at the end of the stream. Always a
        checkpoint: a relay's loop writes without one (``send_now``).

        After a read that took all there was (less than it could), the next one waits for
        data before it tries: an answer's head, or a stream's next token, comes long after
        the last bytes, and a read that finds nothing is a system call for nothing. After a
        full read it tries first: more is likely there, and Trio's wait for a socket that
        is readable already costs more than its checkpoint."""
        if self.stream is not self._tcp:
            return bytes(await self.stream.receive_some(_READ))
        # trio's SocketStream.receive_some without its layers (a token stream reads once
        # per token), and its checkpoints: a cancelled read takes nothing, and what a read
        # took is returned, never lost to a cancellation.
        socket = self._tcp.socket
        if not self._drained:
            await trio.lowlevel.checkpoint_if_cancelled()
            if (data := receive_now(socket)) is not None:
                self._drained = len(data) < _READ
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        while True:
            await trio.lowlevel.wait_readable(_open_descriptor(socket))
            if (data := receive_now(socket)) is not None:
                self._drained = len(data) < _READ
                return data

    async def next_event(self) -> h11.Event:
        while (event := self.h11.next_event()) is h11.NEED_DATA:
            self.h11.receive_data(await self.receive())
        return event  # type: ignore[return-value]  # h11 types its sentinels loosely

    def chunked_body_read(self, *, keep_alive: bool, leftover: bytes) -> None:
        """``_Chunked`` read the body h11 only saw the head of: the next exchange gets a
        fresh h11, if this one could have been reused."""
        state = self.h11
        if keep_alive and not leftover and state.our_state is h11.DONE:
            self.h11 = _h11_client()
            self.recycled = True
        else:
            self.broken = True

    def reusable(self) -> bool:
        """Whether the exchange ended cleanly with nothing read beyond the answer's end.

        Bytes after it were never asked for (a second answer to one request, from a buggy
        or hostile server): the next request's answer would be them, so the connection
        closes. Here: what h11 or ``_Chunked`` holds, and over TLS what the TLS layer read
        ahead; what reaches the socket later, ``stale()`` sees at the next checkout."""
        if self._tls is not None and _read_ahead(self._tls):
            return False
        state = self.h11
        if self.broken or self.recycled:
            return not self.broken
        return state.our_state is state.their_state is h11.DONE and not state.trailing_data[0]

    def start_next_cycle(self) -> None:
        if not self.recycled:
            self.h11.start_next_cycle()
        self.recycled = False
        self.written = 0

    def stale(self) -> bool:
        """Whether anything arrived on this idle connection since its answer's end (it is
        readable): the server closed it (EOF), or sent what nobody asked for. Checked as
        it is taken for a request, the moment of reuse."""
        poll = select.poll()
        poll.register(self._tcp.socket.fileno(), select.POLLIN)
        return bool(poll.poll(0))

    def close(self) -> None:
        """Close at once, without a graceful TLS close (which could wait)."""
        self._tcp.socket.close()


def send_now(socket: trio.socket.SocketType, data: bytes | memoryview) -> int:
    """How much of ``data`` the kernel took at once; 0 if the socket's buffer is full or
    the socket is closed (the caller's Trio send then waits, or raises).

    Trio's ``send`` takes a trip through its scheduler even when the kernel takes the
    bytes at once (about 40 k instructions, docs/performance.md); this does not, so it is
    not a checkpoint: the caller's next wait notices a cancellation. Raises OSError if the
    peer has gone (EPIPE, ECONNRESET).
    """
    fd = socket.fileno()  # -1 once closed: never a descriptor that was reused meanwhile
    if fd < 0:
        return 0
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0


def receive_now(socket: trio.socket.SocketType) -> bytes | None:
    """What has arrived (up to ``_READ`` bytes; b"" at the end of the stream), or None if
    nothing has yet. Not a checkpoint. Raises OSError, or ClosedResourceError if closed."""
    try:
        return os.read(_open_descriptor(socket), _READ)
    except BlockingIOError:
        return None


def _open_descriptor(socket: trio.socket.SocketType) -> int:
    """The socket's file descriptor; ClosedResourceError once it is closed (then -1: never
    a descriptor that was reused meanwhile)."""
    fd = socket.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    return fd


def _read_ahead(tls: trio.SSLStream[trio.SocketStream]) -> int:
    """The bytes trio's TLS layer holds that nobody has read yet.

    trio reads the socket a buffer at a time and decrypts one TLS record per read: a
    record sent after the answer's last one (a second answer, written separately) can
    wait there, where no poll of the socket sees it. trio has no public name for that
    buffer; without it (a trio that renamed it) no TLS connection is reused, which
    the keep-alive tests would show.
    """
    incoming = getattr(tls, "_incoming", None)
    if not isinstance(incoming, ssl.MemoryBIO):
        return 1
    pending: int = tls.pending()  # decrypted, not yet read
    return pending + incoming.pending


def _h11_client() -> h11.Connection:
    return h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_LINE)


#: RFC 9112 §7.1: chunk-size, then extensions (ignored, as h11 ignores them) or spaces.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*|[ \t]*)")
#: The CRLF that ends a chunk's data, then the next chunk-size line as servers write it.
_END_AND_NEXT_SIZE = re.compile(rb"\r\n([0-9A-Fa-f]{1,20})\r\n")


@final
class _Chunked:
    """A chunked response body (RFC 9112 §7.1), decoded here rather than by h11.

    h11 turns every chunk into an event through its state machine: about 7 µs of CPU per
    chunk, while a token stream is thousands of small chunks (this decoder: about 0.4 µs
    per chunk when a read holds many, docs/performance.md). h11 still parses the head;
    what it had read beyond the head is where this decoder starts. Chunk data is passed
    on as it arrives, however large the chunk; a chunk-size line or trailer line longer
    than ``_MAX_LINE`` is a protocol error, as h11's limit makes it. Trailer fields are
    read and dropped (the proxy relays none).
    """

    def __init__(self) -> None:
        self._pending = b""  # an incomplete line, or part of a chunk's closing CRLF
        self._left = 0  # bytes of the current chunk still to come
        self._closing = False  # the current chunk's CRLF is next
        self._trailer = False  # the last chunk has come: trailer lines until an empty one
        self.done = False
        self.leftover = b""  # bytes after the body (a well-behaved server sends none)

    def feed(self, data: bytes) -> bytes:
        """The body's data in ``data`` (maybe b""); raises h11.RemoteProtocolError."""
        buffer = self._pending + data if self._pending else data
        position, end = 0, len(buffer)
        left, closing = self._left, self._closing
        out: list[bytes] = []
        while True:
            if left:
                stop = position + left
                # A stream's chunks, each followed by the next one's size as servers write
                # it: one match per chunk. Anything else takes the steps below.
                while (head := _END_AND_NEXT_SIZE.match(buffer, stop)) is not None:
                    out.append(buffer[position:stop])
                    position = head.end()
                    left = int(head[1], 16)
                    if not left:
                        self._trailer = True
                        break
                    stop = position + left
                if left:  # this chunk's data, maybe not all of it yet
                    if stop > end:
                        out.append(buffer[position:])
                        left, position = stop - end, end
                        break
                    out.append(buffer[position:stop])
                    left, position, closing = 0, stop, True
            if closing:
                if end - position < 2:
                    break
                if buffer[position : position + 2] != b"\r\n":
                    raise h11.RemoteProtocolError("malformed chunk: no CRLF after its data")
                position += 2
                closing = False
            eol = buffer.find(b"\r\n", position)
            if eol < 0:
                if end - position > _MAX_LINE:
                    raise h11.RemoteProtocolError("chunk-size or trailer line too long")
                break
            line = buffer[position:eol]
            position = eol + 2
            if self._trailer:
                if not line:
                    self.done = True
                    self.leftover = buffer[position:]
                    position = end
                    break
                continue
            match = _CHUNK_SIZE.fullmatch(line)
            if match is None:
                raise h11.RemoteProtocolError(f"illegal chunk header: {line[:80]!r}")
            left = int(match[1], 16)
            self._trailer = not left
        self._left, self._closing = left, closing
        self._pending = buffer[position:]
        return b"".join(out)


@final
class UpstreamResponse:
    """A response whose body has not been read yet."""

    def __init__(self, connection: _Connection, head: h11.Response, method: bytes) -> None:
        self._connection = connection
        self.status = head.status_code
        self.headers: list[tuple[bytes, bytes]] = list(head.headers)  # names in lowercase
        self._first = dict(reversed(self.headers))  # each field's first value
        # h11's rules (RFC 9112 §6.3); it has checked a Transfer-Encoding says "chunked".
        has_body = not (
            method == b"HEAD"
            or self.status in (204, 304)
            or (method == b"CONNECT" and 200 <= self.status < 300)
        )
        chunked = has_body and b"transfer-encoding" in self._first
        self._chunked = _Chunked() if chunked else None
        self._http_version = head.http_version

    def header(self, name: bytes) -> str:
        """The first value of ``name`` (lowercase), or ``""``."""
        return self._first.get(name, b"").decode("latin-1")

    def chunks(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, in one piece per read from the socket: when the server
        writes faster than we relay (a fast stream of small events), what has piled up goes
        on together, not one event at a time. Raises UpstreamFailed if it breaks off."""
        return self._h11_body() if self._chunked is None else self._chunked_body(self._chunked)

    async def _h11_body(self) -> AsyncGenerator[bytes, None]:
        connection = self._connection
        arrived: list[bytes] = []
        try:
            while True:
                event = connection.h11.next_event()
                if isinstance(event, h11.Data):
                    arrived.append(event.data)
                    continue
                if arrived:
                    yield b"".join(arrived)  # nothing is held back waiting for more
                    arrived.clear()
                if event is h11.NEED_DATA:
                    connection.h11.receive_data(await connection.receive())
                elif isinstance(event, h11.EndOfMessage):
                    return
                else:  # ConnectionClosed before the end: h11 only says so for framed bodies
                    raise UpstreamFailed("connection closed mid-body", answered=True)
        except _BROKEN as exc:
            raise UpstreamFailed(_describe(exc), answered=True) from exc

    async def _chunked_body(self, decoder: _Chunked) -> AsyncGenerator[bytes, None]:
        connection = self._connection
        try:
            data = decoder.feed(connection.h11.trailing_data[0])  # what came with the head
            while True:
                if data:
                    yield data
                if decoder.done:
                    keep_alive = self._http_version >= b"1.1" and b"close" not in _tokens(
                        self.headers, b"connection"
                    )
                    connection.chunked_body_read(keep_alive=keep_alive, leftover=decoder.leftover)
                    return
                received = await connection.receive()
                if not received:
                    raise UpstreamFailed("connection closed mid-body", answered=True)
                data = decoder.feed(received)
        except _BROKEN as exc:
            raise UpstreamFailed(_describe(exc), answered=True) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def read_at_most(self, limit: int) -> bytes | None:
        """The whole body, or None once it passes ``limit`` bytes: what llamaswap reads for
        itself (a server's ``/props``, its ``/metrics``) must not cost unbounded memory. The
        rest is not read, so the connection is not reused."""
        parts: list[bytes] = []
        size = 0
        async with aclosing(self.chunks()) as chunks:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    return None
                parts.append(chunk)
        return b"".join(parts)


def _tokens(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """The comma-separated tokens of every ``name`` field, in lowercase."""
    return [
        token.strip()
        for key, value in headers
        if key == name
        for token in value.lower().split(b",")
    ]


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
        #: For requests that bring no ``timeouts`` of their own (readiness probes).
        self._timeouts = Timeouts(connect=connect_timeout, idle_conn=idle_timeout)
        self._max_idle = max_idle_per_origin
        self._ssl_context = ssl_context
        self._idle: dict[_Origin, deque[_Connection]] = {}  # oldest first

    @asynccontextmanager
    async def request(
        self,
        method: str,
        base: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes] | None,
        timeouts: Timeouts | None = None,
    ) -> AsyncIterator[UpstreamResponse]:
        """Send ``method base+target`` and yield the response once its head has arrived.

        ``body``: bytes (sent with a Content-Length), an async iterable (sent with the
        Content-Length in ``headers``, else chunked), or None (no body). ``headers`` must
        not carry Host or connection-specific fields. ``timeouts``: the model's or peer's
        (0: no limit), else the pool's own. Raises UpstreamFailed.
        """
        limits = timeouts or self._timeouts
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
        connection = self._checkout(origin)
        reused = connection is not None
        try:
            if connection is None:
                connection = await self._connect(origin, limits)
            try:
                response = await _exchange(connection, request, body, limits.response_header)
            except UpstreamFailed as exc:
                # The server may have closed the reused connection as we sent: once more,
                # anew, if that cannot make the server act twice.
                replayable = method in _IDEMPOTENT and (body is None or isinstance(body, bytes))
                if exc.timed_out or not (reused and (connection.written == 0 or replayable)):
                    raise
                connection.close()
                connection = None
                connection = await self._connect(origin, limits)
                response = await _exchange(connection, request, body, limits.response_header)
            yield response
        finally:
            if connection is not None:
                self._checkin(origin, connection, limits.idle_conn)

    def close_idle(self, base: str) -> None:
        """Close every idle connection to ``base``'s server (its host and port, whatever
        path prefix each was opened for): it has gone, as a stopped model's has."""
        gone = _origin(base)
        server = (gone.scheme, gone.host, gone.port)
        for origin in [o for o in self._idle if (o.scheme, o.host, o.port) == server]:
            for connection in self._idle.pop(origin):
                connection.close()

    def _checkout(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        self._expire(idle)
        while idle:
            connection = idle.pop()  # the newest: the furthest from the server's timeout
            if not connection.stale():
                return connection
            connection.close()
        return None  # the entry, now empty, goes at the next checkin

    def _checkin(self, origin: _Origin, connection: _Connection, idle_conn: float) -> None:
        if connection.reusable():
            connection.start_next_cycle()
            connection.idle_until = trio.current_time() + (idle_conn or math.inf)
            idle = self._idle.get(origin)
            if idle is None:
                idle = self._idle[origin] = deque()
            idle.append(connection)
        else:
            connection.close()
        emptied = [origin for origin, idle in self._idle.items() if not self._expire(idle)]
        for origin in emptied:
            del self._idle[origin]

    def _expire(self, idle: deque[_Connection]) -> bool:
        """Close the connections idle past their ``idleConn``, then the oldest beyond the
        count; whether any is left.

        (Connections to one origin share their model's ``idleConn``, so the oldest expires
        first.)"""
        now = trio.current_time()
        while idle and (len(idle) > self._max_idle or idle[0].idle_until < now):
            idle.popleft().close()
        return bool(idle)

    async def _connect(self, origin: _Origin, limits: Timeouts) -> _Connection:
        where = f"{origin.host}:{origin.port}"
        try:
            with trio.fail_after(limits.connect or math.inf):
                tcp = await trio.open_tcp_stream(origin.host, origin.port)  # TCP_NODELAY on
        except trio.TooSlowError as exc:
            detail = f"no connection to {where} within {limits.connect:g} s"
            raise UpstreamFailed(detail, answered=False) from exc
        except _BROKEN as exc:
            raise UpstreamFailed(_describe(exc), answered=False) from exc
        if limits.keepalive:
            _keep_alive(tcp.socket, limits.keepalive)
        if origin.scheme == "http":
            return _Connection(tcp, tcp)
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        tls = trio.SSLStream(
            tcp, self._ssl_context, server_hostname=origin.host, https_compatible=True
        )
        try:
            with trio.fail_after(limits.tls_handshake or math.inf):
                await tls.do_handshake()
        except BaseException as exc:
            tcp.socket.close()
            if isinstance(exc, trio.TooSlowError):
                detail = f"no TLS handshake with {where} within {limits.tls_handshake:g} s"
                raise UpstreamFailed(detail, answered=False) from exc
            if isinstance(exc, _BROKEN):
                raise UpstreamFailed(_describe(exc), answered=False) from exc
            raise
        return _Connection(tls, tcp)

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
    connection: _Connection,
    request: h11.Request,
    body: bytes | AsyncIterable[bytes] | None,
    head_timeout: float,
) -> UpstreamResponse:
    """Send the request and wait for the response's head, at most ``head_timeout`` seconds
    (0: no limit) after the request's end.

    If a write fails after some bytes went out, the response is read all the same.
    """
    send = connection.h11.send
    failed: BaseException | None = None  # the write that failed
    try:
        try:
            if isinstance(body, bytes):
                pieces = _pieces(connection, request)
                if body:
                    pieces += _pieces(connection, h11.Data(data=body))
                pieces += _pieces(connection, h11.EndOfMessage())
                if len(body) <= _ONE_WRITE:  # the whole request in one write
                    await connection.write(b"".join(pieces))
                else:  # not copied: a long prompt can be megabytes
                    for piece in filter(None, pieces):
                        await connection.write(piece)
            else:
                await connection.write(send(request) or b"")
                if body is not None:
                    async for chunk in body:
                        await connection.write(send(h11.Data(data=chunk)) or b"")
                await connection.write(send(h11.EndOfMessage()) or b"")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            connection.broken = True
            if not connection.written:
                raise
            failed = exc  # but the server may have answered before it stopped reading
        if not head_timeout:  # no limit: no cancel scope to set up for it
            return await _response(connection, request)
        with trio.move_on_after(head_timeout):
            return await _response(connection, request)
        connection.broken = True  # the answer may still come: never reuse it
        detail = f"no response within {head_timeout:g} s (timeouts.responseHeader)"
        raise UpstreamFailed(detail, answered=False, timed_out=True)
    except _BROKEN as exc:
        cause = exc if failed is None else failed
        if cause is exc and connection.h11.trailing_data[1]:  # EOF: h11 says "SEND_RESPONSE"
            detail = "the server closed the connection before answering"
            raise UpstreamFailed(detail, answered=False) from exc
        raise UpstreamFailed(_describe(cause), answered=False) from cause


async def _response(connection: _Connection, request: h11.Request) -> UpstreamResponse:
    """The response's head, once it has arrived (after any 1xx interim responses)."""
    while True:
        event = await connection.next_event()
        if isinstance(event, h11.Response):
            return UpstreamResponse(connection, event, request.method)
        if not isinstance(event, h11.InformationalResponse):  # 1xx: read on
            raise h11.RemoteProtocolError(f"unexpected {event!r}")


def _keep_alive(sock: trio.socket.SocketType, seconds: float) -> None:
    """TCP keep-alive probes after ``seconds`` without traffic, then every ``seconds``."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    whole = max(1, math.ceil(seconds))
    for option in ("TCP_KEEPIDLE", "TCP_KEEPINTVL"):  # Linux; macOS has TCP_KEEPALIVE only
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), whole)


def _pieces(connection: _Connection, event: h11.Event) -> list[bytes]:
    """What h11 would send for ``event``, with a Data event's bytes as they are (uncopied)."""
    return connection.h11.send_with_data_passthrough(event) or []


def _describe(exc: BaseException) -> str:
    # trio wraps the OSError saying what happened (ECONNRESET, EPIPE) in BrokenResourceError.
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
