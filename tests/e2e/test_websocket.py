"""WebSocket passthrough end to end (issue 31 §3): a real proxy and a real fake model
server, whose ``/ws`` echoes; the client is wsproto on a Trio socket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import running
from tests.e2e.test_proxy import config

MODELS = config('[models.ui]\ncmd = "${fake}"\n[models.comfyui_auto]\ncmd = "${fake}"\n')


@attrs.define
class Client:
    stream: trio.SocketStream
    ws: wsproto.WSConnection
    accepted: AcceptConnection | None = None
    refused: tuple[int, bytes] | None = None

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(data or None)


@asynccontextmanager
async def connect(
    url: str,
    path: str,
    headers: Sequence[tuple[bytes, bytes]] = (),
    protocols: Sequence[str] = (),
) -> AsyncIterator[Client]:
    """A WebSocket handshake with llamaswap at ``path``: accepted, or refused (its status
    and body in ``refused``)."""
    host, _, port = url.removeprefix("http://").partition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        client = Client(stream, wsproto.WSConnection(wsproto.ConnectionType.CLIENT))
        await client.send(
            Request(host=f"{host}:{port}", target=path, extra_headers=list(headers),
                    subprotocols=list(protocols))
        )  # fmt: skip
        first = await client.next()
        if isinstance(first, AcceptConnection):
            client.accepted = first
        else:
            assert isinstance(first, RejectConnection), first
            body = bytearray()
            while first.has_body:
                part = await client.next()
                assert isinstance(part, RejectData)
                body += part.data
                if part.body_finished:
                    break
            client.refused = (first.status_code, bytes(body))
        yield client


async def test_a_websocket_is_relayed_once_its_model_is_loaded_for_it(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as http:
        assert "ui" not in await running(http)
        with trio.fail_after(20):
            async with connect(proxy.url, "/upstream/ui/ws", protocols=["chat", "x"]) as ws:
                assert ws.accepted is not None
                assert ws.accepted.subprotocol == "chat"  # the server's choice
                inflight = (await http.get("/api/inflight")).json()["inflight"]
                assert [entry["route"] for entry in inflight] == ["WebSocket /upstream/ui/ws"]
                await ws.send(TextMessage("hello"))
                assert (await ws.next()) == TextMessage("hello")
                await ws.send(BytesMessage(b"\x00\x01" * 40_000))  # several frames' worth
                echoed = bytearray()
                while True:
                    event = await ws.next()
                    assert isinstance(event, BytesMessage)
                    echoed += event.data
                    if event.message_finished:
                        break
                assert echoed == b"\x00\x01" * 40_000
                await ws.send(CloseConnection(code=1000))
                assert isinstance(await ws.next(), CloseConnection)
            while (await http.get("/api/inflight")).json()["inflight"]:  # noqa: ASYNC110
                await trio.sleep(0.02)  # the lease goes as the relay ends
        assert (await running(http))["ui"]["state"] == "ready"


async def test_the_servers_close_and_an_unload_reach_the_client(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as http:
        with trio.fail_after(20):
            async with connect(proxy.url, "/upstream/ui/ws") as ws:
                await ws.send(TextMessage("close"))  # the fake server closes with 4000
                closed = await ws.next()
                assert isinstance(closed, CloseConnection)
                assert closed.code == 4000
            async with connect(proxy.url, "/upstream/ui/ws") as ws:
                assert (await http.post("/api/models/unload/ui")).status_code == 200
                closed = await ws.next()
                assert isinstance(closed, CloseConnection)
                assert closed.code == 1001  # going away
    assert "Traceback" not in proxy.output.text()


async def test_a_websocket_is_refused_cross_site_and_where_it_may_not_load(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    evil = [(b"origin", b"http://evil.example")]
    with trio.fail_after(20):
        async with connect(proxy.url, "/upstream/ui/ws", headers=evil) as ws:
            assert ws.refused is not None
            assert ws.refused[0] == 403
            assert b"cross_site_request" in ws.refused[1]
        async with connect(proxy.url, "/comfyui/ws") as ws:  # only /comfyui/ loads it
            assert ws.refused is not None
            assert ws.refused[0] == 503
            assert b"model_not_loaded" in ws.refused[1]
        async with connect(proxy.url, "/v1/chat/completions") as ws:
            assert ws.refused is not None
            assert ws.refused[0] == 400
        own = [(b"origin", proxy.url.encode())]
        async with connect(proxy.url, "/upstream/ui/ws", headers=own) as ws:
            assert ws.accepted is not None  # llamaswap's own page
    async with proxy.client() as http:
        assert "comfyui_auto" not in await running(http)
