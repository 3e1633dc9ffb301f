"""The fake server's ASGI application: routes, pacing, streaming and disconnect detection."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, final
from urllib.parse import parse_qs

import attrs
import trio
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    HTTPResponseStartEvent,
    Scope,
    WebsocketScope,
)

from ._content import (
    BadRequest,
    Completion,
    called_tool,
    chat_continuation,
    completion_continuation,
    dumps,
    embedding,
    encoded,
    error,
    form_fields,
    n_predict,
    prompt_texts,
    response_input,
    text_of,
    token_limit,
)
from ._slots import N_CTX, SlotCaches, SlotRefused


@attrs.frozen
class Options:
    """The command line, validated (``_cli.parse_args`` holds the defaults)."""

    host: str
    port: int
    model_name: str
    load_seconds: float
    tokens_per_second: float
    max_tokens: int
    fail_start: bool
    crash_after_tokens: int | None
    ignore_sigterm: bool
    embedding_size: int
    parallel: int = 0
    #: ``--memory``: bytes by device "allocated" once loaded (``_gpu.py``); empty: none.
    memory: Mapping[str, int] = attrs.field(factory=dict)
    #: ``--gpu-dir``: the GPU probe's test double (``FileProbe``) it allocates in.
    gpu_dir: str | None = None
    #: ``--cuda``: allocate ``memory`` for real, on the GPUs, with PyTorch.
    cuda: bool = False
    #: ``--ignore-prefill``: a chat's final assistant message does not continue the answer.
    ignore_prefill: bool = False
    #: ``--slot-save-path``: where slots are saved and restored from; None: refused.
    slot_save_path: str | None = None
    #: ``--kv-cache-usage``: the KV figure ``GET /metrics`` exports (as llama-server's
    #: ``--metrics``); None: no ``/metrics`` route.
    kv_cache_usage: float | None = None
    #: ``--cors-origins``: the pages whose ``Origin`` it names back, as llama-server does
    #: for every page (with ``Access-Control-Allow-Credentials``); ``("*",)``: any; empty:
    #: none, as a server that speaks no CORS.
    cors_origins: tuple[str, ...] = ("*",)


#: llama-server's answer to a preflight from a page it allows.
_PREFLIGHT = [
    (b"access-control-allow-methods", b"GET, POST"),
    (b"access-control-allow-headers", b"*"),
    (b"content-length", b"0"),
]


def _with_cors(send: ASGISendCallable, origin: bytes) -> ASGISendCallable:
    """``send``, naming ``origin`` in every answer as llama-server does."""

    async def send_with_cors(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            cors = [
                (b"access-control-allow-origin", origin),
                (b"access-control-allow-credentials", b"true"),
            ]
            message = {**message, "headers": [*message["headers"], *cors]}
        await send(message)

    return send_with_cors


def _with_header(send: ASGISendCallable, name: bytes, value: bytes) -> ASGISendCallable:
    """``send`` with one more field in the response's head."""

    async def send_with_header(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message["headers"], (name, value)]}
        await send(message)

    return send_with_header


def say(line: str) -> None:
    """One flushed stdout line; a vanished reader must not take a request down with it."""
    with contextlib.suppress(OSError, ValueError):
        print(f"fake_server: {line}", flush=True)


