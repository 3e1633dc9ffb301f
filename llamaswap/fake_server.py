"""A simulated OpenAI-compatible model server: the stand-in for llama.cpp's ``llama-server``.

Run it as ``python -m llamaswap.fake_server --port N [...]``. The quickstart, the examples, the
end-to-end tests and the latency benchmarks all start it in place of a real inference server, so
it has to behave like one where the proxy can tell the difference:

* it binds its port at once but reports ``/health`` 503 until ``--load-seconds`` have passed,
  exactly like a server that is still loading weights;
* it streams Server-Sent Events one token per chunk, paced by ``--tokens-per-second``, and it
  notices a client that goes away mid-stream and stops generating;
* it can fail to start (``--fail-start``), crash mid-stream (``--crash-after-tokens``) and
  ignore SIGTERM (``--ignore-sigterm``), the three ways real servers make a supervisor's life
  hard.

Answers are deterministic: the words come from a fixed list, walked by a tiny pseudo-random
generator seeded with ``zlib.crc32`` of the model name and the last user message, so the same
request always gets the same text. Embeddings are derived from the input text the same way.

It is a plain ASGI callable served by hypercorn's Trio worker, the same stack as the proxy
itself: no extra dependency, real HTTP/1.1 keep-alive, and the ASGI ``http.disconnect`` message
for disconnect detection. Everything it prints goes to stdout one flushed line at a time,
prefixed with ``fake_server:``, because the proxy's supervisor captures and shows that output.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import socket
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, Final, final

import attrs
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import (
    ASGIReceiveCallable,
    ASGISendCallable,
    HTTPResponseStartEvent,
    Scope,
)

__all__ = ["FakeServer", "Options", "main", "parse_args"]

_WORDS: Final = (
    "amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor",
    "indigo", "juniper", "kestrel", "lagoon", "meadow", "nectar", "orchid", "pebble",
    "quartz", "river", "saffron", "tundra", "umber", "velvet", "willow", "yarrow",
    "zephyr", "anchor", "bramble", "canyon", "dune", "estuary", "falcon", "glacier",
    "heron", "island", "jasper", "kelp", "lantern", "marble", "nimbus", "ochre",
    "prairie", "quill", "reef", "summit", "thistle", "upland", "valley", "walnut",
    "alder", "beacon", "cobalt", "drift", "echo", "fern", "grove", "hollow",
    "ivory", "jetty", "knoll", "linen", "moss", "north", "opal", "pine",
)  # fmt: skip

_JSON_SEPARATORS: Final = (",", ":")


@attrs.frozen
class Options:
    """The command line, validated."""

    host: str = "127.0.0.1"
    port: int = 0
    model_name: str = "fake"
    load_seconds: float = 0.0
    tokens_per_second: float = 0.0
    max_tokens: int = 16
    fail_start: bool = False
    crash_after_tokens: int | None = None
    ignore_sigterm: bool = False
    embedding_size: int = 8


def _say(line: str) -> None:
    """One flushed stdout line; a vanished reader must not take a request down with it."""
    with contextlib.suppress(OSError, ValueError):
        print(f"fake_server: {line}", flush=True)


def _complain(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=_JSON_SEPARATORS).encode()


class _BadRequest(Exception):
    pass


# --- deterministic content ------------------------------------------------------------------


def _words(seed_text: str, count: int) -> Iterator[str]:
    """Yield ``count`` token strings: the first a bare word, the rest a space and a word."""
    state = zlib.crc32(seed_text.encode())
    for index in range(count):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        word = _WORDS[(state >> 8) % len(_WORDS)]
        yield word if index == 0 else " " + word


def _embedding(text: str, size: int) -> list[float]:
    """A unit vector of ``size`` floats that depends only on ``text``."""
    base = zlib.crc32(text.encode())
    raw = [
        zlib.crc32(index.to_bytes(4, "little"), base) / 0xFFFFFFFF * 2.0 - 1.0
        for index in range(size)
    ]
    norm = math.sqrt(sum(value * value for value in raw)) or 1.0
    return [round(value / norm, 6) for value in raw]


def _text_of(content: object) -> str:
    """The text of a message ``content``: a string, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _prompt_texts(prompt: object) -> list[str]:
    """``prompt``/``input`` as texts: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if all(isinstance(item, int) for item in prompt):
            return [" ".join(str(item) for item in prompt)] if prompt else []
        texts = []
        for item in prompt:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, list):
                texts.append(" ".join(str(token) for token in item))
            else:
                raise _BadRequest(f"unsupported prompt item {item!r}")
        return texts
    raise _BadRequest(f"expected a string or a list for the prompt, got {prompt!r}")


def _token_limit(body: dict[str, Any], default: int) -> tuple[int, bool]:
    """The response length and whether the request set it (then ``finish_reason`` is length)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _BadRequest(f"{key} must be a non-negative integer, got {value!r}")
        return value, True
    return default, False


