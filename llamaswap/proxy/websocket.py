"""WebSocket passthrough on ``/upstream/{model}/{path}`` and ``/comfyui/{path}``.

ComfyUI and realtime audio UIs talk to their server over a WebSocket. **The connection is
the request**: it is admitted and queued by the scheduler as an HTTP request is (its
priority header, its lease; ``upstream.ignorePaths`` and ``?autoload=false`` as for
HTTP), its model is loaded for it, and only then is a WebSocket opened to the model server
on the same path and query; the client's handshake is accepted with the subprotocol the
server chose, and every message is relayed both ways. **The lease is held for the
connection's whole life** (the model is not swapped away under an open socket; under
``serial`` the connection holds a slot), and **closing either side ends both**, as do an
unload, a cancel and the shutdown, which cancel the lease's scope.

The client side is hypercorn's ASGI WebSocket; the server side is wsproto (hypercorn's own
WebSocket engine) on a Trio stream, one writer at a time.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import attrs
import trio
import wsproto
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, WebsocketScope
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from llamaswap.errors import BadRequest, RequestError, Unauthorized, UpstreamError
from llamaswap.http.auth import authorized, credentials
from llamaswap.http.errors import error_answer
from llamaswap.router import Router
from llamaswap.router.names import Peer
from llamaswap.schedulers import parse_priority
from llamaswap.schedulers.priority import HEADER as PRIORITY_HEADER

from . import routes, site
from .forward import check_autoload
from .operations import client_address

__all__ = ["WebSocketRelay"]

logger = logging.getLogger("llamaswap.proxy")

#: The client's handshake fields that go on to the model server besides the WebSocket
#: ones (which the handshake makes anew).
_FORWARDED = frozenset({b"cookie", b"user-agent", b"origin", b"authorization"})
#: Seconds the model server has to connect and answer the upgrade.
HANDSHAKE_TIMEOUT = 10.0
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, LocalProtocolError,
           RemoteProtocolError)  # fmt: skip


class WebSocketRelay:
    """The ASGI handler of every WebSocket scope."""

    def __init__(self, router: Router, listen_hosts: tuple[str, ...]) -> None:
        self._router = router
        self._listen_hosts = listen_hosts

    async def __call__(
        self, scope: WebsocketScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if (await receive())["type"] != "websocket.connect":
            return  # the client left first
        link = _Link(receive, send)
        try:
            await self._serve(scope, link)
        except RequestError as error:
            logger.info("WebSocket %s: %s", scope["path"], error)
            if not link.accepted:  # else the relay has closed the client's side already
                await _refuse(scope, send, error)

    async def _serve(self, scope: WebsocketScope, link: _Link) -> None:
        config = self._router.config
        refused = site.websocket_refusal(scope, config, self._listen_hosts)
        if refused is not None:
            raise refused
        if not authorized(config.api_keys, credentials(scope["headers"])):
            raise Unauthorized()
        route = routes.passthrough(scope["path"])
        if route is None:
            raise BadRequest(
                "WebSockets are relayed on /upstream/{model}/{path} and /comfyui/{path} only"
            )
        _, target, path = routes.upstream_target(scope, self._router.names, comfyui=route.comfyui)
        if isinstance(target, Peer):
            raise BadRequest("a WebSocket is relayed to a local model only, not to a peer's")
        path = path or "/"
        fields = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = scope["query_string"]
        check_autoload(self._router, target.model_id, fields, query, route, path)
        lease = self._router.lease(
            target.model_id,
            priority=parse_priority([fields.get(PRIORITY_HEADER, "")]),
            client=client_address(scope.get("client")),
            route=f"WebSocket {scope['path']}",
        )
        async with self._router.acquire(lease):
            base = config.models[target.model_id].proxy
            target_path = path + (f"?{query.decode('latin-1')}" if query else "")
            await _bridge(target.model_id, base, target_path, scope, link)


async def _bridge(model: str, base: str, target: str, scope: WebsocketScope, link: _Link) -> None:
    """Open the model server's WebSocket at ``target``, accept the client's, and relay
    until either side closes.

    Raises:
        UpstreamError: the model server could not be reached, or refused the upgrade.
    """
    url = urlsplit(base)
    if url.scheme != "http" or url.hostname is None:
        raise UpstreamError(model, f"a WebSocket needs an http:// model server, not {base}")
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            stream = await trio.open_tcp_stream(url.hostname, url.port or 80)
    except (OSError, trio.TooSlowError) as exc:
        raise UpstreamError(model, f"cannot connect to {base}: {exc}") from exc
    async with stream:
        server = _Server(model, stream)
        accepted = await server.handshake(
            Request(
                host=url.netloc,
                target=url.path.rstrip("/") + target,
                subprotocols=list(scope.get("subprotocols", ())),
                extra_headers=[(k, v) for k, v in scope["headers"] if k.lower() in _FORWARDED],
            )
        )
        await link.send(
            {"type": "websocket.accept", "subprotocol": accepted.subprotocol, "headers": []}
        )
        link.accepted = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.client_to_server, server, nursery.cancel_scope)
            nursery.start_soon(link.server_to_client, server, nursery.cancel_scope)


@attrs.define(eq=False)
class _Server:
    """The model server's side: wsproto on a Trio stream, one writer at a time."""

    model: str
    stream: trio.SocketStream
    ws: wsproto.WSConnection = attrs.field(
        factory=lambda: wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
    )
    _writing: trio.Lock = attrs.field(factory=trio.Lock)

    async def send(self, event: Event) -> None:
        async with self._writing:
            await self.stream.send_all(self.ws.send(event))

    async def events(self) -> list[Event]:
        """What arrives next; empty once the stream has ended."""
        data = await self.stream.receive_some(65536)
        self.ws.receive_data(data or None)
        return list(self.ws.events())

    async def handshake(self, request: Request) -> AcceptConnection:
        await self.send(request)
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            while events := await self.events():
                for event in events:
                    if isinstance(event, AcceptConnection):
                        return event
                    if isinstance(event, RejectConnection):
                        status = event.status_code
                        raise UpstreamError(
                            "", f"the model server refused the WebSocket ({status})"
                        )
        raise UpstreamError("", "the model server did not accept the WebSocket")


