"""The forwarding client (proxy/upstream.py) where HTTP/1.1 has its corners.

Early answers to large uploads, bodies that end with the connection (over TLS), HEAD,
interim 1xx responses, ``Connection: close``, and the expiry of idle connections, each
against a scripted server on real sockets (see test_upstream_pool.py).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import h11
import pytest
import trio
import trustme
from trio.testing import MockClock

from llamaswap.config.model import Config, ModelConfig
from llamaswap.http.client import UpstreamFailed
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.router import Router
from tests.e2e.test_forward_asgi import http_scope
from tests.e2e.test_upstream_pool import Peer, Script, get, serve_forever, start_server
from tests.fakes import FakeProbe, FakeSpawner

#: Far more than the kernel buffers on both sides of a loopback connection hold while the
#: server reads nothing (it stops after the head), so the client's write fails.
LARGE = 16 * 1024 * 1024


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    async with UpstreamPool() as pool:
        yield pool


@pytest.fixture
def clock() -> MockClock:
    return MockClock(rate=1.0)  # real time passes (the hang guard works), and tests can jump


def too_large(*, reset: bool) -> Script:
    """A server that answers 413 after the request's head, then closes with the body
    unread (the kernel answers the rest with a reset), or resets at once."""

    async def script(peer: Peer, index: int) -> None:
        if index > 0:
            await peer.serve_forever()
            return
        head = await peer.head()
        assert head is not None
        answer = h11.Response(status_code=413, headers=[(b"content-length", b"9")])
        await peer.send(answer, h11.Data(data=b"too large"), h11.EndOfMessage())
        if reset:
            assert isinstance(peer.stream, trio.SocketStream)
            peer.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Returning closes the connection.

    return script


async def in_pieces(size: int) -> AsyncGenerator[bytes, None]:
    piece = b"x" * 65536
    for _ in range(size // len(piece)):
        yield piece


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
@pytest.mark.parametrize("streamed", [False, True], ids=["bytes", "streamed"])
async def test_an_answer_before_the_whole_body_was_read_reaches_the_caller(
    nursery: trio.Nursery, pool: UpstreamPool, reset: bool, streamed: bool
) -> None:
    server = await start_server(nursery, too_large(reset=reset))
    headers = [(b"content-length", str(LARGE).encode())]
    pieces = in_pieces(LARGE)  # the caller's to close: the pool stops reading it
    body = pieces if streamed else b"x" * LARGE
    with trio.fail_after(10):
        async with (
            contextlib.aclosing(pieces),
            pool.request("POST", server.url, "/upload", headers, body) as response,
        ):
            assert response.status == 413
            assert await response.read() == b"too large"
        assert await get(pool, server.url, "/next") == b"/next"  # not on that connection
    assert server.connections == 2


async def test_a_server_that_stops_reading_without_an_answer_is_a_failure(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    async def script(peer: Peer, index: int) -> None:
        assert await peer.head() is not None  # then close, the body unread

    server = await start_server(nursery, script)
    with trio.fail_after(10), pytest.raises(UpstreamFailed) as failed:
        async with pool.request("POST", server.url, "/", [], b"x" * LARGE):
            pass
    assert not failed.value.answered
    assert "BrokenPipeError" in str(failed.value) or "ConnectionResetError" in str(failed.value)


async def test_a_tls_body_that_ends_with_the_connection_is_complete(
    nursery: trio.Nursery,
) -> None:
    """No Content-Length, not chunked: the body ends when the server closes, and servers
    close TLS without close_notify as often as with it."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)

    def tls(stream: trio.SocketStream) -> trio.abc.Stream:
        return trio.SSLStream(stream, server_context, server_side=True)

    async def script(peer: Peer, index: int) -> None:
        if await peer.request() is None:
            return
        await peer.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil EOF")
        # Returning closes the TCP connection under the TLS one: no close_notify.

    server = await start_server(nursery, script, wrap=tls, scheme="https", host="localhost")
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    with trio.fail_after(10):
        async with UpstreamPool(ssl_context=trusting) as pool:
            assert await get(pool, server.url, "/") == b"until EOF"
            assert await get(pool, server.url, "/") == b"until EOF"
    assert server.connections == 2


