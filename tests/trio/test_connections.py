"""What llamaswap changes in hypercorn's handler of a connection (``llamaswap.http.server``).

The idle timer (``IdleTimer``), on the mock clock: hypercorn calls ``restart`` when a
connection becomes idle and ``stop`` when a request starts; the timer closes the
connection after ``TIMEOUT`` idle seconds, or at once when the server terminates while it
is idle, and never while a request is answered. Its process-level behaviour (a kept-alive
connection closed after the timeout, one closed by its client let go at once) is in
``tests/e2e/test_management_connections.py``.

How a request's messages reach the application (``TaskGroup.spawn_app``'s ``app_put``):
without a checkpoint while the application's queue has room, waiting for room when it is
full.

How an answer is written (``TCPServer.protocol_send``, with ``send_now``, which the
upstream pool's writes use too): what the kernel takes at once goes without a checkpoint,
and the rest waits for the client to read, on real sockets and the real clock. The upstream
pool's reads (``receive_now``) stay checkpoints, so that a relay's loop always has one, and
after a read that took all there was, the next one waits before it tries.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import httpx
import hypercorn.config
import hypercorn.trio
import pytest
import trio
import trio.testing
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.trio.worker_context import EventWrapper, WorkerContext
from hypercorn.typing import HTTPDisconnectEvent, HTTPRequestEvent, HTTPScope

from llamaswap.http import client as upstream
from llamaswap.http.asgi import CLIENT_LEFT_EXTENSION
from llamaswap.http.client import _READ, _Connection, receive_now, send_now
from llamaswap.http.server import H11Protocol, IdleTimer, TaskGroup, TCPServer, install

TIMEOUT = 75.0


class Connection:
    """An idle timer's task, and when (mock time) it closed the connection, if it did."""

    def __init__(self) -> None:
        self.terminated = EventWrapper()
        self.closed_at: float | None = None
        self.timer = IdleTimer(TIMEOUT, self.terminated, self._close)
        self.done = trio.Event()

    async def _close(self) -> None:
        self.closed_at = trio.current_time()

    async def run(self) -> None:
        await self.timer.run()
        self.done.set()


async def open_connection(nursery: trio.Nursery) -> Connection:
    """A connection as hypercorn opens one: the timer restarted, then its task started."""
    connection = Connection()
    await connection.timer.restart()
    nursery.start_soon(connection.run)
    await trio.testing.wait_all_tasks_blocked()
    return connection


