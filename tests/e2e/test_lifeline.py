"""The lifeline guard dies, and llamaswap heals it: real processes, real clock.

Each test kills the guard with SIGKILL, as the OOM killer would, then checks that models
still start and still die with llamaswap. Leaving ``open_lifeline`` closes the pipe exactly
as llamaswap's death does, so the in-process tests see which groups the guard knows by what
it kills then; one test kills a real llamaswap with ``kill -9``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from llamaswap.config.model import ModelConfig
from llamaswap.errors import ModelStartFailed
from llamaswap.process import ModelSupervisor, SubprocessSpawner, open_lifeline
from llamaswap.process import lifeline as lifeline_module
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import FAKE, MARKER_VARIABLE, alive, free_port_base, survivors, wait_until

SLEEPER = (sys.executable, "-c", "import time; time.sleep(600)")


@pytest.fixture
def marker() -> Iterator[str]:
    """Carried by every process a test starts; none may outlive the test."""
    marker = uuid.uuid4().hex
    yield marker
    left = survivors(marker)
    for pid in left:  # only this test's processes carry its marker
        os.kill(pid, signal.SIGKILL)
    assert left == []


def is_guard(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"_guard.py" in cmdline.read()
    except OSError:
        return False


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[1])
    except OSError:
        return None


def our_guards() -> list[int]:
    """Live guard processes started by this test process."""
    me = os.getpid()
    return [
        pid
        for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
        if parent(pid) == me and alive(pid) and is_guard(pid)
    ]


def replaced(guard: int, guards: list[int]) -> bool:
    return len(guards) == 1 and guards != [guard]


def await_exit_without_reaping(pid: int) -> None:
    """Block (no Trio checkpoint: no other task runs) until child ``pid`` has exited."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


