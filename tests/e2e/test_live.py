"""Logs and the event stream over real HTTP: ``/logs``, ``/logs/stream``, ``/api/events``.

Two kinds of tests. In-process ones serve the app with hypercorn on a real socket (real
clock, fake model processes), so they can look inside: that a line appended after the
client connected reaches it while the response is still open (streamed, not buffered),
and that a client hanging up leaves no subscriber behind. The others run the real CLI
with real fake-server processes, like ``test_proxy.py``.

Streams are read with ``LiveStream`` (h11 on a Trio socket): piece by piece, telling a
body that ended properly from a connection that was cut, and hanging up by closing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, final

import h11
import httpx
import hypercorn.config
import hypercorn.trio
import pytest
import trio
import trio.testing

from llamaswap.config.model import Config, ModelConfig
from llamaswap.observability import EventHub, Logs
from llamaswap.process import LogRing
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.router import Router
from tests.e2e.conftest import StartProxy
from tests.e2e.test_operations import wait_for_request
from tests.e2e.test_proxy import chat, config
from tests.fakes import FakeProbe, FakeSpawner, Script

Event = dict[str, Any]


@final
class LiveStream:
    """One GET whose response body is read line by line as it arrives."""

    def __init__(self, stream: trio.SocketStream, connection: h11.Connection) -> None:
        self._stream = stream
        self._connection = connection
        self._buffer = b""
        self._ended = False
        self.status = 0
        self.headers: dict[str, str] = {}

    @classmethod
    async def open(
        cls, url: str, path: str, headers: Sequence[tuple[str, str]] = ()
    ) -> LiveStream:
        host, _, port = url.removeprefix("http://").partition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        connection = h11.Connection(h11.CLIENT)
        request = h11.Request(method="GET", target=path, headers=[("host", host), *headers])
        await stream.send_all(connection.send(request) + connection.send(h11.EndOfMessage()))
        live = cls(stream, connection)
        response = await live._next_event()
        assert isinstance(response, h11.Response), response
        live.status = response.status_code
        live.headers = {k.decode(): v.decode() for k, v in response.headers}
        return live

    async def next_line(self) -> str | None:
        """The next line of the body; ``None`` once it has ended properly (a cut
        connection raises ``h11.RemoteProtocolError``)."""
        while b"\n" not in self._buffer:
            if self._ended:
                assert self._buffer == b"", self._buffer
                return None
            event = await self._next_event()
            if isinstance(event, h11.Data):
                self._buffer += bytes(event.data)
            else:
                assert isinstance(event, h11.EndOfMessage), event
                self._ended = True
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def rest(self) -> list[str]:
        lines = []
        while (line := await self.next_line()) is not None:
            lines.append(line)
        return lines

    async def aclose(self) -> None:
        """Hang up."""
        await self._stream.aclose()

    async def _next_event(self) -> Any:
        while True:
            event = self._connection.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._connection.receive_data(await self._stream.receive_some(65536))


@final
class Served:
    def __init__(self, url: str, router: Router, hub: EventHub, logs: Logs) -> None:
        self.url = url
        self.router = router
        self.hub = hub
        self.logs = logs

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10.0, **kwargs)


async def serve_in_process(nursery: trio.Nursery, config: Config) -> Served:
    """The app as ``serve()`` builds it, on 127.0.0.1:0, with fake model processes."""
    spawner = FakeSpawner(nursery, Script(healthy_after=0.0, output=("model says hi",)))
    router = Router(config, spawner=spawner, probe=FakeProbe(spawner))
    hub = EventHub()
    logs = Logs.of(LogRing(), router)
    await nursery.start(hub.run)
    await nursery.start(router.run)
    pool = UpstreamPool()
    app = create_app(router, pool, hub=hub, logs=logs)
    settings = hypercorn.config.Config()
    settings.bind = ["127.0.0.1:0"]
    settings.accesslog = None
    binds = await nursery.start(partial(hypercorn.trio.serve, app, settings))
    return Served(binds[0], router, hub, logs)


def one_model(**top: Any) -> Config:
    model = ModelConfig(cmd=("server", "1"), proxy="http://m:1")  # argv names its port
    return Config(models={"chat": model}, **top)


@final
class Events:
    """An ``/api/events`` client's events as they arrive, to wait on."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.pings = 0
        self.ended = False
        self._changed = trio.Event()

    async def read(self, stream: LiveStream) -> None:
        """Until the body ends (``ended``); a cut connection raises."""
        name = ""
        try:
            while (line := await stream.next_line()) is not None:
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    event = json.loads(line.removeprefix("data: "))
                    assert event["type"] == name
                    self.events.append(event)
                    self._wake()
                elif line == ": ping":
                    self.pings += 1
            self.ended = True
        finally:
            self._wake()

    async def follow(self, url: str, *, task_status: trio.TaskStatus[None]) -> None:
        """Read ``url``'s ``/api/events`` to its end (a cut connection fails the test)."""
        stream = await LiveStream.open(url, "/api/events")
        try:
            task_status.started()
            await self.read(stream)
        finally:
            await stream.aclose()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, condition: Callable[[Event], bool]) -> Event:
        seen = 0
        while True:
            for event in self.events[seen:]:
                if condition(event):
                    return event
            seen = len(self.events)
            assert not self.ended, "the stream ended first"
            await self._changed.wait()

    async def wait_end(self) -> None:
        while not self.ended:
            await self._changed.wait()

    def transitions(self) -> list[Event]:
        """The events less the model events that repeat their model's state and PID
        (sent again for its counts and TTL as requests come and go)."""
        kept: list[Event] = []
        last: dict[str, tuple[Any, Any]] = {}
        for event in self.events:
            if event["type"] == "snapshot":
                last.update(
                    {entry["model"]: (entry["state"], entry["pid"]) for entry in event["models"]}
                )
            elif event["type"] == "model":
                if last.get(event["model"]) == (event["state"], event["pid"]):
                    continue
                last[event["model"]] = (event["state"], event["pid"])
            kept.append(event)
        return kept

    def lifecycle(self) -> list[tuple[Any, ...]]:
        """Model transitions and request events, by their telling fields, in arrival order."""
        return [
            (event["type"], event["model"], event["state"])
            for event in self.transitions()
            if event["type"] in ("model", "request")
        ]


