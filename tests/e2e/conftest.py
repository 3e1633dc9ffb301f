from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest
import trio

from tests.e2e.harness import ProxyProcess, start_proxy, stop_proxy

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
