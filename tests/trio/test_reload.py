"""``Router.reconfigure``: a reload applied model by model, on the mock clock."""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from llamaswap.config.model import (
    Config,
    GroupConfig,
    MatrixConfig,
    ModelConfig,
    ProfileConfig,
    RouterSection,
    RouterSettings,
    Routing,
    SchedulerSection,
    SchedulerSettings,
    SerialSettings,
)
from llamaswap.errors import BadRequest, ModelUnloaded, RequestError
from llamaswap.observability import ActivityLog, Captures, Metrics
from llamaswap.process import ModelState
from llamaswap.proxy.exchange import Exchange, Recorder
from llamaswap.reloader import READ_TIMEOUT, SETTLE_DELAY, Reloader, ReloadResult
from llamaswap.router import Router
from llamaswap.router.events import ModelStateChanged, ProfileChanged, RouterEvent
from llamaswap.router.lease import Lease
from llamaswap.router.names import Local
from llamaswap.router.reload import ConfigChanges, diff_config
from tests.fakes import FakeProbe, FakeSpawner, StateRecorder

S = ModelState


def model(port: int, **settings: object) -> ModelConfig:
    return ModelConfig(cmd=("server", str(port)), proxy=f"http://m:{port}", **settings)  # type: ignore[arg-type]


def config(scheduler: str = "fifo", **models: ModelConfig) -> Config:
    """Every model may run beside every other: the tests watch processes, not swaps."""
    together = GroupConfig(members=tuple(models), swap=False, exclusive=False)
    return Config(
        models=models,
        routing=Routing(
            router=RouterSection(settings=RouterSettings(groups={"all": together})),
            scheduler=SchedulerSection(use=scheduler),  # type: ignore[arg-type]
        ),
    )


def lease(router: Router, name: str) -> AbstractAsyncContextManager[Lease]:
    return router.acquire(router.lease(name))


async def start(
    nursery: trio.Nursery, spawner: FakeSpawner, recorder: StateRecorder, cfg: Config
) -> Router:
    router = Router(cfg, spawner=spawner, probe=FakeProbe(spawner), observers=[recorder.observe])
    await nursery.start(router.run)
    return router


def test_the_diff_sorts_models_by_what_a_reload_does_to_them() -> None:
    old = Config(models={"same": model(1), "ttl": model(2), "cmd": model(3), "gone": model(4)})
    new = Config(
        models={
            "same": model(1),
            "ttl": model(2, ttl=60.0, aliases=("t",)),
            "cmd": ModelConfig(cmd=("server", "3", "--ctx", "8192"), proxy="http://m:3"),
            "new": model(5),
        },
        api_keys=("k",),
    )
    assert diff_config(old, new) == ConfigChanges(
        added=("new",),
        removed=("gone",),
        restarted=("cmd",),
        updated=("ttl",),
        unchanged=("same",),
        settings=("apiKeys",),
    )
    assert diff_config(old, new).describe() == (
        "added 'new'; removed 'gone'; restarted 'cmd'; updated 'ttl'; settings apiKeys"
    )
    assert diff_config(old, old).describe() == "no change"


@contextmanager
def hung_file(path: Path) -> Iterator[Callable[[], None]]:
    """A FIFO nobody writes at ``path``, standing for a file on a hung network mount: a
    read of it blocks until ``release()`` (it then reads empty text). Should a read never
    give up, a timer releases it after 10 s: the test fails rather than hangs."""
    os.mkfifo(path)

    def release() -> None:
        path.open("w").close()

    guard = threading.Timer(10.0, release)
    guard.start()
    try:
        yield release
    finally:
        guard.cancel()


