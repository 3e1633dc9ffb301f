"""The Endpoint Picker's side of GIE's protocol: Envoy's ``ext_proc`` over gRPC.

Envoy sends each request's headers, then its whole body (``BUFFERED``), and later the
answer's headers. The picker reads the model (where llamaswap's own routes read it: the
JSON body, a form field, the query, or ``/upstream/{model}/``) and the priority header,
asks the board for a node, and answers with the node's ``ip:port`` as dynamic metadata
``envoy.lb`` / ``x-gateway-destination-endpoint``, which is what Envoy routes by (and
the same header, overwritten, as the protocol asks; a client's own is never read). No
node up: 503, answered by Envoy at once. With the answer's headers comes the endpoint
that served it (Envoy's ``upstream.address`` attribute), counted by endpoint.

``GET /v1/models`` is answered here: the union of the nodes' models (but by a node,
which checks the client's key, when the nodes want one: ``LLAMASWAP_NODE_API_KEY``).

gRPC's Python server is not Trio-native: it runs on asyncio (``grpc.aio``), in a thread
of its own (``serve_picker``). What it shares with Trio's thread is the board alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

import attrs

# gRPC's fork handlers are for programs that fork to run Python in the child; the
# gateway forks only to exec Envoy, and would log a line for every such fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
import grpc
import trio
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from llamaswap.errors import BadRequest, GatewayError
from llamaswap.proxy.extract import ModelIn, Payload, read_model
from llamaswap.proxy.routes import INFERENCE, UPSTREAM_PREFIX
from llamaswap.schedulers.priority import HEADER as PRIORITY_HEADER
from llamaswap.schedulers.priority import parse_priority

from .board import Board

__all__ = ["DESTINATION", "NAMESPACE", "RequestInfo", "decide", "serve_picker"]

log = logging.getLogger("llamaswap.gateway")

NAMESPACE = "envoy.lb"
DESTINATION = "x-gateway-destination-endpoint"
#: The ext_proc filter's name in Envoy's config: the key of the attributes it sends.
FILTER = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


@attrs.define
class RequestInfo:
    """One HTTP request, from its headers to its answer's."""

    method: str = ""
    path: str = ""
    query: bytes = b""
    content_type: str = ""
    priority: int = 0


def decide(
    board: Board, info: RequestInfo, body: bytes, *, at_headers: bool, list_models: bool = True
) -> ep.ProcessingResponse:
    """Where the request goes, as the metadata and header for Envoy, in answer to its
    headers (a request without a body) or to its body; an immediate answer (no node up,
    or ``GET /v1/models`` when ``list_models``) as an ``ImmediateResponse``."""
    if list_models and info.method in ("GET", "HEAD") and info.path in ("/v1/models", "/models"):
        listing = [{"id": m, "object": "model", "owned_by": "llamaswap"} for m in board.models()]
        document = json.dumps({"object": "list", "data": listing}).encode()
        return _immediate(200, [("content-type", "application/json")], document, "models")
    model = _model(info, body)
    chosen = board.choose(model, info.priority)
    if chosen is None:  # Envoy's error mapper makes it OpenAI's error shape (envoy.py)
        what = f"model {model!r}" if model else "the request"
        text = f"no llamaswap node is up to serve {what}; try again shortly"
        return _immediate(503, [("content-type", "text/plain")], text.encode(), "no_node_up")
    target = chosen.node.endpoint.target
    metadata = struct_pb2.Struct()
    metadata.update({NAMESPACE: {DESTINATION: target}})
    option = core.HeaderValueOption(
        header=core.HeaderValue(key=DESTINATION, raw_value=target.encode()),
        append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    common = ep.CommonResponse(header_mutation=ep.HeaderMutation(set_headers=[option]))
    if at_headers:
        return ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(response=common), dynamic_metadata=metadata
        )
    return ep.ProcessingResponse(
        request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata
    )


def _model(info: RequestInfo, body: bytes) -> str | None:
    """The model the request names; None when it names none that can be read (the node
    picked answers such a request as it would alone)."""
    if info.path.startswith(UPSTREAM_PREFIX):
        return info.path[len(UPSTREAM_PREFIX) :].partition("/")[0] or None
    method = "GET" if info.method == "HEAD" else info.method
    where = INFERENCE.get((method, info.path))
    if where is None:
        where = ModelIn.JSON if body else ModelIn.QUERY
    try:
        return read_model(where, Payload(body, info.content_type), info.query)
    except BadRequest:
        return None


