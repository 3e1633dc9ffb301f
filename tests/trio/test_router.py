"""Router + fifo + supervisors together, on the mock clock, with fake processes."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest
import trio
import trio.testing

from llamaswap.config.model import (
    Config,
    GroupConfig,
    ModelConfig,
    RouterSection,
    RouterSettings,
    Routing,
    SchedulerSection,
    SchedulerSettings,
    SerialSettings,
)
from llamaswap.errors import (
    ConcurrencyLimit,
    InternalError,
    ModelStartFailed,
    ModelUnloaded,
    RequestError,
    ShuttingDown,
)
from llamaswap.process import ModelState
from llamaswap.router import Router
from llamaswap.router.events import Observer
from llamaswap.router.lease import Lease
from llamaswap.schedulers import Decision, Grant, JoinSwap, Recheck, StartSwap, Ticket
from tests.fakes import FakeProbe, FakeSpawner, Script, StateRecorder, decisions_into

S = ModelState


def lease(router: Router, model: str, *, priority: int = 0) -> AbstractAsyncContextManager[Lease]:
    return router.acquire(router.lease(model, priority=priority))


async def record_failure(
    router: Router,
    model: str,
    failures: list[RequestError],
    while_waiting: Callable[[Lease], Awaitable[None]] | None = None,
) -> None:
    """Make a request; append the error it ends with (it must not be granted)."""
    try:
        async with router.acquire(router.lease(model), while_waiting=while_waiting):
            pytest.fail(f"{model!r} was not expected to serve")
    except RequestError as exc:
        failures.append(exc)


def model(port: int, **settings: object) -> ModelConfig:
    return ModelConfig(cmd=("server", str(port)), proxy=f"http://m:{port}", **settings)  # type: ignore[arg-type]


async def start_router(
    nursery: trio.Nursery, spawner: FakeSpawner, recorder: StateRecorder, **models: ModelConfig
) -> Router:
    router = Router(
        Config(models=models),
        spawner=spawner,
        probe=FakeProbe(spawner),
        observers=[recorder.observe],
    )
    await nursery.start(router.run)
    return router


async def test_swap_between_models_runs_one_at_a_time(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    async with lease(router, "a"):
        assert router.running_models() == {"a"}
    async with lease(router, "b"):
        assert router.running_models() == {"b"}
    assert recorder.history == [
        ("a", S.STARTING),
        ("a", S.READY),
        ("a", S.STOPPING),
        ("a", S.STOPPED),
        ("b", S.STARTING),
        ("b", S.READY),
    ]


async def test_cancel_while_queued_never_starts_the_model(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    async with lease(router, "a"):
        with trio.move_on_after(5.0):
            async with lease(router, "b"):
                pytest.fail("b must wait while a is serving")
        assert router.scheduler.statistics().waiting == 0
    await trio.testing.wait_all_tasks_blocked()
    assert [argv[1] for argv in (p.argv for p in spawner.processes)] == ["1"]
    assert router.running_models() == {"a"}


async def test_abandoned_load_kills_the_starting_process(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=100.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    t0 = trio.current_time()
    with trio.move_on_after(2.0):
        async with lease(router, "a"):
            pytest.fail("a is not ready for 100 s")
    await recorder.wait_for(S.STOPPED, "a")
    assert trio.current_time() - t0 == 2.0
    assert spawner.last.signals == [(t0 + 2.0, signal.SIGTERM)]
    assert router.scheduler.statistics().swaps == ()


async def test_a_load_cut_short_by_the_router_stopping_grants_nobody(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """Not the swap's own scope but an outer one (the router torn down) ends the load."""
    spawner.script = Script(healthy_after=100.0)
    failures: list[RequestError] = []
    with trio.CancelScope() as router_scope:
        async with trio.open_nursery() as inner:
            router = await start_router(inner, spawner, recorder, a=model(1))
            nursery.start_soon(record_failure, router, "a", failures)
            await recorder.wait_for(S.STARTING, "a")
            router_scope.cancel()
    await trio.testing.wait_all_tasks_blocked()
    assert [type(f) for f in failures] == [ModelUnloaded]


