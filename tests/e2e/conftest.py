from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
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
        config: str, *, log_level: str = "debug", args: Sequence[str] = ()
    ) -> ProxyProcess:
        proxy = await start_proxy(nursery, config, tmp_path, log_level=log_level, args=args)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        await stop_proxy(proxy)


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
