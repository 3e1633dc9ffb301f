"""Readiness probes (process/health.py) go the way requests go: through the UpstreamPool.

Against scripted servers on real sockets, then the real proxy with ``HTTP_PROXY`` set in
its environment, which requests to models ignore and so, now, do probes.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import h11
import pytest
import trio

from llamaswap.process import HttpProbe
from llamaswap.process.health import MAX_PROBE_BODY
from llamaswap.proxy import UpstreamPool
from tests.e2e.harness import FAKE, free_port_base, start_proxy, stop_proxy
from tests.e2e.test_upstream_pool import Peer, start_server


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    async with UpstreamPool() as pool:
        yield pool


async def test_ready_is_a_200_on_a_kept_alive_connection(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    targets: list[bytes] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            targets.append(request[0].target)
            status = 200 if len(targets) > 1 else 503
            headers = [(b"content-length", b"2")]
            await peer.send(h11.Response(status_code=status, headers=headers))
            await peer.send(h11.Data(data=b"{}"), h11.EndOfMessage())

    server = await start_server(nursery, script)
    probe = HttpProbe(pool)
    with trio.fail_after(10):
        assert not await probe(server.url + "/health?full=1")  # 503: still loading
        assert await probe(server.url + "/health?full=1")
    assert targets == [b"/health?full=1"] * 2
    assert server.connections == 1


@pytest.mark.parametrize("framing", ["until close", "chunked"])
async def test_a_200_whose_body_never_ends_is_ready_and_read_no_further(
    nursery: trio.Nursery, pool: UpstreamPool, framing: str
) -> None:
    """A check endpoint that streams (an event stream, a file): 200 is ready. The probe
    read the whole body until its timeout, 1.7 GB in QA, and then said not ready."""
    sent = 0

    async def script(peer: Peer, index: int) -> None:
        nonlocal sent
        assert await peer.request() is not None
        head = b"HTTP/1.1 200 OK\r\n"
        head += b"Transfer-Encoding: chunked\r\n\r\n" if framing == "chunked" else b"\r\n"
        piece = b"0" * 65536
        chunk = b"10000\r\n" + piece + b"\r\n" if framing == "chunked" else piece
        with contextlib.suppress(trio.BrokenResourceError):
            await peer.stream.send_all(head)
            while True:
                await peer.stream.send_all(chunk)
                sent += len(piece)

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        assert await HttpProbe(pool, timeout=5.0)(server.url + "/health")
    assert sent < 64 * MAX_PROBE_BODY  # what the socket buffers held, not gigabytes


async def test_nobody_listening_is_not_ready(pool: UpstreamPool) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with trio.fail_after(10):
        assert not await HttpProbe(pool)(f"http://127.0.0.1:{port}/health")


async def test_no_answer_within_the_timeout_is_not_ready(
    nursery: trio.Nursery, pool: UpstreamPool
) -> None:
    gave_up = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        assert await peer.request() is not None
        assert await peer.stream.receive_some() == b""  # no answer, until the probe leaves
        gave_up.set()

    server = await start_server(nursery, script)
    with trio.fail_after(10):
        started = trio.current_time()
        assert not await HttpProbe(pool, timeout=0.5)(server.url + "/health")
        assert trio.current_time() - started >= 0.5
        await gave_up.wait()


async def test_a_model_gets_ready_with_http_proxy_set_in_the_environment(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """HTTP_PROXY names a port nobody listens on and NO_PROXY is unset: a client that
    honours them would find no model ever ready (and the chat request would get 502)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{unused.getsockname()[1]}"
    config = "\n".join(
        [
            f"startPort = {free_port_base()}",
            "healthCheckTimeout = 15",
            "[macros]",
            f"fake = {json.dumps(FAKE)}",
            "[models.alpha]",
            'cmd = "${fake}"',
        ]
    )
    environment = {"HTTP_PROXY": closed, "HTTPS_PROXY": closed, "ALL_PROXY": closed}
    environment |= {key.lower(): value for key, value in environment.items()}
    environment |= {"NO_PROXY": "", "no_proxy": ""}
    proxy = await start_proxy(nursery, config, tmp_path, env=environment)
    try:
        async with proxy.client() as client:
            with trio.fail_after(30):
                body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
                response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "alpha"
    finally:
        await stop_proxy(proxy)
