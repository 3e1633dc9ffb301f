"""The latency the gateway adds: one llamaswap node, direct and through Envoy + picker.

    python tests/benchmarks/bench_gateway.py [--rounds N]

One run starts a real llamaswap node (node mode, a fake model server), ``llamaswap
gateway --envoy`` in front of it, and a second Envoy with the same listener but a static
route and no ext_proc. Each round sends one small non-streaming chat request on each of
the three paths, in a rotating order, on keep-alive connections, so drift hits all three
alike. Prints p50 and p99 per path, and what Envoy and the picker each add. It also
times the pick itself over 3 and 100 nodes (the work done per request under the lock).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from llamaswap.gateway.envoy import envoy_binary, envoy_config  # noqa: E402
from llamaswap.gateway.nodes import Endpoint, Figures, Node  # noqa: E402
from llamaswap.gateway.pick import Policy, pick  # noqa: E402
from tests.benchmarks.bench_proxy import Client, percentile  # noqa: E402
from tests.e2e.harness import (  # noqa: E402
    free_port_base,
    start_gateway,
    start_proxy,
    stop_gateway,
    stop_proxy,
)
from tests.e2e.test_proxy import config  # noqa: E402

NODE = """
[gateway]
node = true
name = "bench"
[models.fast]
cmd = "${fake}"
"""
CHAT = json.dumps(
    {"model": "fast", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
).encode()


def static_envoy(listen: int, node_port: int) -> dict[str, Any]:
    """The gateway's Envoy config with the picker taken out: a plain route to the node."""
    document = envoy_config(
        listen=("127.0.0.1", listen), picker=("127.0.0.1", 1), admin=("127.0.0.1", 0)
    )
    listener = document["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    manager["http_filters"] = manager["http_filters"][1:]  # the router alone
    document["static_resources"]["clusters"] = [{
        "name": "nodes", "type": "STATIC", "connect_timeout": "2s",
        "load_assignment": {"cluster_name": "nodes", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": node_port}}}}]}]},
    }]  # fmt: skip
    return document


async def measure(urls: dict[str, str], rounds: int) -> dict[str, list[float]]:
    clients = {path: await Client.open(url) for path, url in urls.items()}
    samples: dict[str, list[float]] = {path: [] for path in urls}
    for client in clients.values():  # warm connections, the node, Envoy's
        for _ in range(20):
            assert await client.post("/v1/chat/completions", CHAT) == 200
    names = list(urls)
    for i in range(rounds):
        for path in names[i % 3 :] + names[: i % 3]:
            started = time.perf_counter()
            assert await clients[path].post("/v1/chat/completions", CHAT) == 200
            samples[path].append(time.perf_counter() - started)
    for client in clients.values():
        await client.aclose()
    return samples


async def scrape_cost(tmp: Path, count: int, rounds: int = 400) -> tuple[float, float]:
    """p50 of ``GET /gateway/metrics`` and of ``GET /health`` (ms) on a node with ``count``
    models configured, one of them loaded: what a scrape costs beyond any request."""
    models = "\n".join(f'[models.m{i}]\ncmd = "${{fake}}"' for i in range(count))
    async with trio.open_nursery() as nursery:
        node = await start_proxy(
            nursery, config("[gateway]\nnode = true\n" + models), tmp, log_level="info"
        )
        try:
            client = await Client.open(node.url)
            assert await client.post("/api/models/load/m0", b"") == 200
            samples: dict[str, list[float]] = {"/gateway/metrics": [], "/health": []}
            for i in range(rounds):
                for path in sorted(samples, reverse=bool(i % 2)):
                    started = time.perf_counter()
                    assert await client.get(path) == 200
                    samples[path].append(time.perf_counter() - started)
            await client.aclose()
        finally:
            await stop_proxy(node)
        nursery.cancel_scope.cancel()
    metrics, health = (percentile(samples[p], 0.5) * 1000 for p in ("/gateway/metrics", "/health"))
    return metrics, health


def time_pick(count: int) -> float:
    """Microseconds per pick over ``count`` nodes, the model loaded on one of them."""
    nodes = [
        Node(
            Endpoint(f"n{i}", "10.0.0.1", 8000 + i),
            Figures(i % 3, 1, 0.5, frozenset({"a"} if i == count - 1 else {"b"}), frozenset(), 1),
            frozenset({"a", "b"}),
            0.0,
        )
        for i in range(count)
    ]
    rounds = 2000
    started = time.perf_counter()
    for _ in range(rounds):
        pick(nodes, "a", 0, now=0.01, policy=Policy(), pending={})
    return (time.perf_counter() - started) / rounds * 1e6


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        async with trio.open_nursery() as nursery:
            node = await start_proxy(nursery, config(NODE), tmp, log_level="info")
            node_port = int(node.url.rsplit(":", 1)[1])
            endpoints = tmp / "endpoints.yaml"
            endpoints.write_text(
                f'endpoints:\n  - name: bench\n    address: 127.0.0.1\n    port: "{node_port}"\n'
            )
            gateway = await start_gateway(
                nursery, ["--endpoints", str(endpoints), "--grpc", "127.0.0.1:0"]
            )
            port = free_port_base(1)
            plain = tmp / "plain.json"
            plain.write_text(json.dumps(static_envoy(port, node_port)))
            envoy = await trio.lowlevel.open_process(
                [str(envoy_binary()), "-c", str(plain), "--disable-hot-restart",
                 "--log-level", "error"],
            )  # fmt: skip
            try:
                await gateway.wait_for("llamaswap_gateway_node_up", endpoint="bench")
                with trio.fail_after(20):
                    while True:
                        try:
                            await (await Client.open(f"http://127.0.0.1:{port}")).aclose()
                            break
                        except OSError:
                            await trio.sleep(0.05)
                urls = {
                    "direct": node.url,
                    "envoy": f"http://127.0.0.1:{port}",
                    "gateway": gateway.url,
                }
                samples = await measure(urls, rounds)
            finally:
                envoy.kill()
                await envoy.wait()
                await stop_gateway(gateway)
                await stop_proxy(node)
            nursery.cancel_scope.cancel()
    p50 = {path: percentile(values, 0.5) * 1000 for path, values in samples.items()}
    p99 = {path: percentile(values, 0.99) * 1000 for path, values in samples.items()}
    print(f"small chat request, {rounds} rounds, one connection per path (ms)")
    print(f"{'path':<34}{'p50':>8}{'p99':>8}")
    labels = {
        "direct": "node direct",
        "envoy": "Envoy, static route",
        "gateway": "Envoy + picker (llamaswap gateway)",
    }
    for path, label in labels.items():
        print(f"{label:<34}{p50[path]:>8.2f}{p99[path]:>8.2f}")
    print(f"added by Envoy:        p50 +{p50['envoy'] - p50['direct']:.2f} ms")
    print(f"added by the picker:   p50 +{p50['gateway'] - p50['envoy']:.2f} ms")
    print(f"added by the gateway:  p50 +{p50['gateway'] - p50['direct']:.2f} ms, "
          f"{p50['gateway'] / p50['direct']:.2f}x direct")  # fmt: skip
    for count in (3, 100):
        print(f"pick over {count:>3} nodes: {time_pick(count):.1f} µs")
    print("a node's /gateway/metrics against /health, p50 (ms), by models configured")
    for count in (1, 10, 100):
        with tempfile.TemporaryDirectory() as scratch:
            metrics, health = await scrape_cost(Path(scratch), count)
        share = (metrics - health) / 50 * 100
        print(f"{count:>4} models: {metrics:.3f} vs {health:.3f}: +{metrics - health:.3f} ms, "
              f"{share:.2f} % of a 50 ms scrape interval")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    trio.run(main, parser.parse_args().rounds)
