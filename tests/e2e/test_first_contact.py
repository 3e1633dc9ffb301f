"""What a new user meets first: a port already taken, a model that fails to start, a
``cmd`` whose program is missing."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import REPO, child_env, survivors
from tests.e2e.test_proxy import chat, config


async def test_a_listen_address_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config('[models.alpha]\ncmd = "${fake}"\n'))
    marker = uuid.uuid4().hex
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        listen = f"127.0.0.1:{holder.getsockname()[1]}"
        argv = [sys.executable, "-m", "llamaswap", "--config", str(path), "--listen", listen]
        argv += ["--log-level", "info"]
        with trio.fail_after(60):
            result = await trio.run_process(
                argv, capture_stdout=True, capture_stderr=True, check=False,
                env=child_env(marker), cwd=REPO,
            )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"llamaswap: cannot listen on {listen}: address already in use; another program (or "
        "another llamaswap) uses it; choose another address with --listen HOST:PORT"
    ]
    assert result.stdout == b""
    assert survivors(marker) == []  # the lifeline guard went too


async def test_a_failed_start_is_logged_once(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config(
            """
[models.bad]
cmd = "python -c 'import sys; print(\\"boom\\"); sys.exit(3)' --port ${PORT}"
[models.good]
cmd = "${fake}"
"""
        ),
        log_level="info",
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post("/v1/chat/completions", json=chat("bad"))
            assert response.status_code == 502
            assert (await client.post("/api/models/load/good")).status_code == 200
            # Logged after everything the failed request logged (one pipe, in order).
            await proxy.output.wait_for(r"model 'good': ready")
    failures = [line for line in proxy.output.lines if "failed to start" in line]
    assert len(failures) == 1, failures
    assert "model 'bad' failed to start: exited with status 3" in failures[0]


def test_check_config_warns_of_a_missing_program_and_still_passes(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    script = tmp_path / "server.sh"
    script.write_text("#!/bin/sh\n")  # not made executable
    path.write_text(
        "[models.chat]\ncmd = 'no-such-llama-server --port ${PORT}'\n"
        "[models.here]\ncmd = ['python', '-m', 'llamaswap.fake_server', '--port', '${PORT}']\n"
        "[models.stop]\ncmd = 'python --port ${PORT}'\ncmdStop = '/no/such/stopper ${PID}'\n"
        f"[models.script]\ncmd = '{script} --port ${{PORT}}'\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "llamaswap", "check-config", str(path)],
        capture_output=True, text=True, check=False, cwd=REPO, env=child_env("check"),
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    assert result.stdout == f"{path}: ok\n"
    assert result.stderr.splitlines() == [
        f"{path}: warning: models.chat.cmd: program 'no-such-llama-server' not found on PATH "
        "(it may exist where llamaswap will run)",
        f"{path}: warning: models.stop.cmdStop: program '/no/such/stopper' not found "
        "(it may exist where llamaswap will run)",
        f"{path}: warning: models.script.cmd: program '{script}' is not executable (chmod +x it)",
    ]
