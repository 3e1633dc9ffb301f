"""How long a client may take to send its request, end to end (docs/api.md, "Slow clients").

The real bounds (75 s for a request head, 60 s between pieces of a body) are too long for a
test, so these proxies start with both set to two seconds, as ``llamaswap.config.model``
constants patched before the server is imported. The same short bounds then show that
nothing else is cut: a body that trickles in for longer than the bound, a request that waits
in silence for a load, and an answer that streams for longer than the bound. Timing
assertions are lower bounds only, which a loaded machine can only make larger.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys

import h11
import pytest
import trio

from tests.e2e.conftest import BOUND, StartProxy
from tests.e2e.harness import ProxyProcess
from tests.e2e.test_proxy import chat, config
from tests.e2e.test_upstream_pool import Peer, start_server

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


async def connect(proxy: ProxyProcess) -> trio.SocketStream:
    host, _, port = proxy.url.removeprefix("http://").partition(":")
    return await trio.open_tcp_stream(host, int(port))


async def read_to_end(stream: trio.SocketStream) -> bytes:
    received = b""
    while chunk := await stream.receive_some():
        received += chunk
    return received


def head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def test_a_request_head_that_stops_arriving_is_cut_off(
    short_bounds_proxy: StartProxy,
) -> None:
    proxy = await short_bounds_proxy(config('[models.m]\ncmd = "${fake}"'))
    async with await connect(proxy) as stream:
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nCont")
        sent = trio.current_time()
        with trio.fail_after(10 * BOUND):
            assert await read_to_end(stream) == b""  # closed without a word
        assert trio.current_time() - sent > BOUND / 2  # by the timer, not by a parse error
    assert "Traceback" not in proxy.output.text()


async def test_a_request_body_that_stops_arriving_is_answered_408(
    short_bounds_proxy: StartProxy,
) -> None:
    proxy = await short_bounds_proxy(config('[models.m]\ncmd = "${fake}"'))
    async with await connect(proxy) as stream:
        await stream.send_all(head("/v1/chat/completions", 1000) + b'{"model": "m", ')
        with trio.fail_after(10 * BOUND):
            answer = await read_to_end(stream)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408 "), answer
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert error["message"] == (
        "the request body stopped arriving: nothing for 2 s; send the whole body promptly"
    )
    assert "Traceback" not in proxy.output.text()
    assert "loading model" not in proxy.output.text()


async def test_a_body_that_keeps_arriving_slowly_is_not_cut(
    short_bounds_proxy: StartProxy,
) -> None:
    proxy = await short_bounds_proxy(config('[models.m]\ncmd = "${fake}"'))
    body = json.dumps(chat("m", max_tokens=3)).encode()
    size = len(body) // 5 + 1
    pieces = [body[start : start + size] for start in range(0, len(body), size)]
    async with await connect(proxy) as stream:
        with trio.fail_after(60):
            await stream.send_all(head("/v1/chat/completions", len(body)))
            start = trio.current_time()
            for piece in pieces:  # each gap well under BOUND, the whole body longer
                await trio.sleep(BOUND / 4)
                await stream.send_all(piece)
            sending = trio.current_time() - start
            answer = await read_to_end(stream)
    assert sending > BOUND
    assert answer.startswith(b"HTTP/1.1 200 "), answer


async def test_waiting_and_streaming_for_longer_than_the_bounds_is_not_cut(
    short_bounds_proxy: StartProxy,
) -> None:
    proxy = await short_bounds_proxy(
        config('[models.slow]\ncmd = "${fake} --load-seconds 3 --tokens-per-second 10"')
    )
    body = json.dumps(chat("slow", stream=True, max_tokens=30)).encode()
    arrivals: list[float] = []
    async with await connect(proxy) as stream:
        with trio.fail_after(60):
            start = trio.current_time()
            await stream.send_all(head("/v1/chat/completions", len(body)) + body)
            answer = b""
            while chunk := await stream.receive_some():  # the client says nothing meanwhile
                answer += chunk
                arrivals.append(trio.current_time() - start)
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert answer.count(b"data: {") >= 30
    assert b"data: [DONE]" in answer
    assert arrivals[0] > BOUND  # the client was silent through the 3 s load...
    assert arrivals[-1] > 2 * BOUND  # ...and the 3 s stream: all of it arrived


async def test_a_body_still_arriving_at_shutdown_is_answered_503(
    proxy_factory: StartProxy,
) -> None:
    """SIGTERM while a client is still sending its body: the client is told, as a JSON 503,
    that llamaswap is shutting down (not given a bare 500 when the server's last cancel
    reaches the request)."""
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))
    client = h11.Connection(h11.CLIENT)
    fields = [
        ("Host", "localhost"),
        ("Content-Type", "application/json"),
        ("Content-Length", "1000"),
    ]
    request = h11.Request(
        method="POST", target="/v1/chat/completions", headers=[*fields, ("Expect", "100-continue")]
    )
    async with await connect(proxy) as stream:

        async def next_event() -> object:
            while (event := client.next_event()) is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            return event

        with trio.fail_after(30):
            await stream.send_all(client.send(request) or b"")
            interim = await next_event()  # the request is being served
            assert isinstance(interim, h11.InformationalResponse), interim
            await stream.send_all(client.send(h11.Data(data=b'{"model": "m", ')) or b"")
            proxy.process.send_signal(signal.SIGTERM)
            response = await next_event()
            body = b""
            while isinstance(event := await next_event(), h11.Data):
                body += event.data
            assert isinstance(event, h11.EndOfMessage), event
            assert await proxy.process.wait() == 0
    assert isinstance(response, h11.Response), response
    assert response.status_code == 503
    assert json.loads(body)["error"]["code"] == "shutting_down"
    assert "Traceback" not in proxy.output.text()


async def test_a_client_that_does_not_read_does_not_hold_the_shutdown(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """A 32 MB answer to a client that never reads: SIGTERM ends llamaswap while that
    client is still connected. hypercorn shields every write from cancellation, and the
    stuck write held the process (and its guard) until the client left."""

    asked = trio.Event()

    async def big_answer(peer: Peer, index: int) -> None:
        while await peer.request() is not None:
            asked.set()
            size = 32 << 20
            await peer.send(
                h11.Response(status_code=200, headers=[(b"content-length", b"%d" % size)])
            )
            for _ in range(size >> 20):
                await peer.send(h11.Data(data=b"x" * (1 << 20)))
            await peer.send(h11.EndOfMessage())

    upstream = await start_server(nursery, big_answer)
    proxy = await proxy_factory(
        config(
            f"[models.m]\ncmd = {json.dumps(SLEEPER)}\nproxy = {json.dumps(upstream.url)}\n"
            'checkEndpoint = "none"',
            unloadTimeout=1,
        )
    )
    body = json.dumps(chat("m")).encode()
    client = trio.socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)

    async def hang_guard() -> None:
        # Cancelling cannot end a shielded write; the client leaving does.
        await trio.sleep(30)
        client.close()

    with client:
        host, _, port = proxy.url.removeprefix("http://").partition(":")
        await client.connect((host, int(port)))
        await client.send(head("/v1/chat/completions", len(body)) + body)
        async with trio.open_nursery() as guarded:
            guarded.start_soon(hang_guard)
            await asked.wait()
            proxy.process.send_signal(signal.SIGTERM)
            assert await proxy.process.wait() == 0
            guarded.cancel_scope.cancel()
        assert client.fileno() != -1, "llamaswap ended only when its client left"


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (  # a head that never ends: refused however the server's reads split it
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"x" * 200_000,
            431,
            "request_head_too_large",
        ),
        (
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nBad Header: x\r\n\r\n",
            400,
            "invalid_request",
        ),
    ],
    ids=["head-too-large", "not-http"],
)
async def test_a_request_h11_cannot_read_is_refused_with_a_json_error(
    proxy_factory: StartProxy, request_bytes: bytes, status: int, code: str
) -> None:
    proxy = await proxy_factory(config('[models.m]\ncmd = "${fake}"'))

    async def send(stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError):  # refused before it all went
            await stream.send_all(request_bytes)

    answer = b""
    with trio.fail_after(30):
        async with await connect(proxy) as stream, trio.open_nursery() as nursery:
            nursery.start_soon(send, stream)
            with contextlib.suppress(trio.BrokenResourceError):
                # The server closes after its answer; with bytes of ours still unread,
                # the close is a reset, which comes after the answer.
                while chunk := await stream.receive_some():
                    answer += chunk
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "localhost")]))
    client.send(h11.EndOfMessage())
    client.receive_data(answer)
    response = client.next_event()
    assert isinstance(response, h11.Response), answer
    assert response.status_code == status
    data = client.next_event()
    assert isinstance(data, h11.Data), answer
    assert isinstance(client.next_event(), h11.EndOfMessage)
    assert json.loads(data.data)["error"]["code"] == code
    assert "Traceback" not in proxy.output.text()
