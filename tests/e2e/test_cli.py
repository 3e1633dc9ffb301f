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


#: Runs the CLI on its arguments, then prints which of the server's modules it imported.
HEAVY_IMPORTS = """
import sys
from llamaswap.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
server = ("trio", "quart", "hypercorn", "llamaswap._serve")
print("imported:", [module for module in server if module in sys.modules])
"""


def test_version_and_help_answer_without_importing_the_server() -> None:
    for flags in (["--version"], ["--help"], ["quickstart", "--help"]):
        done = subprocess.run(
            [sys.executable, "-c", HEAVY_IMPORTS, *flags],
            capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert done.stdout.splitlines()[-1] == "imported: []", done.stdout
