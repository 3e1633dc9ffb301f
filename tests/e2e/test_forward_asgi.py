"""The forwarder against its ASGI server's habits, driven in-process.

The router runs fake processes; the upstream is a real socket (a scripted h11 server), and
the ASGI ``receive``/``send`` pair plays hypercorn, so a test can do exactly what
hypercorn does at a chosen moment. Where it matters, a test plays both servers: another
ASGI server (the request's watcher task waits for ``http.disconnect``), and hypercorn as
llamaswap runs it (``llamaswap/http/server.py``), which calls the request's ``ClientLeft`` (its
``CLIENT_LEFT_EXTENSION``) as it hands over the message.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from llamaswap.config.model import Config, ModelConfig
from llamaswap.http.asgi import CLIENT_LEFT_EXTENSION, ClientLeft
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.router import Router
from tests.e2e.test_upstream_pool import serve_forever, start_server
from tests.fakes import FakeProbe, FakeSpawner


def http_scope(method: str, path: str, told: ClientLeft | None = None) -> dict[str, Any]:
    """An HTTP scope; with ``told``, as llamaswap's server makes it."""
    extensions: dict[str, Any] = {} if told is None else {CLIENT_LEFT_EXTENSION: told}
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "extensions": extensions,
    }


#: The servers a test plays: another ASGI server, and hypercorn as llamaswap runs it.
SERVERS = pytest.mark.parametrize("server", ["asgi", "llamaswap"])


def told_by(server: str) -> ClientLeft | None:
    """The request's ``ClientLeft``, if ``server`` offers one."""
    return ClientLeft() if server == "llamaswap" else None


def disconnecting(
    to_app: trio.MemorySendChannel[dict[str, Any]], told: ClientLeft | None
) -> Callable[[], Awaitable[None]]:
    """How the server hands the application ``http.disconnect``."""

    async def disconnect() -> None:
        if told is not None:
            told()
        await to_app.send({"type": "http.disconnect"})

    return disconnect


async def start(
    nursery: trio.Nursery, model: ModelConfig
) -> tuple[
    Router, trio.MemorySendChannel[dict[str, Any]], trio.MemoryReceiveChannel[dict[str, Any]]
]:
    """A running router for ``model`` (as ``m``), and the channel the ASGI app receives
    from, holding a bodiless request."""
    spawner = FakeSpawner(nursery)
    router = Router(Config(models={"m": model}), spawner=spawner, probe=FakeProbe(spawner))
    await nursery.start(router.run)
    to_app, from_server = trio.open_memory_channel[dict[str, Any]](10)
    await to_app.send({"type": "http.request", "body": b"", "more_body": False})
    return router, to_app, from_server


@SERVERS
async def test_the_end_of_a_response_is_not_taken_for_a_client_leaving(
    nursery: trio.Nursery, server: str
) -> None:
    """Once the last byte is out, hypercorn reports the stream closed as ``http.disconnect``
    while it is still inside ``send``, tidying up (its keep-alive timer). That must not
    cancel the request task there: it is not a client leaving."""
    told = told_by(server)
    upstream = await start_server(nursery, serve_forever)
    model = ModelConfig(cmd=("server", upstream.url.rsplit(":", 1)[1]), proxy=upstream.url)
    router, to_app, from_server = await start(nursery, model)
    disconnect = disconnecting(to_app, told)
    sent: list[dict[str, Any]] = []
    interrupted: list[str] = []

    async def send(message: Any) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await disconnect()
            try:  # hypercorn's bookkeeping after the last byte: a few checkpoints
                for _ in range(3):
                    await trio.lowlevel.checkpoint()
            except trio.Cancelled:
                interrupted.append("cancelled inside send")
                raise

    async with UpstreamPool() as pool:
        app = create_app(router, pool)
        with trio.fail_after(10):
            scope = http_scope("GET", "/upstream/m/ping", told)
            await app(scope, from_server.receive, send)  # type: ignore[arg-type]
    assert [(m["type"], m.get("status")) for m in sent] == [
        ("http.response.start", 200),
        ("http.response.body", None),
    ]
    assert sent[1]["body"] == b"/ping"
    assert interrupted == []


@SERVERS
async def test_a_finished_request_leaves_no_garbage_cycle(
    nursery: trio.Nursery, server: str
) -> None:
    """What a request held (its body, its reply, its exchange, hypercorn's channel) is
    freed by reference counting as soon as it is over: a cycle among them kept all of it
    until the garbage collector found it."""
    told = told_by(server)
    upstream = await start_server(nursery, serve_forever)
    model = ModelConfig(cmd=("server", upstream.url.rsplit(":", 1)[1]), proxy=upstream.url)
    router, to_app, from_server = await start(nursery, model)
    disconnect = disconnecting(to_app, told)

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            await disconnect()

    async with UpstreamPool() as pool:
        app = create_app(router, pool)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept, to be named
        try:
            with trio.fail_after(10):
                scope = http_scope("GET", "/upstream/m/ping", told)
                await app(scope, from_server.receive, send)  # type: ignore[arg-type]
            gc.collect()
            found = {type(thing).__name__ for thing in gc.garbage}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert not found & {"_Body", "_Reply", "Exchange", "Lease"}


async def test_a_fault_in_a_management_route_is_a_json_500_of_llamaswaps(
    nursery: trio.Nursery,
) -> None:
    """SPEC §4.3: llamaswap's own failure is ``server_error``/``internal_error`` (a werkzeug
    500 was labelled an invalid request)."""
    router, _to_app, from_server = await start(
        nursery, ModelConfig(cmd=("server", "1"), proxy="http://m:1")
    )
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async with UpstreamPool() as pool:
        app = create_app(router, pool)

        @app.quart.get("/api/boom")
        async def boom() -> str:
            raise RuntimeError("a bug")

        with trio.fail_after(10):
            await app(http_scope("GET", "/api/boom"), from_server.receive, send)  # type: ignore[arg-type]
    assert sent[0]["status"] == 500
    error = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert error["message"] == (
        "internal error in llamaswap (GET /api/boom); see its log for the traceback"
    )


@SERVERS
async def test_a_client_that_left_before_the_application_ran_is_noticed(
    nursery: trio.Nursery, server: str
) -> None:
    """The whole request came, then the client left, all before the application's task
    first ran (a busy proxy): the request must not be served."""
    told = told_by(server)
    upstream = await start_server(nursery, serve_forever)
    model = ModelConfig(cmd=("server", upstream.url.rsplit(":", 1)[1]), proxy=upstream.url)
    router, to_app, from_server = await start(nursery, model)
    await disconnecting(to_app, told)()
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async with UpstreamPool() as pool:
        app = create_app(router, pool)
        with trio.fail_after(10):
            scope = http_scope("GET", "/upstream/m/ping", told)
            await app(scope, from_server.receive, send)  # type: ignore[arg-type]
    assert sent == []
