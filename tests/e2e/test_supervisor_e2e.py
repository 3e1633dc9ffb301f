"""The supervisor against real fake-server processes: real clock, real HTTP, no orphans.

Only order and bounds are asserted here, each wait under a generous hang guard: on a loaded
machine wall-clock durations stretch. Exact durations (readiness within 100 ms, SIGKILL at
``unloadTimeout``, fail at once) are proved on Trio's mock clock in tests/trio/.
"""

from __future__ import annotations

import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import trio

from llamaswap.config.model import ModelConfig
from llamaswap.errors import ModelStartFailed
from llamaswap.http.client import UpstreamPool
from llamaswap.process import (
    HttpProbe,
    Lifeline,
    ModelState,
    ModelSupervisor,
    SubprocessSpawner,
    open_lifeline,
)
from tests.e2e.harness import (
    MARKER_VARIABLE,
    alive,
    child_env,
    free_port_base,
    survivors,
    wait_until,
)
from tests.fakes import StateRecorder


@pytest.fixture
async def lifeline() -> AsyncIterator[Lifeline]:
    async with open_lifeline() as lifeline:
        yield lifeline


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    async with UpstreamPool() as pool:
        yield pool


@pytest.fixture
def marker() -> Iterator[str]:
    marker = uuid.uuid4().hex
    yield marker
    assert survivors(marker) == []


async def supervise(
    nursery: trio.Nursery,
    lifeline: Lifeline,
    pool: UpstreamPool,
    marker: str,
    *flags: str,
    recorder: StateRecorder | None = None,
    health_check_timeout: float = 20.0,
    **settings: object,
) -> ModelSupervisor:
    port = free_port_base(1)
    cmd = (sys.executable, "-m", "llamaswap.fake_server", "--port", str(port), *flags)
    env = {
        key: value
        for key, value in child_env(marker).items()
        if key in ("PYTHONPATH", MARKER_VARIABLE)
    }
    supervisor = ModelSupervisor(
        "fake",
        ModelConfig(cmd=cmd, proxy=f"http://127.0.0.1:{port}", env=env, **settings),  # type: ignore[arg-type]
        spawner=SubprocessSpawner(lifeline),
        probe=HttpProbe(pool),
        health_check_timeout=health_check_timeout,
        listener=recorder,
    )
    await nursery.start(supervisor.run)
    return supervisor


