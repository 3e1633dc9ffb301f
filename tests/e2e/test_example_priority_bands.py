"""examples/priority-bands/demo.py, run as a person would (with --spawn): every claim holds.

The demo starts a real proxy on its config, with real fake model servers and the real
clock, plays its three scenarios and prints a timeline per scenario and one ``CLAIM``
line per effect, derived from the proxy's activity log and metrics.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import uuid

import pytest
import trio

from tests.e2e.harness import REPO, child_env, free_port_base, survivors, wait_until

DEMO = REPO / "examples" / "priority-bands" / "demo.py"

EXPECTED_CLAIMS = {
    "bands": 1,
    "affinity": 2,
    "aging": 2,
}


async def _interrupt_then_kill(process: trio.Process) -> None:
    """On a hang: Ctrl-C the demo (it stops its proxy), then kill whatever is left."""
    process.send_signal(signal.SIGINT)
    with trio.move_on_after(30):
        await process.wait()
        return
    os.killpg(process.pid, signal.SIGKILL)


@pytest.mark.slow
async def test_priority_bands_demo_shows_every_effect() -> None:
    marker = uuid.uuid4().hex
    argv = [sys.executable, str(DEMO), "--spawn", "--start-port", str(free_port_base())]
    with trio.fail_after(240):
        result = await trio.run_process(
            argv,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env=child_env(marker),
            start_new_session=True,
            deliver_cancel=_interrupt_then_kill,
        )
    # The demo stopped its proxy, and the proxy its model servers.
    await wait_until(lambda: not survivors(marker), within=10)
    output = result.stdout.decode()
    report = f"stdout:\n{output}\nstderr:\n{result.stderr.decode()}"
    assert result.returncode == 0, report

    claims = re.findall(r"(?m)^CLAIM (\w+): (.+): (yes|no)$", output)
    counted = {name: sum(1 for c in claims if c[0] == name) for name in EXPECTED_CLAIMS}
    assert counted == EXPECTED_CLAIMS, report
    assert all(verdict == "yes" for _, _, verdict in claims), report

    labels = re.findall(r"(?m)^  ([a-z]+(?:-[a-z0-9]+)?) +(?:chat|coder) ", output)
    for label in [
        "blocker",
        *(f"batch-{n}" for n in range(1, 7)),
        "interactive-1",
        "interactive-2",
        "older",
        "newer",
        "batch-old",
        "normal-1",
    ]:
        assert label in labels, report
    assert re.search(r"(?m)^  interactive-1 +coder +interactive +100 ", output), report
    assert re.search(r"(?m)^  batch-old +chat +batch +-100 ", output), report
    assert "proxy stopped (exit status 0)" in output, report
