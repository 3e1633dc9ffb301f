"""Running the real proxy and real fake model servers, for end-to-end tests.

Everything runs on 127.0.0.1 with the real clock. Tests synchronise on the processes'
own output lines (or on HTTP answers), never by sleeping, and every wait is bounded.

Each proxy gets a unique marker in its environment; its model servers inherit it, so
``survivors(marker)`` finds every process the test started, however it was re-parented.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import final

import httpx
import trio

REPO = Path(__file__).resolve().parents[2]
MARKER_VARIABLE = "LLAMASWAP_TEST_MARKER"
FAKE = "python -m llamaswap.fake_server --port ${PORT} --model-name ${MODEL_ID}"
LISTENING = re.compile(r"llamaswap: listening on (?P<url>https?://\S+)")


#: Ports handed out to model servers in tests: below the ephemeral range (32768+), where the
#: kernel picks outgoing connections' ports, so a port found free stays free.
TEST_PORTS = range(20000, 32000)


def free_port_base(count: int = 8) -> int:
    """A port such that ``count`` consecutive ports are free right now (for ``startPort``)."""
    for _ in range(200):
        base = random.randrange(TEST_PORTS.start, TEST_PORTS.stop - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no run of free ports found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def child_env(marker: str, source: Path = REPO) -> dict[str, str]:
    """The environment for processes under test: this interpreter's ``python`` first, and
    llamaswap from ``source`` (this checkout unless another one is compared with it)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    env[MARKER_VARIABLE] = marker
    env.pop("PYTHONWARNINGS", None)
    return env


def survivors(marker: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose environment carries ``marker``."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def wait_until(condition: Callable[[], bool], *, within: float) -> None:
    """Poll ``condition`` (something with no event to wait on, like a PID's death)."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110 (there is no event for "process gone")
            await trio.sleep(0.02)


@final
class Output:
    """Lines a process prints, collected by a task; tests wait for a line to appear."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = trio.Event()
        self.closed = False

    async def collect(self, stream: trio.abc.ReceiveStream) -> None:
        pending = b""
        try:
            while chunk := await stream.receive_some():
                *complete, pending = (pending + chunk).split(b"\n")
                self.lines.extend(line.decode(errors="replace") for line in complete)
                self._changed.set()
                self._changed = trio.Event()
        finally:
            self.closed = True
            self._changed.set()

    async def wait_for(self, pattern: str, *, start: int = 0) -> re.Match[str]:
        """The first line from index ``start`` on that matches ``pattern``."""
        regex = re.compile(pattern)
        seen = start
        while True:
            for line in self.lines[seen:]:
                if match := regex.search(line):
                    return match
            seen = len(self.lines)
            if self.closed:
                tail = "\n".join(self.lines[-40:])
                raise AssertionError(
                    f"output ended without a line matching {pattern!r}; its last lines:\n{tail}"
                )
            await self._changed.wait()

    def text(self) -> str:
        return "\n".join(self.lines)


@final
class ProxyProcess:
    def __init__(
        self, process: trio.Process, url: str, output: Output, marker: str, config: Path
    ) -> None:
        self.process = process
        self.config = config  # the file it was started with (edit it, then reload)
        self.url = url
        self.output = output
        self.marker = marker

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30.0, **kwargs)  # type: ignore[arg-type]

    async def terminate(self) -> int:
        """SIGTERM, then wait (at most 20 s) for the exit code."""
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            return await self.process.wait()


async def start_proxy(
    nursery: trio.Nursery,
    config: str,
    tmp_path: Path,
    *,
    log_level: str = "debug",
    source: Path = REPO,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    launch: Sequence[str] = ("-m", "llamaswap"),
) -> ProxyProcess:
    """Start ``python -m llamaswap`` (from ``source``) on ``config`` (TOML text), port 0.

    ``env`` adds to (or overrides) its environment; ``args`` go on its command line;
    ``launch`` replaces ``-m llamaswap`` (``-c CODE`` that ends by calling the CLI). Its
    output is collected by a task in ``nursery``; ``stop_proxy`` cleans up.
    """
    path = tmp_path / f"config-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(config)
    marker = uuid.uuid4().hex
    argv = [sys.executable, *launch, "--config", str(path)]
    if "--listen" not in args:  # a test's own replaces it: several are all served
        argv += ["--listen", "127.0.0.1:0"]
    argv += ["--log-level", log_level, *args]
    process = await trio.lowlevel.open_process(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**child_env(marker, source), **(env or {})},
        cwd=source,
    )
    proxy = ProxyProcess(process, "", collected(nursery, process), marker, path)
    try:
        with trio.fail_after(20):
            proxy.url = (await proxy.output.wait_for(LISTENING.pattern))["url"]
    except BaseException:
        await stop_proxy(proxy)
        raise
    return proxy


