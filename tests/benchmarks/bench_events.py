"""Proxy CPU per request with many ``/api/events`` subscribers: this checkout against another.

    git worktree add /tmp/before HEAD~1
    python tests/benchmarks/bench_events.py /tmp/before [--subscribers 1 10 100 300]

Each subscriber (a dashboard tab) receives every event a request causes (``queued``,
``serving``, ``done``, its activity record, the queue), so the proxy's work per request
grows with the subscribers. For each count, both proxies (one llamaswap process from each
checkout, each with its own fake model server) get that many ``/api/events`` clients that
read everything as it comes, then the same small chat request in alternating blocks on
one keep-alive connection each, so that whatever else the machine does hits both equally.
Prints each proxy's CPU time per request (user + system, from /proc) side by side, and
how many ``dropped`` events the subscribers got (none, if they kept up: a subscriber that
falls behind costs the proxy less, so the figures would flatter it).
"""

from __future__ import annotations

import argparse
import resource
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_proxy import CHAT, REPO, Client, cpu_seconds, running_proxy
from tests.e2e.harness import free_port_base

CONFIG = """
startPort = {port}
[models.fast]
cmd = "python -m llamaswap.fake_server --port ${{PORT}} --model-name ${{MODEL_ID}}"
"""
BLOCKS = 10
#: Requests per proxy at each subscriber count: fewer where each one costs more.
REQUESTS = {1: 2000, 10: 1000, 100: 400, 300: 200}


class Subscribers:
    """``/api/events`` clients that read everything and count the ``dropped`` events."""

    def __init__(self) -> None:
        self.dropped = 0

    async def follow(self, url: str, *, task_status: trio.TaskStatus[None]) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(f"GET /api/events HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
            received = b""
            while b"event: snapshot" not in received:
                received += await stream.receive_some(65536)
            task_status.started()
            while data := await stream.receive_some(65536):
                self.dropped += data.count(b"event: dropped")


async def measure(
    proxies: list[tuple[str, str, int, Client]], subscribers: int, requests: int
) -> tuple[dict[str, float], dict[str, int]]:
    """Each proxy's CPU µs per request with ``subscribers`` event clients, and the
    ``dropped`` events its clients got."""
    following = {name: Subscribers() for name, *_ in proxies}
    used = dict.fromkeys(following, 0.0)
    async with trio.open_nursery() as nursery:
        for name, url, _, _ in proxies:
            for _ in range(subscribers):
                await nursery.start(following[name].follow, url)
        for _, _, _, client in proxies:
            for _ in range(50):  # warm up; earlier rounds' subscribers are gone by now
                assert await client.post("/v1/chat/completions", CHAT) == 200
        for block in range(BLOCKS):
            for name, _, pid, client in proxies if block % 2 else proxies[::-1]:
                before = cpu_seconds(pid)
                for _ in range(requests // BLOCKS):
                    assert await client.post("/v1/chat/completions", CHAT) == 200
                used[name] += cpu_seconds(pid) - before
        nursery.cancel_scope.cancel("measured")
    cpu = {name: seconds / requests * 1e6 for name, seconds in used.items()}
    return cpu, {name: clients.dropped for name, clients in following.items()}


async def run(other: Path, counts: list[int], start_port: int | None) -> None:
    sources = {"this checkout": REPO, str(other): other}
    rows: list[tuple[int, dict[str, float], dict[str, int]]] = []
    base = free_port_base(16) if start_port is None else start_port
    async with AsyncExitStack() as stack:
        proxies: list[tuple[str, str, int, Client]] = []
        for index, (name, source) in enumerate(sources.items()):
            config = CONFIG.format(port=base + 8 * index)
            proxy = await stack.enter_async_context(running_proxy(config, "info", source))
            client = await Client.open(proxy.url)
            stack.push_async_callback(client.aclose)
            assert await client.post("/api/models/load/fast", b"") == 200
            proxies.append((name, proxy.url, proxy.process.pid, client))
        for count in counts:
            figures, dropped = await measure(proxies, count, REQUESTS.get(count, 200))
            rows.append((count, figures, dropped))
            print(f"{count} subscribers: done", file=sys.stderr)
    mine, theirs = sources
    print("proxy CPU per proxied request (µs) with N /api/events subscribers; the events")
    print("the subscribers were told they lost (dropped), as other / this")
    print(f"{'N':>5}  {theirs:>24}  {mine:>16}  ratio  dropped")
    for count, cpu, dropped in rows:
        print(f"{count:>5}  {cpu[theirs]:>24.0f}  {cpu[mine]:>16.0f}  "
              f"{cpu[mine] / cpu[theirs]:5.2f}  {dropped[theirs]} / {dropped[mine]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="another llamaswap checkout")
    parser.add_argument("--subscribers", type=int, nargs="+", default=[1, 10, 100, 300])
    parser.add_argument("--start-port", type=int, help="the model servers' ports from here")
    options = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trio.run(run, options.other.resolve(), options.subscribers, options.start_port)


if __name__ == "__main__":
    main()