# ----------------------------------------------------------------- in-process


async def test_a_log_stream_sends_lines_as_they_happen_and_leaves_no_follower(
    nursery: trio.Nursery,
) -> None:
    served = await serve_in_process(nursery, one_model())
    ring = served.router.log_rings()["chat"]
    with trio.fail_after(10):
        await served.router.load("chat")
        stream = await LiveStream.open(served.url, "/logs/stream/chat")
        try:
            assert stream.status == 200
            assert stream.headers["content-type"].startswith("text/plain")
            assert stream.headers["x-accel-buffering"] == "no"
            assert await stream.next_line() == "model says hi"  # the history
            assert served.logs.followers() == 1
            ring.append(trio.current_time(), "said later")  # while the response is open
            assert await stream.next_line() == "said later"
        finally:
            await stream.aclose()
        # The client hung up: its follower is gone.
        await served.logs.drained()
    assert served.logs.followers() == 0


async def test_no_history_sends_only_later_lines_and_the_mixed_stream_prefixes_them(
    nursery: trio.Nursery,
) -> None:
    served = await serve_in_process(nursery, one_model())
    ring = served.router.log_rings()["chat"]
    with trio.fail_after(10):
        await served.router.load("chat")
        stream = await LiveStream.open(served.url, "/logs/stream?no-history")
        try:
            # The body (and its subscription) starts just after the head: let it.
            await trio.testing.wait_all_tasks_blocked()
            assert served.logs.followers() == 1
            ring.append(trio.current_time(), "fresh")
            served.logs.own.append(trio.current_time(), "INFO llamaswap: own line")
            assert await stream.next_line() == "[chat] fresh"
            assert await stream.next_line() == "INFO llamaswap: own line"
        finally:
            await stream.aclose()
        async with served.client() as client:
            history = await client.get("/logs")
    assert history.headers["content-type"].startswith("text/plain")
    assert history.text.splitlines() == [
        "[chat] model says hi",
        "[chat] fresh",
        "INFO llamaswap: own line",
    ]


