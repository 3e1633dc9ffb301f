"""Priorities end to end: the serial order, one request at a time, metrics, activity."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess, running
from tests.e2e.test_operations import inflight, wait_for_request
from tests.e2e.test_proxy import chat, config

SERIAL = config(
    """
[models.a]
cmd = "${fake} --tokens-per-second 50"
[models.b]
cmd = "${fake} --tokens-per-second 50"
[routing.scheduler]
use = "serial"
"""
)


async def queue_up(
    proxy: ProxyProcess,
    client: httpx.AsyncClient,
    nursery: trio.Nursery,
    model: str,
    priority: str,
    done: list[str],
) -> None:
    """Send a request and return once the proxy has queued it; ``done`` gets its name."""
    mark = len(proxy.output.lines)
    name = f"{model}:{priority}"

    async def send() -> None:
        response = await client.post(
            "/v1/chat/completions",
            json=chat(model, max_tokens=2),
            headers={"X-LlamaSwap-Priority": priority},
        )
        assert response.status_code == 200, response.text
        done.append(name)

    nursery.start_soon(send)
    await proxy.output.wait_for(rf"request #\d+ for '{model}': queued", start=mark)


async def test_serial_order_under_a_blocker(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(SERIAL)
    done: list[str] = []
    async with proxy.client() as client, trio.open_nursery() as requests:
        with trio.fail_after(60):
            body = chat("a", stream=True, max_tokens=50)  # about a second
            async with client.stream("POST", "/v1/chat/completions", json=body) as blocker:
                assert blocker.status_code == 200
                for model, priority in [
                    ("a", "batch"),
                    ("a", "normal"),
                    ("b", "normal"),
                    ("b", "interactive"),
                ]:
                    await queue_up(proxy, client, requests, model, priority, done)
                metrics = (await client.get("/metrics")).text
                assert 'llamaswap_scheduler_queue_depth{band="batch"} 1.0' in metrics
                assert 'llamaswap_scheduler_queue_depth{band="normal"} 2.0' in metrics
                assert 'llamaswap_scheduler_queue_depth{band="interactive"} 1.0' in metrics
                assert 'llamaswap_scheduler_queue_depth{band="below_batch"} 0.0' in metrics
                oldest = re.search(
                    r'llamaswap_scheduler_queue_oldest_wait_seconds\{band="batch"\} (\S+)',
                    metrics,
                )
                assert oldest is not None
                assert float(oldest[1]) > 0
                await blocker.aread()
    # interactive first (b loads); then b's affinity (+10) puts b:normal before the older
    # a:normal (the one pick affinity changed); batch last.
    assert done == ["b:interactive", "b:normal", "a:normal", "a:batch"]
    async with proxy.client() as client:
        activity = (await client.get("/api/activity", params={"limit": 10})).json()["activity"]
        metrics = (await client.get("/metrics")).text
    records = [r for r in activity if r["path"] == "/v1/chat/completions"]
    assert len(records) == 5
    # one request in service at a time, across models
    spans = sorted(
        (r["queue_wait_ms"] + _ms(r["time"]), _ms(r["time"]) + r["duration_ms"]) for r in records
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 5  # the slot frees before the next dispatch (ms rounding)
    for record in records:
        assert record["scheduler"] == "serial"
        assert record["score"] is not None
        assert record["queue_wait_ms"] is not None
        assert record["band"] in {"interactive", "normal", "batch"}
    queued = [r for r in records if r["queue_wait_ms"] > 100]  # all but the blocker
    assert len(queued) == 4
    assert all(r["completion_tokens"] == 2 for r in queued)  # from each response's usage
    by_priority = {r["priority"]: r for r in queued}
    assert by_priority[100]["band"] == "interactive"
    assert by_priority[-100]["band"] == "batch"
    assert by_priority[-100]["score"] > -100  # it aged while waiting
    assert 'llamaswap_scheduler_dispatch_total{band="batch"} 1.0' in metrics
    assert 'llamaswap_scheduler_dispatch_total{band="normal"} 3.0' in metrics
    assert "llamaswap_scheduler_affinity_changed_pick_total 1.0" in metrics
    assert "llamaswap_scheduler_aging_changed_pick_total 0.0" in metrics
    assert 'llamaswap_tokens_total{kind="completion",model="b"} 4.0' in metrics


async def test_counting_tokens_goes_beside_a_generation_not_after_it(
    proxy_factory: StartProxy,
) -> None:
    """Under serial, POST /v1/messages/count_tokens skips the slot when its model is ready,
    as pages do: it is answered (here with the fake server's 404) while a generation holds
    the slot, not after it."""
    proxy = await proxy_factory(SERIAL)
    async with proxy.client() as client:
        with trio.fail_after(60):
            body = chat("a", stream=True, max_tokens=600)  # 12 s, cut short below
            async with client.stream("POST", "/v1/chat/completions", json=body) as blocker:
                assert blocker.status_code == 200
                count = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}
                answer = await client.post("/v1/messages/count_tokens", json=count)
                assert (answer.status_code, answer.headers["x-llamaswap-upstream"]) == (404, "a")
                serving = [entry["state"] for entry in await inflight(client)]
                assert serving == ["serving"]  # the generation is still going


def _ms(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000


async def test_garbage_priority_header_is_priority_zero(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(SERIAL)
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post(
                "/v1/chat/completions",
                json=chat("a"),
                headers={"X-LlamaSwap-Priority": "very urgent!!"},
            )
            assert response.status_code == 200
            (record,) = (await client.get("/api/activity")).json()["activity"]
    assert (record["priority"], record["band"], record["error"]) == (0, "normal", None)
    assert record["metadata"]["requested_model"] == "a"


async def test_fifo_orders_its_queue_by_model_priority_plus_header(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(
        config(
            """
[models.a]
cmd = "${fake} --tokens-per-second 50"
[models.b]
cmd = "${fake}"
[models.c]
cmd = "${fake}"
[routing.scheduler.settings.fifo.priority]
b = 50
"""
        )
    )
    done: list[str] = []
    async with proxy.client() as client, trio.open_nursery() as requests:
        with trio.fail_after(60):
            body = chat("a", stream=True, max_tokens=50)
            async with client.stream("POST", "/v1/chat/completions", json=body) as blocker:
                assert blocker.status_code == 200
                await queue_up(proxy, client, requests, "b", "normal", done)  # 50 + 0
                await queue_up(proxy, client, requests, "c", "interactive", done)  # 0 + 100
                await blocker.aread()
    loads = re.findall(r"loading model '(\w)'", proxy.output.text())
    assert loads == ["a", "c", "b"]
    assert done == ["c:interactive", "b:normal"]


async def test_loading_state_streams_progress_then_the_answer(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config('[models.slow]\ncmd = "${fake} --load-seconds 1.5"\nsendLoadingState = true')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            body = chat("slow", stream=True, max_tokens=3)
            response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    reasoning = [e["choices"][0]["delta"].get("reasoning_content") for e in events if e["choices"]]
    progress = [r for r in reasoning if r]
    assert progress
    assert all(r.startswith("llamaswap: loading model 'slow'") for r in progress)
    content = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
    )
    assert content
    assert response.text.rstrip().endswith("data: [DONE]")


async def test_loading_state_ends_with_an_error_event_when_the_load_fails(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.broken]\ncmd = "${fake} --load-seconds 1.5 --fail-start"\n'
            "sendLoadingState = true"
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            body = chat("broken", stream=True)
            response = await client.post("/v1/chat/completions", json=body)
            (record,) = (await client.get("/api/activity")).json()["activity"]
    assert response.status_code == 200  # the stream had started before the load failed
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    assert events[0]["choices"][0]["delta"]["reasoning_content"].startswith("llamaswap: loading")
    error = events[-1]["error"]
    assert error["code"] == "model_start_failed"
    assert "failed to load model file" in error["message"]
    assert record["scheduler"] == "fifo"
    assert record["queue_wait_ms"] is not None
    assert "failed to start" in record["error"]


async def test_parallel_slots_serve_the_loaded_model_side_by_side(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            """
[models.a]
cmd = "${fake} --tokens-per-second 20"
[routing.scheduler]
use = "serial"
[routing.scheduler.settings.serial]
slots = 2
"""
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(60):
            assert (await client.post("/api/models/load/a")).status_code == 200
            streams: list[int] = []

            async def stream() -> None:
                body = chat("a", stream=True, max_tokens=40)  # two seconds each
                async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                    streams.append(answer.status_code)
                    async for _ in answer.aiter_bytes():
                        pass

            async with trio.open_nursery() as requests:
                for _ in range(3):
                    requests.start_soon(stream)
                states: list[str] = []
                while sorted(states) != ["queued", "serving", "serving"]:
                    await trio.sleep(0.05)  # polling HTTP, bounded by fail_after
                    inflight = (await client.get("/api/inflight")).json()["inflight"]
                    states = [entry["state"] for entry in inflight]
    assert streams == [200, 200, 200]


async def test_the_request_after_a_crash_starts_the_model_again(
    proxy_factory: StartProxy,
) -> None:
    """SPEC §5: a crash fails the requests in flight (502), and the next one starts the
    model again: the one waiting behind the crashed one (one request at a time under
    ``serial``) is not sent to a dead port."""
    crashing = '[models.c]\ncmd = "${fake} --tokens-per-second 20 --crash-after-tokens 5"\n'
    proxy = await proxy_factory(config(crashing + '[routing.scheduler]\nuse = "serial"'))
    answers: dict[str, httpx.Response] = {}
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/c")).status_code == 200
            pid = (await running(client))["c"]["pid"]

            async def ask(name: str, tokens: int) -> None:
                body = chat("c", max_tokens=tokens)
                answers[name] = await client.post("/v1/chat/completions", json=body)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "crashes", 20)
                await wait_for_request(client, "c", "serving")
                nursery.start_soon(ask, "next", 2)
                await wait_for_request(client, "c", "queued")
            restarted = (await running(client))["c"]["pid"]
    assert answers["crashes"].status_code == 502
    assert answers["next"].status_code == 200, answers["next"].text
    assert restarted != pid
