"""systemd's notify protocol end to end: the real llamaswap, a real datagram socket
standing in for systemd, the real clock."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from tests.e2e.harness import REPO, start_proxy, stop_proxy
from tests.e2e.test_proxy import chat, config

CONFIG = config(
    """
[models.alpha]
cmd = "${fake}"
"""
)


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


async def next_message(
    sock: trio.socket.SocketType, *, skip_watchdog: bool = True
) -> dict[str, str]:
    """The next datagram (watchdog pings skipped unless asked for), within 10 s."""
    with trio.fail_after(10):
        while True:
            got = fields(await sock.recv(4096))
            if not (skip_watchdog and got == {"WATCHDOG": "1"}):
                return got


async def test_ready_watchdog_reload_and_stop_are_notified(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    await sock.bind(path)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    proxy = await start_proxy(nursery, CONFIG, tmp_path, env=env)
    try:
        # READY=1 comes once the listener is bound (start_proxy saw the listening line).
        assert await next_message(sock) == {"READY": "1", "STATUS": "serving; models ready: none"}
        async with proxy.client() as client:
            assert (await client.get("/health")).status_code == 200
        # Pings every 0.1 s: several arrive, and nothing else in between.
        for _ in range(3):
            assert await next_message(sock, skip_watchdog=False) == {"WATCHDOG": "1"}

        async with proxy.client() as client:
            response = await client.post("/v1/chat/completions", json=chat("alpha"))
            assert response.status_code == 200
        assert await next_message(sock) == {"STATUS": "serving; models ready: alpha"}

        proxy.process.send_signal(signal.SIGHUP)
        reloading = await next_message(sock)
        assert reloading["RELOADING"] == "1"
        assert int(reloading["MONOTONIC_USEC"]) > 0
        ready = await next_message(sock)
        assert ready == {"READY": "1", "STATUS": "serving; models ready: alpha"}
        await proxy.output.wait_for(r"reloaded .* \(SIGHUP\)")

        proxy.process.send_signal(signal.SIGTERM)
        assert (await next_message(sock))["STOPPING"] == "1"
        with trio.fail_after(20):
            assert await proxy.process.wait() == 0
    finally:
        await stop_proxy(proxy)
        sock.close()


def test_the_example_unit_file_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = REPO / "examples" / "systemd" / "llamaswap.service"
    result = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )
    # ExecStart's binary need not exist here; anything else it reports is a mistake.
    problems = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and "is not executable" not in line and "No such file" not in line
    ]
    assert not problems, result.stderr
