"""The floor under any proxy on llamaswap's stack, for bench_traffic.py to measure beside it.

    python tests/benchmarks/floor_app.py --port P constant
    python tests/benchmarks/floor_app.py --port P forward URL
    python tests/benchmarks/floor_app.py --port P forward-h11 URL
    python tests/benchmarks/floor_app.py --port P llamaswap-h11 CONFIG

Plain ASGI apps on hypercorn's trio worker, with llamaswap's connection handler
(``llamaswap/http/server.py``: its idle timer) and its keep-alive settings:

* ``constant`` reads the request and answers a fixed small JSON body: what hypercorn alone
  costs per request, before any forwarding;
* ``forward`` sends every request to ``URL`` through llamaswap's own ``UpstreamPool`` and
  relays the answer, with nothing else: no routing, scheduling, disconnect watcher, usage,
  record or metrics. What is left between it and llamaswap is llamaswap's own work.

and, for comparison, the same ASGI applications without hypercorn, on a bare server loop
(Trio streams and h11, one task per connection, keep-alive, an answer's head and body in
one write, nothing else): what they would cost if a lean server replaced hypercorn, as
the upstream pool replaced httpx on the client side. A measuring device, not a server: no
timeouts, limits, error answers, ``Expect``, pipelining, or watching for a client leaving.

* ``forward-h11`` is ``forward`` on the bare loop;
* ``llamaswap-h11`` is llamaswap itself (``llamaswap --config CONFIG``), all of it, with
  the bare loop in the place of ``hypercorn.trio.serve``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from email.utils import formatdate
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
import hypercorn.config
import hypercorn.trio
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llamaswap.http.server
from llamaswap import cli
from llamaswap.http.asgi import CLIENT_LEFT_EXTENSION, ClientLeft
from llamaswap.http.client import UpstreamPool

ANSWER = b'{"id": "floor", "object": "chat.completion", "choices": []}'
_OURS = {b"date", b"server", b"connection", b"transfer-encoding"}


def app(pool: UpstreamPool | None, upstream: str) -> Any:
    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if pool is None:
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": ANSWER})
            return
        forwarded = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"connection")]
        async with pool.request(
            scope["method"], upstream, scope["path"], forwarded, body
        ) as response:
            headers = [(k, v) for k, v in response.headers if k not in _OURS]
            start = {"type": "http.response.start", "status": response.status, "headers": headers}
            await send(start)
            if any(k == b"content-length" for k, _ in headers):  # in one piece, as llamaswap
                await send({"type": "http.response.body", "body": await response.read()})
                return
            async for data in response.chunks():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return serve


async def serve_bare(app: Any, stream: trio.SocketStream) -> None:
    """One client connection on the bare server loop: requests in turn, each handed to the
    ASGI ``app`` as hypercorn would hand it (its body already in a queue, and llamaswap's
    ``ClientLeft`` called as the answer ends), with h11 and nothing else."""
    connection = h11.Connection(h11.SERVER)
    client, server = stream.socket.getpeername()[:2], stream.socket.getsockname()[:2]

    async def next_event() -> Any:
        while (event := connection.next_event()) is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        return event

    with contextlib.suppress(trio.BrokenResourceError):  # a client hanging up (wrk)
        while isinstance(request := await next_event(), h11.Request):
            body = b""
            while isinstance(event := await next_event(), h11.Data):
                body += event.data
            path, _, query = request.target.partition(b"?")
            left = ClientLeft()
            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": request.method.decode(), "scheme": "http",
                "path": unquote_to_bytes(path).decode(), "raw_path": path,
                "query_string": query, "root_path": "", "headers": list(request.headers),
                "client": client, "server": server, "extensions": {CLIENT_LEFT_EXTENSION: left},
            }  # fmt: skip
            put, get = trio.open_memory_channel[Any](1)
            put.send_nowait({"type": "http.request", "body": body, "more_body": False})
            await app(scope, get.receive, partial(_send, connection, stream, left, []))
            connection.start_next_cycle()


async def _send(
    connection: h11.Connection,
    stream: trio.SocketStream,
    left: ClientLeft,
    head: list[bytes],
    message: Any,
) -> None:
    """The bare loop's ASGI ``send``: an answer's head goes out with its body."""
    if message["type"] == "http.response.start":
        date = (b"date", formatdate(usegmt=True).encode())
        headers = [*message["headers"], date, (b"server", b"bare")]
        head.append(connection.send(h11.Response(status_code=message["status"], headers=headers)))
        return
    data = message.get("body", b"")
    out = connection.send(h11.Data(data=data)) if data else b""
    if not message.get("more_body", False):
        out += connection.send(h11.EndOfMessage())
        left()
    if out := b"".join(head) + out:
        head.clear()
        await stream.send_all(out)


async def serve_bare_forever(
    app: Any, port: int, *, task_status: trio.TaskStatus[object] = trio.TASK_STATUS_IGNORED
) -> None:
    """``app`` on the bare server loop, after its lifespan startup (Quart's hooks)."""
    put, get = trio.open_memory_channel[Any](1)
    put.send_nowait({"type": "lifespan.startup"})
    started = trio.Event()

    async def lifespan_send(message: Any) -> None:
        started.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            app, {"type": "lifespan", "asgi": {"version": "3.0"}}, get.receive, lifespan_send
        )
        await started.wait()
        handler = partial(serve_bare, app)
        await trio.serve_tcp(handler, port, host="127.0.0.1", task_status=task_status)


async def bare_hypercorn(
    app: Any, config: hypercorn.config.Config, *, shutdown_trigger: Any, task_status: Any
) -> None:
    """What ``llamaswap-h11`` puts in the place of ``hypercorn.trio.serve``."""
    port = int(config.bind[0].rpartition(":")[2])
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_bare_forever, app, port)
        task_status.started([f"http://127.0.0.1:{port}"])
        await shutdown_trigger()
        nursery.cancel_scope.cancel()


async def main(port: int, mode: str, upstream: str) -> None:
    if mode == "forward-h11":
        async with UpstreamPool() as pool:
            await serve_bare_forever(app(pool, upstream), port)
        return
    settings = hypercorn.config.Config()
    settings.bind = [f"127.0.0.1:{port}"]
    settings.accesslog = None
    settings.keep_alive_max_requests = 2**31
    llamaswap.http.server.install()
    async with UpstreamPool() as pool:
        await hypercorn.trio.serve(app(pool if mode == "forward" else None, upstream), settings)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("mode", choices=["constant", "forward", "forward-h11", "llamaswap-h11"])
    parser.add_argument("upstream", nargs="?", default="", help="a URL; llamaswap: a config file")
    args = parser.parse_args()
    if args.mode == "llamaswap-h11":
        hypercorn.trio.serve = bare_hypercorn  # type: ignore[assignment]
        cli.main(["--config", args.upstream, "--listen", f"127.0.0.1:{args.port}"])
        sys.exit()
    trio.run(main, args.port, args.mode, args.upstream)