async def test_readiness_is_seen_once_the_server_turns_healthy(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    # "Within 100 ms" is the poll interval's doing: proved on the mock clock
    # (tests/trio/test_supervisor.py). Here: a loading server's 503 is not taken for ready.
    supervisor = await supervise(nursery, lifeline, pool, marker, "--load-seconds", "0.5")

    def healthy_at() -> list[float]:
        return [
            float(match[1])
            for line in supervisor.log.lines()
            if (match := re.search(r"fake_server: healthy at ([0-9.]+)", line.text))
        ]

    with trio.fail_after(20):
        await supervisor.ensure_ready()
        ready_at = time.time()
        # Printed as the server turns healthy, the line reaches the log a moment later.
        await wait_until(lambda: bool(healthy_at()), within=10)
    (healthy,) = healthy_at()
    assert healthy <= ready_at
    await supervisor.stop("test over")


async def test_exit_during_start_fails_fast_with_the_output_tail(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    # A start that waited for healthCheckTimeout would trip the hang guard long before.
    supervisor = await supervise(
        nursery, lifeline, pool, marker, "--fail-start", health_check_timeout=3600.0
    )
    with trio.fail_after(60), pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    assert "exited with status 1 while starting" in str(caught.value)
    assert caught.value.exit_code == 1
    assert any("failed to load model file" in line for line in caught.value.log_tail)
    assert supervisor.state is ModelState.STOPPED


async def test_sigterm_ignoring_server_is_sigkilled_after_unload_timeout(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    supervisor = await supervise(
        nursery, lifeline, pool, marker, "--ignore-sigterm", unload_timeout=1.0
    )
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        pid = supervisor.statistics().pid
        started = trio.current_time()
        await supervisor.stop("test")
    # Polite first, SIGKILL no sooner than unloadTimeout (when exactly: the mock-clock test).
    assert trio.current_time() - started >= 1.0
    assert supervisor.statistics().last_exit_code == -signal.SIGKILL
    assert pid is not None
    assert not alive(pid)
    assert any("received SIGTERM" in line.text for line in supervisor.log.lines())


@pytest.mark.parametrize(
    ("stop", "said"),
    [
        (("/no/such/stopper", "${PID}"), "cannot run cmdStop '/no/such/stopper' (No such file"),
        (("false",), "cmdStop 'false' exited with status 1; sending SIGTERM instead"),
    ],
    ids=["cannot-run", "fails"],
)
async def test_a_cmd_stop_that_cannot_run_or_fails_falls_back_to_sigterm(
    nursery: trio.Nursery,
    lifeline: Lifeline,
    pool: UpstreamPool,
    marker: str,
    caplog: pytest.LogCaptureFixture,
    stop: tuple[str, ...],
    said: str,
) -> None:
    """check-config only warns of a cmdStop it cannot find (it may exist where llamaswap
    runs); at stop time, not finding it must not end llamaswap. One that fails is said
    so in the log (nothing said it), and SIGTERM follows (the server that would have
    stopped on it was SIGKILLed after unloadTimeout)."""
    supervisor = await supervise(nursery, lifeline, pool, marker, cmd_stop=stop, unload_timeout=30)
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        pid = supervisor.statistics().pid
        await supervisor.stop("test")
    assert supervisor.statistics().last_exit_code == 0  # the fake server's on SIGTERM
    assert pid is not None
    assert not alive(pid)
    assert said in caplog.text


async def test_a_cmd_stop_ends_when_it_exits_and_what_it_left_dies(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    """A cmdStop that sends a helper to the background (which holds its output open):
    the stop ends with the server, long before unloadTimeout, and the helper is killed
    (the ``marker`` fixture finds no survivor)."""
    stop = ("sh", "-c", "kill ${PID}; sleep 300 &")
    supervisor = await supervise(nursery, lifeline, pool, marker, cmd_stop=stop, unload_timeout=30)
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        started = trio.current_time()
        await supervisor.stop("test")
    assert trio.current_time() - started < 15
    assert supervisor.statistics().last_exit_code == 0


async def test_cancelling_a_start_kills_the_process(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    recorder = StateRecorder()
    supervisor = await supervise(
        nursery, lifeline, pool, marker, "--load-seconds", "60", recorder=recorder
    )
    with trio.fail_after(20):
        async with trio.open_nursery() as waiting:
            waiting.start_soon(supervisor.ensure_ready)
            await recorder.wait_for(ModelState.STARTING)
            while supervisor.statistics().pid is None or not supervisor.log.lines():  # noqa: ASYNC110
                await trio.sleep(0.02)  # the process runs and prints before we abandon it
            pid = supervisor.statistics().pid
            waiting.cancel_scope.cancel()
        await recorder.wait_for(ModelState.STOPPED)
    assert pid is not None
    assert not alive(pid)


async def test_ttl_unloads_a_real_server(
    nursery: trio.Nursery, lifeline: Lifeline, pool: UpstreamPool, marker: str
) -> None:
    recorder = StateRecorder()
    supervisor = await supervise(nursery, lifeline, pool, marker, recorder=recorder, ttl=0.5)
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        stats = supervisor.statistics()
        await recorder.wait_for(ModelState.STOPPED)
    # The idle clock starts when the supervisor saw ready, not when this task woke up.
    pid, ready = stats.pid, stats.ready_since
    assert ready is not None
    assert trio.current_time() - ready >= 0.5
    assert recorder.states() == [
        ModelState.STARTING,
        ModelState.READY,
        ModelState.STOPPING,
        ModelState.STOPPED,
    ]
    assert pid is not None
    assert not alive(pid)