@pytest.mark.parametrize(
    "framing", [(b"content-length", b"1000"), (b"transfer-encoding", b"chunked")]
)
async def test_a_head_response_has_no_body_whatever_its_framing(
    nursery: trio.Nursery, pool: UpstreamPool, framing: tuple[bytes, bytes]
) -> None:
    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            if request[0].method == b"HEAD":
                head = h11.Response(status_code=200, headers=[framing])
                await peer.send(head, h11.EndOfMessage())
            else:
                await peer.respond(b"after")

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        async with pool.request("HEAD", server.url, "/", [], None) as response:
            assert response.header(framing[0]) == framing[1].decode()
            assert await response.read() == b""
        assert await get(pool, server.url, "/") == b"after"
    assert server.connections == 1


async def test_interim_responses_are_skipped(nursery: trio.Nursery, pool: UpstreamPool) -> None:
    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            hints = h11.InformationalResponse(
                status_code=103, headers=[(b"link", b"</a.css>; rel=preload")]
            )
            await peer.send(h11.InformationalResponse(status_code=100, headers=[]), hints)
            await peer.respond(request[0].target)

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        async with pool.request("GET", server.url, "/final", [], None) as response:
            assert response.status == 200
            assert await response.read() == b"/final"
        assert await get(pool, server.url, "/again") == b"/again"
    assert server.connections == 1