def collected(nursery: trio.Nursery, process: trio.Process) -> Output:
    """The lines ``process`` prints, collected by a task in ``nursery``."""
    output = Output()
    assert process.stdout is not None
    nursery.start_soon(output.collect, process.stdout)
    return output


async def stop_proxy(proxy: ProxyProcess) -> None:
    """SIGTERM (SIGKILL if it hangs), reap, and check that nothing it started survives."""
    await stop(proxy.process, proxy.marker, grace=30)


async def stop(process: trio.Process, marker: str, *, grace: float) -> None:
    """SIGTERM (SIGKILL after ``grace`` seconds), reap, and check that nothing the
    process started (whatever carries ``marker``) survives."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        await wait_until(lambda: not survivors(marker), within=5)


async def running(client: httpx.AsyncClient) -> dict[str, dict[str, object]]:
    """``GET /running`` as a map from model ID to its entry."""
    response = await client.get("/running")
    return {entry["model"]: entry for entry in response.json()["running"]}


async def pid_of(client: httpx.AsyncClient, model: str) -> int:
    """The PID of ``model``'s running server (``GET /running``)."""
    pid = (await running(client))[model]["pid"]
    assert isinstance(pid, int)
    return pid


async def open_raw_request(url: str, path: str, body: bytes) -> trio.SocketStream:
    """POST ``body`` as JSON over a bare socket; the caller reads, then closes, the stream.

    For tests that hang up mid-response: closing a socket is the whole point there, with
    no client library in between.
    """
    host, _, port = url.removeprefix("http://").partition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    await stream.send_all(head.encode() + body)
    return stream


GATEWAY_METRICS = re.compile(r"llamaswap gateway: metrics on (?P<url>http://\S+)")
GATEWAY_PICKER = re.compile(r"llamaswap gateway: picker \(ext_proc\) on (?P<address>\S+)")
GATEWAY_ENVOY = re.compile(r"llamaswap gateway: envoy listening on (?P<url>http://\S+)")


@final
class GatewayProcess:
    """A running ``llamaswap gateway``; ``url`` is its Envoy's, when it runs one."""

    def __init__(self, process: trio.Process, output: Output, marker: str) -> None:
        self.process = process
        self.output = output
        self.marker = marker
        self.metrics_url = ""
        self.picker = ""
        self.url = ""

    async def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Its ``/metrics``, each sample by name and sorted labels."""
        from prometheus_client.parser import text_string_to_metric_families

        async with httpx.AsyncClient(timeout=5.0) as client:
            text = (await client.get(self.metrics_url)).text
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def wait_for(self, name: str, within: float = 10.0, **labels: str) -> float:
        """The value of sample ``name`` with ``labels``, once it is there and not 0
        (polled: the gateway scrapes on its own clock)."""
        key = (name, tuple(sorted(labels.items())))
        with trio.fail_after(within):
            while not (value := (await self.samples()).get(key)):  # noqa: ASYNC110
                await trio.sleep(0.02)
        return value


async def start_gateway(
    nursery: trio.Nursery, args: Sequence[str], *, envoy: bool = True
) -> GatewayProcess:
    """Start ``python -m llamaswap gateway ARGS`` (with ``--envoy`` when ``envoy``) and
    wait for its addresses; ``stop_gateway`` cleans up."""
    marker = uuid.uuid4().hex
    argv = [sys.executable, "-m", "llamaswap", "gateway", "--metrics", "127.0.0.1:0", *args]
    if envoy:
        argv += ["--envoy", "--listen", "127.0.0.1:0"]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=child_env(marker), cwd=REPO
    )
    output = collected(nursery, process)
    gateway = GatewayProcess(process, output, marker)
    try:
        with trio.fail_after(30):
            gateway.metrics_url = (await output.wait_for(GATEWAY_METRICS.pattern))["url"]
            gateway.picker = (await output.wait_for(GATEWAY_PICKER.pattern))["address"]
            if envoy:
                gateway.url = (await output.wait_for(GATEWAY_ENVOY.pattern))["url"]
    except BaseException:
        await stop_gateway(gateway)
        raise
    return gateway


async def stop_gateway(gateway: GatewayProcess) -> None:
    """SIGTERM (SIGKILL if it hangs), reap, and check that its Envoy is gone too."""
    await stop(gateway.process, gateway.marker, grace=10)
