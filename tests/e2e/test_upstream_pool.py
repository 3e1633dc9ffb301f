"""The forwarding client (proxy/upstream.py) against scripted servers on real sockets.

Each test's server is a few lines of h11 that do exactly what the test needs (answer,
drop a connection at a chosen moment, wait for the client to leave), and count the
connections they accept, which is how reuse is observed from outside.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import final

import attrs
import h11
import pytest
import trio
import trio.testing
import trustme
from trio.testing import MockClock

from llamaswap._serve import _close_upstream_connections
from llamaswap.config.model import Config, ModelConfig, Timeouts
from llamaswap.http.client import UpstreamFailed, UpstreamPool, _Connection
from llamaswap.router import Router
from tests.fakes import FakeProbe, FakeSpawner


@final
class Peer:
    """The server's side of one connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER)

    async def _next(self) -> h11.Event:
        while (event := self.h11.next_event()) is h11.NEED_DATA:
            self.h11.receive_data(bytes(await self.stream.receive_some(65536)))
        return event  # type: ignore[return-value]

    async def head(self) -> h11.Request | None:
        """The next request's head (its body not read yet), or None once the client has closed."""
        if self.h11.states == {h11.CLIENT: h11.DONE, h11.SERVER: h11.DONE}:
            self.h11.start_next_cycle()
        head = await self._next()
        if isinstance(head, h11.ConnectionClosed):
            return None
        assert isinstance(head, h11.Request)
        return head

    async def request(self) -> tuple[h11.Request, bytes] | None:
        """The next request and its body, or None once the client has closed."""
        if (head := await self.head()) is None:
            return None
        body = b""
        while isinstance(event := await self._next(), h11.Data):
            body += event.data
        assert isinstance(event, h11.EndOfMessage)
        return head, body

    async def send(self, *events: h11.Event) -> None:
        await self.stream.send_all(b"".join(self.h11.send(e) or b"" for e in events))

    async def respond(self, body: bytes) -> None:
        length = [(b"content-length", str(len(body)).encode())]
        await self.send(h11.Response(status_code=200, headers=length), h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def serve_forever(self) -> None:
        """Answer each request with its own target, until the client closes."""
        while (request := await self.request()) is not None:
            await self.respond(request[0].target)


Script = Callable[[Peer, int], Awaitable[None]]  # (peer, index of the connection)


@attrs.define
class Server:
    url: str = ""
    connections: int = 0  # accepted so far


async def start_server(
    nursery: trio.Nursery,
    script: Script,
    *,
    wrap: Callable[[trio.SocketStream], trio.abc.Stream] = lambda s: s,
    scheme: str = "http",
    host: str = "127.0.0.1",
) -> Server:
    server = Server()

    async def handle(stream: trio.SocketStream) -> None:
        index, server.connections = server.connections, server.connections + 1
        with contextlib.suppress(trio.BrokenResourceError):  # a TLS client refusing our cert
            await script(Peer(wrap(stream)), index)

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    server.url = f"{scheme}://{host}:{port}"
    return server


async def serve_forever(peer: Peer, index: int) -> None:
    await peer.serve_forever()


async def get(pool: UpstreamPool, url: str, target: str, body: bytes | None = None) -> bytes:
    async with pool.request("POST" if body else "GET", url, target, [], body) as response:
        assert response.status == 200
        return await response.read()


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    async with UpstreamPool() as pool:
        yield pool


async def test_a_connection_is_kept_alive_for_the_next_request(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    seen: list[h11.Request] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            seen.append(request[0])
            await peer.respond(request[0].target + b" " + request[1])

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        answers = [await get(pool, server.url, f"/n/{i}", b"x" * i) for i in range(3)]
    assert answers == [b"/n/0 ", b"/n/1 x", b"/n/2 xx"]
    assert server.connections == 1
    port = server.url.rpartition(":")[2]
    assert [dict(r.headers)[b"host"] for r in seen] == [f"127.0.0.1:{port}".encode()] * 3


async def test_a_body_larger_than_one_write_arrives_whole(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            await peer.respond(request[1])

    server = await start_server(nursery, script)
    body = bytes(range(256)) * 4096  # 1 MiB: its own writes, after the head's
    with trio.fail_after(10):
        assert await get(pool, server.url, "/", body) == body
        assert await get(pool, server.url, "/", b"small") == b"small"
    assert server.connections == 1


async def test_the_base_url_path_prefixes_the_target(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    server = await start_server(nursery, serve_forever)
    with trio.fail_after(10):
        assert await get(pool, server.url + "/api/", "/v1/models?x=1") == b"/api/v1/models?x=1"


async def test_request_bodies_keep_their_framing(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    seen: list[tuple[dict[bytes, bytes], bytes]] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            seen.append((dict(request[0].headers), request[1]))
            await peer.respond(b"")

    async def parts() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    server = await start_server(nursery, script)
    sized = [(b"content-length", b"4")]
    with trio.fail_after(10):
        for headers, body in (([], b"abcd"), (sized, parts()), ([], parts()), ([], None)):
            async with pool.request("POST", server.url, "/", headers, body):
                pass
    framing = [(h.get(b"content-length"), h.get(b"transfer-encoding"), body) for h, body in seen]
    assert framing == [
        (b"4", None, b"abcd"),
        (b"4", None, b"abcd"),
        (None, b"chunked", b"abcd"),
        (None, None, b""),
    ]


@pytest.fixture
def clock() -> MockClock:
    return MockClock(rate=1.0)  # real time passes (the hang guard works), and tests can jump


async def test_an_idle_connection_older_than_the_idle_timeout_is_not_reused(
    nursery: trio.Nursery, clock: MockClock
) -> None:
    server = await start_server(nursery, serve_forever)
    with trio.fail_after(10):
        async with UpstreamPool(idle_timeout=4.0) as pool:
            await get(pool, server.url, "/")
            clock.jump(3.5)  # and well under 0.5 s of real time passes
            await get(pool, server.url, "/")
            assert server.connections == 1
            clock.jump(4.1)
            await get(pool, server.url, "/")
            assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_replaced(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    closed = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        if index == 0:  # as a keep-alive timeout would: answer, then close
            request = await peer.request()
            assert request is not None
            await peer.respond(b"first")
            await peer.stream.aclose()
            closed.set()
        else:
            await peer.serve_forever()

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/") == b"first"
        await closed.wait()
        assert await get(pool, server.url, "/again") == b"/again"
    assert server.connections == 2


async def test_a_post_that_may_have_reached_the_server_is_never_sent_again(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    """The server reads a whole POST on a kept-alive connection, then closes unanswered:
    it may have acted on it, so the failure is the caller's, not a second POST."""
    received: list[bytes] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            received.append(request[1])
            if len(received) == 2:
                return  # read it all, then close without an answer
            await peer.respond(b"ok")

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/", b"first") == b"ok"
        with pytest.raises(UpstreamFailed, match="before answering") as failed:
            await get(pool, server.url, "/", b"second")
    assert not failed.value.answered
    assert received == [b"first", b"second"]
    assert server.connections == 1


async def test_an_idempotent_request_dropped_on_a_reused_connection_is_sent_again_once(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    """The server closes a kept-alive connection just as the next request arrives."""
    received: list[tuple[int, bytes, bytes]] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            received.append((index, request[0].method, request[0].target))
            if len(received) == 2:
                return  # read the request, then close without an answer
            await peer.respond(b"ok")

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await get(pool, server.url, "/one") == b"ok"
        assert await get(pool, server.url, "/two") == b"ok"
    assert received == [(0, b"GET", b"/one"), (0, b"GET", b"/two"), (1, b"GET", b"/two")]


async def test_a_request_of_which_no_byte_was_written_is_sent_again(
    nursery: trio.Nursery, pool: UpstreamPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server resets a kept-alive connection just after the pool found it alive: the
    first write fails, so the server cannot have seen the request, even a streamed POST."""
    reset = trio.Event()
    received: list[bytes] = []

    async def script(peer: Peer, index: int) -> None:
        if index == 0:
            assert await peer.request() is not None
            await peer.respond(b"first")
            assert isinstance(peer.stream, trio.SocketStream)
            linger = struct.pack("ii", 1, 0)  # close = RST, at once
            peer.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            peer.stream.socket.close()
            reset.set()
            return
        while (request := await peer.request()) is not None:
            received.append(request[1])
            await peer.respond(b"second")

    async def body() -> AsyncIterator[bytes]:
        yield b"streamed"

    server = await start_server(nursery, script)
    monkeypatch.setattr(_Connection, "stale", lambda self: False)  # the reset comes after
    with trio.fail_after(10):
        assert await get(pool, server.url, "/", b"1") == b"first"
        await reset.wait()
        [[idle]] = pool._idle.values()
        await trio.lowlevel.wait_readable(idle._tcp.socket)  # the RST has arrived
        async with pool.request("POST", server.url, "/", [], body()) as response:
            assert await response.read() == b"second"
    assert received == [b"streamed"]
    assert server.connections == 2


async def test_a_streamed_body_is_not_sent_again(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    async def script(peer: Peer, index: int) -> None:
        assert await peer.request() is not None
        await peer.respond(b"")
        await peer.request()  # then close without an answer

    async def body() -> AsyncIterator[bytes]:
        yield b"once"

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        await get(pool, server.url, "/")
        with pytest.raises(UpstreamFailed) as failed:
            async with pool.request("POST", server.url, "/", [], body()):
                pass
    assert not failed.value.answered
    assert server.connections == 1


async def test_cancelling_mid_response_closes_the_connection(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    client_left = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        if index > 0:
            await peer.serve_forever()
            return
        assert await peer.request() is not None
        await peer.send(h11.Response(status_code=200, headers=[]), h11.Data(data=b"first"))
        assert await peer.stream.receive_some() == b""  # the client hung up
        client_left.set()

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with pool.request("GET", server.url, "/", [], None) as response:
                async for chunk in response.chunks():
                    assert chunk == b"first"
                    scope.cancel()
        assert scope.cancelled_caught
        await client_left.wait()
        assert await get(pool, server.url, "/next") == b"/next"
    assert server.connections == 2


async def test_what_has_arrived_is_relayed_in_one_piece_without_waiting_for_more(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    events = [b"data: %d\n\n" % i for i in range(100)]
    first_read = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        assert await peer.request() is not None
        head = h11.Response(status_code=200, headers=[(b"transfer-encoding", b"chunked")])
        await peer.send(head, *(h11.Data(data=event) for event in events))  # one write
        await first_read.wait()  # the rest only once the client has had the first piece
        await peer.send(h11.Data(data=b"data: last\n\n"), h11.EndOfMessage())
        await peer.serve_forever()

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        async with pool.request("GET", server.url, "/", [], None) as response:
            pieces = []
            async for piece in response.chunks():
                pieces.append(piece)
                first_read.set()
    assert pieces == [b"".join(events), b"data: last\n\n"]


async def test_a_response_not_read_to_its_end_closes_the_connection(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    server = await start_server(nursery, serve_forever)
    with trio.fail_after(10):
        async with pool.request("GET", server.url, "/unread", [], None) as response:
            assert response.status == 200
        assert await get(pool, server.url, "/read") == b"/read"
    assert server.connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"content-length: 10\r\n\r\n12345",
        b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",  # no last chunk
        b"transfer-encoding: chunked\r\n\r\n3\r\nab",  # mid-chunk
        b"transfer-encoding: chunked\r\n\r\nzz\r\n",  # not a chunk size
    ],
    ids=["content-length", "no last chunk", "mid-chunk", "bad chunk"],
)
async def test_a_body_that_breaks_off_is_an_answered_failure(
    nursery: trio.Nursery, pool: UpstreamPool, answer: bytes
) -> None:
    async def script(peer: Peer, index: int) -> None:
        assert await peer.request() is not None
        await peer.stream.send_all(b"HTTP/1.1 200 OK\r\n" + answer)  # then closes

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        async with pool.request("GET", server.url, "/", [], None) as response:
            with pytest.raises(UpstreamFailed) as failed:
                await response.read()
    assert failed.value.answered


async def test_nobody_listening_is_a_failure_before_any_answer(pool: UpstreamPool) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with trio.fail_after(10), pytest.raises(UpstreamFailed) as failed:
        await get(pool, f"http://127.0.0.1:{port}", "/")
    assert not failed.value.answered
    assert f"127.0.0.1:{port}" in str(failed.value)


async def test_https_upstreams_are_verified(nursery: trio.Nursery) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)

    def tls(stream: trio.SocketStream) -> trio.abc.Stream:
        return trio.SSLStream(stream, server_context, server_side=True)

    server = await start_server(nursery, serve_forever, wrap=tls, scheme="https", host="localhost")
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    with trio.fail_after(10):
        async with UpstreamPool(ssl_context=trusting) as pool:
            assert await get(pool, server.url, "/secure") == b"/secure"
            assert await get(pool, server.url, "/again") == b"/again"
        assert server.connections == 1
        async with UpstreamPool() as untrusting:  # the system's CAs do not know this one
            with pytest.raises(UpstreamFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await get(untrusting, server.url, "/")


async def test_a_request_h11_refuses_to_send_is_a_failure(pool: UpstreamPool) -> None:
    with pytest.raises(UpstreamFailed, match="cannot send this request"):
        await get(pool, "http://127.0.0.1:1", "/a b")


async def test_an_idle_connection_is_stale_once_the_server_has_closed_it() -> None:
    ours, theirs = trio.socket.socketpair()
    stream = trio.SocketStream(ours)
    connection = _Connection(stream, stream)
    assert not connection.stale()
    theirs.close()
    with trio.fail_after(10):
        await trio.lowlevel.wait_readable(ours)
    assert connection.stale()
    connection.close()


async def test_closing_a_servers_idle_connections_closes_them_whatever_their_prefix(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    send_ended, ended = trio.open_memory_channel[int](3)

    async def script(peer: Peer, index: int) -> None:
        await peer.serve_forever()
        send_ended.send_nowait(index)  # the client closed it

    gone, other = await start_server(nursery, script), await start_server(nursery, script)
    forever = Timeouts(idle_conn=0)  # no expiry: only close_idle ends them
    with trio.fail_after(10):
        for url in (gone.url, gone.url + "/api", other.url):  # as a probe and the proxy do
            async with pool.request("GET", url, "/", [], None, forever) as response:
                await response.read()
        pool.close_idle(gone.url + "/v1")
        assert sorted([await ended.receive(), await ended.receive()]) == [0, 1]
        assert [origin.port for origin in pool._idle] == [int(other.url.rpartition(":")[2])]
        assert await get(pool, gone.url, "/again") == b"/again"  # a new one
    assert gone.connections == 3
    assert other.connections == 1
    with pytest.raises(trio.WouldBlock):
        ended.receive_nowait()  # the other server's connection is still open


async def test_a_model_that_stops_leaves_no_idle_connection_to_its_address(
    nursery: trio.Nursery,
) -> None:
    closed = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        await peer.serve_forever()
        closed.set()

    server = await start_server(nursery, script)  # the model's server, as far as the pool sees
    port = server.url.rpartition(":")[2]  # in its argv: FakeProbe's sign of a server
    model = ModelConfig(cmd=("server", port), proxy=server.url, timeouts=Timeouts(idle_conn=0))
    spawner = FakeSpawner(nursery)
    router = Router(Config(models={"m": model}), spawner=spawner, probe=FakeProbe(spawner))
    async with UpstreamPool() as pool:
        router.observe(partial(_close_upstream_connections, router, pool))
        await nursery.start(router.run)
        with trio.fail_after(10):
            async with (
                router.acquire(router.lease("m")),
                pool.request("GET", server.url, "/", [], None, model.timeouts) as response,
            ):
                await response.read()
            assert len(pool._idle) == 1  # kept: idleConn = 0 never expires it
            await router.unload(["m"])
            await closed.wait()  # the server saw the client close it
        assert pool._idle == {}


async def test_an_origin_left_without_idle_connections_leaves_the_pool(
    nursery: trio.Nursery, clock: MockClock
) -> None:
    first, second = (
        await start_server(nursery, serve_forever),
        await start_server(nursery, serve_forever),
    )
    with trio.fail_after(10):
        async with UpstreamPool(idle_timeout=4.0) as pool:
            await get(pool, first.url, "/")
            clock.jump(4.1)
            await get(pool, second.url, "/")  # its checkin closes the expired one
            assert [origin.port for origin in pool._idle] == [int(second.url.rpartition(":")[2])]
