"""The real port probe, and a unit tier that does not use it.

``${PORT}`` skips a port another program holds: ``load_config`` binds a socket to find out
(``config/macros.py:port_free``), the default for ``llamaswap`` and ``check-config``. The
unit tier injects a probe that touches no socket (``tests/unit/ports.py``), so it passes
whatever holds ports on the machine it runs on; the last test holds them to show it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from llamaswap.config import load_config
from llamaswap.config.macros import port_free
from tests.e2e.harness import REPO

#: The ports the unit tier's configs get from ``${PORT}`` (``startPort`` is 5800).
UNIT_PORTS = range(5800, 5811)


def hold(stack: ExitStack, port: int) -> bool:
    """Listen on 127.0.0.1:``port`` until ``stack`` closes; ``False`` if it is taken."""
    holder = stack.enter_context(socket.socket())
    try:
        holder.bind(("127.0.0.1", port))
    except OSError:
        return False  # someone else holds it: held all the same
    holder.listen()
    return True


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another program (here: a listening socket) holds on 127.0.0.1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_port_free_sees_a_listening_socket(held_port: int) -> None:
    assert not port_free("127.0.0.1", held_port)


def test_load_config_skips_a_held_port_by_default(held_port: int, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'startPort = {held_port}\n[models.m]\ncmd = "server --port ${{PORT}}"\n')
    # Without the probe it would be held_port; held_port + 1 may be taken too.
    assert int(load_config(path).models["m"].cmd[-1]) > held_port


@pytest.mark.slow
def test_the_unit_tier_passes_while_its_ports_are_held() -> None:
    with ExitStack() as stack:
        held = [port for port in UNIT_PORTS if hold(stack, port)]
        if not held:
            pytest.skip(f"another program holds every port of {UNIT_PORTS}")
        assert not any(port_free("127.0.0.1", port) for port in UNIT_PORTS)
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"],
            cwd=REPO, capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
