"""llamaswap against the physical limit: the same model server, direct and through the proxy.

    python tests/benchmarks/bench_proxy.py [--quick] [--trace]

One run starts a real llamaswap (fifo, debug log) with three fake model servers, then
measures side by side, alternating direct and proxied requests to the *same* server
process so that drift hits both equally:

* added latency: a small non-streaming chat request, p50 and p99, at concurrency 1 and 8;
* time to first token and streamed tokens/s, at concurrency 1 and 32;
* readiness detection: from the server's own "healthy at T" to the first request it is
  forwarded (both stamps printed by the server itself);
* proxy memory: RSS idle, and with 1 000 requests waiting in the queue (all answered).

``--trace``: llamaswap sends OpenTelemetry traces (``[tracing]``, the ``otel`` extra) to a
collector in this process, to measure what tracing costs.

The client is a minimal HTTP/1.1 client on raw Trio sockets (h11 for parsing), the same
for both paths, so what differs is the proxy. Prints a table with ratios; the reference
figures of other proxies are quoted beside it (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import final

import h11
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from llamaswap.config import loads_config  # noqa: E402
from tests.e2e.harness import (  # noqa: E402
    Output,
    ProxyProcess,
    free_port_base,
    start_proxy,
    stop_proxy,
)

CHAT = json.dumps(
    {"model": "fast", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
).encode()


@final
class Client:
    """One keep-alive HTTP/1.1 connection, parsed with h11."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, url: str) -> Client:
        host, _, port = url.removeprefix("http://").partition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        return cls(stream, host)

    async def _send(self, event: h11.Event) -> None:
        data = self._h11.send(event)
        if data:
            await self._stream.send_all(data)

    async def _next(self) -> h11.Event:
        while True:
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                self._h11.receive_data(await self._stream.receive_some(65536))
                continue
            return event  # type: ignore[return-value]

    async def post(
        self, path: str, body: bytes, on_chunk: Callable[[bytes], None] | None = None
    ) -> int:
        headers = [
            ("host", self._host),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        await self._send(h11.Request(method="POST", target=path, headers=headers))
        await self._send(h11.Data(data=body))
        return await self._response(on_chunk)

    async def get(self, path: str, on_chunk: Callable[[bytes], None] | None = None) -> int:
        await self._send(h11.Request(method="GET", target=path, headers=[("host", self._host)]))
        return await self._response(on_chunk)

    async def _response(self, on_chunk: Callable[[bytes], None] | None) -> int:
        await self._send(h11.EndOfMessage())
        status = 0
        while True:
            event = await self._next()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data) and on_chunk is not None:
                on_chunk(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._h11.start_next_cycle()
                return status

    async def aclose(self) -> None:
        await self._stream.aclose()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latency(direct: str, proxied: str, concurrency: int, rounds: int) -> dict[str, float]:
    """Each worker alternates one direct and one proxied request on its own connections."""
    samples: dict[str, list[float]] = {"direct": [], "proxied": []}

    async def worker() -> None:
        clients = {"direct": await Client.open(direct), "proxied": await Client.open(proxied)}
        for client in clients.values():  # warm the connections and the server
            assert await client.post("/v1/chat/completions", CHAT) == 200
        for i in range(rounds):
            order = ("direct", "proxied") if i % 2 else ("proxied", "direct")
            for path in order:
                started = time.perf_counter()
                assert await clients[path].post("/v1/chat/completions", CHAT) == 200
                samples[path].append(time.perf_counter() - started)
        for client in clients.values():
            await client.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return {
        f"{path} {name}": percentile(values, q) * 1000
        for path, values in samples.items()
        for name, q in (("p50", 0.5), ("p99", 0.99))
    }


async def streaming(url: str, concurrency: int, tokens: int, batches: int) -> tuple[float, float]:
    """Median time to first token (ms) and mean per-stream tokens/s over ``batches``
    rounds of ``concurrency`` simultaneous streams."""
    body = json.dumps(
        {
            "model": "paced",
            "stream": True,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "go"}],
        }
    ).encode()
    ttfts: list[float] = []
    rates: list[float] = []

    async def one() -> None:
        client = await Client.open(url)
        arrivals: list[float] = []
        started = time.perf_counter()

        def chunk(data: bytes) -> None:
            arrivals.extend(time.perf_counter() for _ in range(data.count(b'"content"')))

        status = await client.post("/v1/chat/completions", body, chunk)
        assert status == 200, (status, url)
        await client.aclose()
        ttfts.append(arrivals[0] - started)
        rates.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))

    for _ in range(batches):
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(one)
    return statistics.median(ttfts) * 1000, statistics.fmean(rates)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def fetch(url: str, path: str) -> bytes:
    """GET ``path``: the body."""
    client = await Client.open(url)
    text = bytearray()
    try:
        assert await client.get(path, text.extend) == 200
    finally:
        await client.aclose()
    return bytes(text)


