"""Connections that carry management routes end when HTTP says they end (docs/api.md).

The management routes are a Quart-Trio app, unlike the proxied routes (a plain ASGI
handler), and quart-trio's way of stopping a request meets hypercorn's way of ending a
connection in three places that these tests pin down, over raw sockets so that nothing
between the test and the server reuses, closes or re-frames a connection:

* a response after which the connection must close (HTTP/1.0, ``Connection: close``, a
  body the route did not wait for) is followed by the close, and a keep-alive connection
  left idle after one is closed by the keep-alive timeout;
* a client that closes a kept-alive connection between requests has it closed at once,
  not held (in CLOSE-WAIT) until the keep-alive timeout (hypercorn's connection handler
  waited for its idle timer; tested in-process, a proxied route's connection too);
* a client that asks for ``100 Continue`` and then leaves is no error of llamaswap's;
* ``HEAD`` of a streamed route ends after the headers, so the connection serves the next
  request;
* at shutdown, a connection waiting for its next request is closed at once.

Every wait is bounded (``trio.fail_after``); the keep-alive test runs a proxy whose timeout
is ``BOUND`` (as in ``test_client_timeouts.py``) and asserts only a lower bound on it.
"""

from __future__ import annotations

import signal
from functools import partial

import h11
import pytest
import trio
import trio.testing

from llamaswap._serve import serve
from tests.e2e.conftest import BOUND, StartProxy
from tests.e2e.harness import ProxyProcess
from tests.e2e.test_client_timeouts import connect, read_to_end
from tests.e2e.test_live import one_model
from tests.e2e.test_proxy import chat, config

ONE_MODEL = config('[models.m]\ncmd = "${fake}"')
#: How long a connection that must close may take to close: far less than the 75 s
#: keep-alive timeout, which would otherwise close it in the end.
PROMPTLY = 10.0


async def read_head(stream: trio.SocketStream, received: bytes = b"") -> tuple[bytes, bytes]:
    """A response's head (status line and headers), and whatever arrived after it."""
    while b"\r\n\r\n" not in received:
        chunk = await stream.receive_some()
        assert chunk, f"the connection closed before a whole response head: {received!r}"
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


async def read_health(stream: trio.SocketStream, received: bytes = b"") -> bytes:
    """A ``GET /health`` answer on a kept-alive connection (its body is ``OK``)."""
    head, rest = await read_head(stream, received)
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"content-length: 2" in head.lower(), head
    while len(rest) < 2:
        rest += await stream.receive_some()
    assert rest[:2] == b"OK", rest
    return rest[2:]


def headers(head: bytes) -> dict[str, str]:
    """A response head's headers (lowercase names) without the ever-changing ``date``."""
    lines = head.decode("latin-1").split("\r\n")[1:]
    fields = dict(line.split(": ", 1) for line in lines)
    return {name.lower(): value for name, value in fields.items() if name.lower() != "date"}


