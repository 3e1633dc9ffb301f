"""The forwarding path: inference routes and ``/upstream``, as a plain ASGI handler.

One task holds everything a proxied request owns, from admission to the last byte:
its place with the scheduler (``Router.acquire``), the upstream connection, and the
response. That is why this path is ASGI rather than a Quart view: a Quart view returns
its response before the body is sent, and a lease held across that gap could leak.

Each request runs in a nursery. The request task reads the body itself (before queueing,
except a large ``/upstream`` upload, which streams through once the model is ready); once
the body is in, llamaswap's server calls the request back as its client leaves
(``CLIENT_LEFT_EXTENSION``), or, under another ASGI server, a *watcher* task waits for
``http.disconnect``; either cancels the request.
**A client that disconnects cancels its request wherever it is**: waiting in the queue (it
leaves the queue), waiting for a load (the load is cancelled if nobody else wants it), or
streaming (the upstream connection is closed, so the model server sees the disconnect and
stops generating).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from functools import lru_cache, partial
from typing import final
from urllib.parse import parse_qsl

import attrs
import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    HTTPScope,
)

from llamaswap.config.model import Config, FilterConfig, Timeouts
from llamaswap.errors import (
    BadRequest,
    BodyTooLarge,
    MethodNotAllowed,
    ModelNotLoaded,
    ModelStartFailed,
    RequestError,
    ShuttingDown,
    Unauthorized,
    UpstreamError,
)
from llamaswap.http import asgi
from llamaswap.http.asgi import RequestBody
from llamaswap.http.auth import authorized
from llamaswap.http.client import UpstreamFailed, UpstreamPool, UpstreamResponse
from llamaswap.http.errors import error_answer, error_response
from llamaswap.http.headers import (
    downstream_headers,
    has_body,
    header_map,
    upstream_headers,
)
from llamaswap.observability import CaptureTap, UsageTap
from llamaswap.observability.estimates import Estimator
from llamaswap.observability.tracing import Tracing
from llamaswap.process import ModelState
from llamaswap.router import Router
from llamaswap.router.lease import Lease
from llamaswap.router.names import Names, Peer
from llamaswap.router.router import CANCEL_GRACE
from llamaswap.schedulers import parse_priority
from llamaswap.schedulers.priority import HEADER as PRIORITY_HEADER
from llamaswap.schedulers.settings import preemptible

from . import anthropic, ollama, resume
from .exchange import CLIENT_LEFT, Exchange, Recorder
from .extract import ModelIn, Payload, body_kind, read_model, rewrite_body, rewrite_query
from .loading import SSE_HEADERS, report_progress
from .operations import client_address
from .routes import METHODS, Route, slash_location, upstream_target

__all__ = ["SMALL_BODY", "Forwarder"]

logger = logging.getLogger("llamaswap.proxy")

#: The request fields the forwarder reads.
_READ = frozenset(
    {
        b"authorization",
        b"x-api-key",
        b"content-encoding",
        b"content-length",
        b"content-type",
        b"transfer-encoding",
        PRIORITY_HEADER.encode(),
        b"x-llamaswap-preemptible",
        b"x-llamaswap-autoload",
    }
)
#: ``X-LlamaSwap-Preemptible: false`` (or 0, no) opts a request out of preemption, and
#: ``X-LlamaSwap-Autoload: false`` (or ``?autoload=false``) out of loading its model.
_NO = frozenset({"false", "0", "no"})
#: The routes ``anthropic = "translate"`` answers by way of chat completions.
_MESSAGES = (anthropic.MESSAGES_PATH, anthropic.COUNT_TOKENS_PATH)

#: Bodies up to this size (by Content-Length) are handled in one piece: answers are relayed
#: in one send rather than chunk by chunk (event streams never have a Content-Length), and
#: ``/upstream`` request bodies are read before the request is queued.
SMALL_BODY = 256 * 1024


@final
class _Reply:
    """The response to the client (to the request whose body is ``request``); remembers
    whether it has started."""

    def __init__(self, send: ASGISendCallable, exchange: Exchange, request: RequestBody) -> None:
        self._send = send
        self._exchange = exchange
        self._request = request
        self.content_type = b""  # the response's, once started

    @property
    def started(self) -> bool:
        return self._exchange.status is not None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._exchange.status = status
        if self._request.unread:
            # The rest of the body would be read as the next request: close the connection.
            headers = [*headers, (b"connection", b"close")]
            self._request.drop_rest()
        self.content_type = next((v for k, v in headers if k == b"content-type"), b"")
        if self._exchange.capture is not None:
            self._exchange.capture.response_start(status, headers)
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": status,
            "headers": headers,
            "trailers": False,
        }
        await self._send(start)

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        self._exchange.finished = not more
        if self._exchange.capture is not None:
            self._exchange.capture.response_body(chunk)
        event: HTTPResponseBodyEvent = {
            "type": "http.response.body",
            "body": chunk,
            "more_body": more,
        }
        await self._send(event)

    async def json(self, status: int, document: object) -> None:
        await self.start(status, [(b"content-type", b"application/json")])
        await self.body(json.dumps(document).encode(), more=False)

    async def error(self, error: RequestError, *, message_only: bool = False) -> None:
        """``error``'s answer; ``message_only``: as ``error_answer``."""
        status, fields, body = error_answer(error, message_only=message_only)
        await self.start(status, fields)
        await self.body(body, more=False)