async def metric(url: str, name: str) -> float:
    text = (await fetch(url, "/metrics")).decode()
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match[1]) if match else 0.0


async def health_cpu(url: str, pid: int, requests: int) -> float:
    """The server's CPU per ``GET /health`` (µs): a constant answer, about the least any
    request costs an app on hypercorn's trio worker."""
    client = await Client.open(url)
    before = cpu_seconds(pid)
    for _ in range(requests):
        assert await client.get("/health") == 200
    used = cpu_seconds(pid) - before
    await client.aclose()
    return used / requests * 1e6


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far.

    The scheduler's own count for each of its threads (``/proc/PID/task/*/schedstat``,
    in nanoseconds), where the kernel keeps it: ``/proc/PID/stat`` counts 10 ms ticks,
    coarser than what some rows measure (a 5 000-chunk stream costs about 17 ms). A thread
    that ends between two readings takes its time with it; the proxies' threads (Trio's
    worker threads) do little while they are measured.
    """
    if not os.path.exists(f"/proc/{pid}/schedstat"):  # a kernel without scheduler statistics
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{task}/schedstat"
        with contextlib.suppress(FileNotFoundError), open(path) as schedstat:  # one may end
            total += int(schedstat.read().split()[0])
    return total / 1e9


async def readiness(url: str, output: Output, runs: int) -> list[float]:
    """Seconds from "healthy at" to the first forwarded chat request, per cold start."""
    delays = []
    load = json.dumps({"model": "cold", "messages": [{"role": "user", "content": "x"}]}).encode()
    for _ in range(runs):
        mark = len(output.lines)
        client = await Client.open(url)
        assert await client.post("/v1/chat/completions", load) == 200
        assert await client.post("/api/models/unload/cold", b"") == 200
        await client.aclose()
        healthy = await output.wait_for(r"\[cold\] fake_server: healthy at ([0-9.]+)", start=mark)
        served = await output.wait_for(
            r"\[cold\] fake_server: request POST /v1/chat/completions at ([0-9.]+)", start=mark
        )
        delays.append(float(served[1]) - float(healthy[1]))
    return delays


async def queued_memory(url: str, pid: int, waiting: int) -> tuple[float, int]:
    """RSS with ``waiting`` requests queued behind a busy model; how many got a 200.

    ``hog`` and ``cold`` swap (the implicit group): while a long request keeps ``hog``
    busy, every request for ``cold`` waits in the queue.
    """
    blocker_body = json.dumps(
        {"model": "hog", "stream": True, "max_tokens": 400, "messages": []}
    ).encode()
    queued_body = json.dumps({"model": "cold", "max_tokens": 1, "messages": []}).encode()
    answered = 0
    blocker = await Client.open(url)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocker.post, "/v1/chat/completions", blocker_body)
        while await metric(url, 'llamaswap_in_flight_requests{model="hog"}') < 1:  # noqa: ASYNC110
            await trio.sleep(0.05)

        async def one() -> None:
            nonlocal answered
            client = await Client.open(url)
            status = await client.post("/v1/chat/completions", queued_body)
            answered += status == 200
            await client.aclose()

        for _ in range(waiting):
            nursery.start_soon(one)
        # Polling a metric over HTTP: nothing else tells us when they have all arrived.
        depth_metric = 'llamaswap_scheduler_queue_depth{band="normal"}'
        while await metric(url, depth_metric) < waiting:  # noqa: ASYNC110
            await trio.sleep(0.1)
        peak = rss_mb(pid)
    await blocker.aclose()
    return peak, answered


CONFIG = """
startPort = {port}
unloadTimeout = 3
[macros]
fake = "python -m llamaswap.fake_server --port ${{PORT}} --model-name ${{MODEL_ID}}"
[models.fast]
cmd = "${{fake}}"
[models.paced]
cmd = "${{fake}} --tokens-per-second 100"
concurrencyLimit = 64
[models.cold]
cmd = "${{fake}} --load-seconds 0.5"
concurrencyLimit = 2000
[models.hog]
cmd = "${{fake}} --tokens-per-second 100"
[routing.router.settings.groups.bench]
members = ["fast", "paced"]
swap = false
exclusive = false
persistent = true
"""


@asynccontextmanager
async def running_proxy(
    config: str, log_level: str, source: Path = REPO
) -> AsyncIterator[ProxyProcess]:
    """A llamaswap process (the one in ``source``) on ``config`` (TOML text). On the way
    out it is stopped, and nothing it started may survive (the e2e harness's checks)."""
    async with trio.open_nursery() as nursery:
        proxy = await start_proxy(
            nursery, config, Path(tempfile.mkdtemp()), log_level=log_level, source=source
        )
        try:
            yield proxy
        finally:
            await stop_proxy(proxy)


async def run(quick: bool, trace: bool) -> None:
    if not trace:
        await measure(quick, "")
        return
    from tests.otel_collector import running_collector

    with running_collector() as collector:
        await measure(quick, f'\n[tracing]\nendpoint = "{collector.url}"\n')
    print(f"spans received by the collector: {len(collector.spans)}")


async def measure(quick: bool, tracing: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    config = CONFIG.format(port=free_port_base()) + tracing
    models = loads_config(config).models
    direct = {m: models[m].proxy for m in ("fast", "paced")}
    results: list[tuple[str, str, str, str]] = []
    # Measured at the default log level (info), as llamaswap normally runs.
    async with running_proxy(config, "info") as proxy:
        url, pid = proxy.url, proxy.process.pid
        client = await Client.open(url)
        for model in ("fast", "paced"):
            assert await client.post(f"/api/models/load/{model}", b"") == 200
        await client.aclose()
        idle = rss_mb(pid)
        running = json.loads(await fetch(url, "/running"))["running"]
        server_pid = next(entry["pid"] for entry in running if entry["model"] == "fast")
        rounds = 300 if quick else 2000
        for concurrency in (1, 8):
            cpu_before = cpu_seconds(pid), cpu_seconds(server_pid)
            figures = await latency(direct["fast"], url, concurrency, rounds // concurrency)
            if concurrency == 1:
                # Each round is one direct and one proxied request: the server answers
                # both, the proxy only the proxied one.
                proxy_us = (cpu_seconds(pid) - cpu_before[0]) / rounds * 1e6
                server_us = (cpu_seconds(server_pid) - cpu_before[1]) / (2 * rounds) * 1e6
                cpu_row = (
                    "CPU per request (server | proxy)", f"{server_us:.0f} µs",
                    f"{proxy_us:.0f} µs", f"{proxy_us / server_us:.2f}x the server's",
                )  # fmt: skip
            for q in ("p50", "p99"):
                d, p = figures[f"direct {q}"], figures[f"proxied {q}"]
                results.append(
                    (f"latency {q}, concurrency {concurrency}", f"{d:.2f} ms", f"{p:.2f} ms",
                     f"+{p - d:.2f} ms ({p / d:.2f}x)")
                )  # fmt: skip
        results.append(cpu_row)
        floor = await health_cpu(direct["fast"], server_pid, rounds)
        results.append(("CPU per GET /health (hypercorn floor)", f"{floor:.0f} µs", "-", ""))
        tokens = 50 if quick else 100
        for concurrency, batches in ((1, 10), (32, 3)):
            d_ttft, d_rate = await streaming(direct["paced"], concurrency, tokens, batches)
            p_ttft, p_rate = await streaming(url, concurrency, tokens, batches)
            results.append(
                (f"time to first token, concurrency {concurrency}", f"{d_ttft:.2f} ms",
                 f"{p_ttft:.2f} ms", f"+{p_ttft - d_ttft:.2f} ms")
            )  # fmt: skip
            results.append(
                (f"tokens/s per stream, concurrency {concurrency}", f"{d_rate:.1f}",
                 f"{p_rate:.1f}", f"{100 * p_rate / d_rate:.1f} % of direct")
            )  # fmt: skip
        waiting = 200 if quick else 1000
        queued_rss, answered = await queued_memory(url, pid, waiting)
        results.append(("proxy RSS, idle", "-", f"{idle:.1f} MB", ""))
        results.append(
            (f"proxy RSS, {waiting} requests waiting", "-", f"{queued_rss:.1f} MB",
             f"{answered}/{waiting} answered 200")
        )  # fmt: skip
    # The servers' own "healthy at" stamps reach llamaswap's output at debug level.
    async with running_proxy(config, "debug") as proxy:
        delays = await readiness(proxy.url, proxy.output, 3 if quick else 10)
        results.append(
            ("readiness: healthy → first request", "-",
             f"median {statistics.median(delays) * 1000:.1f} ms",
             f"max {max(delays) * 1000:.1f} ms")
        )  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"llamaswap benchmark on {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    widths = [max(len(row[i]) for row in results) for i in range(4)]
    header = ("measure", "direct", "through llamaswap", "difference")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    for row in (header, *results):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print()
    print("references: llama-swap polls readiness at 250 ms then every 1 s;")
    print("LiteLLM's published overhead is +4.34 ms on loopback (llm-gateway-bench);")
    print("LlamaStash (Rust) adds +0.45 ms median time to first token.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--trace", action="store_true", help="llamaswap sends traces")
    options = parser.parse_args()
    trio.run(run, options.quick, options.trace)


if __name__ == "__main__":
    main()
