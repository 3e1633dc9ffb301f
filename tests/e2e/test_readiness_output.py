"""A starting server that prints is probed at once, not at the next poll (issue 28).

Real processes on the real clock. The poll interval is an hour, so a start that is seen
ready within the hang guard was seen thanks to the server's output, and the spacing of the
probes is checked against the times the probe itself records.
"""

from __future__ import annotations

import itertools
import re
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
    ModelSupervisor,
    SubprocessSpawner,
    open_lifeline,
)
from llamaswap.process.supervisor import OUTPUT_PROBE_GAP
from tests.e2e.harness import MARKER_VARIABLE, child_env, free_port_base, survivors

#: Longer than every hang guard here: no probe is due to the timer during a test.
HOUR = 3600.0


@pytest.fixture
async def lifeline() -> AsyncIterator[Lifeline]:
    async with open_lifeline() as lifeline:
        yield lifeline


@pytest.fixture
def marker() -> Iterator[str]:
    marker = uuid.uuid4().hex
    yield marker
    assert survivors(marker) == []


class RecordingProbe:
    """Records when each probe began and ended; answers as ``inner`` does, or never ready."""

    def __init__(self, inner: HttpProbe | None = None) -> None:
        self.inner = inner
        self.calls: list[tuple[float, float]] = []

    async def __call__(self, url: str) -> bool:
        began = trio.current_time()
        ready = False if self.inner is None else await self.inner(url)
        await trio.lowlevel.checkpoint()
        self.calls.append((began, trio.current_time()))
        return ready


async def supervise(
    nursery: trio.Nursery,
    lifeline: Lifeline,
    marker: str,
    cmd: tuple[str, ...],
    port: int,
    probe: RecordingProbe,
    health_check_timeout: float,
) -> ModelSupervisor:
    env = {k: v for k, v in child_env(marker).items() if k in ("PYTHONPATH", MARKER_VARIABLE)}
    supervisor = ModelSupervisor(
        "fake",
        ModelConfig(cmd=cmd, proxy=f"http://127.0.0.1:{port}", env=env),
        spawner=SubprocessSpawner(lifeline),
        probe=probe,
        health_check_timeout=health_check_timeout,
        poll_interval=HOUR,
    )
    await nursery.start(supervisor.run)
    return supervisor


async def test_the_line_a_server_prints_as_it_turns_healthy_makes_it_ready(
    nursery: trio.Nursery, lifeline: Lifeline, marker: str
) -> None:
    port = free_port_base(1)
    cmd = (sys.executable, "-m", "llamaswap.fake_server", "--port", str(port))
    async with UpstreamPool() as pool:
        probe = RecordingProbe(HttpProbe(pool))
        supervisor = await supervise(
            nursery, lifeline, marker, (*cmd, "--load-seconds", "0.3"), port, probe, HOUR
        )
        # The first probe, as the process starts, finds nothing listening; the next poll
        # is an hour away. Only the server's lines ("listening on", "healthy at") can
        # have called for the probe that found it ready.
        with trio.fail_after(20):
            await supervisor.ensure_ready()
        ready_at = time.time()
        healthy = [
            float(found[1])
            for line in supervisor.log.lines()
            if (found := re.search(r"fake_server: healthy at ([0-9.]+)", line.text))
        ]
        assert len(healthy) == 1
        assert healthy[0] <= ready_at
        assert len(probe.calls) >= 3  # the port check, the first probe, one for the output
        with trio.fail_after(20):
            await supervisor.stop("test over")


async def test_a_server_printing_all_the_time_is_probed_once_per_gap_at_most(
    nursery: trio.Nursery, lifeline: Lifeline, marker: str
) -> None:
    # A server printing its load log line by line: each probe may be called for by a line
    # printed during the one before it, yet the next begins OUTPUT_PROBE_GAP after that one
    # ended, never at once.
    chatty = "import time\nwhile True:\n    print('loading', flush=True)\n    time.sleep(0.0002)"
    probe = RecordingProbe()  # never ready: the start fails at healthCheckTimeout
    supervisor = await supervise(
        nursery, lifeline, marker, (sys.executable, "-c", chatty), free_port_base(1), probe, 0.5
    )
    with trio.fail_after(20), pytest.raises(ModelStartFailed, match="healthCheckTimeout"):
        await supervisor.ensure_ready()
    readiness = probe.calls[1:]  # the first is the port check before the spawn
    assert len(readiness) > 2  # the lines called for probes: the poll interval is an hour
    for (_, ended), (began, _) in itertools.pairwise(readiness):
        assert began - ended >= OUTPUT_PROBE_GAP - 1e-9