def _immediate(
    status: int, headers: list[tuple[str, str]], body: bytes, details: str
) -> ep.ProcessingResponse:
    options = [core.HeaderValueOption(header=core.HeaderValue(key=k, raw_value=v.encode()))
               for k, v in headers]  # fmt: skip
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            headers=ep.HeaderMutation(set_headers=options),
            body=body,
            details=details,
        )
    )


def _headers(message: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("latin-1") if header.raw_value else header.value
        found.setdefault(header.key.lower(), value)  # the first of a repeated one counts
    return found


class _Processor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, board: Board, list_models: bool) -> None:
        self._board = board
        self._list_models = list_models

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        info = RequestInfo()
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                headers = _headers(request.request_headers)
                path, _, query = headers.get(":path", "/").partition("?")
                info = RequestInfo(
                    method=headers.get(":method", "GET"),
                    path=path,
                    query=query.encode("latin-1"),
                    content_type=headers.get("content-type", ""),
                    priority=parse_priority(
                        [headers[PRIORITY_HEADER]] if PRIORITY_HEADER in headers else []
                    ),
                )
                if request.request_headers.end_of_stream:
                    yield decide(
                        self._board, info, b"", at_headers=True, list_models=self._list_models
                    )
                else:
                    yield ep.ProcessingResponse(request_headers=ep.HeadersResponse())
            elif kind == "request_body":
                yield decide(self._board, info, request.request_body.body, at_headers=False)
            elif kind == "response_headers":
                self._served(request)
                yield ep.ProcessingResponse(response_headers=ep.HeadersResponse())
            else:  # not asked for by the config llamaswap writes: let it through
                yield ep.ProcessingResponse(**{kind: _EMPTY[kind]()})

    def _served(self, request: Any) -> None:
        attributes = request.attributes.get(FILTER)
        if attributes is None or UPSTREAM_ADDRESS not in attributes.fields:
            return
        served = attributes.fields[UPSTREAM_ADDRESS].string_value
        for node in self._board.nodes():
            if node.endpoint.target == served:
                self._board.metrics.served.labels(node.name).inc()


_EMPTY = {
    "request_trailers": ep.TrailersResponse,
    "response_trailers": ep.TrailersResponse,
    "response_body": ep.BodyResponse,
}


async def serve_picker(
    board: Board,
    address: str,
    *,
    list_models: bool = True,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ext_proc and gRPC health on ``address`` (``host:port``; port 0 picks one)
    until cancelled; ``task_status.started`` gets the port. ``list_models``: answer
    ``GET /v1/models`` here (the nodes' models together); otherwise a node answers it,
    checking the client's key (the nodes want one)."""
    runner = _Runner(board, address, list_models)
    thread = threading.Thread(target=runner.run, name="llamaswap-gateway-grpc", daemon=True)
    thread.start()
    try:
        port = await trio.to_thread.run_sync(runner.started.result)
        task_status.started(port)
        await trio.to_thread.run_sync(runner.stopped.wait, abandon_on_cancel=True)
        raise RuntimeError("the gateway's gRPC server stopped")
    finally:
        runner.stop()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(thread.join)


@attrs.define(eq=False)
class _Runner:
    """The gRPC server's thread: an asyncio loop of its own."""

    board: Board
    address: str
    list_models: bool
    started: concurrent.futures.Future[int] = attrs.field(factory=concurrent.futures.Future)
    stopped: threading.Event = attrs.field(factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            else:
                log.exception("the gateway's gRPC server failed")
        finally:
            self.stopped.set()

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is None or stop is None or self.stopped.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed just now: stopped anyway
            loop.call_soon_threadsafe(stop.set)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(
            _Processor(self.board, self.list_models), server
        )
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as exc:  # gRPC's "Failed to bind": in use, no such address
            raise GatewayError(f"cannot serve gRPC on {self.address}: {exc}") from None
        await server.start()
        for service in ("", "liveness", "readiness", _SERVICE):
            await health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self.started.set_result(port)
        try:
            await self._stop.wait()
        finally:
            await server.stop(grace=0.5)