async def test_load_goes_on_while_another_request_wants_it(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=10.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    served = trio.Event()

    async def patient() -> None:
        async with lease(router, "a"):
            served.set()

    nursery.start_soon(patient)
    with trio.move_on_after(2.0):
        async with lease(router, "a"):
            pytest.fail("a is not ready for 10 s")
    await served.wait()
    assert spawner.last.signals == []
    assert len(spawner.processes) == 1


async def test_failed_start_fails_every_waiter(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=None, exit_after=1.0, output=["bad gguf"])
    router = await start_router(nursery, spawner, recorder, a=model(1))
    errors: list[RequestError] = []
    async with trio.open_nursery() as requests:
        for _ in range(3):
            requests.start_soon(record_failure, router, "a", errors)
    assert len(errors) == 3
    assert all(isinstance(e, ModelStartFailed) and "bad gguf" in str(e) for e in errors)
    assert len(spawner.processes) == 1


async def test_unload_fails_waiters_with_unloaded(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=100.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    errors: list[RequestError] = []
    nursery.start_soon(record_failure, router, "a", errors)
    await trio.testing.wait_all_tasks_blocked()
    await router.unload()
    await trio.testing.wait_all_tasks_blocked()
    assert router.model_state("a") is S.STOPPED
    assert len(errors) == 1
    assert isinstance(errors[0], ModelUnloaded)
    assert "unloaded" in str(errors[0])


async def test_unload_ends_the_requests_it_serves_saying_so(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """A request being served when its model is unloaded ends with ``ModelUnloaded``
    (its client got the model server's connection breaking off, as for a crash)."""
    spawner.script = Script(healthy_after=0.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    served = trio.Event()
    ended: list[RequestError] = []

    async def serve() -> None:
        try:
            async with lease(router, "a"):
                served.set()
                await trio.sleep_forever()  # a long generation
        except RequestError as exc:
            ended.append(exc)

    nursery.start_soon(serve)
    await served.wait()
    await router.unload(["a"])
    await trio.testing.wait_all_tasks_blocked()
    assert router.model_state("a") is S.STOPPED
    assert [str(error) for error in ended] == [
        "model 'a' was unloaded while the request was being served (unload requested)"
    ]
    assert isinstance(ended[0], ModelUnloaded)


async def test_unload_all_leaves_requests_for_stopped_models_queued(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """SPEC §7.7: only the requests of the models unloaded fail. ``b`` is not running (it
    waits for ``a`` to be free), so an unload of everything stops ``a`` alone and ``b``'s
    request is served after it."""
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    served: list[str] = []

    async def holds_a() -> None:
        with pytest.raises(ModelUnloaded):  # it is served: the unload ends it
            async with lease(router, "a"):
                await trio.sleep_forever()

    async def wants_b() -> None:
        async with lease(router, "b"):
            served.append("b")

    async with trio.open_nursery() as work:
        work.start_soon(holds_a)
        await trio.testing.wait_all_tasks_blocked()
        work.start_soon(wants_b)
        await trio.testing.wait_all_tasks_blocked()
        assert [t.model for t in router.scheduler.queued()] == ["b"]
        await router.unload()
        assert router.model_state("a") is S.STOPPED
    assert served == ["b"]
    assert [(m, s) for m, s in recorder.history if s is S.STOPPED] == [("a", S.STOPPED)]


async def test_concurrency_limit_is_decided_before_waiting(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1, concurrency_limit=1))
    async with lease(router, "a"):
        t = trio.current_time()
        with pytest.raises(ConcurrencyLimit):
            async with lease(router, "a"):
                pass
        assert trio.current_time() == t


async def test_shutdown_fails_waiters_lets_serving_finish_and_stops_models(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    outcomes: list[str] = []
    served_until: list[float] = []

    async def serving() -> None:
        async with lease(router, "a"):
            served_until.append(trio.current_time() + 3.0)
            await trio.sleep(3.0)
            outcomes.append("served")

    async def waiting() -> None:
        try:
            async with lease(router, "b"):
                pass
        except ShuttingDown:
            outcomes.append("503")

    nursery.start_soon(serving)
    await recorder.wait_for(S.READY, "a")
    nursery.start_soon(waiting)
    await trio.testing.wait_all_tasks_blocked()
    await router.shutdown(grace=10.0)
    assert outcomes == ["503", "served"]
    assert trio.current_time() == served_until[0]  # waited for it, not for the grace
    assert router.running_models() == set()
    with pytest.raises(ShuttingDown):
        async with lease(router, "a"):
            pass


async def test_request_during_ttl_stop_waits_and_restarts(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=0.0, ignores_sigterm=True)
    router = await start_router(
        nursery, spawner, recorder, a=model(1, ttl=5.0, unload_timeout=2.0)
    )
    async with lease(router, "a"):
        pass
    await recorder.wait_for(S.STOPPING, "a")
    t0 = trio.current_time()
    async with lease(router, "a"):
        assert router.model_state("a") is S.READY
    assert trio.current_time() - t0 == 2.0
    assert len(spawner.processes) == 2


async def test_a_model_with_a_request_waiting_for_it_is_not_unloaded_by_its_ttl(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """``b`` (ttl 3 s) is ready, and a request for it waits 9 s for serial's slot, which
    ``a`` holds (the two run together). The TTL waits for it: it unloaded ``b`` 3 s after
    its last request, and loaded it again for the waiting one. Then it counts from the
    end of that request."""
    spawner.script = Script(healthy_after=0.0)
    together = GroupConfig(members=("a", "b"), swap=False)
    config = Config(
        models={"a": model(1), "b": model(2, ttl=3.0)},
        routing=Routing(
            router=RouterSection(settings=RouterSettings(groups={"g": together})),
            scheduler=SchedulerSection(use="serial"),
        ),
    )
    router = Router(
        config, spawner=spawner, probe=FakeProbe(spawner), observers=[recorder.observe]
    )
    await nursery.start(router.run)
    async with lease(router, "b"):
        pass
    served = trio.Event()

    async def hold_a() -> None:
        async with lease(router, "a"):
            served.set()
            await trio.sleep(10.0)

    async def request_b() -> None:
        await served.wait()
        await trio.sleep(1.0)
        async with lease(router, "b"):
            assert trio.current_time() == t0 + 10.0
            assert router.model_state("b") is S.READY
        ended.append(trio.current_time())

    t0 = trio.current_time()
    ended: list[float] = []
    async with trio.open_nursery() as requests:
        requests.start_soon(hold_a)
        requests.start_soon(request_b)
    assert recorder.states("b") == [S.STARTING, S.READY]  # never stopped
    await recorder.wait_for(S.STOPPING, "b")
    assert trio.current_time() == ended[0] + 3.0


@pytest.mark.parametrize(("late", "order"), [(150.0, ["c", "b"]), (201.0, ["b", "c"])])
async def test_serial_aging_overtakes_at_an_exact_time(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    late: float,
    order: list[str],
) -> None:
    # One aging point per second, no affinity. At the pick (t0 + 250) a batch request
    # (-100) that has waited since t0 scores 150; an interactive one (+100) that arrived
    # at t0 + late scores 100 + 250 - late: 200 if late = 150 (it wins), 149 if 201.
    spawner.script = Script(healthy_after=0.0)
    serial = SerialSettings(aging_divisor=1.0, swap_affinity_bonus=0)
    config = Config(
        models={"a": model(1), "b": model(2), "c": model(3)},
        routing=Routing(
            scheduler=SchedulerSection(use="serial", settings=SchedulerSettings(serial=serial))
        ),
    )
    router = Router(
        config, spawner=spawner, probe=FakeProbe(spawner), observers=[recorder.observe]
    )
    await nursery.start(router.run)
    served: list[tuple[str, float]] = []
    both = trio.Event()

    async def request(name: str, priority: int) -> None:
        async with lease(router, name, priority=priority):
            served.append((name, trio.current_time()))
            if len(served) == 2:
                both.set()

    async with lease(router, "a"):
        t0 = trio.current_time()
        nursery.start_soon(request, "b", -100)
        await trio.sleep(late)
        nursery.start_soon(request, "c", 100)
        await trio.sleep(250.0 - late)
    await both.wait()
    assert [name for name, _ in served] == order
    assert served[0][1] == t0 + 250.0


async def test_a_grant_is_released_even_if_cancelled_before_the_block_runs(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    # The load finishes (a grant) while the request is leaving ``while_waiting``, whose
    # slow cleanup lets a cancellation of the request arrive after the grant: the grant
    # must still be released.
    spawner.script = Script(healthy_after=1.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))

    async def slow_to_stop(lease: Lease) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5.0)

    with trio.move_on_after(3.0) as request:
        async with router.acquire(router.lease("a"), while_waiting=slow_to_stop):
            pytest.fail("the block must not run: the request was cancelled")
    assert request.cancelled_caught
    assert router.in_flight("a") == 0
    assert router.requests() == []
    await router.shutdown(grace=0.0)  # returns at once: nothing is being served


class _Broken(Exception):
    pass


def break_scheduler(router: Router, event: str, model: str) -> None:
    """Make the router's scheduler raise in ``event`` for tickets of ``model``."""
    real = getattr(router.scheduler, event)

    def broken(ticket: Ticket) -> list[Decision]:
        if ticket.model == model:
            raise _Broken(f"{event} bug")
        result: list[Decision] = real(ticket)
        return result

    setattr(router.scheduler, event, broken)


async def test_a_scheduler_bug_on_a_request_fails_that_request_only(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1), boom=model(2))
    break_scheduler(router, "on_request", "boom")
    with pytest.raises(InternalError, match="scheduler failed"):
        async with lease(router, "boom"):
            pytest.fail("not granted")
    assert "_Broken: on_request bug" in caplog.text  # with its traceback
    async with lease(router, "a"):
        assert router.model_state("a") is S.READY
    assert router.requests() == []


async def test_a_scheduler_bug_on_cancel_never_reaches_trio_cancellation_delivery(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # on_cancel once ran inside the parked task's abort callback, where an exception
    # crashes the whole Trio run (TrioInternalError). Now only the cancelled task's own
    # bookkeeping runs there; the scheduler hears of the cancel afterwards.
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    break_scheduler(router, "on_cancel", "b")
    async with lease(router, "a"):
        with trio.move_on_after(1.0) as waited:
            async with lease(router, "b"):
                pytest.fail("b waits while a serves")
        assert waited.cancelled_caught
    assert "_Broken: on_cancel bug" in caplog.text
    async with lease(router, "a"):
        pass


async def test_the_scheduler_hears_a_cancel_before_any_later_event(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    # b is queued behind a serving request for a. b's client goes, and in the same
    # moment (before b's task runs again) a finishes: the slot frees with b's cancel
    # not yet reported by b's own task. It must still never be loaded.
    router = await start_router(nursery, spawner, recorder, a=model(1), b=model(2))
    decisions: list[Decision] = []
    router.observe(decisions_into(decisions))
    b_scope = trio.CancelScope()

    async def request_b() -> None:
        with b_scope:
            async with lease(router, "b"):
                pytest.fail("b's client left before its turn")

    async with lease(router, "a"):
        nursery.start_soon(request_b)
        await trio.testing.wait_all_tasks_blocked()
        assert router.scheduler.statistics().waiting == 1
        b_scope.cancel()  # b's abort runs now; b's task has not run yet
    assert not [d for d in decisions if isinstance(d, StartSwap) and d.swap.target == "b"]
    await trio.testing.wait_all_tasks_blocked()
    assert [p.argv[1] for p in spawner.processes] == ["1"]
    assert router.requests() == []


async def test_decisions_are_published_in_the_order_applied(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1))
    decisions: list[Decision] = []
    router.observe(decisions_into(decisions))
    async with lease(router, "a") as held:
        assert [type(d) for d in decisions] == [StartSwap, JoinSwap, Grant]
        assert {getattr(d, "ticket", held.ticket) for d in decisions} == {held.ticket}
        assert held.info().state == "serving"
        assert [info.id for info in router.requests()] == [held.id]


async def test_cancelling_a_lease_ends_it_with_its_error_wherever_it_is(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=100.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    pending = router.lease("a")
    failures: list[RequestError] = []

    async def request() -> None:
        try:
            async with router.acquire(pending):
                pytest.fail("cancelled while loading")
        except RequestError as exc:
            failures.append(exc)

    nursery.start_soon(request)
    await recorder.wait_for(S.STARTING, "a")
    assert pending.info().state == "loading"
    pending.cancel(ModelUnloaded("a", "cancelled by an operator"))
    await recorder.wait_for(S.STOPPED, "a")  # nobody else wanted the load: killed
    assert [str(e) for e in failures] == [
        "model 'a' was unloaded while the request waited (cancelled by an operator)"
    ]


async def test_a_request_still_running_after_the_shutdown_grace_gets_a_clear_error(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1))
    failures: list[RequestError] = []
    serving = trio.Event()

    async def long_request() -> None:
        try:
            async with lease(router, "a"):
                serving.set()
                await trio.sleep_forever()  # a generation longer than the grace
        except RequestError as exc:
            failures.append(exc)

    nursery.start_soon(long_request)
    await serving.wait()
    t0 = trio.current_time()
    await router.shutdown(grace=4.0)
    assert trio.current_time() == t0 + 4.0  # the grace, then at once
    assert [type(e) for e in failures] == [ShuttingDown]
    assert "still running after unloadTimeout (4s)" in str(failures[0])
    assert router.model_state("a") is S.STOPPED


async def test_a_request_waiting_at_shutdown_is_failed_as_waiting_even_with_a_side_task(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    # A loading-state stream waits with ``while_waiting``, whose task takes a pass of the
    # scheduler to end after the request is failed: meanwhile nothing is in flight, so
    # the grace is over at once, and the request must not get the "still running" error.
    spawner.script = Script(healthy_after=60.0)
    router = await start_router(nursery, spawner, recorder, a=model(1))
    failures: list[RequestError] = []

    async def report(lease: Lease) -> None:
        await trio.sleep_forever()

    nursery.start_soon(record_failure, router, "a", failures, report)
    await recorder.wait_for(S.STARTING, "a")
    await router.shutdown(grace=4.0)
    await trio.testing.wait_all_tasks_blocked()
    assert [str(e) for e in failures] == [str(ShuttingDown())]


async def test_serial_queues_a_burst_of_a_thousand_and_serves_every_one(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    config = Config(
        models={"a": model(1)}, routing=Routing(scheduler=SchedulerSection(use="serial"))
    )
    router = Router(
        config, spawner=spawner, probe=FakeProbe(spawner), observers=[recorder.observe]
    )
    await nursery.start(router.run)
    served: list[int] = []
    refused: list[RequestError] = []
    done = trio.Event()

    async def request(index: int) -> None:
        try:
            async with lease(router, "a"):
                await trio.sleep(0.25)  # one at a time: the slot
                served.append(index)
        except RequestError as exc:
            refused.append(exc)
        if len(served) + len(refused) == 1000:
            done.set()

    for index in range(1000):
        nursery.start_soon(request, index)
    await done.wait()
    assert refused == []
    assert sorted(served) == list(range(1000))
    assert len(spawner.processes) == 1


async def serial_router(
    nursery: trio.Nursery, spawner: FakeSpawner, *observers: Observer
) -> Router:
    """'a' and 'b', one at a time, under serial with no affinity (and the default
    minResidency, 5 s)."""
    serial = SerialSettings(swap_affinity_bonus=0)
    config = Config(
        models={"a": model(1), "b": model(2)},
        routing=Routing(
            scheduler=SchedulerSection(use="serial", settings=SchedulerSettings(serial=serial))
        ),
    )
    router = Router(config, spawner=spawner, probe=FakeProbe(spawner), observers=observers)
    await nursery.start(router.run)
    return router


async def test_serial_keeps_a_model_in_its_residency_for_its_waiting_request(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
) -> None:
    # No affinity: 'b' arrived first and is the better pick. But 'a' loaded 1 s before
    # the slot frees (minResidency: 5 s by default) and a request waits for it, so that
    # request goes first, and 'b' loads the moment nothing waits for 'a'.
    decisions: list[Decision] = []
    router = await serial_router(nursery, spawner, decisions_into(decisions))
    served: list[tuple[str, float]] = []
    both = trio.Event()

    async def request(name: str) -> None:
        async with lease(router, name):
            served.append((name, trio.current_time()))
            await trio.sleep(1.0)
        if len(served) == 2:
            both.set()

    async with lease(router, "a"):
        ready = router.statistics("a").ready_since
        assert ready is not None
        nursery.start_soon(request, "b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(request, "a")
        await trio.sleep_until(ready + 1.0)
    await both.wait()
    assert served[0] == ("a", ready + 1.0)
    a_server, b_server = spawner.processes
    assert a_server.signals == [(ready + 2.0, signal.SIGTERM)]  # once its request is done
    assert b_server.spawned_at == ready + 2.0
    assert Recheck(ready + 5.0) in decisions  # the router's wake-up, had it been needed


async def test_serial_evicts_a_model_whose_residency_is_over(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
) -> None:
    # As above, but the slot frees 6 s after 'a' became ready: its residency (5 s) is
    # over, so 'b', the better pick, evicts it although a request still waits for it.
    router = await serial_router(nursery, spawner)
    order: list[str] = []

    async def request(name: str) -> None:
        async with lease(router, name):
            order.append(name)

    async with lease(router, "a"):
        ready = router.statistics("a").ready_since
        assert ready is not None
        nursery.start_soon(request, "b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(request, "a")
        await trio.sleep_until(ready + 6.0)
    await trio.testing.wait_all_tasks_blocked()
    a_server, b_server = spawner.processes[:2]
    assert a_server.signals == [(ready + 6.0, signal.SIGTERM)]
    assert b_server.spawned_at == ready + 6.0
