"""Preemption end to end: a batch generation checkpointed for interactive work, resumed
where it stopped, with the fake server's exact continuation (docs/fake_server.md)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess
from tests.e2e.test_operations import wait_for_request
from tests.e2e.test_proxy import chat, config

PREEMPT = config(
    """
[models.a]
cmd = "${fake} --tokens-per-second 40"
[models.b]
cmd = "${fake} --tokens-per-second 40"
[routing.scheduler]
use = "serial"
[routing.scheduler.settings.serial]
preempt = true
"""
)
INTERACTIVE = {"X-LlamaSwap-Priority": "interactive"}
BATCH = {"X-LlamaSwap-Priority": "batch"}
#: A batch answer long enough to be preempted in: 60 tokens at 40 a second.
LONG = 60


def events(raw: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; asserts exactly one ``[DONE]``, at the end."""
    data = [line[5:].strip() for line in raw.split("\n") if line.startswith("data:")]
    assert data.count("[DONE]") == 1, data[-3:]
    assert data[-1] == "[DONE]", data[-3:]
    return [json.loads(item) for item in data[:-1]]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(
        chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"]
    )


async def uninterrupted(client: httpx.AsyncClient, model: str, **extra: object) -> dict[str, Any]:
    """The answer the same request gets when nothing preempts it."""
    response = await client.post("/v1/chat/completions", json=chat(model, **extra))
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def activity_of(client: httpx.AsyncClient, model: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = (await client.get(f"/api/activity?model={model}")).json()[
        "activity"
    ]
    return records


async def interrupt(
    proxy: ProxyProcess, client: httpx.AsyncClient, model: str, done: list[str]
) -> None:
    """Send an interactive request, which preempts the batch one; ``done`` gets its
    model once answered."""
    response = await client.post(
        "/v1/chat/completions", json=chat(model, max_tokens=3), headers=INTERACTIVE
    )
    assert response.status_code == 200, response.text
    done.append(model)


async def test_a_streamed_batch_answer_pauses_for_interactive_work_and_goes_on_exactly(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(PREEMPT)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            body = chat("a", max_tokens=LONG, stream_options={"include_usage": True})
            reference = await uninterrupted(client, "a", max_tokens=LONG)
            done: list[str] = []
            raw = ""
            body["stream"] = True
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=BATCH
            ) as stream:
                assert stream.status_code == 200
                async for piece in stream.aiter_text():
                    raw += piece
                    if raw.count('"content"') == 5 and not done and not nursery.child_tasks:
                        mark = len(proxy.output.lines)
                        nursery.start_soon(interrupt, proxy, client, "a", done)
                        await proxy.output.wait_for(r"preempting request #\d+", start=mark)
                    if "[DONE]" in raw:
                        assert done == ["a"]  # the interactive answer came in between
            chunks = events(raw)
            assert text_of(chunks) == reference["choices"][0]["message"]["content"]
            assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
            roles = [c["choices"][0]["delta"].get("role") for c in chunks if c["choices"]]
            assert roles.count("assistant") == 1
            usage = chunks[-1]["usage"]
            assert usage["prompt_tokens"] == reference["usage"]["prompt_tokens"]
            assert usage["completion_tokens"] == LONG
            [record] = [r for r in await activity_of(client, "a") if r["priority"] == -100]
            assert record["metadata"]["preemptions"] == 1
            assert record["metadata"]["paused_ms"] > 0
            assert record["metadata"]["recomputed_prompt_tokens"] > 0
            assert record["completion_tokens"] == LONG


async def test_a_whole_answer_is_resumed_after_a_swap_and_back(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(PREEMPT)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            reference = await uninterrupted(client, "a", max_tokens=LONG)
            done: list[str] = []
            answered = trio.Event()

            async def batch() -> None:
                response = await client.post(
                    "/v1/chat/completions", json=chat("a", max_tokens=LONG), headers=BATCH
                )
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0] == reference["choices"][0]
                assert response.json()["usage"] == reference["usage"]
                assert response.json()["object"] == "chat.completion"
                answered.set()

            nursery.start_soon(batch)
            await wait_for_request(client, "a", "serving")
            await interrupt(proxy, client, "b", done)
            assert done == ["b"]  # b was loaded and served while the batch answer waited
        with trio.fail_after(60):
            await answered.wait()
            [record] = [r for r in await activity_of(client, "a") if r["priority"] == -100]
            assert record["metadata"]["preemptions"] == 1
