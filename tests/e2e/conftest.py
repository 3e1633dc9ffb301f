from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.e2e.harness import REPO, ProxyProcess, start_proxy, stop_proxy

StartProxy = Callable[..., Awaitable[ProxyProcess]]


@pytest.fixture
async def proxy_factory(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[StartProxy]:
    """Start real proxies; each is stopped and checked for survivors after the test."""
    started: list[ProxyProcess] = []

    async def start(
        config: str,
        *,
        log_level: str = "debug",
        args: Sequence[str] = (),
        launch: Sequence[str] = ("-m", "llamaswap"),
    ) -> ProxyProcess:
        proxy = await start_proxy(
            nursery, config, tmp_path, log_level=log_level, args=args, launch=launch
        )
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await stop_proxy(proxy)


#: The client timeouts of ``short_bounds_proxy``'s proxies (75 s and 60 s for real).
BOUND = 2.0
_SHORT_BOUNDS = (
    "-c",
    "import sys\n"
    "import llamaswap.config.model as model\n"
    f"model.REQUEST_HEAD_TIMEOUT = model.REQUEST_BODY_TIMEOUT = {BOUND!r}\n"
    "from llamaswap.cli import main\n"
    "main(sys.argv[1:])\n",
)


@pytest.fixture
def short_bounds_proxy(proxy_factory: StartProxy) -> StartProxy:
    """Real proxies whose client timeouts (head, body, keep-alive) are ``BOUND``: the
    ``llamaswap.config.model`` constants are patched before the server is imported."""
    return partial(proxy_factory, launch=_SHORT_BOUNDS)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``tiny-a.gguf`` and ``tiny-b.gguf`` (seeds 1 and 2), made by
    ``examples/tiny_model.py`` for the real-inference tiers (it needs ``gguf``)."""
    folder = tmp_path_factory.mktemp("models")
    script = REPO / "examples" / "tiny_model.py"
    subprocess.run(
        [sys.executable, str(script), str(folder / "tiny-a.gguf"), str(folder / "tiny-b.gguf")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return folder


@pytest.fixture(scope="session")
def macros(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``[macros]`` lines naming llama-server and its library folder, as
    ``examples/llama_server_bin.py`` prints them (or a skip, saying why)."""
    libs = tmp_path_factory.mktemp("llama-libs")
    found = subprocess.run(
        [sys.executable, str(REPO / "examples" / "llama_server_bin.py"), str(libs)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.returncode == 1 and found.stderr.startswith("error: "):
        pytest.skip(found.stderr.strip().removeprefix("error: "))
    assert found.returncode == 0, found.stderr
    return found.stdout
