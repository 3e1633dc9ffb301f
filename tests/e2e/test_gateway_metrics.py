"""What a GIE endpoint picker reads of a node (issue 30 §1, §3's contract tests):
``/gateway/metrics`` parsed with prometheus_client's own parser, as llm-d's reads it
(names, label keys, one series each, the adapter lists following the models), and node
mode's answers. Real proxy, real fake model servers."""

from __future__ import annotations

import time
from functools import partial

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess
from tests.e2e.test_proxy import chat, config

NAMES = {
    "vllm:num_requests_waiting": set(),
    "vllm:num_requests_running": set(),
    "vllm:kv_cache_usage_perc": set(),
    "vllm:lora_requests_info": {"running_lora_adapters", "waiting_lora_adapters", "max_lora"},
}

NODE = config(
    """
[gateway]
node = true
name = "gpu-7"
[models.a]
cmd = "${fake} --kv-cache-usage 0.375"
[models.b]
cmd = "${fake} --load-seconds 1"
[models.c]
cmd = "${fake}"
[routing.router.settings.groups.pair]
members = ["a", "c"]
swap = false
[peers.far]
proxy = "http://127.0.0.1:9"
models = ["elsewhere"]
"""
)


async def scrape(client: httpx.AsyncClient) -> dict[str, tuple[dict[str, str], float]]:
    """Each series of ``/gateway/metrics``, checked to be the only one of its name."""
    answer = await client.get("/gateway/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    series: dict[str, tuple[dict[str, str], float]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            assert sample.name not in series, f"two series of {sample.name}"
            series[sample.name] = (sample.labels, sample.value)
    assert {name: set(labels) for name, (labels, _) in series.items()} == NAMES
    return series


def adapters(series: dict[str, tuple[dict[str, str], float]]) -> tuple[str, str, str]:
    labels = series["vllm:lora_requests_info"][0]
    return (
        labels["running_lora_adapters"],
        labels["waiting_lora_adapters"],
        labels["max_lora"],
    )


async def test_the_adapter_lists_follow_the_models(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(NODE)
    async with proxy.client() as client:
        series = await scrape(client)
        assert adapters(series) == ("", "", "2")  # a and c run together
        assert series["vllm:num_requests_running"][1] == 0
        assert series["vllm:kv_cache_usage_perc"][1] == 0
        assert (await client.post("/api/models/load/a")).status_code == 200
        assert (await client.post("/api/models/load/c")).status_code == 200
        assert adapters(await scrape(client))[:2] == ("a,c", "")
        # b evicts both, and loads for a second: it waits meanwhile.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.post, "/api/models/load/b")
            with trio.fail_after(10):
                while adapters(await scrape(client))[1] != "b":  # noqa: ASYNC110
                    await trio.sleep(0.02)
        assert adapters(await scrape(client))[:2] == ("b", "")
        # Its value is the time of the scrape, as vLLM's (a picker reads the latest).
        before = time.time()
        assert before <= (await scrape(client))["vllm:lora_requests_info"][1] <= time.time()


async def test_the_kv_figure_is_the_model_servers_own_in_node_mode(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(NODE)
    async with proxy.client() as client:
        assert (await client.post("/api/models/load/a")).status_code == 200
        with trio.fail_after(10):  # read once a second
            while (await scrape(client))["vllm:kv_cache_usage_perc"][1] != 0.375:  # noqa: ASYNC110
                await trio.sleep(0.05)


async def test_queued_and_running_requests_are_counted(proxy_factory: StartProxy) -> None:
    serial = '[models.a]\ncmd = "${fake} --tokens-per-second 20"\n[routing.scheduler]\n'
    proxy = await proxy_factory(config(serial + 'use = "serial"\n'))
    async with proxy.client() as client, trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(partial(client.post, "/v1/chat/completions", json=chat("a")))
        with trio.fail_after(10):  # one served (once a is loaded), two queued behind it
            while True:
                series = await scrape(client)
                waiting = series["vllm:num_requests_waiting"][1]
                if (series["vllm:num_requests_running"][1], waiting) == (1, 2):
                    break
                await trio.sleep(0.02)
        # one slot of one busy: a's server exports no figure of its own
        assert series["vllm:kv_cache_usage_perc"][1] == 1.0


async def answers(proxy: ProxyProcess) -> list[httpx.Response]:
    """One answer of each kind: proxied, streamed, a management route, a 404, a 400."""
    async with proxy.client() as client:
        found = [
            await client.post("/v1/chat/completions", json=chat("a", max_tokens=2)),
            await client.get("/health"),
            await client.get("/no/such/route"),
            await client.post("/v1/chat/completions", content=b"{not json"),
        ]
        async with client.stream(
            "POST", "/v1/chat/completions", json=chat("a", max_tokens=2, stream=True)
        ) as streamed:
            await streamed.aread()
            found.append(streamed)
    assert [a.status_code for a in found] == [200, 200, 404, 400, 200]
    return found


async def test_a_node_names_itself_in_every_answer_and_lists_its_own_models(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(NODE)
    assert {answer.headers.get("x-llamaswap-node") for answer in await answers(proxy)} == {"gpu-7"}
    async with proxy.client() as client:
        listed = [entry["id"] for entry in (await client.get("/v1/models")).json()["data"]]
    assert listed == ["a", "b", "c"]


async def test_without_node_mode_no_answer_names_a_node(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(NODE.replace("node = true", "node = false"))
    assert {answer.headers.get("x-llamaswap-node") for answer in await answers(proxy)} == {None}
    async with proxy.client() as client:
        listed = [entry["id"] for entry in (await client.get("/v1/models")).json()["data"]]
    assert listed == ["a", "b", "c", "far/elsewhere"]
