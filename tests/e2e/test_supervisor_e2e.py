"""The supervisor against real fake-server processes: real clock, real HTTP, no orphans."""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import trio

from llamaswap.config.model import ModelConfig
from llamaswap.errors import ModelStartFailed
from llamaswap.process import (
    HttpProbe,
    Lifeline,
    ModelState,
    ModelSupervisor,
    SubprocessSpawner,
    open_lifeline,
)
from tests.e2e.harness import MARKER_VARIABLE, alive, child_env, free_port_base, survivors
from tests.fakes import StateRecorder


@pytest.fixture
async def lifeline() -> AsyncIterator[Lifeline]:
    async with open_lifeline() as lifeline:
        yield lifeline


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
def marker() -> Iterator[str]:
    marker = uuid.uuid4().hex
    yield marker
    assert survivors(marker) == []


async def supervise(
    nursery: trio.Nursery,
    lifeline: Lifeline,
    client: httpx.AsyncClient,
    marker: str,
    *flags: str,
    recorder: StateRecorder | None = None,
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
        probe=HttpProbe(client),
        health_check_timeout=20.0,
        listener=recorder,
    )
    await nursery.start(supervisor.run)
    return supervisor


async def test_readiness_is_detected_within_100ms(
    nursery: trio.Nursery, lifeline: Lifeline, client: httpx.AsyncClient, marker: str
) -> None:
    supervisor = await supervise(nursery, lifeline, client, marker, "--load-seconds", "0.5")
    with trio.fail_after(20):
        await supervisor.ensure_ready()
    ready_at = time.time()
    healthy = [
        float(match[1])
        for line in supervisor.log.lines()
        if (match := re.search(r"fake_server: healthy at ([0-9.]+)", line.text))
    ]
    assert len(healthy) == 1
    assert 0 <= ready_at - healthy[0] < 0.1
    await supervisor.stop("test over")


async def test_exit_during_start_fails_fast_with_the_output_tail(
    nursery: trio.Nursery, lifeline: Lifeline, client: httpx.AsyncClient, marker: str
) -> None:
    supervisor = await supervise(nursery, lifeline, client, marker, "--fail-start")
    started = trio.current_time()
    with trio.fail_after(20), pytest.raises(ModelStartFailed) as caught:
        await supervisor.ensure_ready()
    assert trio.current_time() - started < 10  # far from healthCheckTimeout (20 s)
    assert caught.value.exit_code == 1
    assert any("failed to load model file" in line for line in caught.value.log_tail)
    assert supervisor.state is ModelState.STOPPED


async def test_sigterm_ignoring_server_is_sigkilled_after_unload_timeout(
    nursery: trio.Nursery, lifeline: Lifeline, client: httpx.AsyncClient, marker: str
) -> None:
    supervisor = await supervise(
        nursery, lifeline, client, marker, "--ignore-sigterm", unload_timeout=1.0
    )
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        pid = supervisor.statistics().pid
        started = trio.current_time()
        await supervisor.stop("test")
    took = trio.current_time() - started
    assert 1.0 <= took < 3.0
    assert pid is not None
    assert not alive(pid)
    assert any("received SIGTERM" in line.text for line in supervisor.log.lines())


async def test_cancelling_a_start_kills_the_process(
    nursery: trio.Nursery, lifeline: Lifeline, client: httpx.AsyncClient, marker: str
) -> None:
    recorder = StateRecorder()
    supervisor = await supervise(
        nursery, lifeline, client, marker, "--load-seconds", "60", recorder=recorder
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
    nursery: trio.Nursery, lifeline: Lifeline, client: httpx.AsyncClient, marker: str
) -> None:
    recorder = StateRecorder()
    supervisor = await supervise(nursery, lifeline, client, marker, recorder=recorder, ttl=0.5)
    with trio.fail_after(20):
        await supervisor.ensure_ready()
        pid = supervisor.statistics().pid
        ready = trio.current_time()
        await recorder.wait_for(ModelState.STOPPED)
    assert trio.current_time() - ready >= 0.5
    assert pid is not None
    assert not alive(pid)
