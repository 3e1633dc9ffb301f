"""llamaswap raises its soft open files limit to the hard limit when it starts serving.

Each case runs in its own Python process (``python -c``), so the limits of the test
process stay as they are.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import FAKE

resource = pytest.importorskip("resource")

_PROGRAM = """
import logging, resource, sys
logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, hard))
{then}
from llamaswap._limits import raise_open_files_limit
raise_open_files_limit()
print(*resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def run(soft: str, then: str = "") -> tuple[list[int], str]:
    """The limits after ``raise_open_files_limit`` in a process whose soft limit is
    ``soft`` (``hard``: the hard limit), and what it logged."""
    program = _PROGRAM.format(soft=soft, then=then)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    return [int(word) for word in done.stdout.split()], done.stderr


@pytest.fixture
def hard() -> int:
    hard = int(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    if hard != resource.RLIM_INFINITY and hard <= 64:
        pytest.skip(f"the hard open files limit here is {hard}: no room to raise a soft one")
    return hard


def shown(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def test_the_soft_limit_is_raised_to_the_hard_limit(hard: int) -> None:
    limits, log = run("64")
    assert limits == [hard, hard]
    assert log == (
        f"llamaswap._limits: open files limit: raised from 64 to the hard limit {shown(hard)}\n"
    )


def test_a_soft_limit_at_the_hard_limit_is_left_as_it_is(hard: int) -> None:
    limits, log = run("hard")
    assert limits == [hard, hard]
    assert log == f"llamaswap._limits: open files limit: {shown(hard)}, already the hard limit\n"


def test_a_refused_raise_leaves_the_limit_as_it_was(hard: int) -> None:
    refuse = (
        "def refused(*args):\n"
        "    raise ValueError('not allowed to raise maximum limit')\n"
        "resource.setrlimit = refused\n"
    )
    limits, log = run("64", then=refuse)
    assert limits == [64, hard]
    assert log.startswith("llamaswap._limits: open files limit: kept at 64 (raising it to ")
    assert log.endswith(" was refused: not allowed to raise maximum limit)\n")


def test_without_a_resource_module_nothing_is_done(hard: int) -> None:
    limits, log = run("64", then="sys.modules['resource'] = None\n")
    assert limits == [64, hard]
    assert log == "llamaswap._limits: open files limit: not raised (no resource module here)\n"


#: The CLI in a process whose soft open files limit is 256.
_LOW_LIMIT = (
    "-c",
    "import resource, sys\n"
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
    "from llamaswap.cli import main\n"
    "main(sys.argv[1:])\n",
)


async def test_llamaswap_serves_with_the_hard_limit(proxy_factory: StartProxy, hard: int) -> None:
    proxy = await proxy_factory(f"[models.m]\ncmd = {json.dumps(FAKE)}\n", launch=_LOW_LIMIT)
    with trio.fail_after(10):
        await proxy.output.wait_for(
            rf"open files limit: raised from 256 to the hard limit {shown(hard)}$"
        )
    limits = trio.Path(f"/proc/{proxy.process.pid}/limits")
    if await limits.exists():  # Linux: what the kernel says, too
        text = await limits.read_text()
        row = next(line for line in text.splitlines() if "open files" in line)
        assert row.split()[3:5] == [shown(hard)] * 2