@final
class Forwarder:
    """Handles the inference routes (SPEC §4.1) and ``/upstream/{model}/{path}``.

    ``estimator``: the estimates that a 429's ``Retry-After`` and the loading stream read
    (one of its own by default). ``tracing``: each request's trace, when ``[tracing]`` is on."""

    def __init__(
        self,
        router: Router,
        pool: UpstreamPool,
        recorder: Recorder,
        *,
        estimator: Estimator | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._router = router
        self._pool = pool
        self._recorder = recorder
        self._tracing = tracing
        self._estimator = estimator if estimator is not None else Estimator(router)

    @property
    def _config(self) -> Config:
        return self._router.config  # the current one: a reload applies at once

    @property
    def _names(self) -> Names:
        return self._router.names

    async def __call__(
        self, route: Route, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        exchange = Exchange(scope["method"], scope["path"])
        if self._tracing is not None:
            exchange.trace = self._tracing.begin(
                scope["headers"],
                _span_name(route, scope),
                exchange.started,
                int(exchange.wall_time.timestamp() * 1e9),
            )
        async with trio.open_nursery() as nursery:
            # It reads ``exchange``, not ``reply``: the body holds this function and the
            # reply holds the body, a cycle that only the garbage collector would free,
            # with everything the request touched.
            def client_left() -> None:
                # hypercorn also says "disconnect" once a response is complete.
                if not exchange.finished:
                    nursery.cancel_scope.cancel(reason="client disconnected")

            headers = header_map(scope, _READ)
            limit = self._config.max_body_bytes
            told = asgi.client_left(scope)
            expected = has_body(headers)
            body = RequestBody(
                receive, limit, nursery, client_left, expected=expected, watch=told is None
            )
            if told is not None:
                told.on_leave(body.gone)
            reply = _Reply(send, exchange, body)
            try:
                await self._handle(route, scope, headers, body, reply, exchange)
            except RequestError as exc:
                await self._fail(scope, exchange, reply, exc)
            except trio.Cancelled:
                # The server's last cancel at shutdown reaches what still runs (a body still
                # arriving, a peer's answer): tell its client, as a waiting request is told.
                if self._router.shutting_down and not body.disconnected:
                    with trio.CancelScope(shield=True) as telling:
                        telling.deadline = trio.current_time() + CANCEL_GRACE
                        await self._fail(scope, exchange, reply, ShuttingDown())
                raise
            finally:
                if body.disconnected and not exchange.finished and exchange.error is None:
                    exchange.error = CLIENT_LEFT
                self._recorder.finish(exchange)
            if nursery.child_tasks:  # a watcher, if hypercorn has not ended it yet
                nursery.cancel_scope.cancel()

    async def _fail(
        self, scope: HTTPScope, exchange: Exchange, reply: _Reply, error: RequestError
    ) -> None:
        exchange.error = str(error)
        self._estimator.set_retry_after(error)  # a 429's, when estimated
        if not isinstance(error, ModelStartFailed):  # logged once, by its supervisor
            logger.info("%s %s: %s", scope["method"], scope["path"], error)
        await self._report(reply, error, scope["path"])

    async def _report(self, reply: _Reply, error: RequestError, path: str) -> None:
        """Answer ``error`` (to a request for ``path``) however much of the response has
        already gone out.

        Anthropic Messages streams end with an ``error`` event (a bare ``data:`` line would
        be ignored by its clients); Ollama's routes say it as Ollama does (a string, where
        OpenAI's error is an object: its clients fail on an object mid-stream).
        """
        if not reply.started:
            await reply.error(error, message_only=path in ollama.ROUTES)
        elif reply.content_type.startswith(b"text/event-stream"):
            # The status line said 200 (a loading-state stream, or a stream that broke
            # off): say what went wrong as an event, then end the stream properly.
            status, _, body = error_response(error)
            if path == anthropic.MESSAGES_PATH:
                await reply.body(anthropic.error_event(status, str(error)), more=False)
            else:
                await reply.body(b"data: " + body + b"\n\n", more=False)
        elif reply.content_type.startswith(ollama.NDJSON.encode()):
            _, _, line = error_response(error, message_only=True)
            await reply.body(line + b"\n", more=False)
        # Otherwise there is nothing left to say it with. Returning with the body short
        # of its end makes hypercorn close the connection: the client sees the answer
        # fall short (raising would do the same, with a traceback in the log).

    async def _handle(
        self,
        route: Route,
        scope: HTTPScope,
        headers: dict[str, str],
        body: RequestBody,
        reply: _Reply,
        exchange: Exchange,
    ) -> None:
        if not authorized(self._config.api_keys, headers):
            raise Unauthorized()
        if route.wrong_method:
            raise MethodNotAllowed(scope["method"], scope["path"], METHODS[scope["path"]])
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._config.max_body_bytes:
            raise BodyTooLarge(self._config.max_body_bytes)
        content_type = headers.get("content-type", "")
        query = scope["query_string"]
        priority = headers.get(PRIORITY_HEADER)
        exchange.priority = 0 if priority is None else parse_priority([priority])
        renamed: str | None = None  # the name a pin or selector put in the client's place
        where: ModelIn | None = None  # how the request names its model: None, in the path
        if route.model_in is None:
            name, target, upstream_path = upstream_target(
                scope, self._names, comfyui=route.comfyui
            )
            if upstream_path is None:
                await _redirect_to_slash(scope, reply)
                return
            path = upstream_path
            # A small body is read now, so that a disconnect while queued is noticed; a
            # large or chunked one streams through once the model is ready.
            small = declared.isdigit() and int(declared) <= SMALL_BODY
            streamed = "transfer-encoding" in headers or (bool(declared) and not small)
            payload = None if streamed else Payload(await body.read(), content_type)
        else:
            encoding = headers.get("content-encoding", "identity").strip().lower()
            if encoding != "identity" and route.model_in is not ModelIn.QUERY:
                raise BadRequest(
                    f"the request body is compressed (Content-Encoding: {encoding[:40]}), and "
                    "llamaswap reads the model from it: send it uncompressed"
                )
            payload = Payload(await body.read(), content_type)
            default = self._config.fallback_model()
            # Ollama's clients send JSON whatever their Content-Type says (curl -d's form).
            where = (
                ModelIn.JSON
                if scope["path"] in ollama.PATHS
                else body_kind(route.model_in, content_type)
            )
            name = read_model(where, payload, query, default=default)
            exchange.metadata["requested_model"] = sent = name
            # From here on, the name its pin or selector chose: the model server and the
            # filters see that name, as if the client had sent it.
            name, target = self._names.route(sent)
            if name != sent:
                renamed = name
            path = scope["path"][len(route.strip) :]
        if isinstance(target, Peer):
            exchange.model = f"{target.peer_id}/{target.model}"
            exchange.metadata["peer"] = target.peer_id
            self._capture(exchange, scope, payload, body, wanted=self._config.capture)
            peer = target.config
            payload, query = _rewrite(where, payload, query, target.model, peer.filters, name)
            auth = _peer_auth(target)
            upstream = _Upstream(peer.proxy, path, query, payload, auth, None, peer.timeouts)
            await self._forward(exchange, scope, upstream, body, reply)
            return
        exchange.model = target.model_id
        check_autoload(self._router, target.model_id, headers, query, route, path)
        model = self._config.models[target.model_id]
        self._capture(exchange, scope, payload, body, wanted=model.capture)
        # Set when Anthropic's or Ollama's API goes to a server that speaks OpenAI's:
        translation: anthropic.Translation | ollama.Translation | None = None
        if route.model_in is not None and payload is not None:
            if path in _MESSAGES and model.anthropic == "translate":
                answer = anthropic.local_answer(path, payload.json())
                if answer is not None:
                    await reply.json(200, answer)
                    return
                raw, chat, translation = anthropic.chat_body(payload.json())
                payload = Payload(raw, "application/json", chat)
                path = anthropic.CHAT_PATH
            elif path in ollama.PATHS and model.ollama == "translate":
                raw, request, translation = ollama.translate(path, payload.json(), model=sent)
                payload = Payload(raw, "application/json", request)
                path = translation.upstream_path
        while_waiting: Callable[[Lease], Awaitable[None]] | None = None
        if payload is None:
            while_waiting = body.prefetch  # the upload streams through once granted
        elif model.send_loading_state and _streaming_chat(where, scope, payload):
            exchange.metadata["loading_state"] = True
            while_waiting = partial(
                report_progress,
                self._router,
                exchange.metadata.get("requested_model", target.model_id),
                partial(reply.start, 200, list(SSE_HEADERS)),
                reply.body,
                estimator=self._estimator,
            )
        preemptible = (
            translation is None
            and where is ModelIn.JSON
            and self._preemptible(target.model_id, headers, path, payload)
        )
        exchange.lease = lease = self._router.lease(
            target.model_id,
            priority=exchange.priority,
            client=client_address(scope.get("client")),
            route=f"{scope['method']} {scope['path']}",
            preemptible=preemptible,
        )
        async with self._router.acquire(lease, while_waiting=while_waiting):
            if isinstance(translation, ollama.Translation) and translation.loads_only:
                await reply.json(200, translation.loaded())  # its model is loaded: done
                return
            # The model's definition now: a reload while the request waited may have
            # moved it (a new port) or changed its filters.
            model = self._config.models.get(target.model_id, model)
            payload, query = _rewrite(
                where, payload, query, model.use_model_name or renamed, model.filters, name
            )
            upstream = _Upstream(
                model.proxy, path, query, payload, [], translation, model.timeouts
            )
            if preemptible and payload is not None:  # the body as filters left it
                generation = resume.generation(path, payload.json())
                if generation is not None:
                    await self._resumably(exchange, scope, upstream, reply, generation, lease)
                    return
                lease.pin()
            await self._forward(exchange, scope, upstream, body, reply)

    def _capture(
        self,
        exchange: Exchange,
        scope: HTTPScope,
        payload: Payload | None,
        body: RequestBody,
        *,
        wanted: bool,
    ) -> None:
        """Take the request's capture if its model's ``capture`` is on: its head and the
        body the client sent now (or, streamed through, as it arrives); the answer as it
        goes out (``_Reply``)."""
        if not wanted:
            return
        exchange.capture = capture = CaptureTap(
            scope["method"],
            scope["path"],
            scope["query_string"],
            scope["headers"],
            self._config.capture_max_bytes,
        )
        if payload is None:
            body.tee = capture.request_body
        else:
            capture.request_body(payload.raw)

    def _preemptible(
        self, model_id: str, headers: dict[str, str], path: str, payload: Payload | None
    ) -> bool:
        """Whether the request may be checkpointed and resumed (``resume.py``): under
        ``serial`` with ``preempt``, for a model that allows it, unless the client opts out,
        and for a generation that can be resumed exactly."""
        return (
            preemptible(self._config, model_id)
            and headers.get("x-llamaswap-preemptible", "").strip().lower() not in _NO
            and payload is not None
            and resume.generation(path, payload.json()) is not None
        )

    async def _forward(
        self,
        exchange: Exchange,
        scope: HTTPScope,
        upstream: _Upstream,
        body: RequestBody,
        reply: _Reply,
    ) -> None:
        headers = upstream_headers(
            scope, strip_auth=bool(self._config.api_keys or upstream.extra_headers)
        )
        headers.extend(upstream.extra_headers)
        if upstream.translation is not None:  # the answer is read here: no compression
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        if exchange.trace is not None:
            _trace_sent(exchange, headers)
        content: bytes | AsyncIterator[bytes] | None
        if upstream.payload is None:
            content = body
        elif upstream.payload.raw or body.expected:
            content = upstream.payload.raw
        else:
            content = None  # no body at all (a GET), as the client sent it
        path = upstream.path
        if upstream.query:
            path += "?" + upstream.query.decode("latin-1")
        try:
            async with self._pool.request(
                scope["method"], upstream.base, path, headers, content, upstream.timeouts
            ) as response:
                if upstream.translation is None:
                    await self._relay(exchange, response, reply)
                else:
                    await self._relay_translated(exchange, response, reply, upstream.translation)
        except UpstreamFailed as exc:
            raise await self._upstream_error(exchange, exc) from exc

    async def _upstream_error(self, exchange: Exchange, exc: UpstreamFailed) -> UpstreamError:
        """What the client is told of a broken upstream exchange (a 502)."""
        if exchange.lease is not None:  # a local model: has its server died?
            await self._router.notice_exit(exchange.model)
        detail = f"broke off mid-response: {exc}" if exc.answered else str(exc)
        return UpstreamError(exchange.model, detail)

    async def _resumably(
        self,
        exchange: Exchange,
        scope: HTTPScope,
        upstream: _Upstream,
        reply: _Reply,
        generation: resume.Generation,
        lease: Lease,
    ) -> None:
        """A preemptible request, one segment at a time: each preemption ends the
        segment's upstream request, gives the slot back and waits to be granted again
        (``Router.resume``), then the next segment goes on from what was generated, until
        the answer ends. The client sees one answer (``resume.py``)."""
        headers = [
            (k, v)
            for k, v in upstream_headers(scope, strip_auth=bool(self._config.api_keys))
            if k not in (b"accept-encoding", b"content-length")
        ]
        headers.append((b"accept-encoding", b"identity"))  # its events are read here
        if exchange.trace is not None:
            _trace_sent(exchange, headers)
        paused = 0.0
        try:
            while not await self._segment(exchange, upstream, headers, reply, generation, lease):
                logger.info(
                    "request #%d for %r preempted after %d tokens",
                    lease.id,
                    exchange.model,
                    generation.tokens,
                )
                since = trio.current_time()
                try:
                    await self._router.resume(lease)
                finally:
                    paused += trio.current_time() - since
                    exchange.metadata["paused_ms"] = round(paused * 1000, 3)
                # The model's definition now: a reload while it waited may have moved it.
                model = self._config.models.get(exchange.model)
                if model is not None:
                    upstream = attrs.evolve(upstream, base=model.proxy, timeouts=model.timeouts)
        except UpstreamFailed as exc:
            raise await self._upstream_error(exchange, exc) from exc
        finally:
            if lease.ticket.preemptions:
                exchange.metadata["preemptions"] = lease.ticket.preemptions
            if generation.segments > 1:
                exchange.metadata["recomputed_prompt_tokens"] = generation.recomputed
        if generation.repeated:
            exchange.metadata["prefill_ignored"] = True
            logger.warning(
                "model %r answered request #%d again from its start when asked to go on: it "
                "ignores a prefill; set preemptible = false for it",
                exchange.model,
                lease.id,
            )

    async def _segment(
        self,
        exchange: Exchange,
        upstream: _Upstream,
        headers: list[tuple[bytes, bytes]],
        reply: _Reply,
        generation: resume.Generation,
        lease: Lease,
    ) -> bool:
        """One segment of a resumable generation; False if it was preempted.

        A later segment whose connection the model server closed before answering (an
        idle one it dropped as llama-server does after a cancelled stream) is sent once
        more, on another: nothing of it reached the client, and it starts from the same
        checkpoint.

        *Cancellation*: the upstream's reads happen in ``lease.preemption()`` scopes, which
        a preemption cancels (closing the upstream connection, so the model server stops);
        the writes to the client never do, so a preemption cannot cut one short.
        """
        content = generation.body()
        async with AsyncExitStack() as stack:
            for attempt in (1, 2):
                request = self._pool.request(
                    "POST", upstream.base, upstream.path, headers, content, upstream.timeouts
                )
                try:
                    with lease.preemption() as preemption:
                        response = await stack.enter_async_context(request)
                    break
                except UpstreamFailed as exc:
                    if exc.answered or attempt == 2 or generation.segments == 1:
                        raise
            if preemption.cancelled_caught:
                return False
            content_type = response.header(b"content-type")
            if response.status != 200 or not content_type.startswith("text/event-stream"):
                lease.pin()  # an error, or a server that would not stream: passed on
                await self._relay(exchange, response, reply)
                return True
            exchange.tap = tap = UsageTap(
                content_type if generation.client_streams else "application/json"
            )
            fields = downstream_headers(response, content_type, exchange.model)
            if generation.client_streams and not reply.started:
                await reply.start(200, fields)
            chunks = response.chunks()
            while True:
                if generation.pinned:  # read to its end: it cannot be resumed
                    data = await anext(chunks, None)
                else:
                    with lease.preemption() as preemption:
                        data = await anext(chunks, None)
                    if preemption.cancelled_caught:
                        generation.checkpoint()
                        return False
                if data is None:
                    break
                out = generation.feed(data)
                if generation.pinned:
                    lease.pin()
                if out:
                    exchange.answer(out)
                    await reply.body(out)
        if generation.client_streams:
            if generation.usage is not None and not generation.client_usage:
                # Asked for by llamaswap, not sent: counted in the record all the same.
                tap.feed(b"data: " + json.dumps({"usage": generation.usage}).encode() + b"\n\n")
            await reply.body(b"", more=False)
            return True
        document = json.dumps(generation.answer()).encode()
        exchange.answer(document)
        json_fields = [(k, v) for k, v in fields if k not in (b"content-type", b"content-length")]
        await reply.start(200, [*json_fields, (b"content-type", b"application/json")])
        await reply.body(document, more=False)
        return True

    async def _relay(self, exchange: Exchange, response: UpstreamResponse, reply: _Reply) -> None:
        content_type = response.header(b"content-type")
        if not response.header(b"content-encoding"):
            exchange.tap = UsageTap(content_type)
        if not reply.started:
            headers = downstream_headers(response, content_type, exchange.model)
            await reply.start(response.status, headers)
        elif response.status != 200:
            # The loading-state stream already said 200: pass the error on as an event.
            exchange.error = f"upstream answered {response.status}"
            event = _error_event(await response.read(), response.status, exchange.model)
            await reply.body(b"data: " + event + b"\n\n", more=False)
            return
        length = (
            "" if response.header(b"transfer-encoding") else response.header(b"content-length")
        )
        if length.isdigit() and int(length) <= SMALL_BODY:
            # A small answer goes out in one piece, together with the response's end.
            data = await response.read()
            exchange.answer(data)
            await reply.body(data, more=False)
            return
        async for data in response.chunks():
            exchange.answer(data)
            await reply.body(data)
        await reply.body(b"", more=False)

    async def _relay_translated(
        self,
        exchange: Exchange,
        response: UpstreamResponse,
        reply: _Reply,
        translation: anthropic.Translation | ollama.Translation,
    ) -> None:
        """An OpenAI answer relayed as the API's the client spoke (``anthropic`` or
        ``ollama = "translate"``). An error from the model server passes through untouched
        (SPEC §4.3)."""
        content_type = response.header(b"content-type")
        stream = content_type.startswith("text/event-stream")
        if response.status != 200 or not (stream or content_type.startswith("application/json")):
            await self._relay(exchange, response, reply)
            return
        exchange.tap = UsageTap(content_type)
        headers = [
            (k, v)
            for k, v in downstream_headers(response, content_type, exchange.model)
            if k not in (b"content-type", b"content-length")
        ]
        if not stream:
            data = await response.read()
            exchange.answer(data)
            try:
                document = translation.whole(json.loads(data))
            except (ValueError, RecursionError) as exc:  # not JSON, too deep, not an answer
                raise UpstreamError(exchange.model, f"cannot translate its answer: {exc}") from exc
            await reply.start(200, [*headers, (b"content-type", content_type.encode("latin-1"))])
            await reply.body(json.dumps(document).encode(), more=False)
            return
        events = translation.stream_lines()
        stream_type = translation.stream_type or content_type
        await reply.start(200, [*headers, (b"content-type", stream_type.encode("latin-1"))])
        async for data in response.chunks():
            exchange.answer(data)
            if translated := events.feed(data):
                await reply.body(translated)
        await reply.body(events.close(), more=False)


@attrs.frozen
class _Upstream:
    """Where a request goes, and what changes on the way."""

    base: str  # the model's or peer's `proxy` URL
    path: str  # percent-encoded, without the query
    query: bytes
    payload: Payload | None  # None: stream the client's body through
    extra_headers: list[tuple[bytes, bytes]]
    #: Anthropic's or Ollama's request, sent as OpenAI's.
    translation: anthropic.Translation | ollama.Translation | None = None
    timeouts: Timeouts | None = None  # the model's or peer's; None: the pool's own


def _span_name(route: Route, scope: HTTPScope) -> str:
    """A request span's name: its method and route (``/upstream``'s without the rest of its
    path, which is the model's and the client's to choose)."""
    if route.model_in is not None:
        return f"{scope['method']} {scope['path']}"
    return f"{scope['method']} {'/comfyui' if route.comfyui else '/upstream/{model}'}"


def _trace_sent(exchange: Exchange, headers: list[tuple[bytes, bytes]]) -> None:
    """The request goes upstream: its trace's upstream span begins, named in ``headers``'
    ``traceparent``."""
    assert exchange.trace is not None
    granted = None if exchange.lease is None else exchange.lease.ticket.granted_at
    exchange.trace.sent(headers, trio.current_time(), granted)


async def _redirect_to_slash(scope: HTTPScope, reply: _Reply) -> None:
    """``/upstream/{model}`` → ``/upstream/{model}/``, as llama-swap answers: relative links
    in the model server's own pages then resolve under it. 308 keeps the method and body."""
    headers = [(b"location", slash_location(scope)), (b"content-length", b"0")]
    await reply.start(301 if scope["method"] in ("GET", "HEAD") else 308, headers)
    await reply.body(b"", more=False)


def _rewrite(
    where: ModelIn | None,
    payload: Payload | None,
    query: bytes,
    rename: str | None,
    filters: FilterConfig | None,
    requested: str,
) -> tuple[Payload | None, bytes]:
    """The body and query sent upstream: ``model`` renamed to ``rename`` (the name the
    model server knows, if not the client's) and ``filters`` applied. ``where``: how the
    request named its model (``body_kind``); None for ``/upstream``."""
    if payload is None or where is None:
        return payload, query  # /upstream passes the client's request through
    payload = rewrite_body(where, payload, model=rename, filters=filters, requested=requested)
    if where is ModelIn.QUERY and rename:
        query = rewrite_query(query, rename)
    return payload, query


def _error_event(body: bytes, status: int, model: str) -> bytes:
    """A model server's error answer as the data of one SSE event: its JSON on one line
    (an event's data cannot hold a line break), or what is not JSON (an HTML error page)
    in llamaswap's error object."""
    try:
        return json.dumps(json.loads(body), separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        text = " ".join(body.decode("utf-8", "replace").split())[:300]
        return error_response(UpstreamError(model, f"answered {status}: {text}"))[2]


def _streaming_chat(where: ModelIn | None, scope: HTTPScope, payload: Payload | None) -> bool:
    if scope["path"] != "/v1/chat/completions" or payload is None or where is not ModelIn.JSON:
        return False
    return payload.field("stream") is True


def check_autoload(
    router: Router,
    model_id: str,
    headers: Mapping[str, str],
    query: bytes,
    route: Route,
    path: str,
) -> None:
    """Raises ModelNotLoaded if ``model_id`` is not ready and the request may not load
    it: it says so; it is an ``/upstream`` request (``path``: the path after the model's
    name) to one of ``upstream.ignorePaths`` (a web UI's files); or it is a ``/comfyui``
    request for anything but ComfyUI's page itself (as llama-swap has it: a tab left open
    never loads it again). A model unloaded just after this check is loaded again for the
    request."""
    if router.model_state(model_id) is ModelState.READY:
        return
    if headers.get("x-llamaswap-autoload", "").strip().lower() in _NO:
        raise ModelNotLoaded(model_id, "the request says X-LlamaSwap-Autoload: false")
    if b"autoload" in query and _query_value(query, "autoload") in _NO:
        raise ModelNotLoaded(model_id, "the request says ?autoload=false")
    if route.comfyui and path != "/":
        raise ModelNotLoaded(model_id, "only /comfyui/ itself loads it")
    ignored = ignored_paths(router.config.upstream.ignore_paths)
    if route.model_in is None and ignored.search(path):
        raise ModelNotLoaded(model_id, "its path is one of upstream.ignorePaths")


def _query_value(query: bytes, name: str) -> str:
    """The first value of ``name`` in the query string, lowercased ("" if absent)."""
    return dict(parse_qsl(query.decode("latin-1"))).get(name, "").strip().lower()


@lru_cache(maxsize=8)
def ignored_paths(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """``upstream.ignorePaths`` as one expression, searched as llama-swap does (a match
    anywhere in the path); validation has compiled each pattern already."""
    return re.compile("|".join(f"(?:{pattern})" for pattern in patterns) or r"(?!)")


def _peer_auth(peer: Peer) -> list[tuple[bytes, bytes]]:
    key = peer.config.api_key
    if not key:
        return []
    return [(b"authorization", b"Bearer " + key.encode()), (b"x-api-key", key.encode())]
