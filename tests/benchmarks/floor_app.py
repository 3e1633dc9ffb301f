"""The floor under any proxy on llamaswap's stack, for bench_traffic.py to measure beside it.

    python tests/benchmarks/floor_app.py --port P constant
    python tests/benchmarks/floor_app.py --port P forward URL
    python tests/benchmarks/floor_app.py --port P forward-h11 URL

Plain ASGI apps on hypercorn's trio worker, with llamaswap's connection handler
(``llamaswap/_connections.py``: its idle timer) and its keep-alive settings:

* ``constant`` reads the request and answers a fixed small JSON body: what hypercorn alone
  costs per request, before any forwarding;
* ``forward`` sends every request to ``URL`` through llamaswap's own ``UpstreamPool`` and
  relays the answer, with nothing else: no routing, scheduling, disconnect watcher, usage,
  record or metrics. What is left between it and llamaswap is llamaswap's own work.

and, for comparison, the same forwarder without hypercorn:

* ``forward-h11`` is ``forward`` on a bare server loop (Trio streams and h11, one task per
  connection, keep-alive, nothing else): what the forwarding path would cost if a lean
  server replaced hypercorn there, as the upstream pool replaced httpx on the client side.
  A measuring device, not a server: no timeouts, limits or error answers.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from functools import partial
from pathlib import Path
from typing import Any

import h11
import hypercorn.config
import hypercorn.trio
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import llamaswap._connections  # noqa: F401  (installs llamaswap's connection handler)
from llamaswap.proxy.upstream import UpstreamPool

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


async def serve_h11(pool: UpstreamPool, upstream: str, stream: trio.SocketStream) -> None:
    """One client connection of ``forward-h11``: requests in turn, each forwarded."""
    connection = h11.Connection(h11.SERVER)

    async def next_event() -> Any:
        while (event := connection.next_event()) is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        return event

    with contextlib.suppress(trio.BrokenResourceError):  # a client hanging up (wrk)
        while isinstance(request := await next_event(), h11.Request):
            body = b""
            while isinstance(event := await next_event(), h11.Data):
                body += event.data
            forwarded = [(k, v) for k, v in request.headers if k not in (b"host", b"connection")]
            target = request.target.decode("latin-1")
            async with pool.request("POST", upstream, target, forwarded, body) as response:
                headers = [(k, v) for k, v in response.headers if k not in _OURS]
                out = connection.send(h11.Response(status_code=response.status, headers=headers))
                if any(k == b"content-length" for k, _ in headers):
                    out += connection.send(h11.Data(data=await response.read()))
                    await stream.send_all(out + connection.send(h11.EndOfMessage()))
                else:
                    await stream.send_all(out)
                    async for data in response.chunks():
                        await stream.send_all(connection.send(h11.Data(data=data)))
                    await stream.send_all(connection.send(h11.EndOfMessage()))
            connection.start_next_cycle()


async def main(port: int, mode: str, upstream: str) -> None:
    if mode == "forward-h11":
        async with UpstreamPool() as pool:
            await trio.serve_tcp(partial(serve_h11, pool, upstream), port, host="127.0.0.1")
        return
    settings = hypercorn.config.Config()
    settings.bind = [f"127.0.0.1:{port}"]
    settings.accesslog = None
    settings.keep_alive_max_requests = 2**31
    async with UpstreamPool() as pool:
        await hypercorn.trio.serve(app(pool if mode == "forward" else None, upstream), settings)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("mode", choices=["constant", "forward", "forward-h11"])
    parser.add_argument("upstream", nargs="?", default="")
    args = parser.parse_args()
    trio.run(main, args.port, args.mode, args.upstream)