async def test_an_event_client_that_hangs_up_leaves_no_subscriber(nursery: trio.Nursery) -> None:
    served = await serve_in_process(nursery, one_model())
    events = Events()
    with trio.fail_after(10):
        stream = await LiveStream.open(served.url, "/api/events")
        async with trio.open_nursery() as reading:
            assert stream.headers["content-type"] == "text/event-stream"
            reading.start_soon(events.read, stream)
            snapshot = await events.wait_for(lambda e: True)
            assert snapshot["type"] == "snapshot"
            assert served.hub.statistics().subscribers == 1
            await served.router.load("chat")
            await events.wait_for(lambda e: e["type"] == "model" and e["state"] == "ready")
            reading.cancel_scope.cancel()
        await stream.aclose()
        await served.hub.drained()
    assert served.hub.statistics().subscribers == 0


async def test_closing_ends_every_stream_cleanly(nursery: trio.Nursery) -> None:
    served = await serve_in_process(nursery, one_model())
    events = Events()
    log_lines: list[str] = []

    async def follow_logs(stream: LiveStream) -> None:
        log_lines.extend(await stream.rest())  # raises if the body does not end properly

    with trio.fail_after(10):
        logs = await LiveStream.open(served.url, "/logs/stream")
        stream = await LiveStream.open(served.url, "/api/events?logs=1")
        try:
            async with trio.open_nursery() as clients:
                clients.start_soon(follow_logs, logs)
                clients.start_soon(events.read, stream)
                await events.wait_for(lambda e: e["type"] == "snapshot")
                served.logs.own.append(trio.current_time(), "the last word")
                await events.wait_for(lambda e: e["type"] == "log")
                served.hub.close()
                served.logs.close()
        finally:
            await logs.aclose()
            await stream.aclose()
    assert events.ended
    assert log_lines[-1] == "the last word"
    assert events.events[-1] == {"type": "log", "model": None, "text": "the last word"}