@attrs.define(eq=False)
class _Link:
    """One relayed connection: each direction is a task; the first to end ends both."""

    receive: ASGIReceiveCallable
    send: ASGISendCallable
    #: The client's handshake is accepted (after the server's): errors end it by a close.
    accepted: bool = False
    client_gone: bool = False
    #: The frames of the server's message being received.
    _text: list[str] = attrs.field(factory=list)
    _data: bytearray = attrs.field(factory=bytearray)

    async def client_to_server(self, server: _Server, done: trio.CancelScope) -> None:
        try:
            while True:
                message = await self.receive()
                if message["type"] == "websocket.disconnect":
                    self.client_gone = True
                    await server.send(CloseConnection(code=message.get("code", 1000)))
                    return
                if message["type"] == "websocket.receive":
                    text = message.get("text")
                    event = (
                        TextMessage(text)
                        if text is not None
                        else BytesMessage(message.get("bytes") or b"")
                    )
                    await server.send(event)
        except _BROKEN:
            return
        finally:
            done.cancel()

    async def server_to_client(self, server: _Server, done: trio.CancelScope) -> None:
        code = 1011  # the server went without a close frame
        try:
            while events := await server.events():
                for event in events:
                    if isinstance(event, CloseConnection):
                        code = event.code
                        await server.send(event.response())
                        return
                    if isinstance(event, Ping):
                        await server.send(event.response())
                    elif isinstance(event, TextMessage | BytesMessage):
                        await self._relay(event)
        except _BROKEN:
            pass
        except trio.Cancelled:
            code = 1001  # going away: unloaded, cancelled, shutting down, or the client left
            raise
        finally:
            done.cancel()
            if not self.client_gone:
                with trio.CancelScope(shield=True):
                    await self.send({"type": "websocket.close", "code": code, "reason": ""})

    async def _relay(self, event: TextMessage | BytesMessage) -> None:
        """A message the server sent, to the client once its last frame has come."""
        if isinstance(event, TextMessage):
            self._text.append(event.data)
            if event.message_finished:
                text, self._text = "".join(self._text), []
                await self.send({"type": "websocket.send", "text": text, "bytes": None})
        else:
            self._data += event.data
            if event.message_finished:
                data, self._data = bytes(self._data), bytearray()
                await self.send({"type": "websocket.send", "bytes": data, "text": None})


async def _refuse(scope: WebsocketScope, send: ASGISendCallable, error: RequestError) -> None:
    """The handshake refused: the JSON error answer where hypercorn lets an application
    answer a handshake with HTTP, else a close (hypercorn answers 403)."""
    if "websocket.http.response" in scope.get("extensions", {}):
        status, raw, body = error_answer(error)
        await send({"type": "websocket.http.response.start", "status": status, "headers": raw})
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": str(error)})