def complain(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


@final
@attrs.define(eq=False)
class _Progress:
    """Shared by a generation and the task watching for the client to leave."""

    tokens: int = 0
    complete: bool = False
    disconnected: bool = False


# --- the ASGI application ---------------------------------------------------------------------

_Handler = Callable[[ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


@final
class FakeServer:
    """The ASGI application. ``healthy`` flips once the simulated load is over."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.healthy = False
        self._ids = itertools.count(1)
        self._model_header = options.model_name.encode("latin-1", "replace")
        #: llama-server's slots: completions generated at once (``--parallel``).
        self._slots = trio.Semaphore(options.parallel) if options.parallel else None
        #: Each slot's prompt cache, and its files (``_slots.py``).
        self._caches = SlotCaches(options.parallel, options.model_name, options.slot_save_path)
        self._routes: dict[tuple[str, str], _Handler] = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", "/props"): self._props,
            ("POST", "/v1/chat/completions"): partial(self._complete, "chat"),
            ("POST", "/v1/completions"): partial(self._complete, "text"),
            # llama.cpp's native route: the same words as /v1/completions, its own shape.
            ("POST", "/completion"): partial(self._complete, "native"),
            ("POST", "/v1/messages"): partial(self._complete, "messages"),
            ("POST", "/v1/responses"): partial(self._complete, "responses"),
            ("POST", "/v1/embeddings"): self._embeddings,
            # llama-server serves the OpenAI routes without /v1 too.
            ("POST", "/chat/completions"): partial(self._complete, "chat"),
            ("POST", "/completions"): partial(self._complete, "text"),
            ("POST", "/embeddings"): self._embeddings,
            ("GET", "/slots"): self._list_slots,
        }
        if options.kv_cache_usage is not None:
            self._routes["GET", "/metrics"] = self._metrics

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await self._echo(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        traceparent = next((v for k, v in scope["headers"] if k == b"traceparent"), None)
        if traceparent is not None:  # shown back, so tests see what reached the model server
            send = _with_header(send, b"x-fake-traceparent", traceparent)
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        allowed = self.options.cors_origins
        if origin is not None and ("*" in allowed or origin.decode("latin-1") in allowed):
            send = _with_cors(send, origin)
            if method == "OPTIONS":  # a preflight, answered as llama-server answers it
                start: HTTPResponseStartEvent = {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": _PREFLIGHT,
                    "trailers": False,
                }
                await send(start)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        if path != "/health":  # as llama-server: readiness polls would crowd the log
            say(f"request {method} {path} at {time.time():.6f}")
        # HEAD as GET, as llama-server answers it (hypercorn leaves the body out).
        handler = self._routes.get(("GET" if method == "HEAD" else method, path))
        if handler is None and method == "POST" and path == "/v1/audio/transcriptions":
            content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
            handler = partial(self._transcribe, content_type)
        if handler is None and method == "POST" and path.startswith("/slots/"):
            query = parse_qs(scope["query_string"].decode("latin-1"))
            action = query.get("action", [""])[0]
            handler = partial(self._slot_action, path.removeprefix("/slots/"), action)
        if handler is None:
            await self._json(send, 404, error(f"no route for {method} {path}", "not_found_error"))
        elif not self.healthy and path != "/health":
            await self._json(send, 503, error("Loading model", "unavailable_error"))
        else:
            try:
                await handler(receive, send)
            except BadRequest as exc:
                await self._json(send, 400, error(str(exc), "invalid_request_error"))

    async def _echo(
        self, scope: WebsocketScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """``/ws``: a WebSocket that echoes each message, as ComfyUI's and realtime audio
        servers' stand-in; it accepts the first subprotocol asked for, and the text
        ``close`` makes it close with code 4000. Any other path is refused."""
        if (await receive())["type"] != "websocket.connect":
            return
        say(f"websocket {scope['path']} at {time.time():.6f}")
        if scope["path"] != "/ws" or not self.healthy:
            await send({"type": "websocket.close", "code": 1008, "reason": "no such socket"})
            return
        protocol = next(iter(scope.get("subprotocols", ())), None)
        await send({"type": "websocket.accept", "subprotocol": protocol, "headers": []})
        while (message := await receive())["type"] == "websocket.receive":
            text, data = message.get("text"), message.get("bytes")
            if text == "close":
                await send({"type": "websocket.close", "code": 4000, "reason": "asked to"})
                return
            await send({"type": "websocket.send", "text": text, "bytes": data})
        say("websocket closed by the client")

    async def _lifespan(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _headers(self, content_type: bytes) -> list[tuple[bytes, bytes]]:
        return [(b"content-type", content_type), (b"x-fake-model", self._model_header)]

    async def _json(self, send: ASGISendCallable, status: int, obj: object) -> None:
        body = dumps(obj)
        headers = self._headers(b"application/json")
        headers.append((b"content-length", str(len(body)).encode()))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": status,
            "headers": headers,
            "trailers": False,
        }
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _read_body(self, receive: ASGIReceiveCallable) -> bytes | None:
        """The request body, or None if the client left while sending it."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if message["type"] == "http.request":
                chunks.append(message["body"])
                if not message["more_body"]:
                    return b"".join(chunks)

    async def _read_json(self, receive: ASGIReceiveCallable) -> dict[str, Any] | None:
        """The request body as a JSON object, or None if the client left while sending it."""
        raw = await self._read_body(receive)
        if raw is None:
            return None
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
        return body

    # --- routes ---

    async def _health(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if self.healthy:
            await self._json(send, 200, {"status": "ok"})
        else:
            await self._json(send, 503, {"status": "loading"})

    async def _models(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        name = self.options.model_name
        model = {"id": name, "object": "model", "created": 0, "owned_by": "fake"}
        await self._json(send, 200, {"object": "list", "data": [model]})

    async def _props(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        options = self.options
        props = {
            "model": options.model_name,
            "model_path": f"{options.model_name}.gguf",
            "total_slots": 1,
            "default_generation_settings": {"n_ctx": N_CTX, "n_predict": options.max_tokens},
            "tokens_per_second": options.tokens_per_second,
            "build_info": "llamaswap.fake_server",
        }
        await self._json(send, 200, props)

    async def _metrics(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        body = (
            "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
            f"llamacpp:kv_cache_usage_ratio {self.options.kv_cache_usage}\n"
        ).encode()
        headers = self._headers(b"text/plain; version=0.0.4")
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers,
                    "trailers": False})  # fmt: skip
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _list_slots(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await self._json(send, 200, self._caches.describe())

    async def _slot_action(
        self, slot: str, action: str, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """``POST /slots/{slot}?action=save|restore``, ``{"filename": ...}``."""
        body = await self._read_json(receive)
        if body is None:
            return
        filename = body.get("filename")
        try:
            if action == "save":
                answer = self._caches.save(slot, filename)
                say(f"saved slot {slot} to {filename} ({answer['n_saved']} tokens)")
            elif action == "restore":
                answer = self._caches.restore(slot, filename)
                say(f"restored slot {slot} from {filename} ({answer['n_restored']} tokens)")
            else:
                raise SlotRefused(400, "Invalid action")
        except SlotRefused as exc:
            await self._json(send, exc.status, error(str(exc), exc.kind))
            return
        await self._json(send, 200, answer)

    async def _transcribe(
        self, content_type: str, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """``/v1/audio/transcriptions``: a multipart or URL-encoded form; the answer says
        the ``model`` field the server was sent and how many bytes its ``file`` held."""
        body = await self._read_body(receive)
        if body is None:
            return
        fields = form_fields(body, content_type)
        text = f"fake transcription of {len(fields.get('file', b''))} bytes"
        model = fields.get("model")
        answer = {
            "text": text,
            "model": None if model is None else model.decode("utf-8", "replace"),
        }
        await self._json(send, 200, answer)

    async def _embeddings(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        body = await self._read_json(receive)
        if body is None:
            return
        texts = prompt_texts(body.get("input"))
        size, encoding_format = self.options.embedding_size, body.get("encoding_format")
        data = [
            {
                "object": "embedding",
                "index": index,
                "embedding": encoded(embedding(text, size), encoding_format),
            }
            for index, text in enumerate(texts)
        ]
        tokens = sum(len(text.split()) for text in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        response = {"object": "list", "data": data, "model": self.options.model_name}
        await self._json(send, 200, {**response, "usage": usage})

    async def _complete(
        self, kind: str, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        body = await self._read_json(receive)
        if body is None:
            return
        received = trio.current_time()  # "prompt processing" starts: timings measure from here
        job, words = self._completion(kind, body)
        options = self.options
        if (
            not job.stream
            and options.tokens_per_second == 0
            and options.crash_after_tokens is None
        ):
            # The fast path: nothing to wait for.
            started = trio.current_time()
            document = job.response()
            ended = trio.current_time()
            document["timings"] = job.timings(started - received, ended - started)
            await self._json(send, 200, document)
            self._caches.generated(job.slot, words + "".join(job.pieces()).split())
            return
        work = self._stream if job.stream else self._respond_when_done
        progress = _Progress()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, receive, progress, nursery.cancel_scope)
            async with self._slots or contextlib.nullcontext():
                await work(send, job, progress, received)
            nursery.cancel_scope.cancel()
        if progress.complete:  # the slot holds the answer too (cut short: the prompt only)
            self._caches.generated(job.slot, words + "".join(job.pieces()).split())
        if progress.disconnected:
            say(f"client disconnected after {progress.tokens} tokens")

    def _completion(self, kind: str, body: dict[str, Any]) -> tuple[Completion, list[str]]:
        """The generation ``body`` asks for, and its prompt's tokens (words), which a slot
        now caches."""
        if kind == "native":
            count, limited = n_predict(body, self.options.max_tokens)
        elif kind == "responses":
            count, limited = token_limit(body, self.options.max_tokens, ("max_output_tokens",))
        else:
            count, limited = token_limit(body, self.options.max_tokens)
        finish_reason = "length" if limited else "stop"
        if kind == "responses":
            texts, question = response_input(body)
            finish_reason = "incomplete" if limited else "completed"  # the response's status
            seed, start = chat_continuation(self.options.model_name, question, "")
            prefix = "resp"
        elif kind in ("chat", "messages"):
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise BadRequest(f"'messages' must be a list, got {messages!r}")
            texts = [text_of(m.get("content")) for m in messages if isinstance(m, dict)]
            if kind == "messages":  # the system prompt is a key of its own
                texts.insert(0, text_of(body.get("system")))
                finish_reason = "max_tokens" if limited else "end_turn"
            users = [
                text_of(m.get("content"))
                for m in messages
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            question = users[-1] if users else ""
            # A final assistant message is a prefill: the answer continues it, unless
            # --ignore-prefill makes this a server that answers from scratch regardless.
            last = messages[-1] if messages else None
            prefill = None
            if isinstance(last, dict) and last.get("role") == "assistant":
                prefill = text_of(last.get("content"))
            if prefill is None or self.options.ignore_prefill:
                prefill = ""
            seed, start = chat_continuation(self.options.model_name, question, prefill)
            prefix = "msg" if kind == "messages" else "chatcmpl"
        else:
            texts = prompt_texts(body.get("prompt", ""))
            prompt = texts[-1] if texts else ""
            seed, start = completion_continuation(self.options.model_name, prompt)
            prefix = "cmpl"
        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage")
        )
        name = self.options.model_name
        tool = called_tool(kind, body) if kind in ("chat", "messages") else None
        if tool is not None:
            finish_reason = "tool_use" if kind == "messages" else "tool_calls"
        words = [word for text in texts for word in text.split()]
        slot, cached = self._caches.take(words)
        job = Completion(
            kind=kind,
            id=f"{prefix}-fake-{next(self._ids)}",
            model=name,
            created=int(time.time()),
            prompt_tokens=len(words),
            seed=seed,
            start=start,
            tokens=count,
            finish_reason=finish_reason,
            stream=body.get("stream") is True,
            include_usage=include_usage,
            tool=tool,
            slot=slot,
            cached=cached,
        )
        return job, words

    async def _watch_disconnect(
        self, receive: ASGIReceiveCallable, progress: _Progress, scope: trio.CancelScope
    ) -> None:
        while True:
            message = await receive()
            # hypercorn also says http.disconnect once the response is complete; that one is
            # not a client leaving, hence the `complete` flag set before the last send.
            if message["type"] == "http.disconnect":
                if not progress.complete:
                    progress.disconnected = True
                    scope.cancel(reason="client disconnected")
                return

    async def _pace(self, started: float, tokens: int) -> None:
        """Wait until ``tokens`` tokens are due; a checkpoint even when unpaced, so a
        disconnect can always cancel the generation."""
        rate = self.options.tokens_per_second
        if rate > 0:
            await trio.sleep_until(started + tokens / rate)
        else:
            await trio.lowlevel.checkpoint()

    def _maybe_crash(self, tokens: int) -> None:
        if tokens == self.options.crash_after_tokens:
            complain(f"fake_server: crashing after {tokens} tokens (--crash-after-tokens)")
            os._exit(3)

    async def _stream(
        self, send: ASGISendCallable, job: Completion, progress: _Progress, received: float
    ) -> None:
        headers = self._headers(b"text/event-stream")
        headers.append((b"cache-control", b"no-cache"))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": 200,
            "headers": headers,
            "trailers": False,
        }
        await send(start)
        if head := job.head():
            await send({"type": "http.response.body", "body": head, "more_body": True})
        started = trio.current_time()
        for index, piece in enumerate(job.pieces()):
            self._maybe_crash(index)
            await self._pace(started, index + 1)
            chunk = job.chunk(index, piece)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            progress.tokens = index + 1
        tail = job.tail(job.timings(started - received, trio.current_time() - started))
        progress.complete = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _respond_when_done(
        self, send: ASGISendCallable, job: Completion, progress: _Progress, received: float
    ) -> None:
        """Take as long as streaming would have, then answer in one piece."""
        crash_at = self.options.crash_after_tokens
        started = trio.current_time()
        try:
            if crash_at is not None and crash_at < job.tokens:
                await self._pace(started, crash_at)
                self._maybe_crash(crash_at)
            await self._pace(started, job.tokens)
        finally:  # on a disconnect: how far generation got, for the log line
            elapsed = trio.current_time() - started
            progress.tokens = min(job.tokens, int(elapsed * self.options.tokens_per_second))
        progress.tokens = job.tokens
        progress.complete = True
        document = job.response()
        document["timings"] = job.timings(started - received, trio.current_time() - started)
        await self._json(send, 200, document)
