"""A model's or peer's ``timeouts`` in the forwarding client, against scripted servers."""

from __future__ import annotations

import socket

import pytest
import trio
from trio.testing import MockClock

from llamaswap.config.model import Timeouts
from llamaswap.http.client import UpstreamFailed, UpstreamPool
from tests.e2e.test_upstream_pool import Peer, serve_forever, start_server


@pytest.fixture
def clock() -> MockClock:
    return MockClock(rate=1.0)  # real time passes (the hang guard works), and tests can jump


async def get(pool: UpstreamPool, url: str, timeouts: Timeouts) -> bytes:
    async with pool.request("GET", url, "/", [], None, timeouts) as response:
        return await response.read()


async def test_idle_conn_is_the_requests_own(nursery: trio.Nursery, clock: MockClock) -> None:
    server = await start_server(nursery, serve_forever)
    async with UpstreamPool(idle_timeout=4.0) as pool:

        async def request(timeouts: Timeouts) -> None:
            with trio.fail_after(10):  # each on its own: the clock jumps further in between
                await get(pool, server.url, timeouts)

        await request(Timeouts(idle_conn=30))
        clock.jump(20)  # past the pool's own 4 s, within the request's 30 s
        await request(Timeouts(idle_conn=30))
        assert server.connections == 1
        clock.jump(31)
        await request(Timeouts(idle_conn=0))  # 0: kept until the server closes it
        assert server.connections == 2
        clock.jump(100_000)
        await request(Timeouts())
        assert server.connections == 2


async def test_no_response_head_in_time_fails_once_without_a_retry(
    nursery: trio.Nursery,
) -> None:
    async def script(peer: Peer, index: int) -> None:
        if index == 0:
            request = await peer.request()
            assert request is not None
            await peer.respond(b"first")  # the connection is then reused
        await trio.sleep_forever()  # then nothing: no answer

    server = await start_server(nursery, script)
    limits = Timeouts(response_header=0.2)
    with trio.fail_after(10):
        async with UpstreamPool() as pool:
            assert await get(pool, server.url, limits) == b"first"
            started = trio.current_time()
            with pytest.raises(UpstreamFailed, match=r"no response within 0\.2 s") as info:
                await get(pool, server.url, limits)
            assert info.value.timed_out
            assert 0.2 <= trio.current_time() - started < 2
            assert server.connections == 1  # a GET on a reused connection: still not resent


async def test_tls_handshake_timeout(nursery: trio.Nursery) -> None:
    async def silent(peer: Peer, index: int) -> None:
        await trio.sleep_forever()  # accepts TCP, never answers the TLS hello

    server = await start_server(nursery, silent, scheme="https")
    with trio.fail_after(10):
        async with UpstreamPool() as pool:
            with pytest.raises(UpstreamFailed, match=r"no TLS handshake with .* within 0\.2 s"):
                await get(pool, server.url, Timeouts(tls_handshake=0.2))


async def test_keepalive_turns_on_tcp_keepalive(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, serve_forever)
    with trio.fail_after(10):
        for keepalive, expected in ((0, 0), (30, 1)):
            async with (
                UpstreamPool() as pool,
                pool.request(
                    "GET", server.url, "/", [], None, Timeouts(keepalive=keepalive)
                ) as response,
            ):
                sock = response._connection._tcp.socket
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == expected
                if expected:
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 30
                await response.read()
