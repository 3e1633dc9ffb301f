"""Hostile clients on the wire: what a client that speaks HTTP badly, or on purpose wrongly,
can do to llamaswap's server. Each runs the real proxy (and the fake model server) on
127.0.0.1, with raw sockets, so that no client library tidies the bytes up first.

**None of them stops the process, reaches another request, or holds a request for ever.**
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import h2.config
import h2.connection
import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_proxy import chat, config

#: One model whose answers stream for long: 200 000 tokens, as fast as they go.
CHAT = """
[models.chat]
cmd = "${fake} --max-tokens 200000"
"""
MODEL = config(CHAT)


def address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    return host, int(port)


async def connect(url: str) -> trio.SocketStream:
    return await trio.open_tcp_stream(*address(url))


async def read_to_end(stream: trio.SocketStream) -> bytes:
    """Everything until the server closes (bounded by the caller's ``fail_after``)."""
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


async def exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is; what came back before the server closed."""
    with trio.fail_after(10):
        stream = await connect(url)
        async with stream:
            await stream.send_all(request)
            return await read_to_end(stream)


async def still_serves(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        assert (await client.get("/health")).status_code == 200


def head(url: str) -> str:
    return f"Host: {url.removeprefix('http://')}\r\n"


async def test_an_http2_burst_of_streams_is_refused_and_the_process_lives(
    proxy_factory: StartProxy,
) -> None:
    """hypercorn served HTTP/2 with prior knowledge: a few thousand HEADERS + RST_STREAM
    pairs on one connection raised in its h2 protocol, unwound ``serve()``, and the process
    exited with everything in flight. llamaswap speaks HTTP/1.1 only: the preface gets a
    400 saying so, and the connection closes."""
    proxy = await proxy_factory(MODEL)
    h2_client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    h2_client.initiate_connection()
    authority = proxy.url.removeprefix("http://")
    headers = [(":method", "GET"), (":path", "/health"), (":scheme", "http")]
    headers.append((":authority", authority))
    for stream_id in range(1, 2 * 3000, 2):
        h2_client.send_headers(stream_id, headers, end_stream=True)
        h2_client.reset_stream(stream_id)
    answer = await exchange(proxy.url, h2_client.data_to_send())
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"HTTP/1.1 only" in answer
    await still_serves(proxy.url)
    assert proxy.process.returncode is None


async def test_an_h2c_upgrade_is_ignored_and_answered_in_http1(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODEL)
    request = (
        "GET /health HTTP/1.1\r\n" + head(proxy.url) + "Connection: Upgrade, HTTP2-Settings\r\n"
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
    with trio.fail_after(10):
        stream = await connect(proxy.url)
        async with stream:
            await stream.send_all(request.encode())
            answer = b""
            while not answer.endswith(b"\r\n\r\nOK"):  # the whole answer, kept alive
                answer += await stream.receive_some(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer


async def test_content_length_with_transfer_encoding_is_refused_and_closed(
    proxy_factory: StartProxy,
) -> None:
    """RFC 9112 §6.1: such a request is a smuggling attempt (a front proxy that reads the
    Content-Length sees one request, llamaswap two). It is answered 400 and the connection
    closed, so the bytes after the chunked body never run as a request of their own."""
    proxy = await proxy_factory(MODEL)
    smuggled = b"GET /running HTTP/1.1\r\n" + head(proxy.url).encode() + b"\r\n"
    body = b"0\r\n\r\n" + smuggled
    for path in ("/v1/chat/completions", "/upstream/chat/v1/chat/completions", "/running"):
        request = (
            f"POST {path} HTTP/1.1\r\n" + head(proxy.url) + "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode() + body
        answer = await exchange(proxy.url, request)
        assert answer.startswith(b"HTTP/1.1 400 "), (path, answer)
        assert answer.count(b"HTTP/1.1 ") == 1, (path, answer)  # nothing smuggled through
        assert b"Content-Length and Transfer-Encoding" in answer


async def test_a_transfer_coding_other_than_chunked_is_a_400(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODEL)
    request = (
        "POST /v1/chat/completions HTTP/1.1\r\n" + head(proxy.url) + "Content-Type: "
        "application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    )
    answer = await exchange(proxy.url, request.encode())
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b'"code": "invalid_request"' in answer


async def test_a_chunk_larger_than_max_body_bytes_is_refused_at_its_size_line(
    proxy_factory: StartProxy,
) -> None:
    """A chunk announced larger than ``maxBodyBytes`` gets its 413 at once: the server does
    not wait for a body it would refuse."""
    proxy = await proxy_factory(config(CHAT, maxBodyBytes=4096))
    for path in ("/v1/chat/completions", "/upstream/chat/v1/chat/completions"):
        request = (
            f"POST {path} HTTP/1.1\r\n" + head(proxy.url) + "Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n100000\r\n{}"
        )
        answer = await exchange(proxy.url, request.encode())  # nothing more is sent
        assert answer.startswith(b"HTTP/1.1 413 "), (path, answer)
        assert b'"code": "request_too_large"' in answer


async def not_reading(url: str) -> trio.SocketStream:
    """A client that asks for a long stream and never reads it."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect(address(url))
    stream = trio.SocketStream(sock)
    body = httpx.Request("POST", "/", json=chat("chat", stream=True)).read()
    await stream.send_all(
        (
            "POST /v1/chat/completions HTTP/1.1\r\n" + head(url) + "Content-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    return stream


async def inflight_until(
    client: httpx.AsyncClient, condition: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Poll /api/inflight until ``condition`` holds of its entries (bounded by the
    caller's ``fail_after``): there is no event to wait on from outside the proxy."""
    while True:
        entries: list[dict[str, Any]] = (await client.get("/api/inflight")).json()["inflight"]
        if condition(entries):
            return entries
        await trio.sleep(0.02)


async def test_an_operators_cancel_ends_a_request_whose_client_does_not_read(
    proxy_factory: StartProxy,
) -> None:
    """The request's writes wait for a client that does not read. They were shielded from
    cancellation: the cancel answered 200, the request stayed ``serving``, and under
    ``serial`` every other request waited for ever. Its own cancel reaches its writes."""
    proxy = await proxy_factory(config(CHAT + '[routing.scheduler]\nuse = "serial"\n'))
    async with proxy.client() as client:
        with trio.fail_after(20):
            stream = await not_reading(proxy.url)
            async with stream:
                entries = await inflight_until(
                    client, lambda e: bool(e) and e[0]["state"] == "serving"
                )
                cancel = await client.post(f"/api/inflight/{entries[0]['id']}/cancel")
                assert cancel.status_code == 200
                await inflight_until(client, lambda entries: not entries)
                # The slot is free: another request is served.
                answer = await client.post("/v1/chat/completions", json=chat("chat", max_tokens=2))
                assert answer.status_code == 200


async def test_a_client_that_reads_nothing_for_client_write_timeout_is_cut_off(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(CHAT, clientWriteTimeout=1))
    async with proxy.client() as client:
        with trio.fail_after(20):
            stream = await not_reading(proxy.url)
            async with stream:
                await inflight_until(client, bool)
                await inflight_until(client, lambda entries: not entries)  # a second later
                assert "read nothing for 1 s (clientWriteTimeout)" in proxy.output.text()
                activity = (await client.get("/api/activity")).json()["activity"]
                assert activity[0]["model"] == "chat"


async def test_an_unload_ends_a_request_whose_client_does_not_read(
    proxy_factory: StartProxy,
) -> None:
    """An unload cancels the requests its model serves; with their writes shielded, one
    whose client did not read stayed in flight after its model stopped: a ghost that
    held later swaps. It leaves at once, and the model loads again for the next."""
    proxy = await proxy_factory(MODEL)
    async with proxy.client() as client:
        with trio.fail_after(20):
            stream = await not_reading(proxy.url)
            async with stream:
                await inflight_until(client, lambda e: bool(e) and e[0]["state"] == "serving")
                unloaded = await client.post("/api/models/unload")
                assert unloaded.json() == {"unloaded": ["chat"]}
                await inflight_until(client, lambda entries: not entries)
                answer = await client.post("/v1/chat/completions", json=chat("chat", max_tokens=2))
                assert answer.status_code == 200