async def all_output(proxy: ProxyProcess) -> str:
    """What ``proxy`` printed, to the end: it is stopped, and its output read to EOF."""
    assert await proxy.terminate() == 0
    with trio.fail_after(PROMPTLY), pytest.raises(AssertionError, match="output ended"):
        await proxy.output.wait_for(r"(?!)")  # matches nothing: returns at the end
    return proxy.output.text()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"GET /health HTTP/1.0\r\n\r\n", b"200", id="http-1.0"),
        pytest.param(
            b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            b"200",
            id="connection-close",
        ),
        pytest.param(
            b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            b"200",
            id="connection-close-models",
        ),
        pytest.param(
            b"POST /nope HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n123456789",
            b"404",
            id="body-not-waited-for",
        ),
    ],
)
async def test_a_management_answer_that_ends_the_connection_closes_it(
    proxy_factory: StartProxy, request_bytes: bytes, status: bytes
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    async with await connect(proxy) as stream:
        await stream.send_all(request_bytes)
        with trio.fail_after(PROMPTLY):
            answer = await read_to_end(stream)  # to the server's close
    assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer
    assert "Traceback" not in proxy.output.text()


async def test_a_kept_alive_connection_idle_after_management_answers_is_closed(
    short_bounds_proxy: StartProxy,
) -> None:
    proxy = await short_bounds_proxy(ONE_MODEL)
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    async with await connect(proxy) as stream:
        with trio.fail_after(10 * BOUND):
            await stream.send_all(request)
            rest = await read_health(stream)
            await stream.send_all(request)  # the connection is kept alive...
            rest = await read_health(stream, rest)
            idle_from = trio.current_time()
            rest += await read_to_end(stream)  # ...until it has been idle for BOUND
        assert trio.current_time() - idle_from > BOUND / 2
    assert rest == b""
    assert "Traceback" not in proxy.output.text()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n", 200, id="management"),
        pytest.param(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 17\r\n\r\n"
            b'{"model": "nope"}',
            404,
            id="proxied",
        ),
    ],
)
async def test_a_kept_alive_connection_its_client_closes_is_closed_at_once(
    nursery: trio.Nursery, request_bytes: bytes, status: int
) -> None:
    # In-process, to know when the server has finished its answer and waits for the next
    # request (every task blocked): a client closing before that raced hypercorn's own
    # bookkeeping, which then closed the connection at once anyway.
    (url,) = await nursery.start(partial(serve, one_model(), listen=["127.0.0.1:0"]))
    host, _, port = url.removeprefix("http://").partition(":")
    client = h11.Connection(h11.CLIENT)
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        with trio.fail_after(PROMPTLY):  # far less than the 75 s keep-alive timeout
            await stream.send_all(request_bytes)
            events = []
            while not isinstance(event := client.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    client.receive_data(await stream.receive_some())
                else:
                    events.append(event)
            await trio.testing.wait_all_tasks_blocked()  # the connection is idle
            # The client closes its side: the connection is over, and the server closes
            # its own side at once, rather than hold it until its keep-alive timeout (each
            # such connection held a file descriptor for 75 s).
            await stream.send_eof()
            assert await read_to_end(stream) == b""
    assert isinstance(events[0], h11.Response)
    assert events[0].status_code == status, events


#: Routes that answer without reading the body, so the answer races the client's leaving.
EXPECTING = [
    b"GET /health",
    b"GET /api/version",
    b"GET /nope",
    b"POST /api/models/load/m",
]


async def test_a_client_that_leaves_after_expect_100_continue_logs_no_error(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    for _ in range(25):
        for request_line in EXPECTING:
            async with await connect(proxy) as stream:
                await stream.send_all(
                    request_line + b" HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n"
                    b"Content-Length: 5\r\n\r\n"
                )
                await stream.send_eof()  # gone before the body: the server reads EOF
                with trio.fail_after(PROMPTLY):
                    await read_to_end(stream)  # whatever it answered, then its close
    output = await all_output(proxy)
    assert "Traceback" not in output
    assert "Error in ASGI Framework" not in output


@pytest.mark.parametrize("path", ["/api/events", "/logs/stream", "/logs/stream/m", "/health"])
async def test_head_of_a_management_route_ends_after_the_headers(
    proxy_factory: StartProxy, path: str
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    target = path.encode()
    async with await connect(proxy) as stream:
        with trio.fail_after(PROMPTLY):
            await stream.send_all(b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
            get_head, _ = await read_head(stream)  # a stream's body never ends: not read
    async with await connect(proxy) as stream:
        with trio.fail_after(PROMPTLY):
            await stream.send_all(b"HEAD " + target + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
            head, rest = await read_head(stream)
            # The same connection serves the next request: the HEAD answer has ended.
            await stream.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            rest = await read_health(stream, rest)  # no body bytes came before it
        assert rest == b""
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert headers(head) == headers(get_head)
    assert "Traceback" not in proxy.output.text()


async def test_at_shutdown_an_idle_kept_alive_connection_closes_at_once(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """SIGTERM stops accepting, and a connection waiting for its next request is closed
    then, not at the end of the shutdown, which here waits for a request still streaming
    on another connection (``unloadTimeout``, 20 s)."""
    proxy = await proxy_factory(
        config('[models.slow]\ncmd = "${fake} --tokens-per-second 10"', unloadTimeout=20)
    )
    streaming = trio.Event()

    async def stream_for_a_minute() -> None:
        async with proxy.client() as client:
            body = chat("slow", stream=True, max_tokens=600)
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                async for _ in stream.aiter_raw():
                    streaming.set()

    with trio.fail_after(30):
        nursery.start_soon(stream_for_a_minute)
        await streaming.wait()
    async with await connect(proxy) as idle:
        with trio.fail_after(PROMPTLY):
            await idle.send_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            rest = await read_health(idle)
            proxy.process.send_signal(signal.SIGTERM)
            rest += await read_to_end(idle)
        assert proxy.process.returncode is None  # still shutting down: the stream goes on
    assert rest == b""