async def test_a_connection_the_server_says_it_closes_is_not_reused(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    client_closed = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        if index > 0:
            await peer.serve_forever()
            return
        assert await peer.request() is not None
        headers = [(b"content-length", b"4"), (b"connection", b"close")]
        await peer.send(h11.Response(status_code=200, headers=headers), h11.Data(data=b"last"))
        await peer.send(h11.EndOfMessage())
        assert await peer.stream.receive_some() == b""  # the client closed its side
        client_closed.set()

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/") == b"last"
        await client_closed.wait()
        assert await get(pool, server.url, "/next") == b"/next"
    assert server.connections == 2


def closing_recorder(closed: list[trio.Event]) -> Script:
    """A server that answers with the target, and sets ``closed[i]`` when the client
    closes connection ``i``."""

    async def script(peer: Peer, index: int) -> None:
        await peer.serve_forever()
        closed[index].set()

    return script


async def test_expired_idle_connections_are_closed_not_just_passed_over(
    nursery: trio.Nursery, clock: MockClock
) -> None:
    closed = [trio.Event() for _ in range(3)]
    server = await start_server(nursery, closing_recorder(closed))
    with trio.fail_after(10):
        async with UpstreamPool(idle_timeout=4.0) as pool:
            async with pool.request("GET", server.url, "/0", [], None) as first:
                async with pool.request("GET", server.url, "/1", [], None) as second:
                    assert await second.read() == b"/1"
                clock.jump(3.0)
                assert await first.read() == b"/0"
            clock.jump(2.0)  # connection 1 has been idle 5 s, connection 0 2 s
            assert await get(pool, server.url, "/2") == b"/2"  # on connection 0
            await closed[1].wait()
            assert not closed[0].is_set()
    assert server.connections == 2


async def test_an_expired_connection_to_another_origin_is_closed_on_checkin(
    nursery: trio.Nursery, clock: MockClock
) -> None:
    closed = [trio.Event()]
    quiet = await start_server(nursery, closing_recorder(closed))
    busy = await start_server(nursery, serve_forever)
    with trio.fail_after(10):
        async with UpstreamPool(idle_timeout=4.0) as pool:
            await get(pool, quiet.url, "/")
            clock.jump(5.0)
            await get(pool, busy.url, "/")
            await closed[0].wait()


async def test_beyond_the_idle_count_the_oldest_connection_is_closed(
    nursery: trio.Nursery,
) -> None:
    closed = [trio.Event() for _ in range(2)]
    server = await start_server(nursery, closing_recorder(closed))
    with trio.fail_after(10):
        async with UpstreamPool(max_idle_per_origin=1) as pool:
            async with pool.request("GET", server.url, "/0", [], None) as first:
                async with pool.request("GET", server.url, "/1", [], None) as second:
                    assert await second.read() == b"/1"
                assert await first.read() == b"/0"
            await closed[1].wait()  # connection 1, idle the longer, made room for 0
            assert await get(pool, server.url, "/2") == b"/2"
            assert not closed[0].is_set()
    assert server.connections == 2


async def through_the_app(
    nursery: trio.Nursery, script: Script, scope: dict[str, Any], body: bytes
) -> list[dict[str, Any]]:
    """The ASGI messages llamaswap's app sends for one request (``scope``, ``body``) to
    model ``m``, served by ``script``; the client stays connected throughout."""
    server = await start_server(nursery, script)
    config = Config(
        models={"m": ModelConfig(cmd=("server", server.url.rsplit(":", 1)[1]), proxy=server.url)}
    )
    spawner = FakeSpawner(nursery)
    router = Router(config, spawner=spawner, probe=FakeProbe(spawner))
    await nursery.start(router.run)
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with UpstreamPool() as pool:
        app = create_app(router, pool)
        with trio.fail_after(10):
            await app(scope, receive, send)  # type: ignore[arg-type]
    return sent


async def test_expect_is_not_forwarded(nursery: trio.Nursery) -> None:
    """hypercorn has answered ``100 Continue`` to the client already; a server asked
    again would wait for a body already on its way, or answer 100 a second time."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            seen.append(list(request[0].headers))
            await peer.respond(request[1])

    scope = http_scope("POST", "/upstream/m/echo")
    scope["headers"] += [(b"expect", b"100-continue"), (b"content-length", b"5")]
    sent = await through_the_app(nursery, script, scope, b"hello")
    assert sent[0]["status"] == 200
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"hello"
    [headers] = seen
    assert [name for name, _ in headers if name == b"expect"] == []
    assert (b"content-length", b"5") in headers


async def test_a_chunked_answer_is_decoded_and_its_connection_kept_alive(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            head = h11.Response(status_code=200, headers=[(b"transfer-encoding", b"chunked")])
            pieces = [h11.Data(data=part) for part in (request[0].target, b"|", b"x" * 70000)]
            await peer.send(head, *pieces, h11.EndOfMessage(headers=[(b"checksum", b"1")]))

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        for target in (b"/one", b"/two"):
            assert await get(pool, server.url, target.decode()) == target + b"|" + b"x" * 70000
    assert server.connections == 1


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (b"", b"3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n"),  # more than the body
        (b"connection: close\r\n", b"3\r\nabc\r\n0\r\n\r\n"),
    ],
    ids=["bytes after the body", "connection close"],
)
async def test_a_chunked_answer_that_ends_the_connection_is_not_reused(
    nursery: trio.Nursery, pool: UpstreamPool, headers: bytes, body: bytes
) -> None:
    async def script(peer: Peer, index: int) -> None:
        if index > 0:
            await peer.serve_forever()
            return
        assert await peer.request() is not None
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n" + headers + b"\r\n"
        await peer.stream.send_all(head + body)
        await peer.stream.receive_some()  # until the client closes

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/") == b"abc"
        assert await get(pool, server.url, "/next") == b"/next"
    assert server.connections == 2


async def test_bytes_after_an_answer_are_never_the_next_answer(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    """A server that sends more than its answer's length (a second answer, unasked): the
    connection is out of step, so the next request goes on a new one."""

    async def script(peer: Peer, index: int) -> None:
        if index > 0:
            await peer.serve_forever()
            return
        assert await peer.request() is not None
        two = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        two += b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nEVIL"
        await peer.stream.send_all(two)
        await peer.stream.receive_some()  # until the client closes it

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/") == b"ok"
        assert await get(pool, server.url, "/next", b"{}") == b"/next"
    assert server.connections == 2


async def test_framing_and_connection_fields_stay_on_their_hop(nursery: trio.Nursery) -> None:
    """RFC 9112 §6.3: Transfer-Encoding wins over Content-Length, which a proxy must not
    pass on; RFC 9110 §7.6.1: the fields a Connection header names are that hop's only,
    both ways."""
    seen: list[list[tuple[bytes, bytes]]] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            seen.append(list(request[0].headers))
            await peer.stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n"
                b"connection: x-hop\r\nx-hop: secret\r\nx-kept: yes\r\n\r\n"
                b"5\r\nhello\r\n0\r\n\r\n"
            )

    scope = http_scope("GET", "/upstream/m/x")
    scope["headers"] += [(b"connection", b"x-client-hop"), (b"x-client-hop", b"private")]
    sent = await through_the_app(nursery, script, scope, b"")
    names = {name for name, _ in sent[0]["headers"]}
    assert (sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])) == (200, b"hello")
    assert names.isdisjoint({b"content-length", b"x-hop", b"connection"})
    assert b"x-kept" in names
    [headers] = seen
    assert b"x-client-hop" not in {name for name, _ in headers}
