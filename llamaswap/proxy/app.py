"""The HTTP application: proxied routes go to the Forwarder, everything else to Quart.

The Quart-Trio app serves the management routes (SPEC §4.2): model lists, running
models, load and unload. Routes receive finished services; no background task runs in
``app.nursery``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from typing import Any, final

import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPResponseBodyEvent,
    HTTPScope,
    Scope,
)
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.datastructures import Headers
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect

from llamaswap.config.model import REQUEST_BODY_TIMEOUT, SelectorConfig
from llamaswap.errors import (
    BadRequest,
    InternalError,
    ModelNotFound,
    RequestError,
    RequestTimeout,
    Unauthorized,
)
from llamaswap.http.asgi import Inbox, send_error
from llamaswap.http.auth import authorized, credentials
from llamaswap.http.client import UpstreamPool
from llamaswap.http.errors import error_response
from llamaswap.observability import CONTENT_TYPE as METRICS_CONTENT_TYPE
from llamaswap.observability import (
    ActivityLog,
    ActivityStore,
    Captures,
    EventHub,
    Logs,
    Metrics,
)
from llamaswap.observability.estimates import Estimator
from llamaswap.observability.model_server import ModelServerMetrics
from llamaswap.observability.props import ServerProps
from llamaswap.observability.tracing import Tracing
from llamaswap.reloader import Reloader, ReloadResult
from llamaswap.router import Router
from llamaswap.router.events import ModelForgotten, ModelStateChanged
from llamaswap.router.names import Local, Peer
from llamaswap.schedulers import parse_priority
from llamaswap.schedulers.priority import HEADER as PRIORITY_HEADER

from . import cors, gpu, history, live, ollama, ollama_models, routes, site, ui
from .exchange import CLIENT_LEFT, Exchange, Recorder
from .forward import Forwarder
from .gpu import memory_entry
from .operations import (
    capability_fields,
    client_address,
    client_status,
    json_response,
    listed_names,
    model_status,
    register,
)
from .websocket import WebSocketRelay

__all__ = ["Application", "create_app"]

logger = logging.getLogger("llamaswap.proxy")


@final
class Application:
    """The ASGI callable hypercorn serves."""

    def __init__(
        self,
        quart: QuartTrio,
        forwarder: Forwarder,
        reloader: Reloader | None,
        router: Router,
        model_server: ModelServerMetrics,
        props: ServerProps,
        listen_hosts: tuple[str, ...] = (),
    ) -> None:
        self.router = router
        #: ``/gateway/metrics``; ``serve()`` runs its reader of the models' KV figures.
        self.model_server = model_server
        #: The models' context lengths; ``serve()`` runs its reader of their ``/props``.
        self.props = props
        self.quart = quart
        self.forwarder = forwarder
        self.reloader = reloader  # None: no config file to reload from
        self.listen_hosts = listen_hosts  # a name there is one clients use (proxy/site.py)
        self.websockets = WebSocketRelay(router, listen_hosts)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "websocket":
            await self.websockets(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.quart(scope, receive, send)  # lifespan
            return
        config = self.router.config
        if config.gateway.node:
            send = _naming_node(config.gateway.name.encode(), send)
        route = routes.route(scope)
        inference = site.is_inference(scope["path"], proxied=route is not None)
        refused = site.refusal(scope, config, self.listen_hosts, inference=inference)
        if refused is None and config.api_keys:
            try:
                credentials(scope["headers"])  # one key field of each kind, for every route
            except RequestError as exc:
                refused = exc
        if refused is not None:
            logger.info("%s %s: %s", scope["method"], scope["path"], refused)
            await send_error(send, refused, message_only=scope["path"] in ollama.ROUTES)
            return
        origins = site.cors_origins(config, inference=inference)
        if config.cors_origins and cors.is_preflight(scope):
            await cors.answer_preflight(origins, scope, send)  # no API key: browsers send none
            return
        send = cors.with_origin(origins, scope, send)
        # A request body must keep arriving: at most REQUEST_BODY_TIMEOUT between pieces
        # (hypercorn bounds the head; see _serve.py). If it stops, the handler sees the
        # client leave, as if it had hung up, and the client gets a 408. Once the body is
        # in, receive() only waits for the client to leave: waiting for an answer is never
        # limited (a queued request, a load, a long generation).
        body_done = stalled = answered = False

        async def receive_body() -> ASGIReceiveEvent:
            nonlocal body_done, stalled
            if stalled:
                return {"type": "http.disconnect"}
            if body_done:
                return await receive()
            # A piece of a body that has arrived needs no timer: a small body comes with
            # its head, and arming one for each message, with receive()'s trip through
            # Trio's scheduler, was 3 % of what a small request cost (docs/performance.md,
            # fourth pass).
            message = receive.nowait() if isinstance(receive, Inbox) else None
            if message is None:
                with trio.move_on_after(REQUEST_BODY_TIMEOUT):
                    message = await receive()
            if message is None:
                stalled = True
                return {"type": "http.disconnect"}
            more = message["type"] == "http.request" and message.get("more_body", False)
            body_done = not more
            return message

        async def send_answer(message: ASGISendEvent) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        if route is not None:
            await self.forwarder(route, scope, receive_body, send_answer)
        else:
            edge = _QuartEdge(scope, receive_body, send_answer)
            with edge.cancel_scope:
                await self.quart(scope, edge.receive, edge.send)
        if stalled and not answered:  # the rest of the body may still come: close
            await send_error(send, RequestTimeout(REQUEST_BODY_TIMEOUT), close=True)


NODE_HEADER = b"x-llamaswap-node"


def _naming_node(name: bytes, send: ASGISendCallable) -> ASGISendCallable:
    """``send``, adding ``X-LlamaSwap-Node: name`` to the answer (node mode: which node of
    several behind a gateway answered; a model server's own field of that name is
    replaced)."""

    async def send_naming(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message["headers"] if k.lower() != NODE_HEADER]
            message = {**message, "headers": [*headers, (NODE_HEADER, name)]}
        await send(message)

    return send_naming


_END_OF_BODY: HTTPResponseBodyEvent = {
    "type": "http.response.body",
    "body": b"",
    "more_body": False,
}


@final
class _QuartEdge:
    """Between hypercorn and the Quart-Trio app, for one request: where the two disagree.

    quart-trio (0.12, ``quart_trio/asgi.py``) runs a view beside a task that reads the
    request's messages, in one nursery, and cancels that nursery when the reader gets
    ``http.disconnect``. hypercorn (0.18) queues that disconnect *inside* the send of a
    response's last message: ending the response closes the stream
    (``HTTPStream._send_closed`` → ``H11Protocol._maybe_recycle`` → ``_close_stream``),
    and the same call then goes on to restart the connection's idle timer for the next
    request, or to close the connection (``TCPServer._close``). The cancel landed in the
    middle of that, so after a management answer the keep-alive timeout never ran again
    and a connection that had to close (HTTP/1.0, ``Connection: close``, a body the view
    did not wait for) stayed open until the client gave up. **The disconnect reaches
    Quart only once the last send has returned.** (The proxied routes are not Quart: the
    Forwarder never cancels a response it has finished.)

    Two more: hypercorn's own task, closing a connection whose client left, sends the EOF
    outside the lock its writes take (``TCPServer._close``), so the view's write on it
    raises ``trio.BusyResourceError`` (seen after ``Expect: 100-continue``): the client
    has gone, and the rest of the answer is dropped. And Quart sends a ``HEAD`` answer's
    body like a ``GET``'s (hypercorn drops the bytes), so a streamed route's answer never
    ended: **a HEAD answer ends with its headers**, and the view is cancelled.
    """

    def __init__(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        self._receive = receive
        self._send = send
        self._head = scope["method"] == "HEAD"
        self._sent_last: trio.Event | None = None  # exists from the start of the last send
        self._over = False  # nothing more goes to the client
        self.cancel_scope = trio.CancelScope()  # around the app: a HEAD answer cancels it

    async def receive(self) -> ASGIReceiveEvent:
        message = await self._receive()
        if message["type"] == "http.disconnect" and self._sent_last is not None:
            await self._sent_last.wait()
        return message

    async def send(self, message: ASGISendEvent) -> None:
        if self._over:
            return
        if self._head and message["type"] == "http.response.start":
            await self._send_last(message, _END_OF_BODY)
            self.cancel_scope.cancel(reason="a HEAD answer ends with its headers")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            await self._send_last(message)
        else:
            await self._forward(message)

    async def _send_last(self, *messages: ASGISendEvent) -> None:
        self._over = True
        self._sent_last = trio.Event()
        try:
            for message in messages:
                await self._forward(message)
        finally:
            self._sent_last.set()

    async def _forward(self, message: ASGISendEvent) -> None:
        try:
            await self._send(message)
        except trio.BusyResourceError:  # hypercorn is closing the connection: client gone
            self._over = True


def _relative_location(redirect: RequestRedirect) -> str:
    """Where werkzeug's redirect goes, as a path only: its URL names the request's own
    ``Host``, which would send the client wherever that said (an open redirect). The path
    never starts with ``//`` (or ``/\\``), which a browser reads as another host."""
    parts = urllib.parse.urlsplit(redirect.new_url)
    path = "/" + parts.path.lstrip("/\\")
    return f"{path}?{parts.query}" if parts.query else path


