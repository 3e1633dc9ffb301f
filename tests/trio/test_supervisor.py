"""The supervisor's state machine on Trio's mock clock, against fake processes."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from llamaswap.config.model import ModelConfig
from llamaswap.errors import ModelStartFailed, ModelUnloaded
from llamaswap.process import ModelState, ModelSupervisor, StartFailure
from llamaswap.process.supervisor import EXIT_GRACE
from tests.fakes import FakeProbe, FakeSpawner, Script, StateRecorder

S = ModelState
Factory = Callable[..., Awaitable[ModelSupervisor]]


@pytest.fixture
def spawner(nursery: trio.Nursery) -> FakeSpawner:
    return FakeSpawner(nursery)


@pytest.fixture
def make(nursery: trio.Nursery, spawner: FakeSpawner, recorder: StateRecorder) -> Factory:
    async def factory(**overrides: object) -> ModelSupervisor:
        health_check_timeout = float(overrides.pop("health_check_timeout", 30.0))  # type: ignore[arg-type]
        in_flight = overrides.pop("in_flight", lambda: 0)
        settings: dict[str, object] = {"cmd": ("server", "--port", "9"), "proxy": "http://m:9"}
        settings.update(overrides)
        supervisor = ModelSupervisor(
            "m",
            ModelConfig(**settings),  # type: ignore[arg-type]
            spawner=spawner,
            probe=FakeProbe(spawner),
            health_check_timeout=health_check_timeout,
            listener=recorder,
            in_flight=in_flight,  # type: ignore[arg-type]
            poll_interval=0.25,
        )
        await nursery.start(supervisor.run)
        return supervisor

    return factory


async def test_start_becomes_ready_at_first_healthy_probe(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=0.9)
    supervisor = await make()
    t0 = trio.current_time()
    await supervisor.ensure_ready()
    assert trio.current_time() - t0 == 1.0  # polls at 0, 0.25, 0.5, 0.75, 1.0
    assert supervisor.state is S.READY
    assert recorder.states() == [S.STARTING, S.READY]
    assert spawner.last.argv == ("server", "--port", "9")
    stats = supervisor.statistics()
    assert (stats.state, stats.pid, stats.starts, stats.ready_since) == (
        S.READY,
        1000,
        1,
        t0 + 1.0,
    )


async def test_ready_model_returns_at_once_and_env_is_passed(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    supervisor = await make(env={"CUDA_VISIBLE_DEVICES": "1"})
    await supervisor.ensure_ready()
    t = trio.current_time()
    await supervisor.ensure_ready()
    assert trio.current_time() == t
    assert len(spawner.processes) == 1
    assert spawner.last.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "PATH" in spawner.last.env


async def test_a_failed_start_quotes_only_its_own_output(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(output=["first run: serving"])
    supervisor = await make()
    await supervisor.ensure_ready()
    await supervisor.stop("unload")
    spawner.script = Script(healthy_after=None, exit_after=0.5, output=[])
    with pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    assert caught.value.log_tail == ()  # not the lines of the run before
    assert "last output" not in str(caught.value)


async def test_check_endpoint_none_is_ready_once_started(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(healthy_after=None)
    supervisor = await make(check_endpoint="none")
    await supervisor.ensure_ready()
    assert supervisor.state is S.READY


async def test_health_timeout_kills_and_fails_with_output(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=None, output=["loading tensors", "stuck"])
    supervisor = await make(health_check_timeout=5.0)
    t0 = trio.current_time()
    with pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    assert trio.current_time() - t0 == 5.0
    assert "healthCheckTimeout (5s)" in str(caught.value)
    assert caught.value.log_tail == ("loading tensors", "stuck")
    assert spawner.last.signals == [(t0 + 5.0, signal.SIGTERM)]
    assert recorder.states() == [S.STARTING, S.STOPPING, S.STOPPED]
    assert supervisor.statistics().start_failures == 1


async def test_exit_while_starting_fails_at_once(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(
        healthy_after=None, exit_after=0.5, exit_code=1, output=["error: no such file 'm.gguf'"]
    )
    supervisor = await make(health_check_timeout=120.0)
    t0 = trio.current_time()
    with pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    assert trio.current_time() - t0 == 0.5
    assert caught.value.exit_code == 1
    assert "exited with status 1 while starting" in str(caught.value)
    assert "error: no such file 'm.gguf'" in str(caught.value)
    assert "check models.m.cmd" in str(caught.value)
    assert recorder.states() == [S.STARTING, S.STOPPED]
    assert spawner.last.signals == []


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (FileNotFoundError(2, "No such file or directory"), "No such file or directory"),
        (ValueError("embedded null byte"), "embedded null byte"),  # what subprocess raises
    ],
)
async def test_unrunnable_command_fails(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    error: OSError | ValueError,
    reason: str,
) -> None:
    spawner.fail_with = error
    supervisor = await make()
    with pytest.raises(ModelStartFailed, match=f"cannot run 'server': {reason}"):
        await supervisor.ensure_ready()
    assert supervisor.state is S.STOPPED


async def test_failed_start_can_be_retried(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(healthy_after=None, exit_after=0.5)
    supervisor = await make()
    with pytest.raises(ModelStartFailed):
        await supervisor.ensure_ready()
    spawner.script = Script(healthy_after=0.0)
    await supervisor.ensure_ready()
    assert supervisor.state is S.READY
    assert len(spawner.processes) == 2


async def test_a_failed_start_reads_failed_until_the_next_start_begins(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    nursery: trio.Nursery,
) -> None:
    lines = ["error: no such file 'm.gguf'", "llama_model_load: failed"]
    spawner.script = Script(healthy_after=None, exit_after=0.5, exit_code=1, output=lines)
    supervisor = await make()
    assert (supervisor.statistics().failure, supervisor.statistics().shown_state) == (
        None,
        "stopped",
    )
    with pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    stats = supervisor.statistics()
    reason = "exited with status 1 while starting"
    assert stats.failure == StartFailure(reason, str(caught.value), 1, tuple(lines))
    assert (stats.state, stats.shown_state) == (S.STOPPED, "failed")
    assert stats.failure_json() == {
        "reason": reason,
        "message": str(caught.value),
        "exit_code": 1,
        "output": lines,
    }
    # The next start ends it: starting, then ready, with no failure.
    spawner.script = Script(healthy_after=1.0)
    nursery.start_soon(supervisor.ensure_ready)
    await trio.testing.wait_all_tasks_blocked()
    starting = supervisor.statistics()
    assert (starting.shown_state, starting.failure) == ("starting", None)
    await supervisor.ensure_ready()
    assert (supervisor.statistics().shown_state, supervisor.statistics().failure) == (
        "ready",
        None,
    )


async def test_a_health_timeout_is_a_failure_without_an_exit_code(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(healthy_after=None, output=["loading tensors"])
    supervisor = await make(health_check_timeout=5.0)
    with pytest.raises(ModelStartFailed):
        await supervisor.ensure_ready()
    failure = supervisor.statistics().failure
    assert failure is not None
    assert (failure.exit_code, failure.output) == (None, ("loading tensors",))
    assert supervisor.statistics().last_exit_code == 0  # SIGTERM: it stopped when asked


async def test_a_start_stopped_or_a_crash_after_ready_is_no_failure(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=60.0)
    supervisor = await make()
    with trio.move_on_after(2.0):  # abandoned: stopped
        await supervisor.ensure_ready()
    await recorder.wait_for(S.STOPPED)
    assert (supervisor.statistics().shown_state, supervisor.statistics().failure) == (
        "stopped",
        None,
    )
    spawner.script = Script(exit_after=7.0, exit_code=139, output=["segfault"])
    await supervisor.ensure_ready()
    await recorder.wait_for(S.STOPPED)
    stats = supervisor.statistics()
    assert (stats.shown_state, stats.failure, stats.crashes) == ("stopped", None, 1)


async def test_stop_is_polite_first(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    supervisor = await make()
    await supervisor.ensure_ready()
    t0 = trio.current_time()
    await supervisor.stop("unload requested")
    assert trio.current_time() == t0
    assert spawner.last.signals == [(t0, signal.SIGTERM)]
    assert recorder.states() == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    assert supervisor.statistics().last_exit_code == 0


async def test_stop_escalates_to_sigkill_after_unload_timeout(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(ignores_sigterm=True)
    supervisor = await make(unload_timeout=10.0)
    await supervisor.ensure_ready()
    t0 = trio.current_time()
    await supervisor.stop("unload requested")
    assert trio.current_time() - t0 == 10.0
    assert spawner.last.signals == [(t0, signal.SIGTERM), (t0 + 10.0, signal.SIGKILL)]
    assert supervisor.state is S.STOPPED
    assert supervisor.statistics().last_exit_code == -signal.SIGKILL


async def test_cmd_stop_replaces_sigterm_with_pid(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    supervisor = await make(cmd_stop=("docker", "stop", "--pid=${PID}", "${PID}"))
    await supervisor.ensure_ready()
    await supervisor.stop("unload requested")
    assert spawner.commands == [("docker", "stop", "--pid=1000", "1000")]
    assert spawner.last.signals == []
    assert supervisor.log.tail(1) == ["cmdStop: stopped 1000"]  # its output, in the log


async def test_cancelling_the_only_waiter_aborts_the_start(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(healthy_after=60.0)
    supervisor = await make()
    t0 = trio.current_time()
    with trio.move_on_after(2.0):
        await supervisor.ensure_ready()
    assert supervisor.state is S.STOPPING
    await recorder.wait_for(S.STOPPED)
    assert trio.current_time() - t0 == 2.0
    assert spawner.last.signals == [(t0 + 2.0, signal.SIGTERM)]


async def test_start_goes_on_while_one_waiter_remains(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    nursery: trio.Nursery,
) -> None:
    spawner.script = Script(healthy_after=3.0)
    supervisor = await make()
    done = trio.Event()

    async def patient() -> None:
        await supervisor.ensure_ready()
        done.set()

    nursery.start_soon(patient)
    with trio.move_on_after(1.0):
        await supervisor.ensure_ready()
    assert supervisor.statistics().state is S.STARTING
    await done.wait()
    assert supervisor.state is S.READY
    assert spawner.last.signals == []
    assert len(spawner.processes) == 1


async def test_stop_during_start_fails_waiters_as_unloaded(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    nursery: trio.Nursery,
) -> None:
    spawner.script = Script(healthy_after=60.0)
    supervisor = await make()
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await supervisor.ensure_ready()
        except ModelUnloaded as exc:
            errors.append(exc)

    nursery.start_soon(waiter)
    await trio.testing.wait_all_tasks_blocked()
    await supervisor.stop("evicted for 'other'")
    await trio.testing.wait_all_tasks_blocked()
    assert supervisor.state is S.STOPPED
    assert [str(e) for e in errors] == [
        "model 'm' was unloaded while the request waited (evicted for 'other')"
    ]


async def test_ttl_unloads_after_idle_time_from_ready(
    autojump_clock: trio.testing.MockClock, make: Factory, recorder: StateRecorder
) -> None:
    supervisor = await make(ttl=60.0)
    await supervisor.ensure_ready()
    t0 = trio.current_time()
    await recorder.wait_for(S.STOPPED)
    assert trio.current_time() - t0 == 60.0


async def test_ttl_counts_from_the_end_of_the_last_request(
    autojump_clock: trio.testing.MockClock, make: Factory, recorder: StateRecorder
) -> None:
    in_flight = 0
    supervisor = await make(ttl=60.0, in_flight=lambda: in_flight)
    await supervisor.ensure_ready()
    t0 = trio.current_time()
    await trio.sleep(30.0)
    in_flight = 1
    supervisor.requests_changed()
    await trio.sleep(200.0)  # in flight far longer than the ttl: never unloaded
    assert supervisor.state is S.READY
    assert supervisor.statistics().in_flight == 1
    in_flight = 0
    supervisor.requests_changed()
    await recorder.wait_for(S.STOPPED)
    assert trio.current_time() - t0 == 290.0


async def test_ttl_zero_never_unloads(
    autojump_clock: trio.testing.MockClock, make: Factory
) -> None:
    supervisor = await make(ttl=0.0)
    await supervisor.ensure_ready()
    await trio.sleep(10_000.0)
    assert supervisor.state is S.READY


async def test_request_during_a_stop_waits_then_restarts(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(ignores_sigterm=True, healthy_after=0.5)
    supervisor = await make(ttl=10.0, unload_timeout=4.0)
    await supervisor.ensure_ready()
    await recorder.wait_for(S.STOPPING)
    t_stop = trio.current_time()
    await supervisor.ensure_ready()
    # waited for the SIGKILL at +4, then a fresh start that is healthy after 0.5 (next poll)
    assert trio.current_time() - t_stop == 4.5
    assert len(spawner.processes) == 2
    assert supervisor.state is S.READY


async def test_crash_after_ready_is_detected(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    spawner.script = Script(exit_after=7.0, exit_code=139, output=["segfault"])
    supervisor = await make()
    await supervisor.ensure_ready()
    await recorder.wait_for(S.STOPPED)
    stats = supervisor.statistics()
    assert (stats.crashes, stats.last_exit_code, stats.pid) == (1, 139, None)
    assert recorder.states() == [S.STARTING, S.READY, S.STOPPING, S.STOPPED]
    await supervisor.ensure_ready()  # the next request starts it again
    assert len(spawner.processes) == 2


async def test_output_goes_to_the_log_ring(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    spawner.script = Script(output=["one", "two"])
    supervisor = await make()
    await supervisor.ensure_ready()
    await trio.testing.wait_all_tasks_blocked()
    assert [line.text for line in supervisor.log.lines()] == ["one", "two"]


async def test_cancelling_the_supervisor_stops_the_process(
    autojump_clock: trio.testing.MockClock, spawner: FakeSpawner
) -> None:
    supervisor = ModelSupervisor(
        "m",
        ModelConfig(cmd=("server", "9"), proxy="http://m:9", unload_timeout=3.0),
        spawner=spawner,
        probe=FakeProbe(spawner),
        health_check_timeout=30.0,
    )
    spawner.script = Script(ignores_sigterm=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.ensure_ready()
        t0 = trio.current_time()
        nursery.cancel_scope.cancel()
    assert trio.current_time() - t0 == 3.0
    assert spawner.last.returncode == -signal.SIGKILL
    with pytest.raises(RuntimeError, match="supervisor is not running"):
        await supervisor.ensure_ready()


async def test_request_stop_is_stopping_on_return_and_stop_waits_for_the_exit(
    autojump_clock: trio.testing.MockClock, make: Factory, spawner: FakeSpawner
) -> None:
    supervisor = await make()
    await supervisor.ensure_ready()
    supervisor.request_stop("unload requested")
    assert supervisor.state is ModelState.STOPPING  # no await in between: nobody is granted
    await supervisor.stop("unload requested")
    assert supervisor.statistics().state is ModelState.STOPPED
    assert spawner.last.signals == [(trio.current_time(), signal.SIGTERM)]
    supervisor.request_stop("again")  # nothing running: nothing to do
    assert supervisor.statistics().state is ModelState.STOPPED


async def test_readiness_is_seen_within_100ms_of_turning_healthy_at_the_default_interval(
    autojump_clock: trio.testing.MockClock, spawner: FakeSpawner, nursery: trio.Nursery
) -> None:
    from llamaswap.process.supervisor import HEALTH_POLL_INTERVAL

    # Not the `make` factory: its 0.25 s poll interval would hide the default's promise.
    supervisor = ModelSupervisor(
        "m",
        ModelConfig(cmd=("server", "9"), proxy="http://m:9"),
        spawner=spawner,
        probe=FakeProbe(spawner),
        health_check_timeout=30.0,
    )
    await nursery.start(supervisor.run)
    spawner.script = Script(healthy_after=0.51)  # between two polls, 20 ms apart
    await supervisor.ensure_ready()
    healthy_at = spawner.last.spawned_at + 0.51
    assert 0.0 < trio.current_time() - healthy_at < 0.1
    assert trio.current_time() - healthy_at <= HEALTH_POLL_INTERVAL


async def test_a_broken_connection_waits_for_the_crash_it_may_mean_at_most_exit_grace(
    autojump_clock: trio.testing.MockClock,
    make: Factory,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """``notice_exit``: a server that dies a moment after the connection broke is stopping
    when it returns; one that lives on costs EXIT_GRACE, and stays ready."""
    supervisor = await make()
    await supervisor.ensure_ready()
    t0 = trio.current_time()
    await supervisor.notice_exit()
    assert trio.current_time() - t0 == EXIT_GRACE
    assert supervisor.state is S.READY
    seen: list[ModelState] = []

    async def notice() -> None:
        await supervisor.notice_exit()
        seen.append(supervisor.state)  # when the broken request would be released

    async with trio.open_nursery() as nursery:
        nursery.start_soon(notice)
        await trio.sleep(0.1)
        spawner.last.exit(3)
    assert trio.current_time() - t0 == EXIT_GRACE + 0.1
    assert seen == [S.STOPPING]
