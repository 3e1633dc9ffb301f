"""The estimates on Trio's mock clock, with fake processes: after loads and requests of
known duration, a waiting request's estimate is exactly what the learned figures say, in
``/api/inflight``, the loading stream's line, the queue events and a 429's Retry-After."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llamaswap.config.model import (
    Config,
    Routing,
    SchedulerSection,
    SchedulerSettings,
    SerialSettings,
)
from llamaswap.errors import ConcurrencyLimit, QueueFull
from llamaswap.http.errors import error_response
from llamaswap.observability import ActivityLog, EventHub, RouterEvents
from llamaswap.observability.estimates import Estimator, estimates
from llamaswap.process import ModelState
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.proxy.loading import progress
from llamaswap.router import Router
from llamaswap.router.lease import Lease
from tests.fakes import FakeProbe, FakeSpawner, Script, StateRecorder
from tests.trio.test_router import lease, model, start_router

#: A request that takes no slot: it loads its model, and teaches no serve time.
PAGE = "GET /props"


async def load(router: Router, model_id: str) -> None:
    async with router.acquire(router.lease(model_id, route=PAGE)):
        pass


async def hold(router: Router, request: Lease, until: float) -> None:
    async with router.acquire(request):
        await trio.sleep_until(until)


async def teach(router: Router) -> float:
    """Load ``b`` (about 2 s: the health poll's step), serve it 3 s, then ``a`` 4 s, each
    request granted at an exact time; return b's load figure."""
    await load(router, "b")
    await trio.sleep_until(10.0)
    async with lease(router, "b"):
        await trio.sleep(3.0)
    await load(router, "a")
    await trio.sleep_until(20.0)
    async with lease(router, "a"):
        await trio.sleep(4.0)
    resources = router.resources
    load_b = resources.load_seconds("b")
    assert load_b is not None
    assert 2.0 <= load_b < 2.1
    assert (resources.serve_seconds("a"), resources.serve_seconds("b")) == (4.0, 3.0)
    return load_b


async def test_a_queued_request_waits_for_what_is_served_then_its_load(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=2.0)
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    load_b = await teach(router)
    await trio.sleep_until(30.0)
    served, waiting = router.lease("a"), router.lease("b")
    nursery.start_soon(hold, router, served, 34.0)
    await trio.sleep(1.0)
    nursery.start_soon(hold, router, waiting, 34.0)
    await trio.sleep_until(32.0)
    assert waiting.info().state == "queued"
    found = estimates(router)
    # a's request has 4 - 2 s left; then b loads.
    assert found.start(served.id, 32.0) == 0.0
    assert found.start(waiting.id, 32.0) == 2.0 + load_b
    assert found.by_id[waiting.id].end == 2.0 + load_b + 3.0
    assert progress(router, waiting) == (
        "llamaswap: waiting for a turn, position 1 of 1, about 4 s\n"
    )
    async with UpstreamPool() as pool:
        app = create_app(router, pool)
    response = await app.quart.test_client().get("/api/inflight")
    entries = {entry["id"]: entry for entry in (await response.get_json())["inflight"]}
    assert entries[served.id]["eta_seconds"] == 0.0
    assert entries[waiting.id]["eta_seconds"] == round(2.0 + load_b, 3)
    assert entries[waiting.id]["position"] == 1

    # a's request ends on time; b's load begins, and 1 s into it the rest is due.
    await recorder.wait_for(ModelState.STARTING, "b")
    began = router.statistics("b").starting_since
    assert began is not None
    await trio.sleep_until(began + 1.0)
    assert waiting.info().state == "loading"
    assert estimates(router).start(waiting.id, began + 1.0) == load_b - 1.0
    assert progress(router, waiting) == "llamaswap: loading model 'b' (1s), about 1 s to go\n"


async def test_an_unknown_figure_leaves_the_estimate_out(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """Before any request was served, nothing says when the one being served ends."""
    spawner.script = Script(healthy_after=2.0)
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    await load(router, "a")
    served, waiting = router.lease("a"), router.lease("b")
    nursery.start_soon(hold, router, served, 100.0)
    await trio.testing.wait_all_tasks_blocked()
    nursery.start_soon(hold, router, waiting, 100.0)
    await trio.testing.wait_all_tasks_blocked()
    found = estimates(router)
    assert (found.start(served.id, router.now()), found.start(waiting.id, router.now())) == (
        0.0,
        None,
    )
    assert progress(router, waiting) == "llamaswap: waiting for a turn, position 1 of 1\n"


async def test_the_queue_event_carries_each_waiting_requests_estimate(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=2.0)
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    load_b = await teach(router)
    hub = EventHub()
    events = RouterEvents(hub, router, ActivityLog())
    await trio.sleep_until(30.0)
    served, waiting = router.lease("a"), router.lease("b")
    nursery.start_soon(hold, router, served, 34.0)
    await trio.sleep(1.0)
    nursery.start_soon(hold, router, waiting, 34.0)
    await trio.sleep_until(32.0)
    queue = events.snapshot()["queue"]
    assert queue["order"] == [waiting.id]
    assert queue["eta_ms"] == {waiting.id: round((2.0 + load_b) * 1000, 3)}


def serial(**settings: object) -> Config:
    return Config(
        models={"a": model(1), "b": model(2)},
        routing=Routing(
            scheduler=SchedulerSection(
                use="serial",
                settings=SchedulerSettings(serial=SerialSettings(**settings)),  # type: ignore[arg-type]
            )
        ),
    )


async def test_queue_full_retries_when_the_first_waiting_request_is_due(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, spawner: FakeSpawner
) -> None:
    spawner.script = Script(healthy_after=2.0)
    router = Router(serial(max_queued=1), spawner=spawner, probe=FakeProbe(spawner))
    await nursery.start(router.run)
    await teach(router)
    await trio.sleep_until(30.0)
    nursery.start_soon(hold, router, router.lease("a"), 40.0)  # its figure: 4 s
    await trio.sleep(0.5)
    nursery.start_soon(hold, router, router.lease("a"), 40.0)  # queued for the slot
    await trio.sleep(0.25)
    with pytest.raises(QueueFull) as refused:
        async with lease(router, "b"):
            pytest.fail("the queue is full")
    error = refused.value
    assert error_response(error)[1][1] == ("retry-after", "1")  # no estimate asked yet
    Estimator(router).set_retry_after(error)
    # The slot frees in 4 - 0.75 s: 3.25, rounded up.
    assert error.retry_after == 4
    assert ("retry-after", "4") in error_response(error)[1]


async def test_concurrency_limit_retries_when_one_of_the_models_requests_ends(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=2.0)
    limited = model(1, concurrency_limit=2)
    router = await start_router(nursery, spawner, recorder, a=limited, b=model(2))
    await teach(router)
    await trio.sleep_until(30.0)
    nursery.start_soon(hold, router, router.lease("a"), 40.0)
    await trio.sleep(1.5)
    nursery.start_soon(hold, router, router.lease("a"), 40.0)
    await trio.sleep(0.25)
    estimator = Estimator(router)
    with pytest.raises(ConcurrencyLimit) as refused:
        async with lease(router, "a"):
            pytest.fail("a has 2 requests")
    estimator.set_retry_after(refused.value)
    # The first of them has 4 - 1.75 s left: 2.25, rounded up.
    assert refused.value.retry_after == 3
    assert ("retry-after", "3") in error_response(refused.value)[1]
    # Read again within MAX_AGE, the same estimate is moved on by the time since.
    await trio.sleep(0.25)
    again = ConcurrencyLimit("a", 2)
    estimator.set_retry_after(again)
    assert again.retry_after == 2
