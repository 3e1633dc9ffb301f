"""The event hub and the router's events on Trio's mock clock, with fake processes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from typing import Any, Literal

import pytest
import trio
import trio.testing

from llamaswap.config.model import (
    Config,
    ModelConfig,
    Routing,
    SchedulerSection,
    SchedulerSettings,
    SerialSettings,
)
from llamaswap.errors import ModelStartFailed
from llamaswap.observability import (
    ActivityLog,
    ActivityRecord,
    EventHub,
    Logs,
    Metrics,
    RouterEvents,
)
from llamaswap.observability.events import PING, Event, encode_sse, next_sse
from llamaswap.observability.feed import Dropped, Feed
from llamaswap.observability.logs import capture_logs
from llamaswap.process import LogLine, LogRing
from llamaswap.router import Router
from tests.fakes import FakeProbe, FakeSpawner, Script


def decode(chunk: bytes) -> Event:
    """The event an SSE chunk carries (``event: <type>``, ``data: <json>``)."""
    name, data = chunk.decode().removesuffix("\n\n").split("\n")
    event: Event = json.loads(data.removeprefix("data: "))
    assert name == f"event: {event['type']}", chunk
    return event


def take(feed: Feed[bytes], *, skip: tuple[str, ...] = ()) -> list[Event]:
    """Every event the feed holds now (a ``Dropped`` fails the test), minus ``skip`` types."""
    events: list[Event] = []
    while True:
        try:
            item = feed.receive_nowait()
        except trio.WouldBlock:
            return events
        assert not isinstance(item, Dropped), item
        event = decode(item)
        if event["type"] not in skip:
            events.append(event)


def brief(event: Event) -> tuple[Any, ...]:
    """The fields that tell events apart in an order assertion."""
    if event["type"] == "model":
        return ("model", event["model"], event["state"], event["pid"])
    if event["type"] == "request":
        return ("request", event["id"], event["state"])
    return (event["type"],)


def transitions(events: list[Event]) -> list[Event]:
    """``events`` less the model events that repeat their model's state and PID: a
    request's admission, grant or release sends its model again, for its counts and TTL.
    A model not in a snapshot before is taken to be stopped."""
    last: dict[str, tuple[Any, Any]] = {}
    kept: list[Event] = []
    for event in events:
        if event["type"] == "snapshot":
            last.update(
                {entry["model"]: (entry["state"], entry["pid"]) for entry in event["models"]}
            )
        elif event["type"] == "model":
            now = (event["state"], event["pid"])
            if last.get(event["model"], ("stopped", None)) == now:
                continue
            last[event["model"]] = now
        kept.append(event)
    return kept


def models(events: list[Event]) -> list[Event]:
    return [event for event in events if event["type"] == "model"]


# ------------------------------------------------------------ coalescing, heartbeat


async def test_changes_are_coalesced_to_one_event_per_interval(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    hub = EventHub(interval=0.25)
    await nursery.start(hub.run)
    depth = 0
    builds: list[float] = []

    def build() -> Event:
        builds.append(trio.current_time())
        return {"type": "queue", "depth": depth}

    with hub.subscribe() as feed:
        start = trio.current_time()
        depth = 1
        hub.publish_soon("queue", build)  # the first change goes out at once
        assert await feed.receive() == encode_sse({"type": "queue", "depth": 1})
        assert trio.current_time() == start
        depth = 2
        hub.publish_soon("queue", build)
        await trio.sleep(0.125)
        depth = 3
        hub.publish_soon("queue", build)
        # Both changes make one event, built (with the latest state) at the interval's end.
        assert await feed.receive() == encode_sse({"type": "queue", "depth": 3})
        assert trio.current_time() == start + 0.25
        assert builds == [start, start + 0.25]
        await trio.sleep(1.0)
        depth = 4
        hub.publish_soon("queue", build)  # quiet for longer than the interval: at once
        assert await feed.receive() == encode_sse({"type": "queue", "depth": 4})
        assert trio.current_time() == start + 1.25


async def test_a_build_that_returns_none_sends_nothing(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    hub = EventHub(interval=0.25)
    await nursery.start(hub.run)
    with hub.subscribe() as feed:
        hub.publish_soon("queue", lambda: None)
        await trio.sleep(1.0)
        assert take(feed) == []


async def test_nothing_is_built_while_nobody_listens(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    hub = EventHub(interval=0.25)
    await nursery.start(hub.run)
    builds: list[float] = []

    def build() -> Event:
        builds.append(trio.current_time())
        return {"type": "queue"}

    hub.publish_soon("queue", build)
    await trio.sleep(1.0)
    assert builds == []


async def test_a_ping_after_fifteen_quiet_seconds(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    hub = EventHub()
    with hub.subscribe() as feed:
        start = trio.current_time()
        assert await next_sse(feed) == PING
        assert trio.current_time() == start + 15.0

        async def publish_at(delay: float) -> None:
            await trio.sleep(delay)
            hub.publish({"type": "model", "model": "a"})

        nursery.start_soon(publish_at, 10.0)
        assert await next_sse(feed) == encode_sse({"type": "model", "model": "a"})
        assert trio.current_time() == start + 25.0
        # The silence is counted from the last thing sent.
        assert await next_sse(feed) == PING
        assert trio.current_time() == start + 40.0
        hub.close()
        assert await next_sse(feed) is None
        assert trio.current_time() == start + 40.0


async def test_a_burst_is_received_in_one_piece_up_to_the_limit_then_the_end() -> None:
    feed = Feed[int](8)
    for i in range(5):
        feed.put(i)
    feed.close()
    assert await feed.receive_burst(3) == [0, 1, 2]
    assert await feed.receive_burst(3) == [3, 4]
    with pytest.raises(trio.EndOfChannel):
        await feed.receive_burst(3)


async def test_a_slow_reader_is_told_what_it_lost_as_an_event() -> None:
    hub = EventHub(buffer=2)
    with hub.subscribe() as feed:
        for i in range(5):
            hub.publish({"type": "tick", "i": i})
        # What is waiting goes out in one piece, the loss told where it happened.
        assert await next_sse(feed) == b"".join(
            [
                encode_sse({"type": "tick", "i": 0}),
                encode_sse({"type": "tick", "i": 1}),
                encode_sse({"type": "dropped", "count": 3}),
            ]
        )
        hub.publish({"type": "tick", "i": 5})
        assert await next_sse(feed) == encode_sse({"type": "tick", "i": 5})


class Counted:
    """A value JSON has no type for: ``encode_sse`` writes it with ``str()``, which
    counts how many times the event carrying it was encoded."""

    def __init__(self) -> None:
        self.encoded = 0

    def __str__(self) -> str:
        self.encoded += 1
        return "counted"


async def test_an_event_is_encoded_once_however_many_subscribers_read_it() -> None:
    hub = EventHub()
    value = Counted()
    with ExitStack() as stack:
        feeds = [stack.enter_context(hub.subscribe()) for _ in range(300)]
        hub.publish({"type": "tick", "value": value})
        got = [await next_sse(feed) for feed in feeds]
    assert value.encoded == 1
    assert got == [b'event: tick\ndata: {"type":"tick","value":"counted"}\n\n'] * 300
    assert all(chunk is got[0] for chunk in got)  # one object, shared


async def test_a_log_line_is_encoded_once_for_every_subscriber_that_asked_for_logs() -> None:
    hub = EventHub()
    logs = Logs(LogRing(), dict)
    with ExitStack() as stack:
        with_logs = [stack.enter_context(hub.subscribe(logs=logs)) for _ in range(3)]
        without = stack.enter_context(hub.subscribe())
        logs.own.append(1.0, "hello")
        logs.model_line("chat", LogLine(2.0, "hi"))
        hub.publish({"type": "tick"})
        got = [feed.receive_nowait() for feed in with_logs for _ in range(3)]
        assert await next_sse(without) == encode_sse({"type": "tick"})
    expected = [
        encode_sse({"type": "log", "model": None, "text": "hello"}),
        encode_sse({"type": "log", "model": "chat", "text": "hi"}),
        encode_sse({"type": "tick"}),
    ]
    assert got == expected * 3
    assert all(chunk is got[i % 3] for i, chunk in enumerate(got))  # shared objects


# ------------------------------------------------------------ the router's events


def model(port: int, **settings: object) -> ModelConfig:
    return ModelConfig(cmd=("server", str(port)), proxy=f"http://m:{port}", **settings)  # type: ignore[arg-type]


Started = tuple[Router, EventHub, RouterEvents, ActivityLog]


async def start(
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    scheduler: Literal["fifo", "serial"] = "fifo",
    **models: ModelConfig,
) -> Started:
    config = Config(models=models, routing=Routing(scheduler=SchedulerSection(use=scheduler)))
    router = Router(config, spawner=spawner, probe=FakeProbe(spawner))
    hub = EventHub(interval=0.25)
    activity = ActivityLog()
    events = RouterEvents(hub, router, activity)
    events.connect()
    await nursery.start(hub.run)
    await nursery.start(router.run)
    return router, hub, events, activity


@pytest.mark.parametrize("scheduler", ["fifo", "serial"])
async def test_load_serve_unload_arrive_in_order(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    scheduler: Literal["fifo", "serial"],
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, events, _ = await start(nursery, spawner, scheduler, a=model(1))
    with hub.subscribe(first=events.snapshot) as feed:
        start_time = trio.current_time()
        async with router.acquire(router.lease("a", priority=100)):
            await trio.testing.wait_all_tasks_blocked()
            got = take(feed, skip=("queue",))
            assert trio.current_time() == pytest.approx(start_time + 1.0)  # polled every 20 ms
        await router.unload(["a"])
        got += take(feed, skip=("queue",))
    got = transitions(got)
    pid = spawner.last.pid
    assert [brief(event) for event in got] == [
        ("snapshot",),
        ("request", 0, "queued"),
        ("load",),
        ("request", 0, "loading"),
        ("model", "a", "starting", None),
        ("model", "a", "starting", pid),  # its process runs: the PID is known
        ("model", "a", "ready", pid),
        ("request", 0, "serving"),
        ("request", 0, "done"),
        ("model", "a", "stopping", pid),
        ("model", "a", "stopped", None),
    ]
    assert got[2] == {"type": "load", "model": "a", "evict": [], "retry": None}
    serving = got[7]
    assert serving == {
        "type": "request",
        "id": 0,
        "model": "a",
        "state": "serving",
        "priority": 100,
        "band": "interactive",
        "score": serving["score"],  # serial's pick score; None under fifo
        "waited_ms": 0.0,  # dispatched at once: its load started
        "preemptions": 0,
        "paused": False,
        "paused_ms": None,
        "error": None,
    }
    assert (serving["score"] is None) == (scheduler == "fifo")


async def test_a_failed_load_is_one_failed_event_with_the_reason(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    script = Script(healthy_after=None, exit_after=0.5, exit_code=3, output=["no model.gguf"])
    spawner = FakeSpawner(nursery, script)
    router, hub, events, _ = await start(nursery, spawner, a=model(1))
    with hub.subscribe() as feed:
        with pytest.raises(ModelStartFailed) as caught:
            async with router.acquire(router.lease("a")):
                pytest.fail("a load that failed must not serve")
        await trio.testing.wait_all_tasks_blocked()
        got = take(feed, skip=("queue",))
    requests = [event for event in got if event["type"] != "model"]
    assert [brief(event) for event in requests] == [
        ("request", 0, "queued"),
        ("load",),
        ("request", 0, "loading"),
        ("request", 0, "failed"),
    ]
    assert "exited with status 3" in requests[3]["error"]
    assert requests[3]["waited_ms"] == 0.0
    # The model is failed, and says why, from the moment it stopped (in later snapshots too).
    failure = {
        "reason": "exited with status 3 while starting",
        "message": str(caught.value),
        "exit_code": 3,
        "output": ["no model.gguf"],
    }
    failed = shown("failed", ttl=None, failure=failure)
    assert [brief(event) for event in transitions(models(got))] == [
        ("model", "a", "starting", None),
        ("model", "a", "starting", spawner.last.pid),
        ("model", "a", "failed", None),  # never "stopped" first
    ]
    assert models(got)[-1] == failed
    assert [{"type": "model", **entry} for entry in events.snapshot()["models"]] == [failed]


async def test_a_client_leaving_while_loading_is_cancelled_and_the_load_stopped(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=10.0))
    router, hub, _, _ = await start(nursery, spawner, a=model(1))
    with hub.subscribe() as feed:
        with trio.move_on_after(2.0):
            async with router.acquire(router.lease("a")):
                pytest.fail("the load takes 10 s")
        await trio.testing.wait_all_tasks_blocked()
        got = transitions(take(feed, skip=("queue",)))
    assert [brief(event) for event in got] == [
        ("request", 0, "queued"),
        ("load",),
        ("request", 0, "loading"),
        ("model", "a", "starting", None),
        ("model", "a", "starting", spawner.last.pid),
        ("request", 0, "cancelled"),
        ("model", "a", "stopping", spawner.last.pid),
        ("model", "a", "stopped", None),
    ]


def shown(state: str, **fields: object) -> dict[str, object]:
    """A model event of ``a`` (ttl 60 s), with ``fields`` differing from a stopped one."""
    stopped = {
        "type": "model",
        "model": "a",
        "pid": None,
        "ttl": 60.0,
        "ttl_left_ms": None,
        "ttl_paused": False,
        "loading_for_ms": None,
        "loaded_for_ms": None,
        "in_flight": 0,
        "waiting": 0,
        "failure": None,
    }
    return {**stopped, "state": state, **fields}


async def test_model_events_say_what_the_page_shows(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """State, PID, the TTL countdown or its pause, how long it has loaded or been ready,
    the requests in flight and waiting: as the router has them, never re-derived."""
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, events, _ = await start(nursery, spawner, a=model(1, ttl=60.0))
    with hub.subscribe(first=events.snapshot) as feed:
        async with router.acquire(router.lease("a")):
            await trio.sleep(0.5)
            loading = take(feed)
        await trio.sleep(0.5)
        released = take(feed)
        await trio.sleep(10.0)
        later = events.snapshot()["models"]
    pid = spawner.last.pid
    assert [{"type": "model", **entry} for entry in loading[0]["models"]] == [shown("stopped")]
    # Its load's request wants it: its TTL is paused from the moment it is ready.
    assert models(transitions(loading)) == [
        shown("starting", loading_for_ms=0.0, waiting=1),
        shown("starting", pid=pid, loading_for_ms=0.0, waiting=1),
        shown("ready", pid=pid, ttl_paused=True, loaded_for_ms=0.0, waiting=1),
    ]
    # Granted at once: in flight, and still paused.
    serving = shown("ready", pid=pid, ttl_paused=True, loaded_for_ms=0.0, in_flight=1)
    assert models(loading)[-1] == serving
    # Released half a second later: the countdown runs, from its full 60 s.
    assert models(released) == [shown("ready", pid=pid, ttl_left_ms=60000.0, loaded_for_ms=500.0)]
    counting = shown("ready", pid=pid, ttl_left_ms=49500.0, loaded_for_ms=11000.0)
    assert [{"type": "model", **entry} for entry in later] == [counting]


async def test_a_model_event_goes_out_as_requests_are_admitted_granted_and_released(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """Under serial, one request holds the slot while a second one waits for it."""
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, _, _ = await start(nursery, spawner, "serial", a=model(1, ttl=60.0))
    await router.load("a")  # ready now, nobody listening
    pid = spawner.last.pid

    async def hold() -> None:
        async with router.acquire(router.lease("a")):
            await trio.sleep(1.0)

    with hub.subscribe() as feed:
        seen: list[Event] = []
        nursery.start_soon(hold)  # served at once
        await trio.sleep(0.25)
        seen += models(take(feed))
        nursery.start_soon(hold)  # waits for the slot
        await trio.sleep(0.5)
        seen += models(take(feed))
        await trio.sleep(0.5)  # at +1 s the first leaves and the second is served
        seen += models(take(feed))
        await trio.sleep(1.0)  # at +2 s the second leaves: its countdown starts
        seen += models(take(feed))
    paused = {"pid": pid, "ttl_paused": True, "in_flight": 1}
    assert seen == [
        shown("ready", **paused, loaded_for_ms=0.0),
        shown("ready", **paused, loaded_for_ms=250.0, waiting=1),
        shown("ready", **paused, loaded_for_ms=1000.0),  # one event for both
        shown("ready", pid=pid, ttl_left_ms=60000.0, loaded_for_ms=2000.0),
    ]


async def test_queue_events_follow_the_depth(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, _, _ = await start(nursery, spawner, a=model(1), b=model(2))
    await router.load("a")
    with hub.subscribe() as feed:

        async def request_b() -> None:
            async with router.acquire(router.lease("b", priority=-100)):
                pass

        async with router.acquire(router.lease("a")):
            await trio.sleep(0.5)
            nursery.start_soon(request_b)  # must evict 'a', which is busy: queued
            await trio.sleep(1.0)
            queued = take(feed, skip=("request", "model"))
        await trio.sleep(2.0)
        later = take(feed)
    after = [event for event in later if event["type"] == "queue"]
    b_loading = next(e for e in later if e["type"] == "request" and e["state"] == "loading")
    # Queued at +0.5 s, dispatched when 'a' finished at +1.5 s.
    assert b_loading["model"] == "b"
    assert b_loading["waited_ms"] == 1000.0
    # 'a' granted (an empty queue: the first queue event), then 'b' queued.
    assert [event["bands"]["batch"] for event in queued] == [
        {"depth": 0, "oldest_wait_ms": 0.0},
        {"depth": 1, "oldest_wait_ms": 0.0},
    ]
    assert [event["waiting"] for event in queued] == [0, 1]
    assert [len(event["order"]) for event in queued] == [0, 1]  # b's ID, waiting
    # 'a' released and 'b' dispatched (its load, evicting 'a'), then 'b' granted.
    assert [(event["waiting"], event["loading"]) for event in after] == [(0, 1), (0, 0)]
    assert [event["bands"]["batch"]["depth"] for event in after] == [0, 0]


async def test_queue_events_score_the_waiting_requests_under_serial(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, events, _ = await start(nursery, spawner, "serial", a=model(1))
    await router.load("a")

    async def request(priority: int) -> None:
        async with router.acquire(router.lease("a", priority=priority)):
            await trio.sleep(0.5)

    with hub.subscribe() as feed:
        async with router.acquire(router.lease("a")):  # holds the one slot
            for priority in (-100, 0, 100):
                nursery.start_soon(request, priority)
            await trio.sleep(0.5)
            got = take(feed)
            ids = {e["priority"]: e["id"] for e in got if e["type"] == "request"}
            queue = [e for e in got if e["type"] == "queue"][-1]
            assert queue["order"] == [ids[100], ids[0], ids[-100]]
            # priority + affinity ('a' is ready: 10) + aging (a point a minute), as the
            # next pick will compare them
            assert queue["scores"] == pytest.approx([110.0, 10.0, -90.0], abs=0.01)
            await trio.sleep(60.0)
            assert events.snapshot()["queue"]["scores"] == pytest.approx(
                [111.0, 11.0, -89.0], abs=0.01
            )
        await trio.sleep(0.1)  # the holder left: the best one is served
        changed = [e for e in take(feed) if e["type"] == "queue"][-1]
        assert changed["order"] == [ids[0], ids[-100]]
        assert changed["scores"] == pytest.approx([11.0, -89.0], abs=0.01)


async def test_a_preempted_request_is_preempting_then_paused_then_serving_again(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """Under serial with preempt, an interactive request checkpoints a batch one, whose
    task gives its slot back and waits (as the forwarder does: ``Router.resume``)."""
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    serial = SerialSettings(preempt=True)
    section = SchedulerSection(use="serial", settings=SchedulerSettings(serial=serial))
    config = Config(models={"a": model(1)}, routing=Routing(scheduler=section))
    router = Router(config, spawner=spawner, probe=FakeProbe(spawner))
    hub = EventHub(interval=0.25)
    events = RouterEvents(hub, router, ActivityLog())
    events.connect()
    await nursery.start(hub.run)
    await nursery.start(router.run)
    await router.load("a")
    generated = trio.Event()

    async def batch() -> None:
        """Ten seconds of generation, checkpointed and resumed as often as it is told."""
        lease = router.lease("a", priority=-100, preemptible=True)
        async with router.acquire(lease):
            left, start = 10.0, trio.current_time()
            while True:
                with lease.preemption() as preemption:
                    await trio.sleep(left)
                if not preemption.cancelled_caught:
                    break
                left -= trio.current_time() - start
                await router.resume(lease)
                start = trio.current_time()
        generated.set()

    async def interactive() -> None:
        async with router.acquire(router.lease("a", priority=100)):
            await trio.sleep(2.0)

    with hub.subscribe() as feed:
        nursery.start_soon(batch)
        await trio.sleep(1.0)
        start = trio.current_time()
        nursery.start_soon(interactive)  # preempts the batch one at once
        await trio.sleep(1.0)
        [waiting] = [r for r in events.snapshot()["requests"] if r["priority"] == -100]
        assert (waiting["state"], waiting["preemptions"]) == ("queued", 1)
        assert (waiting["paused"], waiting["paused_ms"]) == (True, 1000.0)
        with trio.fail_after(20):
            await generated.wait()
        assert trio.current_time() == start + 11.0  # 1 s, 2 s paused, the other 9 s
        got = [e for e in take(feed) if e["type"] == "request" and e["priority"] == -100]
    assert [(e["state"], e["preemptions"], e["paused"], e["paused_ms"]) for e in got] == [
        ("queued", 0, False, None),
        ("serving", 0, False, None),
        ("preempting", 0, False, None),
        ("paused", 1, True, 0.0),
        ("serving", 1, False, None),
        ("done", 1, False, None),
    ]
    assert {e["waited_ms"] for e in got} == {0.0}  # its one wait in the queue: none
    scrape = Metrics(router).exposition().decode()  # and /metrics counted it, by its band
    assert 'llamaswap_scheduler_preemptions_total{band="batch"} 1.0' in scrape
    assert 'llamaswap_scheduler_preemptions_total{band="interactive"} 0.0' in scrape


async def test_queue_events_have_no_scores_under_fifo(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, _, _ = await start(nursery, spawner, "fifo", a=model(1), b=model(2))
    await router.load("a")

    async def request_b() -> None:
        async with router.acquire(router.lease("b", priority=100)):
            pass

    with hub.subscribe() as feed:
        async with router.acquire(router.lease("a")):
            nursery.start_soon(request_b)  # must evict 'a', which is busy: queued
            await trio.sleep(0.5)
            queue = [e for e in take(feed) if e["type"] == "queue"][-1]
    assert len(queue["order"]) == 1
    assert queue["scores"] == [None]


async def test_a_late_subscriber_gets_the_state_first(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, events, activity = await start(nursery, spawner, a=model(1), b=model(2))
    record = ActivityRecord(
        id=activity.next_id(),
        time="2025-01-01T00:00:00.000Z",
        model="a",
        method="POST",
        path="/v1/chat/completions",
        status=200,
        duration_ms=1.5,
        queue_wait_ms=0.0,
        scheduler="fifo",
        priority=0,
        band="normal",
        score=None,
        prompt_tokens=3,
        completion_tokens=4,
        error=None,
        metadata={},
    )
    activity.add(record)
    async with router.acquire(router.lease("a", priority=5)):
        await trio.sleep(0.5)
        with hub.subscribe(first=events.snapshot) as feed:
            snapshot, *rest = take(feed)
            activity.add(record)
            assert take(feed) == [{"type": "activity", "record": record.to_json()}]
    assert rest == []
    assert snapshot["type"] == "snapshot"
    assert snapshot["scheduler"] == "fifo"
    stopped = {
        "ttl": None,
        "ttl_left_ms": None,
        "ttl_paused": False,
        "loading_for_ms": None,
        "loaded_for_ms": None,
        "in_flight": 0,
        "waiting": 0,
        "failure": None,
    }
    assert snapshot["models"] == [
        {
            **stopped,
            "model": "a",
            "state": "ready",
            "pid": spawner.last.pid,
            "loaded_for_ms": 500.0,
            "in_flight": 1,
        },
        {**stopped, "model": "b", "state": "stopped", "pid": None},
    ]
    assert snapshot["requests"] == [
        {
            "type": "request",
            "id": 0,
            "model": "a",
            "state": "serving",
            "priority": 5,
            "band": "normal",
            "score": None,
            "waited_ms": 0.0,
            "preemptions": 0,
            "paused": False,
            "paused_ms": None,
            "error": None,
        }
    ]
    assert snapshot["queue"]["waiting"] == 0
    assert set(snapshot["queue"]["bands"]) == {
        "above_interactive",
        "interactive",
        "normal",
        "batch",
        "below_batch",
    }
    assert snapshot["activity"] == [record.to_json()]


async def test_nothing_is_published_while_nobody_listens(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router, hub, _, _ = await start(nursery, spawner, a=model(1))
    await router.load("a")
    assert hub.statistics().published == 0


# ------------------------------------------------------------------------ logs


@pytest.fixture
def debug_logs() -> Iterator[None]:
    llamaswap = logging.getLogger("llamaswap")
    level = llamaswap.level
    llamaswap.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        llamaswap.setLevel(level)


@pytest.mark.usefixtures("debug_logs")
async def test_own_log_lines_are_captured_but_not_model_output_copies(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0, output=("hello from a",)))
    own = LogRing()
    async with capture_logs(own):
        router, _, _, _ = await start(nursery, spawner, a=model(1))
        await router.load("a")
    logging.getLogger("llamaswap.test").warning("after the block")
    texts = [line.text for line in own.lines()]
    assert any("llamaswap.process: model 'a': ready" in text for text in texts)
    assert all(" DEBUG " in t or " INFO " in t or " WARNING " in t for t in texts)
    # The model's output is in its own ring, not copied into ours.
    assert router.log_rings()["a"].tail(1) == ["hello from a"]
    assert not any("hello from a" in text for text in texts)
    assert not any("after the block" in text for text in texts)
    assert logging.getLogger().handlers == [
        h for h in logging.getLogger().handlers if type(h).__name__ != "RingHandler"
    ]


async def test_lines_logged_in_a_thread_are_appended_by_the_trio_thread() -> None:
    own = LogRing()
    appended_in: list[int] = []
    own.subscribe(lambda line: appended_in.append(threading.get_ident()))
    async with capture_logs(own):
        await trio.to_thread.run_sync(logging.getLogger("llamaswap.test").warning, "threaded")
        await trio.testing.wait_all_tasks_blocked()
    assert [line.text.endswith("WARNING llamaswap.test: threaded") for line in own.lines()] == [
        True
    ]
    assert appended_in == [threading.get_ident()]


def ring(*lines: tuple[float, str]) -> LogRing:
    result = LogRing()
    for time, text in lines:
        result.append(time, text)
    return result


async def test_history_merges_every_log_by_time_and_prefixes_model_lines() -> None:
    own = ring((1.0, "own one"), (4.0, "own two"))
    models = {"chat": ring((2.0, "chat one"), (5.0, "chat two")), "code": ring((3.0, "code"))}
    logs = Logs(own, lambda: models)
    assert [line.text for line in logs.history()] == [
        "own one",
        "[chat] chat one",
        "[code] code",
        "own two",
        "[chat] chat two",
    ]
    assert [line.text for line in logs.history("chat")] == ["[chat] chat one", "[chat] chat two"]
    assert [line.line for line in logs.history("code")] == [LogLine(3.0, "code")]


async def test_followers_hear_models_that_come_later_and_only_their_model() -> None:
    models = {"chat": ring()}
    logs = Logs(ring(), lambda: models)
    with logs.follow() as (_, everything), logs.follow("chat") as (_, chat_only):
        models["code"] = ring((1.0, "code's first"))  # a reload added it
        logs.model_line("code", models["code"].lines()[0])
        models["chat"].append(2.0, "chat's first")
        logs.model_line("chat", models["chat"].lines()[0])
        got = [everything.receive_nowait(), everything.receive_nowait()]
        assert got == [logs.history()[0], logs.history()[1]]
        assert [line.text for line in logs.history()] == [
            "[code] code's first",
            "[chat] chat's first",
        ]
        assert chat_only.receive_nowait() == got[1]
        with pytest.raises(trio.WouldBlock):
            chat_only.receive_nowait()


async def test_a_follower_gets_history_then_every_later_line_until_closed() -> None:
    own = ring((1.0, "before"))
    chat = ring()
    logs = Logs(own, lambda: {"chat": chat}, buffer=2)
    chat.subscribe(partial(logs.model_line, "chat"))  # as Logs.of has the router do
    with logs.follow() as (history, feed):
        assert [line.text for line in history] == ["before"]
        assert logs.followers() == 1
        chat.append(2.0, "one")
        own.append(3.0, "two")
        chat.append(4.0, "lost")
        assert [await feed.receive() for _ in range(3)] == [
            logs.history()[1],
            logs.history()[2],
            Dropped(1),
        ]
        logs.close()
        with pytest.raises(trio.EndOfChannel):
            await feed.receive()
    assert logs.followers() == 0
    own.append(5.0, "nobody listens")  # unsubscribed: no error, no buffer
    with trio.fail_after(1):
        await logs.drained()