def create_app(
    router: Router,
    pool: UpstreamPool,
    *,
    config_path: str | None = None,
    hub: EventHub | None = None,
    logs: Logs | None = None,
    activity: ActivityLog | None = None,
    store: ActivityStore | None = None,
    listen_hosts: tuple[str, ...] = (),
    tracing: Tracing | None = None,
) -> Application:
    """The whole HTTP side of ``router``: routes, forwarding, metrics and activity.

    ``config_path``: the file a reload (``POST /api/config/reload``, SIGHUP) reads.
    ``hub`` and ``logs``: the running event hub and logs for the live routes
    (``proxy/live.py``); without them, idle ones are made (no coalesced events).
    ``activity``: the log finished requests are recorded in (a new one by default);
    ``store``: the opened SQLite store that ``GET /api/activity`` reads as well (its
    writer, listening to ``activity``, is ``serve()``'s). ``listen_hosts``: the hosts
    of the addresses served on; a name there is a ``Host`` requests may carry (site.py).
    ``tracing``: traces of the forwarded requests (``[tracing]``), ``serve()``'s to close.
    """
    metrics = Metrics(router)
    router.observe(metrics.on_event, ModelStateChanged, ModelForgotten)
    model_server = ModelServerMetrics(router, pool)
    props = ServerProps(router, pool)
    router.observe(props.on_event, ModelStateChanged, ModelForgotten)
    if hub is None:
        hub = EventHub()  # idle: its coalesced events are never sent
    reloader = None
    if config_path is not None:

        def reloaded(result: ReloadResult) -> None:
            metrics.on_reload(result.ok)
            hub.publish_reload(result.to_json())

        reloader = Reloader(config_path, router, reloaded)
    if activity is None:
        activity = ActivityLog()
    recorder = Recorder(activity, metrics, Captures(lambda: router.config.capture_buffer))
    # One for the whole app: a flood of 429s costs one estimate per MAX_AGE.
    estimator = Estimator(router)
    quart = QuartTrio("llamaswap")
    # Generations may stream for many minutes: Quart's 60 s defaults would cut them.
    quart.config.update(RESPONSE_TIMEOUT=None, BODY_TIMEOUT=None, MAX_CONTENT_LENGTH=None)
    created = int(time.time())

    def local(name: str) -> str:
        target = router.names.resolve(name)
        if not isinstance(target, Local):
            raise ModelNotFound(name, peer=target.peer_id)
        return target.model_id

    @quart.errorhandler(RequestError)
    async def answer_error(error: RequestError) -> Response:
        message_only = request.path in ollama.ROUTES  # Ollama's clients read a string
        status, headers, body = error_response(error, message_only=message_only)
        return Response(body, status=status, headers=dict(headers))

    @quart.errorhandler(HTTPException)
    async def answer_http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status >= 500:  # a fault of llamaswap's (Quart has logged its traceback)
            return await answer_error(InternalError(f"{request.method} {request.path}"))
        code = (error.name or "error").lower().replace(" ", "_")
        message = f"{request.method} {request.path}: {(error.name or 'error').lower()}"
        error_body = {"message": message, "type": "invalid_request_error", "code": code}
        body = json.dumps({"error": {**error_body, "param": None}})
        headers = Headers(error.get_headers())  # a 405's Allow
        headers.remove("content-type")
        if isinstance(error, RequestRedirect):
            headers["location"] = _relative_location(error)
        return Response(body, status=status, headers=headers, content_type="application/json")

    @quart.before_request
    async def check_key() -> None:
        headers = credentials(request.scope["headers"])  # as the proxied routes read them
        # /health and the dashboard's own files (it must load to ask for a key) are
        # public; every request for data needs a key, the dashboard's included.
        public = request.path == "/health" or request.endpoint in ui.PUBLIC_ENDPOINTS
        if not public and not authorized(router.config.api_keys, headers):
            raise Unauthorized()

    @quart.before_request
    async def redirect_relative() -> Response | None:
        # werkzeug redirects //v1//models to /v1/models. Quart answers such a redirect
        # itself, without the error handlers, at an absolute URL built from the Host.
        redirect = request.routing_exception
        if isinstance(redirect, RequestRedirect):
            return await answer_http_error(redirect)
        return None

    @quart.get("/health")
    async def health() -> Response:
        return Response("OK", content_type="text/plain")

    def model_entry(
        name: str, target: Local | Peer, *, now: float, wall_now: float
    ) -> dict[str, Any]:
        """The ``/v1/models`` entry for ``name`` (an ID, alias or peer name) of ``target``."""
        entry: dict[str, Any] = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llamaswap",
        }
        if isinstance(target, Peer):  # its state is the peer's to say
            qualified = f"{target.peer_id}/{target.model}"
            return entry | {
                "name": qualified,
                "description": "",
                "context_length": None,
                "meta": {"peer": target.peer_id},
            }
        model = router.config.models[target.model_id]  # the current config: names' own
        stats = router.statistics(target.model_id)
        ttl = router.definition(target.model_id).idle_ttl
        status = model_status(stats, ttl, now=now, wall_now=wall_now)
        status.update(memory_entry(router.resources, target.model_id))
        return entry | {
            "name": model.name or target.model_id,
            "description": model.description or "",
            "status": client_status(stats),
            "context_length": props.context_length(target.model_id),
            **capability_fields(model.capabilities),
            "meta": {**model.metadata, "llamaswap": status},
        }

    def selector_entry(name: str, selector_id: str, selector: SelectorConfig) -> dict[str, Any]:
        """The ``/v1/models`` entry for ``name``, which reaches the selector ``selector_id``."""
        about = {"selector": {"strategy": selector.strategy, "targets": list(selector.targets)}}
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llamaswap",
            "name": selector.name or selector_id,
            "description": selector.description or "",
            "meta": {**selector.metadata, "llamaswap": about},
        }

    def entry(name: str, *, now: float, wall_now: float) -> dict[str, Any]:
        """The ``/v1/models`` entry for any name a request may use (ModelNotFound if none)."""
        names = router.names
        found = names.selector(name)
        if found is not None:
            return selector_entry(name, *found)
        return model_entry(name, names.resolve(name), now=now, wall_now=wall_now)

    @quart.get("/v1/models")
    @quart.get("/models")
    async def models() -> Response:
        now, wall_now = trio.current_time(), time.time()
        data = [entry(name, now=now, wall_now=wall_now) for name in listed_names(router)]
        return json_response({"object": "list", "data": data})

    @quart.get("/v1/models/<path:name>")
    @quart.get("/models/<path:name>")
    async def model_info(name: str) -> Response:
        # Any name a request may use, listed or not (an alias, an unlisted model, a bare
        # peer model name), as OpenAI answers for any model the key may use.
        return json_response(entry(name, now=trio.current_time(), wall_now=time.time()))

    @quart.get("/running")
    async def running() -> Response:
        entries = []
        for model_id in router.known_models():
            stats = router.statistics(model_id)
            if stats.shown_state == "stopped":
                continue
            model = router.definition(model_id)
            entries.append(
                {
                    "model": model_id,
                    "name": model.name or model_id,
                    "state": stats.shown_state,
                    "proxy": model.proxy,
                    "ttl": model.idle_ttl,
                    "pid": stats.pid,
                    "in_flight": stats.in_flight,
                    "failure": stats.failure_json(),
                    **memory_entry(router.resources, model_id),
                }
            )
        return json_response({"running": entries})

    @quart.post("/api/models/load/<path:name>")
    async def load(name: str) -> Response:
        exchange = Exchange(request.method, request.path)
        try:
            exchange.model = model_id = local(name)
            priority = parse_priority(request.headers.getlist(PRIORITY_HEADER))
            exchange.lease = router.lease(
                model_id,
                priority=priority,
                client=client_address(request.scope.get("client")),
                route=f"{request.method} {request.path}",
            )
            async with router.acquire(exchange.lease):
                pass
            exchange.status = 200
        except RequestError as exc:
            estimator.set_retry_after(exc)  # a 429's, when estimated
            exchange.status = error_response(exc)[0]
            exchange.error = str(exc)
            raise
        except trio.Cancelled:
            exchange.error = CLIENT_LEFT  # Quart cancels the view of a client that left
            raise
        finally:
            recorder.finish(exchange)
        return json_response({"model": model_id, "state": router.model_state(model_id).value})

    @quart.post("/api/models/unload")
    @quart.get("/unload")  # llama-swap's
    async def unload_all() -> Response:
        return json_response({"unloaded": sorted(await router.unload())})

    @quart.post("/api/models/unload/<path:name>")
    async def unload(name: str) -> Response:
        model_id = local(name)
        await router.unload([model_id])
        return json_response({"unloaded": [model_id]})

    @quart.post("/api/config/reload")
    async def reload_config() -> Response:
        if reloader is None:
            raise BadRequest("llamaswap was started without a config file to reload")
        result = await reloader.reload("api")
        if not result.ok:
            count = len(result.problems)
            message = f"the config has {count} problem(s); the running config stays"
            status, _, body = error_response(BadRequest(message))
            document = {**json.loads(body), **result.to_json()}
            return json_response(document, status)
        return json_response(result.to_json())

    @quart.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.exposition(), content_type=METRICS_CONTENT_TYPE)

    @quart.get("/gateway/metrics")
    async def gateway_metrics() -> Response:
        text = model_server.exposition(time.time())
        return Response(text, content_type=METRICS_CONTENT_TYPE)

    register(quart, router)
    history.register(quart, recorder.activity, store, recorder.captures)
    gpu.register(quart, router)
    ollama_models.register(quart, router, props.context_length)
    live.register(quart, router, recorder.activity, hub=hub, logs=logs)
    ui.register(quart)
    forwarder = Forwarder(router, pool, recorder, estimator=estimator, tracing=tracing)
    return Application(quart, forwarder, reloader, router, model_server, props, listen_hosts)
