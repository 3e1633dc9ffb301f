"""What a user's client sees: llamaswap against the same upstream reached directly.

    python tests/benchmarks/bench_traffic.py [--other CHECKOUT] [--quick]

The upstream is ``stdlib_upstream.py`` (``http.server``, keep-alive), cheap enough that the
figures are the proxy's, not the model server's. Each row is measured side by side in one
run: *direct* (the upstream itself), *nginx* (a keep-alive reverse proxy in front of the same
upstream, when ``nginx`` is installed), *llamaswap* (this checkout) and, with ``--other``,
the llamaswap of another checkout (e.g. ``git worktree add /tmp/base HEAD~3``), each
llamaswap with an upstream of its own. Targets are measured in turn, in short blocks, the
order rotating, so that whatever else the machine does hits every column alike.

Each client sends its requests back to back on one keep-alive connection, as a user's
client (or ``wrk``) does; a proxy's work after its answer's last byte (records, metrics,
the server's own bookkeeping) therefore delays the next request, as it does in real use.

Rows:

* small chat request at concurrency 1: p50 and p99 (a blocking-socket client, each request
  timed); CPU per request of each proxy process (user + system, the scheduler's count);
* the same with the client alternating direct and proxied requests: how ``bench_proxy.py``
  measured, which hides that after-answer work (see docs/performance.md);
* concurrency 8: requests/s and p50 (``wrk`` if installed, else 8 client threads);
* a 200 KB and a 2 MB chat body: added time (p50) and CPU per request;
* an 850 KB embeddings answer (40 inputs), whose ``usage`` comes at its end: the same;
* a stream of 5 000 SSE chunks sent as fast as the upstream can: chunks/s, median of 15
  (the client reads the answer without parsing its chunks, so that it keeps up with the
  upstream);
* a stream at a model's pace (1 000 chunks, 1 ms apart): CPU per chunk, each chunk relayed
  on its own, which is what a token stream costs the proxy;
* RSS idle, and per request waiting in the queue (1 000 waiting behind a busy model).

In the small-request rows more columns show the floor under llamaswap on its stack
(``floor_app.py``): hypercorn answering a constant, and a minimal forwarder on llamaswap's
upstream pool with nothing else; and that forwarder, and llamaswap itself, on a bare Trio +
h11 server loop, to show what hypercorn itself costs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import final

import attrs
import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.benchmarks.bench_proxy import (  # noqa: E402
    cpu_seconds,
    percentile,
    queued_memory,
    rss_mb,
    running_proxy,
)
from tests.e2e.harness import free_port_base  # noqa: E402

UPSTREAM = f"{sys.executable} {REPO / 'tests/benchmarks/stdlib_upstream.py'} --port ${{PORT}}"
CONFIG = """
startPort = {port}
maxBodyBytes = 67108864
[models.fast]
cmd = "{upstream}"
[models.cold]
cmd = "python -m llamaswap.fake_server --port ${{PORT}} --model-name cold"
concurrencyLimit = 2000
[models.hog]
cmd = "python -m llamaswap.fake_server --port ${{PORT}} --tokens-per-second 100"
[routing.router.settings.groups.bench]
members = ["fast"]
swap = false
exclusive = false
persistent = true
"""

#: Figures from the issue this benchmark answers (issue 13), printed beside the results.
TARGETS = {
    "c=1 added p50": "≤ +0.5 ms",
    "c=1 added p99": "≤ +2 ms",
    "c=8 req/s": "≥ 50 % of direct",
    "CPU per request": "≤ 0.7 ms",
    "stream chunks/s": "≥ 90 % of direct",
    "RSS idle": "≤ 60 MB",
}


def chat(size: int = 0, *, stream: bool = False, tokens: int = 8, interval_ms: float = 0) -> bytes:
    """A chat request for model ``fast``, padded to about ``size`` bytes of messages;
    ``interval_ms``: the upstream's pause between a stream's chunks."""
    sentence = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod. "
    messages = [{"role": "user", "content": "hello"}]
    while size > 0:
        content = sentence * 40
        messages.append({"role": "user", "content": content})
        size -= len(content) + 30
    document = {"model": "fast", "max_tokens": tokens, "messages": messages}
    if stream:
        document["stream"] = True
    if interval_ms:
        document["interval_ms"] = interval_ms
    return json.dumps(document).encode()


@final
class Client:
    """One keep-alive HTTP/1.1 connection on a blocking socket: as little client as can be,
    so that the time is the server's."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self._host = f"{host}:{port}".encode()
        self._socket = socket.create_connection((host, int(port)))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()
        self._at = 0  # what is before this in the buffer has been read

    def close(self) -> None:
        self._socket.close()

    def post(self, body: bytes) -> int:
        """POST /v1/chat/completions; the status."""
        return self.request("POST", "/v1/chat/completions", body)

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        on_data: Callable[[bytes], None] | None = None,
    ) -> int:
        self.send_request(method, path, body)
        status, fields = self._head()
        if b"content-length" in fields:
            data = self._exactly(int(fields[b"content-length"]))
            if on_data:
                on_data(data)
            return status
        while True:  # chunked
            size = int(self._take(self._until(b"\r\n") + 2), 16)
            data = self._exactly(size + 2)[:-2]
            if size == 0:
                return status
            if on_data:
                on_data(data)

    def send_request(self, method: str, path: str, body: bytes) -> None:
        """Send a request (its head and ``body``)."""
        head = (
            b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n"
            % (method.encode(), path.encode(), self._host, len(body))
        )
        self._socket.sendall(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self._socket.sendall(body)

    def stream(self, body: bytes) -> int:
        """POST a streaming ``body`` and read the answer raw, to the end of its chunked body,
        without parsing its chunks; the SSE events it held. A client that parsed every
        chunk would measure itself: it would be slower than the upstream writes them."""
        self.send_request("POST", "/v1/chat/completions", body)
        status, _ = self._head()
        assert status == 200, status
        while not self._buffer.endswith(b"\r\n0\r\n\r\n"):  # SSE data holds no \r
            self._fill()
        events = self._buffer.count(b"data: ", self._at)
        self._buffer.clear()
        self._at = 0
        return events

    def _head(self) -> tuple[int, dict[bytes, bytes]]:
        """The response's status and header fields (names in lowercase)."""
        lines = self._take(self._until(b"\r\n\r\n") + 4).split(b"\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:] if line)
        return int(lines[0].split()[1]), fields

    def _fill(self) -> None:
        data = self._socket.recv(1 << 18)
        if not data:
            raise ConnectionError(f"{self._host.decode()} closed the connection")
        self._buffer += data

    def _until(self, marker: bytes) -> int:
        while (at := self._buffer.find(marker, self._at)) < 0:
            self._fill()
        return at - self._at

    def _take(self, count: int) -> bytes:
        taken = bytes(self._buffer[self._at : self._at + count])
        self._at += count
        if self._at == len(self._buffer):
            self._buffer.clear()
            self._at = 0
        return taken

    def _exactly(self, count: int) -> bytes:
        while len(self._buffer) - self._at < count:
            self._fill()
        return self._take(count)


@attrs.define
class Target:
    name: str
    url: str
    pid: int | None  # the proxy process whose CPU is counted; None: direct
    cpu: float = 0.0
    served: int = 0
    samples: dict[str, list[float]] = attrs.field(factory=dict)

    @contextmanager
    def counting(self, requests: int) -> Iterator[None]:
        before = cpu_seconds(self.pid) if self.pid else 0.0
        yield
        if self.pid:
            self.cpu += cpu_seconds(self.pid) - before
            self.served += requests

    def cpu_us(self) -> float:
        return self.cpu / self.served * 1e6 if self.served else float("nan")


def timed_blocks(
    targets: list[Target],
    key: str,
    body: bytes,
    blocks: int,
    per_block: int,
    path: str = "/v1/chat/completions",
) -> None:
    """Each target in turn (order rotating), ``per_block`` back-to-back requests per block."""
    clients = {t.name: Client(t.url) for t in targets}
    for target in targets:  # warm the connection, the upstream pool, the caches
        for _ in range(min(per_block, 50)):
            assert clients[target.name].request("POST", path, body) == 200
    for block in range(blocks):
        shift = block % len(targets)
        for target in targets[shift:] + targets[:shift]:
            client, samples = clients[target.name], target.samples.setdefault(key, [])
            with target.counting(per_block):
                for _ in range(per_block):
                    started = time.perf_counter()
                    assert client.request("POST", path, body) == 200
                    samples.append(time.perf_counter() - started)
    for client in clients.values():
        client.close()


def alternating(direct: Target, proxied: Target, key: str, rounds: int) -> None:
    """bench_proxy.py's old method: one direct request, one proxied, and so on."""
    clients = [Client(direct.url), Client(proxied.url)]
    body = chat()
    pairs = list(zip(clients, (direct, proxied), strict=True))
    for i in range(rounds):
        for client, target in pairs if i % 2 else pairs[::-1]:
            started = time.perf_counter()
            assert client.post(body) == 200
            target.samples.setdefault(key, []).append(time.perf_counter() - started)
    for client in clients:
        client.close()


def stream_rate(
    targets: list[Target], chunks: int, runs: int, interval_ms: float = 0
) -> dict[str, float]:
    """Chunks per second of one stream of ``chunks`` SSE events (median over ``runs``)."""
    body = chat(stream=True, tokens=chunks, interval_ms=interval_ms)
    rates: dict[str, list[float]] = {t.name: [] for t in targets}
    for run in range(runs):
        shift = run % len(targets)
        for target in targets[shift:] + targets[:shift]:
            client = Client(target.url)
            started = time.perf_counter()
            with target.counting(1):
                events = client.stream(body)
            elapsed = time.perf_counter() - started
            client.close()
            assert events == chunks + 2, events  # the chunks, usage, [DONE]
            rates[target.name].append(chunks / elapsed)
    return {name: sorted(values)[len(values) // 2] for name, values in rates.items()}


def wrk(url: str, connections: int, seconds: float) -> tuple[float, float]:
    """Requests/s and p50 (ms) of ``wrk`` posting the small chat request."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            f'wrk.method = "POST"\nwrk.body = {json.dumps(chat().decode())}\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
    out = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", script.name, "--latency",
         url + "/v1/chat/completions"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    os.unlink(script.name)
    rate = float(re.search(r"Requests/sec:\s+([0-9.]+)", out)[1])  # type: ignore[index]
    value, unit = re.search(r"50%\s+([0-9.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return rate, float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def threads_rate(url: str, connections: int, seconds: float) -> tuple[float, float]:
    """Without wrk: ``connections`` client threads, back to back."""
    samples: list[float] = []
    stop = time.perf_counter() + seconds

    def run() -> None:
        client, body = Client(url), chat()
        while (started := time.perf_counter()) < stop:
            assert client.post(body) == 200
            samples.append(time.perf_counter() - started)
        client.close()

    workers = [threading.Thread(target=run) for _ in range(connections)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return len(samples) / seconds, percentile(samples, 0.5) * 1e3


def concurrency8(
    targets: list[Target], seconds: float, rounds: int
) -> dict[str, tuple[float, float]]:
    """Mean requests/s and median p50 (ms) over ``rounds`` runs of 8 connections."""
    measure = wrk if shutil.which("wrk") else threads_rate
    figures: dict[str, list[tuple[float, float]]] = {t.name: [] for t in targets}
    for run in range(rounds):
        shift = run % len(targets)
        for target in targets[shift:] + targets[:shift]:
            figures[target.name].append(measure(target.url, 8, seconds))
    return {
        name: (sum(r for r, _ in runs) / len(runs), sorted(p for _, p in runs)[len(runs) // 2])
        for name, runs in figures.items()
    }


NGINX = """
daemon off; master_process off; worker_processes 1;
error_log {dir}/error.log; pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  client_max_body_size 64m; client_body_buffer_size 4m;
  keepalive_requests 100000000;
  upstream model {{ server {upstream}; keepalive 64; keepalive_requests 100000000; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://model; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


async def start_nginx(stack: AsyncExitStack, upstream: str) -> Target | None:
    """nginx 1 worker in front of ``upstream`` (host:port), if nginx is installed."""
    binary = shutil.which("nginx", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if binary is None:
        return None
    directory = tempfile.mkdtemp(prefix="bench-nginx-")
    port = free_port_base(1)
    conf = Path(directory) / "nginx.conf"
    conf.write_text(NGINX.format(dir=directory, upstream=upstream, port=port))
    return await start_server(stack, "nginx", [binary, "-e", "stderr", "-c", str(conf)], port)


async def start_floors(stack: AsyncExitStack, upstream: str) -> list[Target]:
    """hypercorn alone (a constant answer) and a minimal forwarder to ``upstream`` through
    llamaswap's upstream pool: the floor under llamaswap on its stack; then that forwarder,
    and llamaswap itself (with an upstream of its own), on a bare Trio + h11 server loop
    instead of hypercorn (floor_app.py)."""
    command = [sys.executable, str(REPO / "tests/benchmarks/floor_app.py"), "--port"]
    floors = []
    for name, args in (
        ("hypercorn alone", ["constant"]),
        ("minimal forwarder", ["forward", upstream]),
        ("forwarder without hypercorn", ["forward-h11", upstream]),
    ):
        port = free_port_base(1)
        floors.append(await start_server(stack, name, [*command, str(port), *args], port))
    # Its models' ports, then its own: free of each other, and of the floors above.
    base = free_port_base(9)
    config = Path(tempfile.mkdtemp(prefix="bench-floor-")) / "llamaswap.toml"
    config.write_text(CONFIG.format(port=base, upstream=UPSTREAM))
    args = [str(base + 8), "llamaswap-h11", str(config)]
    floors.append(
        await start_server(stack, "llamaswap without hypercorn", command + args, base + 8)
    )
    url = floors[-1].url
    assert await trio.to_thread.run_sync(lambda: _post(url, "/api/models/load/fast")) == 200
    return floors


async def start_server(stack: AsyncExitStack, name: str, command: list[str], port: int) -> Target:
    """Run ``command``, stopped on the way out, once it accepts connections on ``port``."""
    process = await trio.lowlevel.open_process(command)

    async def stop() -> None:
        process.terminate()
        await process.wait()

    stack.push_async_callback(stop)
    with trio.fail_after(10):
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                await trio.sleep(0.05)
    return Target(name, f"http://127.0.0.1:{port}", process.pid)


async def start_llamaswap(stack: AsyncExitStack, name: str, source: Path) -> tuple[Target, str]:
    """A llamaswap from ``source`` with model ``fast`` loaded; its target and upstream URL."""
    config = CONFIG.format(port=free_port_base(), upstream=UPSTREAM)
    proxy = await stack.enter_async_context(running_proxy(config, "info", source))
    status = await trio.to_thread.run_sync(lambda: _post(proxy.url, "/api/models/load/fast"))
    assert status == 200
    running = json.loads(await trio.to_thread.run_sync(lambda: _get(proxy.url, "/running")))
    upstream = next(m["proxy"] for m in running["running"] if m["model"] == "fast")
    return Target(name, proxy.url, proxy.process.pid), upstream


def _request(url: str, method: str, path: str) -> tuple[int, bytes]:
    client, body = Client(url), bytearray()
    try:
        return client.request(method, path, on_data=body.extend), bytes(body)
    finally:
        client.close()


def _post(url: str, path: str) -> int:
    return _request(url, "POST", path)[0]


def _get(url: str, path: str) -> bytes:
    status, body = _request(url, "GET", path)
    assert status == 200
    return body


def shares(figures: dict[str, float]) -> dict[str, str]:
    """Each figure, and beside it its share of the direct one."""
    direct = figures["direct"]
    return {
        name: f"{value:.0f}" if name == "direct" else f"{value:.0f} ({value / direct:.0%})"
        for name, value in figures.items()
    }


#: The table's columns: the targets' names, in order (set once they are all running).
COLUMNS: list[str] = []


def row(label: str, cells: dict[str, str], target: str = "") -> list[str]:
    """A table row: ``cells`` by target name, in the columns' order (blank where missing)."""
    return [label, *(cells.get(name, "") for name in COLUMNS), TARGETS.get(target, "")]


async def run(other: Path | None, quick: bool) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    async with AsyncExitStack() as stack:
        this, upstream = await start_llamaswap(stack, "llamaswap", REPO)
        proxies = [this]
        if other is not None:
            proxies.append((await start_llamaswap(stack, f"other ({other.name})", other))[0])
        direct = Target("direct", upstream, None)
        nginx = await start_nginx(stack, upstream.removeprefix("http://"))
        targets = [direct, *([nginx] if nginx else []), *proxies]
        floors = await start_floors(stack, upstream)  # only in the small-request rows
        COLUMNS[:] = names = [t.name for t in targets + floors]
        idle = {t.name: rss_mb(t.pid) for t in proxies if t.pid is not None}
        table: list[list[str]] = [["measure", *names, "target"]]

        def added(key: str, q: float) -> dict[str, str]:
            base = percentile(direct.samples[key], q) * 1e3
            cells = {}
            for t in targets + floors:
                if key not in t.samples:
                    cells[t.name] = ""
                    continue
                value = percentile(t.samples[key], q) * 1e3
                cells[t.name] = f"{value:.3f} ms" if t is direct else f"+{value - base:.3f} ms"
            return cells

        def cpu(chunks: int = 0) -> dict[str, str]:
            """CPU per request since the last call, or per chunk of its ``chunks``."""
            measured = [t for t in targets + floors if t.pid is not None and t.served]
            per = f"{{:.{1 if chunks else 0}f}} µs"
            cells = {t.name: per.format(t.cpu_us() / (chunks or 1)) for t in measured}
            for t in measured:
                t.cpu, t.served = 0.0, 0
            return cells

        blocks, per_block = (6, 100) if quick else (20, 250)
        small = targets + floors
        await trio.to_thread.run_sync(timed_blocks, small, "small", chat(), blocks, per_block)
        table.append(row("c=1 small chat, p50 (added)", added("small", 0.5), "c=1 added p50"))
        table.append(row("c=1 small chat, p99 (added)", added("small", 0.99), "c=1 added p99"))
        table.append(row("CPU per small chat request", cpu(), "CPU per request"))
        rounds = 300 if quick else 2000
        await trio.to_thread.run_sync(alternating, direct, this, "alternating", rounds)
        table.append(
            row("c=1 alternated with direct (old method), p50", added("alternating", 0.5))
        )
        seconds, rounds8 = (2, 1) if quick else (4, 3)
        c8 = await trio.to_thread.run_sync(concurrency8, targets + floors, seconds, rounds8)
        rates = {name: rate for name, (rate, _) in c8.items()}
        table.append(row("c=8 req/s (share of direct)", shares(rates), "c=8 req/s"))
        table.append(row("c=8 p50", {n: f"{p:.2f} ms" for n, (_, p) in c8.items()}))
        for label, size in (("200 KB", 200_000), ("2 MB", 2_000_000)):
            count = (3, 10) if quick else (10, 20)
            if size > 1e6:
                count = (3, 4) if quick else (10, 5)
            await trio.to_thread.run_sync(timed_blocks, targets, label, chat(size), *count)
            table.append(row(f"{label} chat body, p50 (added)", added(label, 0.5)))
            table.append(row(f"{label} chat body, CPU per request", cpu()))
        embed = json.dumps({"model": "fast", "input": ["hello"] * 40}).encode()
        count = (3, 10) if quick else (10, 20)
        path = "/v1/embeddings"
        await trio.to_thread.run_sync(timed_blocks, targets, "embed", embed, *count, path)
        table.append(row("850 KB embeddings answer, p50 (added)", added("embed", 0.5)))
        table.append(row("850 KB embeddings answer, CPU per request", cpu()))
        chunks = 5000
        rates = await trio.to_thread.run_sync(stream_rate, targets, chunks, 3 if quick else 15)
        label = f"stream of {chunks} chunks, chunks/s (share)"
        table.append(row(label, shares(rates), "stream chunks/s"))
        table.append(row("stream, CPU per chunk", cpu(chunks)))
        # A model's pace: every chunk arrives alone, so each costs a whole relay.
        paced, runs = (300, 3) if quick else (1000, 5)
        await trio.to_thread.run_sync(stream_rate, targets, paced, runs, 1.0)
        table.append(row("stream at 1 chunk/ms, CPU per chunk", cpu(paced)))
        table.append(row("RSS idle", {
            t.name: f"{idle[t.name]:.1f} MB" if t.name in idle else "" for t in targets
        }, "RSS idle"))  # fmt: skip
        waiting = 200 if quick else 1000
        per_wait: dict[str, str] = {}
        for proxy in proxies:
            assert proxy.pid is not None
            before = rss_mb(proxy.pid)
            peak, answered = await queued_memory(proxy.url, proxy.pid, waiting)
            per_kb = (peak - before) * 1024 / waiting
            per_wait[proxy.name] = f"{per_kb:.1f} KB ({answered}/{waiting} answered)"
        table.append(row(f"memory per waiting request ({waiting})", {
            t.name: per_wait.get(t.name, "") for t in targets
        }))  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"bench_traffic on {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, help="another llamaswap checkout, side by side")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    options = parser.parse_args()
    trio.run(run, options.other.resolve() if options.other else None, options.quick)


if __name__ == "__main__":
    main()