async def test_unknown_model_is_a_json_404(nursery: trio.Nursery) -> None:
    served = await serve_in_process(nursery, one_model())
    async with served.client() as client:
        response = await client.get("/logs/stream/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    assert served.logs.followers() == 0


@pytest.mark.parametrize("path", ["/logs", "/logs/stream", "/logs/stream/chat", "/api/events"])
async def test_api_keys_guard_the_live_routes(nursery: trio.Nursery, path: str) -> None:
    served = await serve_in_process(nursery, one_model(api_keys=("sk-secret",)))
    async with served.client() as client:
        refused = await client.get(path)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    with trio.fail_after(10):
        stream = await LiveStream.open(served.url, path, [("authorization", "Bearer sk-secret")])
        await stream.aclose()
    assert stream.status == 200


# ------------------------------------------------------------- the real proxy

ONE_MODEL = config('[models.alpha]\ncmd = "${fake} --load-seconds 0.2"')


async def test_a_client_that_came_while_nobody_listened_hears_the_queue_change(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """The last queue event anyone got said "empty"; a load starts while nobody listens;
    a client that comes during it must hear the queue go back to empty."""
    proxy = await proxy_factory(ONE_MODEL.replace("--load-seconds 0.2", "--load-seconds 1"))
    first, second = Events(), Events()
    async with proxy.client() as client:
        with trio.fail_after(30):
            async with trio.open_nursery() as listening:
                await listening.start(first.follow, proxy.url)
                assert (await client.post("/api/models/load/alpha")).status_code == 200
                await first.wait_for(lambda e: e["type"] == "queue" and e["loading"] == 1)
                await first.wait_for(lambda e: e["type"] == "queue" and e["loading"] == 0)
                listening.cancel_scope.cancel()  # hangs up
            assert (await client.post("/api/models/unload")).status_code == 200
            async with trio.open_nursery() as loading:
                loading.start_soon(client.post, "/api/models/load/alpha")
                await wait_for_request(client, "alpha", "loading")
                await nursery.start(second.follow, proxy.url)
                snapshot = await second.wait_for(lambda e: e["type"] == "snapshot")
                assert snapshot["queue"]["loading"] == 1
                await second.wait_for(lambda e: e["type"] == "queue" and e["loading"] == 0)


async def test_events_tell_a_load_serve_unload_in_order_and_a_late_client_the_state(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(ONE_MODEL)
    early, late = Events(), Events()
    async with proxy.client() as client:
        with trio.fail_after(30):
            await nursery.start(early.follow, proxy.url)
            await early.wait_for(lambda e: e["type"] == "snapshot")
            answer = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert answer.status_code == 200
            record = await early.wait_for(lambda e: e["type"] == "activity")
            assert record["record"]["status"] == 200
            assert record["record"]["path"] == "/v1/chat/completions"
            await nursery.start(late.follow, proxy.url)
            snapshot = await late.wait_for(lambda e: True)
            assert (await client.post("/api/models/unload")).status_code == 200
            await early.wait_for(lambda e: e["type"] == "model" and e["state"] == "stopped")
            await late.wait_for(lambda e: e["type"] == "model" and e["state"] == "stopped")
            assert await proxy.terminate() == 0
            await early.wait_end()
            await late.wait_end()
    assert early.events[0]["type"] == "snapshot"
    assert early.lifecycle() == [
        ("request", "alpha", "queued"),
        ("request", "alpha", "loading"),
        ("model", "alpha", "starting"),
        ("model", "alpha", "starting"),  # again once its process runs, with the PID
        ("model", "alpha", "ready"),
        ("request", "alpha", "serving"),
        ("request", "alpha", "done"),
        ("model", "alpha", "stopping"),
        ("model", "alpha", "stopped"),
    ]
    starting = [e["pid"] for e in early.transitions() if e.get("state") == "starting"]
    ready = next(e for e in early.events if e.get("state") == "ready")
    assert isinstance(ready["pid"], int)
    assert starting == [None, ready["pid"]]
    # The late client's first event is the whole state: the model is running, with its PID.
    assert snapshot["type"] == "snapshot"
    assert snapshot["models"] == [
        {
            "model": "alpha",
            "state": "ready",
            "pid": ready["pid"],
            "ttl": None,
            "ttl_left_ms": None,
            "ttl_paused": False,
            "loading_for_ms": None,
            "loaded_for_ms": snapshot["models"][0]["loaded_for_ms"],
            "in_flight": 0,
            "waiting": 0,
            "failure": None,
        }
    ]
    assert snapshot["models"][0]["loaded_for_ms"] > 0
    assert snapshot["requests"] == []
    assert [r["path"] for r in snapshot["activity"]] == ["/v1/chat/completions"]
    assert late.lifecycle() == [("model", "alpha", "stopping"), ("model", "alpha", "stopped")]


async def test_at_shutdown_the_events_end_after_a_model_that_ignores_sigterm_stopped(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    """Shutdown takes two ``unloadTimeout``s here (the request's grace, then SIGTERM to
    SIGKILL): the events must outlast both, to the model's ``stopped``."""
    proxy = await proxy_factory(
        config(
            '[models.stubborn]\ncmd = "${fake} --ignore-sigterm --tokens-per-second 20"',
            unloadTimeout=2,
        )
    )
    events = Events()
    async with proxy.client() as client:
        with trio.fail_after(30):
            await nursery.start(events.follow, proxy.url)
            body = chat("stubborn", stream=True, max_tokens=1000)  # 50 s unless stopped
            async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                assert answer.status_code == 200
                await events.wait_for(lambda e: e["type"] == "request" and e["state"] == "serving")
                assert await proxy.terminate() == 0
                text = (await answer.aread()).decode()
            await events.wait_end()
    assert text.rstrip().endswith('"code": "shutting_down", "param": null}}')
    assert events.lifecycle()[-2:] == [
        ("model", "stubborn", "stopping"),
        ("model", "stubborn", "stopped"),
    ]
    assert "sending SIGKILL" in proxy.output.text()


async def test_logs_mix_llamaswap_and_model_lines_and_streams_end_at_shutdown(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(ONE_MODEL, log_level="info")
    streamed: list[str] = []
    ended = trio.Event()

    async def follow(*, task_status: trio.TaskStatus[None]) -> None:
        stream = await LiveStream.open(proxy.url, "/logs/stream")
        try:
            task_status.started()
            streamed.extend(await stream.rest())  # a cut connection fails the test
        finally:
            await stream.aclose()
        ended.set()

    async with proxy.client() as client:
        with trio.fail_after(30):
            await nursery.start(follow)
            answer = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert answer.status_code == 200
            history = (await client.get("/logs")).text.splitlines()
            assert await proxy.terminate() == 0
            await ended.wait()
    assert any(" INFO llamaswap.process: model 'alpha': ready" in line for line in history)
    assert "[alpha] fake_server: request POST /v1/chat/completions" in " ".join(history)
    # The stream had the same lines and more: the shutdown, to the model's last words.
    assert streamed[: len(history)] == history
    assert any("received SIGTERM: shutting down" in line for line in streamed)
    assert any(line.startswith("[alpha] ") for line in streamed[len(history) :])
