"""The ``llamaswap`` command line run as a program (tests/unit/test_cli.py: in-process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.harness import REPO as ROOT


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamaswap", *args],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("listen", ["127.0.0.1:99999", "127.0.0.1:-1", "", "127.0.0.1"])
def test_a_bad_listen_is_one_line_and_exit_2_before_the_config_is_read(listen: str) -> None:
    # Nothing binds: the address is refused before the (missing) config is even read.
    done = run("--config", "/no/such/config.toml", "--listen", listen)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"llamaswap: cannot listen on {listen or repr('')}: ")
    assert done.stdout == ""