@final
@attrs.define(eq=False)
class _Completion:
    """One generation request: what to say and how to wrap each piece of it."""

    kind: str  # "chat" or "text"
    id: str
    model: str
    created: int
    prompt_tokens: int
    seed: str  # what the words are derived from
    tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool

    def pieces(self) -> Iterator[str]:
        """The tokens, generated lazily: a huge max_tokens must not stall the event loop."""
        return _words(self.seed, self.tokens)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def response(self) -> dict[str, Any]:
        text = "".join(self.pieces())
        choice: dict[str, Any] = {"index": 0, "finish_reason": self.finish_reason}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        return {**self._envelope([choice], chunk=False), "usage": self.usage(self.tokens)}

    def chunk(self, index: int, piece: str | None) -> bytes:
        """The SSE event for token ``index``; ``piece=None`` is the closing finish_reason chunk."""
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "chat":
            delta: dict[str, str] = {} if piece is None else {"content": piece}
            if index == 0 and piece is not None:
                delta = {"role": "assistant", **delta}
            choice["delta"] = delta
        else:
            choice.update(text=piece or "", logprobs=None)
        choice["finish_reason"] = self.finish_reason if piece is None else None
        return b"data: " + _dumps(self._envelope([choice], chunk=True)) + b"\n\n"

    def usage_chunk(self) -> bytes:
        envelope = self._envelope([], chunk=True)
        envelope["usage"] = self.usage(self.tokens)
        return b"data: " + _dumps(envelope) + b"\n\n"


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
        self._routes: dict[tuple[str, str], _Handler] = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", "/props"): self._props,
            ("POST", "/v1/chat/completions"): partial(self._complete, "chat"),
            ("POST", "/v1/completions"): partial(self._complete, "text"),
            ("POST", "/v1/embeddings"): self._embeddings,
        }

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        _say(f"request {method} {path} at {time.time():.6f}")
        handler = self._routes.get((method, path))
        if handler is None:
            await self._json(send, 404, _error(f"no route for {method} {path}", "not_found_error"))
        elif not self.healthy and path != "/health":
            await self._json(send, 503, _error("Loading model", "unavailable_error"))
        else:
            try:
                await handler(receive, send)
            except _BadRequest as exc:
                await self._json(send, 400, _error(str(exc), "invalid_request_error"))

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
        body = _dumps(obj)
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

    async def _read_json(self, receive: ASGIReceiveCallable) -> dict[str, Any] | None:
        """The request body as a JSON object, or None if the client left while sending it."""
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            if message["type"] == "http.request":
                chunks.append(message["body"])
                if not message["more_body"]:
                    break
        try:
            body = json.loads(b"".join(chunks))
        except ValueError as exc:
            raise _BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
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
            "default_generation_settings": {"n_predict": options.max_tokens},
            "tokens_per_second": options.tokens_per_second,
            "build_info": "llamaswap.fake_server",
        }
        await self._json(send, 200, props)

    async def _embeddings(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        body = await self._read_json(receive)
        if body is None:
            return
        texts = _prompt_texts(body.get("input"))
        size = self.options.embedding_size
        data = [
            {"object": "embedding", "index": index, "embedding": _embedding(text, size)}
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
        job = self._completion(kind, body)
        options = self.options
        if (
            not job.stream
            and options.tokens_per_second == 0
            and options.crash_after_tokens is None
        ):
            await self._json(send, 200, job.response())  # the fast path: nothing to wait for
            return
        work = self._stream if job.stream else self._respond_when_done
        progress = _Progress()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect, receive, progress, nursery.cancel_scope)
            await work(send, job, progress)
            nursery.cancel_scope.cancel()
        if progress.disconnected:
            _say(f"client disconnected after {progress.tokens} tokens")

    def _completion(self, kind: str, body: dict[str, Any]) -> _Completion:
        count, limited = _token_limit(body, self.options.max_tokens)
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise _BadRequest(f"'messages' must be a list, got {messages!r}")
            texts = [_text_of(m.get("content")) for m in messages if isinstance(m, dict)]
            users = [
                _text_of(m.get("content"))
                for m in messages
                if isinstance(m, dict) and m.get("role") == "user"
            ]
            seed_text = users[-1] if users else ""
            prefix = "chatcmpl"
        else:
            texts = _prompt_texts(body.get("prompt", ""))
            seed_text = texts[-1] if texts else ""
            prefix = "cmpl"
        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(
            stream_options.get("include_usage")
        )
        name = self.options.model_name
        return _Completion(
            kind=kind,
            id=f"{prefix}-fake-{next(self._ids)}",
            model=name,
            created=int(time.time()),
            prompt_tokens=sum(len(text.split()) for text in texts),
            seed=f"{name}\0{seed_text}",
            tokens=count,
            finish_reason="length" if limited else "stop",
            stream=body.get("stream") is True,
            include_usage=include_usage,
        )

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
            _complain(f"fake_server: crashing after {tokens} tokens (--crash-after-tokens)")
            os._exit(3)

    async def _stream(self, send: ASGISendCallable, job: _Completion, progress: _Progress) -> None:
        headers = self._headers(b"text/event-stream")
        headers.append((b"cache-control", b"no-cache"))
        start: HTTPResponseStartEvent = {
            "type": "http.response.start",
            "status": 200,
            "headers": headers,
            "trailers": False,
        }
        await send(start)
        started = trio.current_time()
        for index, piece in enumerate(job.pieces()):
            self._maybe_crash(index)
            await self._pace(started, index + 1)
            chunk = job.chunk(index, piece)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            progress.tokens = index + 1
        tail = job.chunk(job.tokens, None)
        if job.include_usage:
            tail += job.usage_chunk()
        progress.complete = True
        await send(
            {"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False}
        )

    async def _respond_when_done(
        self, send: ASGISendCallable, job: _Completion, progress: _Progress
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
        await self._json(send, 200, job.response())


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind}}


# --- process lifetime -------------------------------------------------------------------------


def _hypercorn_config(options: Options) -> Config:
    """Bind the listening socket here, so a busy port is a plain OSError, then hand it over."""
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((options.host, options.port))
    except OSError:
        sock.close()
        raise
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn takes ownership of the descriptor
    config.loglevel = "WARNING"
    # Outlive the clients' idle timeouts (llamaswap's pool: 4 s, httpx: 5 s) so the client,
    # never the server, closes an idle keep-alive connection: no request races a close.
    config.keep_alive_timeout = 75.0
    config.keep_alive_max_requests = 2**31
    config.graceful_timeout = 1.0  # after SIGTERM, in-flight responses get this long
    return config


async def _run(options: Options) -> int:
    """Serve until SIGTERM/SIGINT (exit status 0) or a (simulated) failure (status 1)."""
    started = trio.current_time()
    app = FakeServer(options)
    try:
        config = _hypercorn_config(options)
    except OSError as exc:
        _complain(f"error: cannot listen on {options.host}:{options.port}: {exc}")
        return 1
    shutdown = trio.Event()
    exit_code = 0

    # The receiver is open before the port is announced: a supervisor may signal at once.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def serve_then_stop(*, task_status: trio.TaskStatus[list[str]]) -> None:
                await serve(
                    app,
                    config,
                    shutdown_trigger=shutdown.wait,
                    mode="asgi",
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel(reason="server shut down")

            async def load() -> None:
                nonlocal exit_code
                await trio.sleep_until(started + options.load_seconds)
                if options.fail_start:
                    _complain(f"error: failed to load model file '{options.model_name}.gguf'")
                    exit_code = 1
                    nursery.cancel_scope.cancel(reason="simulated load failure")
                    return
                app.healthy = True
                _say(f"healthy at {time.time():.6f}")

            async def watch_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == signal.SIGTERM and options.ignore_sigterm:
                        _say(f"received {name}, ignoring it (--ignore-sigterm)")
                        continue
                    _say(f"received {name}")
                    shutdown.set()

            (url,) = await nursery.start(serve_then_stop)
            _say(f"listening on {url} model={options.model_name} pid={os.getpid()}")
            nursery.start_soon(watch_signals)
            nursery.start_soon(load)
    return exit_code


def _number(kind: type[int] | type[float], minimum: int = 0) -> Callable[[str], Any]:
    """An argparse ``type`` accepting finite numbers >= ``minimum``."""

    def convert(text: str) -> int | float:
        value = kind(text)
        if not minimum <= value < math.inf:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {text!r}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its error messages
    return convert


def parse_args(argv: list[str] | None = None) -> Options:
    """Parse the command line into :class:`Options`."""
    parser = argparse.ArgumentParser(
        prog="python -m llamaswap.fake_server",
        description="A deterministic OpenAI-compatible stand-in for llama-server that simulates "
        "slow loads, token rates, failed starts, crashes and stubborn shutdowns. It logs one "
        "line per event to stdout.",
    )
    seconds, count = _number(float), _number(int)
    add = parser.add_argument
    # fmt: off
    add("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    add("--port", type=_number(int), required=True, help="port to bind; 0 picks a free one")
    add("--model-name", default="fake", help="model id it reports (default: %(default)s)")
    add("--load-seconds", type=seconds, default=0.0, metavar="S",
        help="/health answers 503 until S seconds after start (default: %(default)s)")
    add("--tokens-per-second", type=seconds, default=0.0, metavar="R",
        help="generation speed; 0 = as fast as possible (default: %(default)s)")
    add("--max-tokens", type=count, default=16, metavar="N",
        help="response length when the request sets no max_tokens (default: %(default)s)")
    add("--fail-start", action="store_true",
        help="after --load-seconds, print a load error to stderr and exit with status 1")
    add("--crash-after-tokens", type=count, metavar="N",
        help="after generating N tokens of a response, exit at once with status 3")
    add("--ignore-sigterm", action="store_true",
        help="log SIGTERM and keep running (SIGKILL or SIGINT still stop it)")
    add("--embedding-size", type=_number(int, minimum=1), default=8, metavar="N",
        help="length of /v1/embeddings vectors (default: %(default)s)")
    # fmt: on
    args = parser.parse_args(argv)
    if args.port > 65535:
        parser.error(f"--port must be at most 65535, got {args.port}")
    return Options(**{name: getattr(args, name) for name in attrs.fields_dict(Options)})


def main(argv: list[str] | None = None) -> None:
    """Run the fake server; exits with status 1 on a (simulated) start failure."""
    options = parse_args(argv)
    exit_code = trio.run(_run, options)
    if exit_code:
        sys.exit(exit_code)


if __name__ == "__main__":
    main()
