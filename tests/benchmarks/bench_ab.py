"""Proxy CPU and latency per request: this checkout against another, side by side in one run.

    git worktree add /tmp/before HEAD~1
    python tests/benchmarks/bench_ab.py /tmp/before [--requests 3000]

Starts two llamaswap processes, one from each checkout, each with its own fake model
server, and sends them the same small chat request in alternating blocks on one
keep-alive connection each, so that whatever else the machine does hits both equally.
With ``--trace``, this checkout's llamaswap sends OpenTelemetry traces (``[tracing]``) to a
collector in this process (the ``otel`` extra): ``bench_ab.py . --trace`` is tracing's cost.
Prints each proxy's CPU time per request (user + system, from /proc), its p50 and p99
latency, and the ratios. These are the figures to compare changes by: on a shared 2-core
machine, figures from separate runs drift by more than most changes are worth.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_proxy import (
    CHAT,
    CONFIG,
    REPO,
    Client,
    cpu_seconds,
    percentile,
    running_proxy,
)
from tests.e2e.harness import free_port_base

BLOCKS = 10


async def run(other: Path, requests: int, trace: bool, ratio: float | None) -> None:
    this = "this checkout, traced" if trace else "this checkout"
    sources = {this: REPO, str(other): other}
    async with AsyncExitStack() as stack:
        tracing = ""
        if trace:
            from tests.otel_collector import running_collector

            collector = stack.enter_context(running_collector())
            tracing = f'\n[tracing]\nendpoint = "{collector.url}"\n'
            if ratio is not None:
                tracing += f"sampleRatio = {ratio}\n"
        proxies: list[tuple[str, int, Client]] = []
        for index, (name, source) in enumerate(sources.items()):
            config = CONFIG.format(port=free_port_base() + 100 * index)
            if index == 0:
                config += tracing
            proxy = await stack.enter_async_context(running_proxy(config, "info", source))
            client = await Client.open(proxy.url)
            stack.push_async_callback(client.aclose)
            assert await client.post("/api/models/load/fast", b"") == 200
            for _ in range(300):  # warm up
                assert await client.post("/v1/chat/completions", CHAT) == 200
            proxies.append((name, proxy.process.pid, client))
        used = dict.fromkeys(sources, 0.0)
        latencies: dict[str, list[float]] = {name: [] for name in sources}
        for block in range(BLOCKS):
            for name, pid, client in proxies if block % 2 else proxies[::-1]:
                before = cpu_seconds(pid)
                for _ in range(requests // BLOCKS):
                    started = time.perf_counter()
                    assert await client.post("/v1/chat/completions", CHAT) == 200
                    latencies[name].append(time.perf_counter() - started)
                used[name] += cpu_seconds(pid) - before
    figures = {
        name: (
            used[name] / requests * 1e6,
            percentile(latencies[name], 0.5) * 1e3,
            percentile(latencies[name], 0.99) * 1e3,
        )
        for name in sources
    }
    for name, (cpu, p50, p99) in figures.items():
        print(f"{name}: {cpu:.0f} µs of proxy CPU per request; latency p50 {p50:.3f} ms, "
              f"p99 {p99:.3f} ms")  # fmt: skip
    if trace:  # the proxies have stopped, so every span was sent
        print(f"spans received by the collector: {len(collector.spans)}")
    mine, theirs = figures.values()
    ratios = ", ".join(f"{m / t:.2f}" for m, t in zip(mine, theirs, strict=True))
    print(f"ratios (this checkout / the other), CPU, p50, p99: {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="another llamaswap checkout")
    parser.add_argument("--requests", type=int, default=3000, help="per proxy")
    parser.add_argument("--trace", action="store_true", help="this checkout sends traces")
    parser.add_argument("--sample-ratio", type=float, help="with --trace: its sampleRatio")
    options = parser.parse_args()
    trio.run(run, options.other.resolve(), options.requests, options.trace, options.sample_ratio)


if __name__ == "__main__":
    main()
