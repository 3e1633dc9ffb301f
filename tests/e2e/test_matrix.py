"""``routing.router.use = "matrix"`` end to end: the real proxy swaps real fake servers."""

from __future__ import annotations

import json

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import alive, open_raw_request, running
from tests.e2e.test_proxy import chat, config

MODELS = """
[models.a]
cmd = "${fake}"
[models.b]
cmd = "${fake} --tokens-per-second 20"
[models.c]
cmd = "${fake}"
[routing.router]
use = "matrix"
[routing.router.settings.matrix]
vars = { a = "a", b = "b", c = "c" }
"""


async def ask(client: httpx.AsyncClient, model: str) -> None:
    response = await client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == model


async def pids(client: httpx.AsyncClient) -> dict[str, int]:
    entries = await running(client)
    assert all(entry["state"] == "ready" for entry in entries.values()), entries
    return {model: int(str(entry["pid"])) for model, entry in entries.items()}


async def test_models_that_fit_together_stay_loaded_and_a_solo_model_evicts_them(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(MODELS + 'sets = { pair = "a & b", solo = "c" }'))
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "a")
            first = await pids(client)
            assert set(first) == {"a"}
            await ask(client, "b")
            both = await pids(client)
            assert set(both) == {"a", "b"}
            assert both["a"] == first["a"]  # a was not restarted
            await ask(client, "c")
            alone = await pids(client)
            assert set(alone) == {"c"}
            assert not alive(both["a"])
            assert not alive(both["b"])
            await ask(client, "a")
            assert set(await pids(client)) == {"a"}
            assert not alive(alone["c"])
    await proxy.output.wait_for(r"model 'c': stopping \(evicted for 'a'\)")


async def test_a_busy_model_stays_loaded_when_another_set_fits(
    proxy_factory: StartProxy,
) -> None:
    # b and c fit together, a fits beside either; unloading c is dearer, so when nothing
    # is busy a load of a unloads b. While b streams an answer, a loads beside it instead.
    sets = 'evict_costs = { c = 5 }\nsets = { pair = "b & c", with_b = "a & b", with_c = "a & c" }'
    proxy = await proxy_factory(config(MODELS + sets))
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "b")
            await ask(client, "c")
            before = await pids(client)
            assert set(before) == {"b", "c"}
            long_answer = chat("b", stream=True, max_tokens=2000)  # 100 s at 20 tokens/s
            stream = await open_raw_request(
                proxy.url, "/v1/chat/completions", json.dumps(long_answer).encode()
            )
            async with stream:
                received = b""
                while b"data: " not in received:
                    received += await stream.receive_some()
                assert (await running(client))["b"]["in_flight"] == 1  # b is serving
                await ask(client, "a")
                after = await pids(client)
                assert set(after) == {"a", "b"}
                assert after["b"] == before["b"]
                assert not alive(before["c"])
                assert await stream.receive_some()  # b still streams
