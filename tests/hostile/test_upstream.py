"""Hostile model servers (and clients) on the proxy's upstream side, on real sockets.

A model server or peer is trusted to run a model, not to speak HTTP correctly. These tests
are the ways one that does not could give a client another client's answer, or be reached
where it should not be.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import h11
import pytest
import trio
import trustme

from llamaswap.http.client import UpstreamPool
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import start_proxy, stop_proxy
from tests.e2e.test_proxy import config
from tests.e2e.test_upstream_pool import Peer, Script, get, start_server

TIMINGS = ["one write", "two writes", "later"]


def answer(body: bytes, *, chunked: bool) -> bytes:
    if chunked:
        size = b"%x" % len(body)
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%s\r\n%s\r\n0\r\n\r\n" % (
            size,
            body,
        )
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


@contextlib.contextmanager
def corked(stream: trio.abc.Stream) -> Iterator[None]:
    """What is sent in the block leaves in one TCP segment: the client reads it at once."""
    tcp = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    assert isinstance(tcp, trio.SocketStream)
    tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    try:
        yield
    finally:
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


@attrs.define
class TwiceAnswering:
    """A server that answers each request twice: its target, then ``stale <target>``.

    ``one write``: both answers in one write (over TLS, one record). ``two writes``: two
    writes (two TLS records) that arrive together. ``later``: the second once ``trigger``
    is set, after the client has read the first. ``sent`` is set once it has gone.
    """

    timing: str
    chunked: bool
    trigger: trio.Event = attrs.Factory(trio.Event)
    sent: trio.Event = attrs.Factory(trio.Event)

    async def __call__(self, peer: Peer, index: int) -> None:
        while (request := await peer.head()) is not None:
            while not isinstance(await peer._next(), h11.EndOfMessage):
                pass
            first = answer(request.target, chunked=self.chunked)
            extra = answer(b"stale " + request.target, chunked=self.chunked)
            if self.timing == "one write":
                await peer.stream.send_all(first + extra)
            elif self.timing == "two writes":
                with corked(peer.stream):
                    await peer.stream.send_all(first)
                    await peer.stream.send_all(extra)
            else:
                await peer.stream.send_all(first)
                await self.trigger.wait()
                await peer.stream.send_all(extra)
            self.sent.set()
            peer.h11 = h11.Connection(h11.SERVER)  # h11 would refuse to answer twice


@attrs.frozen
class Tls:
    """A CA, and the server's side of TLS with a certificate for ``localhost``."""

    ca: trustme.CA = attrs.Factory(trustme.CA)

    def wrap(self) -> Callable[[trio.SocketStream], trio.abc.Stream]:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("localhost").configure_cert(context)
        return lambda stream: trio.SSLStream(stream, context, server_side=True)

    def trusting(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


async def start(nursery: trio.Nursery, script: Script, scheme: str, tls: Tls) -> str:
    if scheme == "http":
        return (await start_server(nursery, script)).url
    server = await start_server(nursery, script, wrap=tls.wrap(), scheme=scheme, host="localhost")
    return server.url


async def readable(pool: UpstreamPool) -> None:
    """Until every idle connection's socket has something to read."""
    for idle in pool._idle.values():
        for connection in idle:
            await trio.lowlevel.wait_readable(connection._tcp.socket)


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("timing", TIMINGS)
async def test_a_second_answer_to_one_request_is_never_the_next_requests(
    nursery: trio.Nursery, scheme: str, chunked: bool, timing: str
) -> None:
    """The connection is closed rather than reused, so each request gets its own answer
    (over TLS, a record after the answer's last waits in the TLS layer's buffer, where
    no poll of the socket sees it)."""
    server = TwiceAnswering(timing, chunked)
    tls = Tls()
    url = await start(nursery, server, scheme, tls)
    with trio.fail_after(10):
        async with UpstreamPool(ssl_context=tls.trusting()) as pool:
            assert await get(pool, url, "/first") == b"/first"
            server.trigger.set()
            await server.sent.wait()
            if timing == "later":
                await readable(pool)
            assert await get(pool, url, "/second") == b"/second"


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("timing", TIMINGS)
async def test_two_clients_in_turn_each_get_their_own_answer(
    nursery: trio.Nursery, tmp_path: Path, scheme: str, chunked: bool, timing: str
) -> None:
    """Through the proxy, from a model server that answers every request twice."""
    server = TwiceAnswering(timing, chunked)
    tls = Tls()
    url = await start(nursery, server, scheme, tls)
    tls.ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    models = f'[models.m]\ncmd = "${{fake}}"\nproxy = "{url}"\ncheckEndpoint = "none"'
    env = {"SSL_CERT_FILE": str(tmp_path / "ca.pem")}  # the pool's default context trusts it
    proxy = await start_proxy(nursery, config(models), tmp_path, env=env)
    try:
        async with proxy.client() as client:
            with trio.fail_after(30):
                assert (await client.get("/upstream/m/first")).text == "/first"
                server.trigger.set()
                await server.sent.wait()
                assert (await client.get("/upstream/m/second")).text == "/second"
    finally:
        await stop_proxy(proxy)


async def raw_exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is on a new connection; what comes back until it closes."""
    host, _, port = url.removeprefix("http://").partition(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(request)
        received = b""
        while chunk := await stream.receive_some():
            received += chunk
    return received


def parse(answer: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The status, fields and body of the one response in ``answer``, read by h11."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[(b"host", b"x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(answer)
    client.receive_data(b"")
    head = client.next_event()
    assert isinstance(head, h11.Response), head
    body = b""
    while isinstance(event := client.next_event(), h11.Data):
        body += event.data
    assert isinstance(event, h11.EndOfMessage), event
    return head.status_code, list(head.headers), body


async def test_a_chunked_upload_too_large_while_its_model_loads_gets_the_json_413(
    proxy_factory: StartProxy,
) -> None:
    """The body is read ahead while the request waits for the load (``RequestBody.prefetch``
    in ``Router.acquire``'s wait): its BodyTooLarge came out of the wait's nursery as an
    ExceptionGroup, an empty 500 and a traceback. Then the connection closes (the rest of
    the body is not read as a next request)."""
    models = '[models.m]\ncmd = "${fake} --load-seconds 60"'
    proxy = await proxy_factory(config(models, maxBodyBytes=1000))
    head = (
        b"POST /upstream/m/upload HTTP/1.1\r\nHost: localhost\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunks = b"c8\r\n" + b"x" * 200 + b"\r\n"  # 200 bytes
    with trio.fail_after(30):
        answer = await raw_exchange(proxy.url, head + chunks * 10 + b"0\r\n\r\n")
    status, headers, body = parse(answer)
    assert status == 413
    assert (b"connection", b"close") in headers
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large"
    assert "1000 bytes" in error["message"]
    assert not [line for line in proxy.output.lines if "Traceback" in line]


@pytest.mark.parametrize("rename", [False, True], ids=["as sent", "useModelName"])
async def test_a_json_body_that_is_not_utf8_is_refused_and_valid_json_goes_as_written(
    nursery: trio.Nursery, proxy_factory: StartProxy, rename: bool
) -> None:
    """RFC 8259: JSON between systems is UTF-8. A byte that is not, in a field llamaswap
    does not read, went to the model server as it came; now it is a 400. Valid JSON,
    with what a document would change (1e400, a 5 000-digit integer, non-ASCII text),
    still goes byte for byte (renamed: only ``model`` changes)."""
    received: list[bytes] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            if request[0].target != b"/props":  # llamaswap reads it once after a load
                received.append(request[1])
            await peer.respond(b"{}")

    server = await start_server(nursery, script)
    rename_line = 'useModelName = "upstream"\n' if rename else ""
    models = (
        f'[models.m]\ncmd = "${{fake}}"\nproxy = "{server.url}"\ncheckEndpoint = "none"\n'
        + rename_line
    )
    proxy = await proxy_factory(config(models))
    valid = (
        b'{"model": "m", "temperature": 1e400, "seed": ' + b"7" * 5000 + b', "messages": '
        b'[{"role": "user", "content": "caf\xc3\xa9 \xe7\x8b\x90 \xf0\x9f\xa6\x8a"}]}'
    )
    invalid = valid.replace(b"caf\xc3\xa9", b"caf\xe9")  # Latin-1, not UTF-8
    json_type = {"content-type": "application/json"}
    async with proxy.client() as client:
        with trio.fail_after(30):
            refused = await client.post("/v1/chat/completions", content=invalid, headers=json_type)
            answered = await client.post("/v1/chat/completions", content=valid, headers=json_type)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_request"
    at = invalid.index(b"\xe9")
    assert error["message"] == (
        f"the request body is not valid UTF-8 (invalid continuation byte at byte {at}); "
        "JSON must be (RFC 8259): send it as UTF-8"
    )
    assert answered.status_code == 200
    expected = valid
    if rename:
        expected = b'{"model":"upstream","temperature":1e400,"seed":' + valid.split(b'"seed": ')[1]
        expected = expected.replace(b', "messages": ', b',"messages":')
    assert received == [expected]


async def test_dot_segments_after_the_model_are_refused_not_passed_on(
    nursery: trio.Nursery, proxy_factory: StartProxy
) -> None:
    """``/upstream/m/../../x`` reached the model server as ``/../../x``. Sent as raw
    bytes: h11 clients and httpx resolve dot segments before sending."""
    targets: list[bytes] = []

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            if request[0].target != b"/props":  # llamaswap reads it once after a load
                targets.append(request[0].target)
            await peer.respond(request[0].target)

    server = await start_server(nursery, script)
    proxy = await proxy_factory(
        config(f'[models.m]\ncmd = "${{fake}}"\nproxy = "{server.url}"\ncheckEndpoint = "none"')
    )

    async def get(target: str) -> tuple[int, bytes]:
        request = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        status, _, body = parse(await raw_exchange(proxy.url, request.encode()))
        return status, body

    refused = {
        "/upstream/m/../../x": "..",
        "/upstream/m/a/./b": ".",
        "/upstream/m/a/..": "..",
        "/upstream/m/%2e%2e/x": "..",
        "/upstream/m/.%2E/x": "..",
        "/upstream/m/%2E/x": ".",
        "/upstream/m/a%2F..%2Fx": "..",  # a server may decode %2F before resolving
    }
    passed = {
        "/upstream/m/.well-known/x": b"/.well-known/x",
        "/upstream/m/.../a..b": b"/.../a..b",
        "/upstream/m/%252e%252e/x": b"/%252e%252e/x",  # '%2e%2e' once decoded: a name
    }
    with trio.fail_after(30):
        for target, segment in refused.items():
            status, body = await get(target)
            assert status == 400, target
            error = json.loads(body)["error"]
            assert error["code"] == "invalid_request"
            assert error["message"] == (
                f"the path after '/upstream/m' has a {segment!r} segment (RFC 3986 dot "
                "segments, %2E included): llamaswap does not pass them to the model server; "
                "send the path with them resolved"
            )
        for target, forwarded in passed.items():
            assert await get(target) == (200, forwarded)
    assert targets == list(passed.values())


@pytest.mark.parametrize(
    "props",
    [
        b"[" * 100_000 + b"]" * 100_000,  # valid JSON, nested deeper than Python parses
        b'{"n_ctx": 8192, "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}',  # 2 MiB: not read
        b"\xff\xfe not json",
    ],
    ids=["too deep", "too large", "not json"],
)
async def test_a_props_answer_llamaswap_cannot_read_leaves_the_context_length_unknown(
    proxy_factory: StartProxy, nursery: trio.Nursery, props: bytes
) -> None:
    # After a load llamaswap asks the model's server for GET /props, for its own use.
    # Whatever it answers, the process goes on serving (a too-deep answer once stopped it).
    answered = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        while (request := await peer.request()) is not None:
            head, _ = request
            if head.target == b"/props":
                try:
                    await peer.respond(props)  # llamaswap may close before the end of it
                finally:
                    answered.set()
            else:
                await peer.respond(
                    json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
                )

    server = await start_server(nursery, script)
    text = f'[models.m]\ncmd = "${{fake}}"\nproxy = "{server.url}"\ncheckEndpoint = "none"\n'
    proxy = await proxy_factory(config(text))
    async with proxy.client() as client:
        with trio.fail_after(30):
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
            await answered.wait()
            # The next request is served after the /props read has ended either way.
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
            [entry] = (await client.get("/v1/models")).json()["data"]
    assert entry["context_length"] is None
    assert "Traceback" not in proxy.output.text()