async def test_a_spawn_that_finds_the_guard_dead_replaces_it(
    marker: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {MARKER_VARIABLE: marker}
    with trio.fail_after(20):
        async with open_lifeline() as lifeline:
            spawner = SubprocessSpawner(lifeline)
            before = await spawner.spawn(SLEEPER, env)
            (guard,) = our_guards()
            os.kill(guard, signal.SIGKILL)
            await_exit_without_reaping(guard)
            # The watch task has not run since the kill: this spawn meets the dead pipe.
            after = await spawner.spawn(SLEEPER, env)
            assert replaced(guard, our_guards())
            assert after.returncode is None
        # The pipe is closed: the new guard kills the group registered after its start,
        # and the one registered with its predecessor.
        assert await after.wait() == -signal.SIGKILL
        assert await before.wait() == -signal.SIGKILL
    assert f"lifeline guard (pid {guard}) no longer reads its pipe" in caplog.text


async def test_the_watch_task_replaces_a_dead_guard_and_re_registers_the_groups(
    marker: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {MARKER_VARIABLE: marker}
    with trio.fail_after(20):
        async with open_lifeline() as lifeline:
            spawner = SubprocessSpawner(lifeline)
            before = await spawner.spawn(SLEEPER, env)
            (guard,) = our_guards()
            os.kill(guard, signal.SIGKILL)
            await wait_until(lambda: replaced(guard, our_guards()), within=10)
            after = await spawner.spawn(SLEEPER, env)
        assert await after.wait() == -signal.SIGKILL
        assert await before.wait() == -signal.SIGKILL
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(";")[0] for r in warnings] == [
        f"lifeline guard (pid {guard}) exited while llamaswap runs (status -9)"
    ]


#: A guard that, at the end of its pipe, also writes the groups it kills into ``argv[1]``.
RECORDING_GUARD = """\
import os, signal, sys
groups = set()
pending = b""
while chunk := os.read(0, 4096):
    *lines, pending = (pending + chunk).split(b"\\n")
    for line in lines:
        if line.startswith(b"+"):
            groups.add(int(line[1:]))
        elif line.startswith(b"-"):
            groups.discard(int(line[1:]))
with open(sys.argv[1], "w") as record:
    record.write(" ".join(map(str, sorted(groups))))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


async def test_a_child_that_cannot_run_its_program_is_not_left_registered(
    marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child registers before exec; an exec that fails must not leave its number with
    # the guard, which would SIGKILL whatever group holds that number when llamaswap dies.
    guard, killed = tmp_path / "guard.py", tmp_path / "killed"
    guard.write_text(RECORDING_GUARD)
    monkeypatch.setattr(lifeline_module, "GUARD_ARGV", (sys.executable, str(guard), str(killed)))
    not_executable = tmp_path / "server.sh"
    not_executable.write_text("#!/bin/sh\n")  # not executable: exec fails with EACCES
    env = {MARKER_VARIABLE: marker}
    with trio.fail_after(20):
        async with open_lifeline() as lifeline:
            spawner = SubprocessSpawner(lifeline)
            for program, error in [
                ("/nonexistent/server", FileNotFoundError),
                (str(not_executable), PermissionError),
            ] * 2:
                with pytest.raises(error):
                    await spawner.spawn((program,), env)
            sleeper = await spawner.spawn(SLEEPER, env)
        # The pipe is closed: the guard kills the groups it knows, the sleeper's alone.
        assert await sleeper.wait() == -signal.SIGKILL
    assert killed.read_text() == str(sleeper.pid)


async def never_ready(url: str) -> bool:
    await trio.lowlevel.checkpoint()
    return False


async def test_a_guard_that_cannot_be_replaced_fails_the_start_as_llamaswaps_own(
    marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ModelConfig(cmd=SLEEPER, proxy="http://127.0.0.1:9", env={MARKER_VARIABLE: marker})
    with trio.fail_after(20):
        async with open_lifeline() as lifeline, trio.open_nursery() as nursery:
            supervisor = ModelSupervisor(
                "m",
                config,
                spawner=SubprocessSpawner(lifeline),
                probe=never_ready,
                health_check_timeout=20.0,
            )
            await nursery.start(supervisor.run)
            (guard,) = our_guards()
            monkeypatch.setattr(lifeline_module, "GUARD_ARGV", ("/nonexistent/guard",))
            os.kill(guard, signal.SIGKILL)
            await_exit_without_reaping(guard)
            with pytest.raises(ModelStartFailed) as caught:
                await supervisor.ensure_ready()
            nursery.cancel_scope.cancel(reason="test over")
    message = str(caught.value)
    assert message.startswith(
        "model 'm' failed to start: llamaswap's lifeline guard failed: cannot start a guard: "
    )
    assert message.endswith(
        "; the command never ran: this is llamaswap's own failure; see its log"
    )
    assert "models.m.cmd" not in message
    assert caught.value.exit_code is None


BOTH_LOADED = "\n".join(
    [
        f"startPort = {free_port_base()}",
        "[macros]",
        f"fake = {json.dumps(FAKE)}",
        "[models.alpha]",
        'cmd = "${fake}"',
        "[models.beta]",
        'cmd = "${fake}"',
        "[routing.router.settings.groups.both]",
        'members = ["alpha", "beta"]',
        "swap = false",
    ]
)


async def test_models_die_with_a_killed_llamaswap_after_its_guard_was_replaced(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(BOTH_LOADED)

    def guards() -> list[int]:
        return [pid for pid in survivors(proxy.marker) if is_guard(pid)]

    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            (guard,) = guards()
            os.kill(guard, signal.SIGKILL)
            await wait_until(lambda: replaced(guard, guards()), within=10)
            # alpha was registered with the dead guard, beta registers with the new one.
            assert (await client.post("/api/models/load/beta")).status_code == 200
            running = (await client.get("/running")).json()["running"]
            await proxy.output.wait_for(rf"lifeline guard \(pid {guard}\) exited")
    pids = {entry["model"]: entry["pid"] for entry in running}
    assert set(pids) == {"alpha", "beta"}
    os.kill(proxy.process.pid, signal.SIGKILL)
    await wait_until(lambda: not any(alive(pid) for pid in pids.values()), within=5)
    await wait_until(lambda: not survivors(proxy.marker), within=5)