async def test_an_unchanged_model_keeps_its_process_and_serves_throughout(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    async with lease(router, "a"):
        pid = router.statistics("a").pid
        changes = await router.reconfigure(config(a=model(1), b=model(2)))
        assert changes.unchanged == ("a",)
        assert changes.added == ("b",)
    async with lease(router, "a"):
        assert router.statistics("a").pid == pid
    async with lease(router, "b"):  # servable at once
        assert router.model_state("b") is S.READY
    assert recorder.states("a") == [S.STARTING, S.READY]


async def test_a_changed_model_finishes_its_requests_then_restarts_with_no_request_lost(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    served: list[tuple[str, ...]] = []

    async def queued_request() -> None:
        async with lease(router, "a"):
            served.append(spawner.last.argv)

    changed = model(1, env={"N_CTX": "8192"})
    async with lease(router, "a"):
        old = spawner.last
        changes = await router.reconfigure(config(a=changed))
        assert changes.restarted == ("a",)
        # Still serving this request; no new one goes to the old process.
        assert router.model_state("a") is S.STOPPING
        assert old.returncode is None
        nursery.start_soon(queued_request)
        await trio.testing.wait_all_tasks_blocked()
        assert served == []
    await recorder.wait_for(S.READY, "a")
    await trio.testing.wait_all_tasks_blocked()
    assert spawner.processes[0].returncode == 0  # SIGTERM once drained
    assert len(spawner.processes) == 2
    assert spawner.last.env["N_CTX"] == "8192"
    assert served == [spawner.last.argv]


async def test_a_removed_model_fails_its_queue_and_stops_once_drained(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    exclusive = Config(models={"a": model(1), "b": model(2)})  # one at a time
    router = await start(nursery, spawner, recorder, exclusive)
    failures: list[RequestError] = []

    async def waiting_request() -> None:
        try:
            async with lease(router, "a"):
                pytest.fail("a was removed while this waited")
        except RequestError as exc:
            failures.append(exc)

    async with lease(router, "b"):
        nursery.start_soon(waiting_request)  # queued: it would evict b, which serves
        await trio.testing.wait_all_tasks_blocked()
        await router.reconfigure(Config(models={"b": model(2)}))
        await trio.testing.wait_all_tasks_blocked()
        assert [type(f) for f in failures] == [ModelUnloaded]
        assert "removed from the configuration" in str(failures[0])
    with pytest.raises(RequestError, match="not found"):
        router.names.resolve("a")
    assert recorder.states("a") == []  # never started


async def test_a_removed_model_serving_a_request_stops_once_it_is_done(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    async with lease(router, "a"):
        process = spawner.last
        await router.reconfigure(config(b=model(2)))
        await trio.testing.wait_all_tasks_blocked()
        assert router.model_state("a") is S.STOPPING
        assert process.returncode is None  # the request in flight goes on
        assert router.shown_models() == ["a", "b"]  # shown (events) until it stops
    await recorder.wait_for(S.STOPPED, "a")
    assert router.shown_models() == ["b"]
    assert process.returncode == 0


async def test_switching_scheduler_requeues_waiting_requests_in_arrival_order(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    exclusive = Config(models={"a": model(1), "b": model(2), "c": model(3)})
    router = await start(nursery, spawner, recorder, exclusive)
    order: list[str] = []
    all_served = trio.Event()

    async def request(name: str) -> None:
        async with lease(router, name):
            order.append(name)
            if len(order) == 3:
                all_served.set()

    async with lease(router, "a"):
        for name in ("b", "c", "b"):
            nursery.start_soon(request, name)
            await trio.testing.wait_all_tasks_blocked()
        assert router.scheduler.statistics().waiting == 3  # fifo
        # No affinity: serial then serves in arrival order (fifo would collate: b b c).
        settings = SchedulerSettings(serial=SerialSettings(swap_affinity_bonus=0))
        # No minResidency either: it would keep the just-loaded 'b' for its second request.
        serial = Config(
            models=exclusive.models,
            min_residency=0.0,
            routing=Routing(scheduler=SchedulerSection(use="serial", settings=settings)),
        )
        await router.reconfigure(serial)
        assert router.scheduler.name == "serial"
        states = [(info.model, info.state) for info in router.requests()]
        assert states == [("a", "serving"), ("b", "queued"), ("c", "queued"), ("b", "queued")]
    with trio.fail_after(600):
        await all_served.wait()
    assert order == ["b", "c", "b"]
    assert router.requests() == []


async def test_after_a_switch_to_serial_its_slot_is_not_shared_with_fifos_requests(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """fifo serves two requests for 'a' at once. After the switch, serial's one slot is
    theirs: a new request for 'a' waits until both are done (it ran beside them before,
    with the old scheduler keeping its requests). One scheduler is left."""
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    release = trio.Event()
    served: list[str] = []
    counts = {2: trio.Event(), 3: trio.Event()}  # set as that many have been served

    async def request(name: str) -> None:
        async with lease(router, "a"):
            served.append(name)
            if len(served) in counts:
                counts[len(served)].set()
            if name != "later":
                await release.wait()

    for name in ("first", "second"):
        nursery.start_soon(request, name)
    with trio.fail_after(60):
        await counts[2].wait()  # its load takes simulated time
    await router.reconfigure(config("serial", a=model(1)))
    assert router.scheduler.name == "serial"
    nursery.start_soon(request, "later")
    await trio.testing.wait_all_tasks_blocked()
    assert sorted(served) == ["first", "second"]  # the slot is the old requests'
    assert [info.state for info in router.requests()] == ["serving", "serving", "queued"]
    release.set()
    with trio.fail_after(60):
        await counts[3].wait()
    assert served[2] == "later"
    await trio.testing.wait_all_tasks_blocked()
    assert router.requests() == []


async def test_switching_between_group_and_matrix_rebuilds_the_swapper(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    models = {"a": model(1), "b": model(2), "c": model(3)}
    exclusive = Config(models=models)  # group: one at a time
    pairs = Config(
        models=models,
        routing=Routing(
            router=RouterSection(
                use="matrix",
                settings=RouterSettings(
                    matrix=MatrixConfig(
                        vars={"a": "a", "b": "b", "c": "c"}, sets={"pair": "a & b", "solo": "c"}
                    )
                ),
            )
        ),
    )
    router = await start(nursery, spawner, recorder, exclusive)
    async with lease(router, "a"):
        pass
    await router.reconfigure(pairs)
    async with lease(router, "b"):  # beside a
        assert router.running_models() == {"a", "b"}
    async with lease(router, "c"):  # alone
        assert router.running_models() == {"c"}
    async with lease(router, "a"):
        pass
    await router.reconfigure(exclusive)
    async with lease(router, "b"):  # groups again: a stops
        assert router.running_models() == {"b"}
    assert recorder.states("a") == [S.STARTING, S.READY, S.STOPPING, S.STOPPED] * 2


# --- the Reloader: reading the file ------------------------------------------------------

ONE_MODEL = '[models.a]\ncmd = "server 1"\nproxy = "http://m:1"\n'


async def test_a_file_that_cannot_be_read_fails_the_reload_after_the_read_timeout(
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    """A FIFO nobody writes stands for a hung network mount: the reading thread is left
    blocked, and the reload fails instead of holding every later reload (and shutdown).
    (The clock moves only when told: reading a file takes real time.)"""
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    fifo = tmp_path / "config.toml"
    reloader = Reloader(str(fifo), router)
    results = []

    async def reload() -> None:
        results.append(await reloader.reload("api"))

    with hung_file(fifo) as release:
        async with trio.open_nursery() as reloading:
            reloading.start_soon(reload)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(READ_TIMEOUT)
    (result,) = results
    assert not result.ok
    assert result.problems == (f"{fifo}: not read within 10 s; is it on a hung mount?",)
    await trio.to_thread.run_sync(release)
    fifo.unlink()
    fifo.write_text(ONE_MODEL.replace("[models.a]", "[models.b]"))
    assert (await reloader.reload("api")).ok  # the lock was released
    assert set(router.config.models) == {"b"}


async def test_reloads_while_a_read_hangs_take_none_of_trios_default_thread_tokens(
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    """Each reload of a file on a hung mount left a thread behind, holding one of Trio's 40
    default worker tokens for good; then nothing else got a thread (the activity store,
    host name lookups). Now reads have a token of their own: the first read's thread keeps
    it, and the next reloads time out waiting for it rather than start a thread each."""
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    fifo = tmp_path / "config.toml"
    reloader = Reloader(str(fifo), router)
    default = trio.to_thread.current_default_thread_limiter()
    results = []

    async def reload() -> None:
        results.append(await reloader.reload("api"))

    with hung_file(fifo) as release:
        for _ in range(3):
            async with trio.open_nursery() as reloading:
                reloading.start_soon(reload)
                await trio.testing.wait_all_tasks_blocked()
                assert default.borrowed_tokens == 0
                mock_clock.jump(READ_TIMEOUT)
    hung = (f"{fifo}: not read within 10 s; is it on a hung mount?",)
    assert [result.problems for result in results] == [hung] * 3
    await trio.to_thread.run_sync(release)


async def test_a_reload_after_shutdown_began_changes_nothing(
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    path = tmp_path / "config.toml"
    path.write_text(ONE_MODEL.replace("[models.a]", "[models.b]"))
    reloader = Reloader(str(path), router)
    reloader.close()
    result = await reloader.reload("SIGHUP")
    assert result.problems == ("llamaswap is shutting down; the running config stays",)
    assert set(router.config.models) == {"a"}


def emptying(path: Path, models: str) -> str:
    return (
        f"{path}: models: the file defines no model and has no [models] table, so it would "
        f"remove every model ({models}); if it was saved half-written, save it again; "
        "to remove every model, write [models] with nothing under it"
    )


@pytest.mark.parametrize(
    "text",
    ["", "# saved half-written\n", "startPort = 6000\n", '[macros]\nx = "y"\n'],
    ids=["empty", "comment", "setting", "macros"],
)
async def test_a_file_with_no_models_table_does_not_remove_every_model(
    text: str,
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    """A writer that truncates the file, then writes it, leaves it empty for a while: a
    reload then removed every model, and every request waiting for one failed with 503."""
    router = await start(nursery, spawner, recorder, config(a=model(1), b=model(2)))
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = await Reloader(str(path), router).reload("SIGHUP")
    assert result == ReloadResult(False, "SIGHUP", problems=(emptying(path, "'a', 'b'"),))
    assert set(router.config.models) == {"a", "b"}
    path.write_text('startPort = "x"\n')  # reported beside the file's other problems
    problems = (await Reloader(str(path), router).reload("SIGHUP")).problems
    assert problems == (
        emptying(path, "'a', 'b'"),
        f"{path}: startPort: expected an integer, got 'x'",
    )


async def test_an_empty_models_table_removes_every_model(
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    path = tmp_path / "config.toml"
    reloader = Reloader(str(path), router)
    path.write_text("[models]\n")
    result = await reloader.reload("api")
    assert result.ok
    assert result.changes is not None
    assert result.changes.removed == ("a",)
    assert dict(router.config.models) == {}
    path.write_text("")  # with no model configured, there is none to remove
    assert (await reloader.reload("api")).ok


async def test_the_watch_reloads_once_the_file_has_been_left_unchanged_for_a_while(
    mock_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    tmp_path: Path,
) -> None:
    """A burst of changes (truncated, then written) is one reload, ``SETTLE_DELAY`` after
    the last change, of the complete file. (The clock moves only when told: reading the
    file takes real time.)"""
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    path = tmp_path / "config.toml"
    path.write_text(ONE_MODEL)
    results: list[tuple[float, ReloadResult]] = []
    reloaded = trio.Event()

    def on_result(result: ReloadResult) -> None:
        results.append((trio.current_time(), result))
        reloaded.set()

    reloader = Reloader(str(path), router, on_result)
    send, receive = trio.open_memory_channel[set[str]](0)

    async def change(text: str) -> None:
        path.write_text(text)
        await send.send({"modified"})
        await trio.testing.wait_all_tasks_blocked()

    async with trio.open_nursery() as watching, send:
        watching.start_soon(reloader.follow, receive)
        await send.send(set())  # armed
        await change("")  # truncated at t = 0 ...
        mock_clock.jump(0.25)
        await change(ONE_MODEL + '[models.b]\ncmd = "server 2"\nproxy = "http://m:2"\n')
        mock_clock.jump(SETTLE_DELAY - 0.125)  # ... written at t = 0.25; now t = 0.625
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        mock_clock.jump(0.25)  # t = 0.875: unchanged for 0.625 s
        await reloaded.wait()
        ((when, result),) = results
        assert when == 0.875
        assert result.ok
        assert result.changes is not None
        assert result.changes.added == ("b",)
        assert set(router.config.models) == {"a", "b"}
        reloaded = trio.Event()
        await change(ONE_MODEL)  # the next burst: one more reload, once settled
        mock_clock.jump(SETTLE_DELAY + 0.125)
        await reloaded.wait()
        assert [when for when, _ in results] == [0.875, 1.5]
        assert set(router.config.models) == {"a"}


# ------------------------------------------------- a removed model is forgotten


def all_tasks() -> list[trio.lowlevel.Task]:
    tasks, todo = [], [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        assert task is not None
        tasks.append(task)
        todo += [child for nursery in task.child_nurseries for child in nursery.child_tasks]
    return tasks


def series(metrics: Metrics) -> list[str]:
    text = metrics.exposition().decode()
    return [line for line in text.splitlines() if not line.startswith("#")]


def recording(router: Router) -> tuple[Metrics, Recorder]:
    """Metrics and a recorder for ``router``'s requests, listening as ``create_app``'s do."""
    metrics = Metrics(router)
    router.observe(metrics.on_event)
    return metrics, Recorder(
        ActivityLog(), metrics, Captures(lambda: router.config.capture_buffer)
    )


def chat_exchange(router: Router, name: str) -> tuple[Exchange, Lease]:
    """A chat request for ``name`` and its lease, as the forwarder makes them."""
    exchange = Exchange("POST", "/v1/chat/completions", model=name)
    exchange.lease = held = router.lease(name)
    return exchange, held


async def serve_one(router: Router, recorder: Recorder, name: str) -> None:
    """A request for ``name`` served and recorded, as the forwarder does."""
    exchange, held = chat_exchange(router, name)
    async with router.acquire(held):
        exchange.status = 200
    recorder.finish(exchange)


async def test_a_model_each_reload_replaces_leaves_no_supervisor_task_or_series_behind(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(keep=model(1), m0=model(2)))
    metrics, records = recording(router)

    async def reload(n: int) -> None:
        """Replace m{n-1} with m{n}, and serve one request on each model."""
        await router.reconfigure(config(keep=model(1), **{f"m{n}": model(2)}))  # type: ignore[arg-type]
        for name in ("keep", f"m{n}"):
            await serve_one(router, records, name)
        await trio.testing.wait_all_tasks_blocked()

    await reload(1)  # warm-up: every kind of series exists once
    before = (len(all_tasks()), len(series(metrics)))
    for n in range(2, 22):
        await reload(n)
    assert router.known_models() == ["keep", "m21"]
    assert (len(all_tasks()), len(series(metrics))) == before
    assert not any('model="m20"' in line for line in series(metrics))
    assert sum('model="m21"' in line for line in series(metrics)) > 0
    assert len(spawner.processes) == 22  # keep, and each m once


async def test_a_straggler_of_a_removed_model_finishes_then_the_model_is_forgotten(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    metrics, records = recording(router)
    await serve_one(router, records, "a")
    ring = router.log_rings()["a"]
    exchange, held = chat_exchange(router, "a")
    async with router.acquire(held):
        await router.reconfigure(config(b=model(2)))
        await trio.testing.wait_all_tasks_blocked()
        assert router.log_rings()["a"] is ring  # kept for the straggler
        assert router.model_state("a") is S.STOPPING
        exchange.status = 200
    records.finish(exchange)
    assert 'llamaswap_requests_total{model="a",status="200"} 2.0' in series(metrics)
    await recorder.wait_for(S.STOPPED, "a")
    assert router.known_models() == ["b"]
    assert not any('model="a"' in line for line in series(metrics))
    await trio.testing.wait_all_tasks_blocked()
    assert not any("supervisor of a" in task.name for task in all_tasks())
    assert records.activity.recent(2)[0].status == 200


async def test_a_straggler_whose_removed_model_crashed_is_recorded_without_series(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    metrics, records = recording(router)
    exchange, held = chat_exchange(router, "a")
    async with router.acquire(held):
        await router.reconfigure(config(b=model(2)))
        spawner.last.exit(1)  # crashed under its last request
        await recorder.wait_for(S.STOPPED, "a")
        assert "a" in router.known_models()  # its request is still in flight
        exchange.status = 502
    assert router.known_models() == ["b"]  # forgotten as the request ended
    records.finish(exchange)  # after: the series must not come back
    assert not any('model="a"' in line for line in series(metrics))
    assert records.activity.recent(1)[0].status == 502


async def test_a_model_removed_and_re_added_before_it_stopped_keeps_its_supervisor(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    ring = router.log_rings()["a"]
    async with lease(router, "a"):
        await router.reconfigure(config(b=model(2)))
        await router.reconfigure(config(a=model(1), b=model(2)))
    await trio.testing.wait_all_tasks_blocked()
    assert router.log_rings()["a"] is ring
    async with lease(router, "a"):
        assert router.log_rings()["a"] is ring
    assert router.statistics("a").starts == 2  # re-added: started anew, same supervisor


async def test_a_model_re_added_after_it_was_forgotten_gets_a_new_supervisor(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    old = router.log_rings()["a"]
    async with lease(router, "a"):
        pass
    await router.reconfigure(config(b=model(2)))
    await recorder.wait_for(S.STOPPED, "a")
    assert "a" not in router.known_models()
    await router.reconfigure(config(a=model(1), b=model(2)))
    async with lease(router, "a"):
        assert router.log_rings()["a"] is not old
        assert router.model_state("a") is S.READY


async def test_a_reload_cancelled_as_it_starts_a_new_supervisor_still_records_it(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """A supervisor's task runs from the moment it is started: a reload cancelled while
    it waits for the task to run must not leave that task running unrecorded."""
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await router.reconfigure(config(a=model(1), b=model(2)))
    await trio.testing.wait_all_tasks_blocked()
    running = {
        t.name.removeprefix("supervisor of ") for t in all_tasks() if "supervisor of" in t.name
    }
    assert running == set(router.known_models()) == set(router.config.models) == {"a", "b"}
    async with lease(router, "b"):
        assert router.model_state("b") is S.READY


async def test_a_request_named_before_its_model_was_removed_is_refused_at_admission(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1), b=model(2)))
    late = router.lease("a")  # named, then its body is read while the reload happens
    await router.reconfigure(config(b=model(2)))
    with pytest.raises(ModelUnloaded, match="removed from the configuration"):
        async with router.acquire(late):
            pytest.fail("a removed model was served")
    assert recorder.states("a") == []  # and never started again
    assert "a" not in router.known_models()


async def test_a_supervisor_a_reload_adds_keeps_no_copy_of_the_reloading_tasks_context(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    request = object()  # what Quart's request context is to a reload through the API

    async def reload_request() -> None:
        REQUEST.set(request)
        await router.reconfigure(config(a=model(1), b=model(2)))

    async with trio.open_nursery() as requests:
        requests.start_soon(reload_request)
    assert "b" in router.known_models()
    assert [task.name for task in all_tasks() if task.context.get(REQUEST) is request] == []


REQUEST: contextvars.ContextVar[object] = contextvars.ContextVar("REQUEST")


async def test_a_stopped_models_address_is_that_of_the_server_that_stopped(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start(nursery, spawner, recorder, config(a=model(1)))
    stopped_at: list[str | None] = []

    def on_event(event: RouterEvent) -> None:  # as serve()'s pool observer reads it
        if isinstance(event, ModelStateChanged) and event.state is S.STOPPED:
            stopped_at.append(router.statistics(event.model).address)

    router.observe(on_event)
    async with lease(router, "a"):
        await router.reconfigure(config(a=model(2)))  # another port: restarts once drained
    await recorder.wait_for(S.STOPPED, "a")
    assert stopped_at == ["http://m:1"]  # the old server's, whose connections are dead
    async with lease(router, "a"):
        assert router.statistics("a").address == "http://m:2"


async def test_a_request_is_recorded_under_the_scheduler_that_had_it_across_a_switch(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """Served under fifo, recorded as fifo's, though serial had replaced it by its end; a
    request still waiting at the switch went to serial, and is recorded as serial's."""
    models = {"a": model(1), "b": model(2)}  # one at a time
    router = await start(nursery, spawner, recorder, Config(models=models))
    _, records = recording(router)
    served, held = chat_exchange(router, "a")
    waiting, queued = chat_exchange(router, "b")
    b_recorded = trio.Event()

    async def wait_for_b() -> None:
        async with router.acquire(queued):
            waiting.status = 200
        records.finish(waiting)
        b_recorded.set()

    async with router.acquire(held):
        nursery.start_soon(wait_for_b)
        await trio.testing.wait_all_tasks_blocked()  # b waits: a is busy
        serial = Routing(scheduler=SchedulerSection(use="serial"))
        await router.reconfigure(Config(models=models, routing=serial))
        served.status = 200
    records.finish(served)
    with trio.fail_after(60):
        await b_recorded.wait()
    assert [(r.model, r.scheduler) for r in records.activity.recent()] == [
        ("b", "serial"),
        ("a", "fifo"),
    ]


async def test_a_reload_keeps_the_active_profile_while_the_config_has_it(
    nursery: trio.Nursery,
) -> None:
    spawner = FakeSpawner(nursery)
    events: list[RouterEvent] = []
    router = Router(config(a=model(1), b=model(2)), spawner=spawner, probe=FakeProbe(spawner))
    router.observe(events.append, ProfileChanged)
    await nursery.start(router.run)
    with pytest.raises(BadRequest, match="no profile 'day'"):
        router.set_profile("day")

    def with_profile(target: str) -> Config:
        profile = ProfileConfig(pins={"a": target})
        return attrs.evolve(config(a=model(1), b=model(2)), profiles={"day": profile})

    await router.reconfigure(with_profile("b"))
    router.set_profile("day")
    router.set_profile("day")  # already active: nothing to tell
    assert router.names.resolve("a") == Local("b")
    changes = await router.reconfigure(with_profile("a"))  # its pins changed: still active
    assert changes.settings == ("profiles",)
    assert (router.names.profile, router.names.resolve("a")) == ("day", Local("a"))
    await router.reconfigure(config(a=model(1), b=model(2)))  # gone: none is active
    assert router.names.profile is None
    assert events == [ProfileChanged("day"), ProfileChanged(None)]