async def test_an_idle_connection_closes_after_the_timeout(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    start = trio.current_time()
    connection = await open_connection(nursery)
    await connection.done.wait()
    assert connection.closed_at == start + TIMEOUT


async def test_a_request_stops_the_timer_and_its_end_starts_it_afresh(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    connection = await open_connection(nursery)
    await trio.sleep(TIMEOUT - 1)
    await connection.timer.stop()  # a request arrives
    await trio.sleep(10 * TIMEOUT)  # and is answered for a long time
    assert connection.closed_at is None
    answered = trio.current_time()
    await connection.timer.restart()
    await connection.done.wait()
    assert connection.closed_at == answered + TIMEOUT


async def test_termination_closes_an_idle_connection_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    connection = await open_connection(nursery)
    await trio.sleep(5.0)
    terminated = trio.current_time()
    await connection.terminated.set()
    await connection.done.wait()
    assert connection.closed_at == terminated


async def test_termination_waits_for_the_answer_being_sent(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    connection = await open_connection(nursery)
    await connection.timer.stop()
    await connection.terminated.set()
    await trio.sleep(10 * TIMEOUT)
    assert connection.closed_at is None
    answered = trio.current_time()
    await connection.timer.restart()
    await connection.done.wait()
    assert connection.closed_at == answered


async def test_a_connection_with_nothing_more_to_read_is_not_closed_by_the_timer(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    # Its handler closes it once the answer being sent, if any, is over.
    connection = await open_connection(nursery)
    await trio.sleep(1.0)
    ended = trio.current_time()
    connection.timer.end()
    await connection.done.wait()
    assert connection.closed_at is None
    assert trio.current_time() == ended


async def test_request_messages_reach_the_application_at_once_while_there_is_room() -> None:
    config = hypercorn.config.Config()
    config.max_app_queue_size = 1
    received: list[Any] = []
    reading = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await reading.wait()
        while (message := await receive())["type"] != "http.disconnect":
            received.append(message)

    async def send(message: object) -> None:
        pass

    first: HTTPRequestEvent = {"type": "http.request", "body": b"a", "more_body": True}
    last: HTTPRequestEvent = {"type": "http.request", "body": b"", "more_body": False}
    scope = cast(HTTPScope, {"type": "http", "extensions": {}})
    told: list[str] = []
    async with TaskGroup() as group:
        put = await group.spawn_app(ASGIWrapper(app), config, scope, send)
        with trio.testing.assert_no_checkpoints():
            await put(first)  # the queue has room
        scope["extensions"][CLIENT_LEFT_EXTENSION].on_leave(lambda: told.append("left"))  # type: ignore[attr-defined]

        async def put_the_rest() -> None:
            await put(last)
            await put({"type": "http.disconnect"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(put_the_rest)
            await trio.testing.wait_all_tasks_blocked()
            assert received == []  # the queue is full: the rest waits for the application
            assert told == []
            reading.set()
    assert received == [first, last]
    assert told == ["left"]


async def test_the_application_is_told_at_once_that_its_client_left() -> None:
    """Even while its queue is full: nothing of the application waits for the message."""
    config = hypercorn.config.Config()
    config.max_app_queue_size = 1
    scope = cast(HTTPScope, {"type": "http", "extensions": {}})
    told: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["extensions"][CLIENT_LEFT_EXTENSION].on_leave(lambda: told.append("left"))
        await trio.sleep_forever()  # reads nothing

    async def send(message: object) -> None:
        pass

    async with TaskGroup() as group:
        put = await group.spawn_app(ASGIWrapper(app), config, scope, send)
        await trio.testing.wait_all_tasks_blocked()
        await put({"type": "http.request", "body": b"", "more_body": False})
        async with trio.open_nursery() as nursery:
            disconnect: HTTPDisconnectEvent = {"type": "http.disconnect"}
            nursery.start_soon(put, disconnect)
            await trio.testing.wait_all_tasks_blocked()
            assert told == ["left"]  # while the message itself waits for room
            nursery.cancel_scope.cancel()
        # What the application asks to be told of afterwards is told at once.
        scope["extensions"][CLIENT_LEFT_EXTENSION].on_leave(lambda: told.append("late"))  # type: ignore[attr-defined]
        assert told == ["left", "late"]
        group._nursery.cancel_scope.cancel()  # type: ignore[union-attr]


async def test_what_the_kernel_takes_at_once_is_sent_without_a_checkpoint() -> None:
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        with a, b:
            with trio.testing.assert_no_checkpoints():
                assert send_now(a, b"hello") == 5
            assert await b.recv(10) == b"hello"


async def test_a_full_buffer_takes_a_part_then_nothing() -> None:
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        with a, b:
            a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            data = bytes(range(256)) * 4096  # 1 MiB: more than both buffers hold
            taken = send_now(a, data)
            assert 0 < taken < len(data)
            assert send_now(a, data[taken:]) == 0  # full: the caller's Trio send waits
            received = bytearray()

            async def read_all() -> None:
                while len(received) < len(data):
                    received.extend(await b.recv(65536))

            connection = pool_connection(a)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                await connection.write(data[taken:])  # the pool's: send_now, then waits
            assert connection.written == len(data) - taken
            assert received == data


async def test_a_closed_socket_takes_nothing_and_a_gone_peer_raises() -> None:
    a, b = trio.socket.socketpair()
    a.close()
    assert send_now(a, b"x") == 0  # never a descriptor number reused meanwhile
    b.close()
    c, d = trio.socket.socketpair()
    with c:
        d.close()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            send_now(c, b"x")


def answering(body: bytes) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """An ASGI app that answers every request with ``body``."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            return
        await receive()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def local_config() -> hypercorn.config.Config:
    """hypercorn's settings for a server on a free port, with llamaswap's handler."""
    install()
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    return config


async def test_an_answer_larger_than_the_buffers_reaches_a_client_that_reads_late() -> None:
    """llamaswap's handler writes what the kernel takes, then waits for the client to read
    the rest: the answer arrives whole and in order, and the connection serves the next."""
    body = bytes(range(256)) * (16 * 4096)  # 16 MiB
    app, config = answering(body), local_config()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(hypercorn.trio.serve, app, config))
            port = int(binds[0].rsplit(":", 1)[1])
            client = trio.socket.socket()
            with client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                await client.connect(("127.0.0.1", port))
                for _ in range(2):
                    await client.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                    await trio.testing.wait_all_tasks_blocked()  # the server waits to write
                    received = bytearray()
                    while b"\r\n\r\n" not in received:
                        received.extend(await client.recv(65536))
                    head, _, rest = bytes(received).partition(b"\r\n\r\n")
                    assert head.startswith(b"HTTP/1.1 200")
                    received = bytearray(rest)
                    while len(received) < len(body):
                        received.extend(await client.recv(1 << 20))
                    assert received == body
            nursery.cancel_scope.cancel()


async def test_a_cancel_ends_a_write_to_a_client_that_does_not_read() -> None:
    """hypercorn shields a write from cancellation (so that none is cut in half): with a
    client that never reads, cancelling the server waited for that client for good. The
    cancel reaches the write, and the connection, its answer cut short, is closed."""
    app = answering(b"x" * (32 << 20))  # more than any socket buffers hold
    config = local_config()
    client = trio.socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    async def hang_guard() -> None:
        # Cancelling cannot end a shielded write; the client leaving does.
        await trio.sleep(10)
        client.close()

    with client:
        async with trio.open_nursery() as guarded:
            guarded.start_soon(hang_guard)
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(partial(hypercorn.trio.serve, app, config))
                await client.connect(("127.0.0.1", int(binds[0].rsplit(":", 1)[1])))
                await client.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                await trio.testing.wait_all_tasks_blocked()  # the write waits for the client
                nursery.cancel_scope.cancel()
            guarded.cancel_scope.cancel()
        assert client.fileno() != -1, "the server ended only when its client left"
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := await client.recv(1 << 20):
                received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert len(received) < 32 << 20


async def test_a_read_takes_what_has_arrived_and_says_when_nothing_has() -> None:
    a, b = trio.socket.socketpair()
    with a, b:
        with trio.testing.assert_no_checkpoints():
            assert receive_now(b) is None
            assert send_now(a, b"hello") == 5
            assert receive_now(b) == b"hello"
        a.close()
        assert receive_now(b) == b""  # the end of the stream
    with pytest.raises(trio.ClosedResourceError):
        receive_now(b)


def pool_connection(sock: trio.socket.SocketType) -> _Connection:
    """The upstream pool's connection over ``sock``, as it makes one to a plain-TCP server."""
    stream = trio.SocketStream(sock)
    return _Connection(stream, stream)


async def test_the_upstream_pools_read_is_a_checkpoint_and_a_cancelled_one_takes_nothing() -> None:
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        with a, b:
            connection = pool_connection(b)
            full = b"x" * _READ
            assert await a.send(full + b"ready") == len(full) + 5
            # Each of the two ways a read goes: waiting first (as a fresh connection's
            # first read does), then trying first (after a full read).
            for expected in (full, b"ready"):
                with trio.CancelScope() as cancelled:
                    cancelled.cancel()
                    await connection.receive()  # raises Cancelled, taking nothing
                assert cancelled.cancelled_caught
                with trio.testing.assert_checkpoints():
                    assert await connection.receive() == expected
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.send, b"later")
                with trio.testing.assert_checkpoints():
                    assert await connection.receive() == b"later"


async def test_after_taking_all_there_was_the_pools_next_read_waits_before_it_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token stream's next chunk comes long after the last: no read that finds nothing."""
    tries: list[bytes | None] = []

    def counted(sock: trio.socket.SocketType) -> bytes | None:
        tries.append(data := receive_now(sock))
        return data

    monkeypatch.setattr(upstream, "receive_now", counted)
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        with a, b:
            connection = pool_connection(b)
            for token in (b"one", b"two"):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a.send, token)  # once the read below waits
                    assert await connection.receive() == token
            assert tries == [b"one", b"two"]
            tries.clear()
            full = b"x" * _READ
            assert await a.send(full + b"rest") == len(full) + 4
            assert await connection.receive() == full
            assert await connection.receive() == b"rest"  # tried first: it was there
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.send, b"three")
                assert await connection.receive() == b"three"
            assert tries == [full, b"rest", b"three"]


async def test_a_closed_connections_read_says_so_whichever_way_it_goes() -> None:
    with trio.fail_after(10):
        a, b = trio.socket.socketpair()
        with a, b:
            drained = pool_connection(b)  # a fresh connection waits first
            drained.close()
            with pytest.raises(trio.ClosedResourceError):
                await drained.receive()
        a, b = trio.socket.socketpair()
        with a, b:
            full = pool_connection(b)
            assert await a.send(b"x" * _READ) == _READ
            assert len(await full.receive()) == _READ  # the next read tries first
            full.close()
            with pytest.raises(trio.ClosedResourceError):
                await full.receive()


async def test_a_connection_closed_by_a_cancelled_task_is_closed_all_the_same() -> None:
    """hypercorn's close sends the EOF first, and the EOF's checkpoint raised a pending
    cancellation before the socket was closed: after an unload's cancel raced the end of
    an answer with ``Connection: close``, its client waited for an end that never came."""
    ours, theirs = trio.socket.socketpair()
    with theirs:
        server = TCPServer(
            ASGIWrapper(answering(b"")),
            local_config(),
            WorkerContext(None),
            {},
            trio.SocketStream(ours),
        )
        with trio.CancelScope() as scope:
            scope.cancel()
            await server._close()
        assert ours.fileno() == -1
        assert await theirs.recv(1) == b""


async def test_a_failure_in_one_connection_ends_it_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An error in the handling of one connection (llamaswap's or hypercorn's) unwound
    hypercorn's serve(): the process exited with everything in flight. It is logged once
    and closes that connection; the server serves the next."""

    async def broken(self: H11Protocol, event: object) -> None:
        if b"/boom" in getattr(event, "target", b""):
            raise RuntimeError("a bug")

    monkeypatch.setattr(H11Protocol, "_check_protocol", broken)
    config = local_config()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(hypercorn.trio.serve, answering(b"ok"), config))
            host, port = binds[0].removeprefix("http://").rsplit(":", 1)
            failing = await trio.open_tcp_stream(host, int(port))
            async with failing:
                await failing.send_all(b"GET /boom HTTP/1.1\r\nhost: x\r\n\r\n")
                assert await failing.receive_some(1) == b""  # closed, unanswered
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{binds[0]}/fine")).content == b"ok"
            nursery.cancel_scope.cancel()
    failures = [r for r in caplog.records if "failed (it is closed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None
