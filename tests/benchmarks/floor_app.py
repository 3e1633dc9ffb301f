"""The floor under any proxy on llamaswap's stack, for bench_traffic.py to measure beside it.

    python tests/benchmarks/floor_app.py --port P constant
    python tests/benchmarks/floor_app.py --port P forward URL

Plain ASGI apps on hypercorn's trio worker, configured as llamaswap configures it:

* ``constant`` reads the request and answers a fixed small JSON body: what hypercorn alone
  costs per request, before any forwarding;
* ``forward`` sends every request to ``URL`` through llamaswap's own ``UpstreamPool`` and
  relays the answer, with nothing else: no routing, scheduling, disconnect watcher, usage,
  record or metrics. What is left between it and llamaswap is llamaswap's own work.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import hypercorn.config
import hypercorn.trio
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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


async def main(port: int, mode: str, upstream: str) -> None:
    settings = hypercorn.config.Config()
    settings.bind = [f"127.0.0.1:{port}"]
    settings.accesslog = None
    settings.keep_alive_max_requests = 2**31
    async with UpstreamPool() as pool:
        await hypercorn.trio.serve(app(pool if mode == "forward" else None, upstream), settings)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("mode", choices=["constant", "forward"])
    parser.add_argument("upstream", nargs="?", default="")
    args = parser.parse_args()
    trio.run(main, args.port, args.mode, args.upstream)
