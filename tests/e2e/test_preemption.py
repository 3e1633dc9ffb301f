"""Preemption end to end: a batch generation checkpointed for interactive work, resumed
where it stopped, with the fake server's exact continuation (docs/fake_server.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, cast

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess
from tests.e2e.test_operations import inflight, wait_for_request
from tests.e2e.test_proxy import chat, config


def preempting(models: str) -> str:
    """A config of ``models`` under ``serial`` with preemption on."""
    return config(models + SERIAL_PREEMPT)


SERIAL_PREEMPT = """
[routing.scheduler]
use = "serial"
[routing.scheduler.settings.serial]
preempt = true
"""
PREEMPT = preempting(
    """
[models.a]
cmd = "${fake} --tokens-per-second 40"
[models.b]
cmd = "${fake} --tokens-per-second 40"
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


#: b takes a second to load, so a batch request preempted for it stays paused that long.
SLOW_B = preempting(
    """
[models.a]
cmd = "${fake} --tokens-per-second 40"
[models.b]
cmd = "${fake} --load-seconds 1"
"""
)


async def paused_batch_stream(
    proxy: ProxyProcess, client: httpx.AsyncClient, nursery: trio.Nursery, done: list[str]
) -> tuple[httpx.Response, AsyncGenerator[str, None], str]:
    """Open a streamed batch request for ``a`` and return once it has streamed a little
    and is paused for an interactive request for ``b`` (which loads for a second): the
    response, its text's iterator (kept: a dropped one closes the response) and the text
    so far."""
    body = chat("a", max_tokens=LONG, stream=True)
    request = client.build_request("POST", "/v1/chat/completions", json=body, headers=BATCH)
    stream = await client.send(request, stream=True)
    assert stream.status_code == 200
    raw, pieces = "", cast(AsyncGenerator[str, None], stream.aiter_text())
    async for piece in pieces:
        raw += piece
        if raw.count('"content"') >= 3:
            break
    mark = len(proxy.output.lines)
    nursery.start_soon(interrupt, proxy, client, "b", done)
    await proxy.output.wait_for(r"request #\d+ for 'a' preempted after \d+ tokens", start=mark)
    return stream, pieces, raw


async def test_a_client_that_leaves_while_paused_leaves_the_queue(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(SLOW_B)
    host, port = proxy.url.removeprefix("http://").split(":")
    body = json.dumps(chat("a", max_tokens=LONG, stream=True)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nX-LlamaSwap-Priority: batch\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            done: list[str] = []
            socket = await trio.open_tcp_stream(host, int(port))
            await socket.send_all(head + body)
            seen = b""
            while seen.count(b'"content"') < 3:
                seen += await socket.receive_some()
            mark = len(proxy.output.lines)
            nursery.start_soon(interrupt, proxy, client, "b", done)
            await proxy.output.wait_for(r"request #\d+ for 'a' preempted after", start=mark)
            await socket.aclose()  # the client leaves while its request is paused
            # It leaves the queue at once, though b is still loading.
            while any(e["model"] == "a" for e in await inflight(client)):  # noqa: ASYNC110
                await trio.sleep(0.02)
            assert done == []
        with trio.fail_after(60):
            while done != ["b"]:  # noqa: ASYNC110 (the answer comes over HTTP)
                await trio.sleep(0.02)
            assert (await client.get("/api/inflight")).json()["inflight"] == []
            # Nothing wants a any more: it is not loaded back.
            running = {m["model"] for m in (await client.get("/running")).json()["running"]}
            assert running == {"b"}
            [record] = [r for r in await activity_of(client, "a") if r["priority"] == -100]
            assert record["metadata"]["preemptions"] == 1
            assert record["error"] == "client disconnected"


async def test_an_unload_while_paused_ends_the_stream_with_a_503(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(SLOW_B)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            done: list[str] = []
            stream, pieces, raw = await paused_batch_stream(proxy, client, nursery, done)
            unloaded = await client.post("/api/models/unload/a")
            assert unloaded.status_code == 200, unloaded.text
            async for piece in pieces:
                raw += piece
            await stream.aclose()
            last = json.loads(
                [line for line in raw.split("\n") if line.startswith("data:")][-1][5:]
            )
            assert "unloaded" in last["error"]["message"]
            assert last["error"]["code"] == "model_unloaded"


IGNORES_PREFILL = preempting(
    """
[models.a]
cmd = "${fake} --tokens-per-second 40 --ignore-prefill"
"""
)


async def test_a_server_that_ignores_the_prefill_ends_cleanly_and_is_named(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(IGNORES_PREFILL)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            body = chat("a", max_tokens=LONG, stream=True)
            raw, done = "", list[str]()
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=BATCH
            ) as stream:
                async for piece in stream.aiter_text():
                    raw += piece
                    if raw.count('"content"') == 5 and not done and not nursery.child_tasks:
                        nursery.start_soon(interrupt, proxy, client, "a", done)
            chunks = events(raw)  # one [DONE], at the end
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            await proxy.output.wait_for(r"ignores a prefill; set preemptible = false")
            [record] = [r for r in await activity_of(client, "a") if r["priority"] == -100]
            assert record["metadata"]["prefill_ignored"] is True


async def test_a_request_that_opts_out_is_not_preempted(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(PREEMPT)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            done: list[str] = []
            headers = {**BATCH, "X-LlamaSwap-Preemptible": "false"}
            body = chat("a", max_tokens=LONG // 3, stream=True)
            raw = ""
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as stream:
                async for piece in stream.aiter_text():
                    raw += piece
                    if raw.count('"content"') == 2 and not nursery.child_tasks:
                        mark = len(proxy.output.lines)
                        nursery.start_soon(interrupt, proxy, client, "a", done)
                        await proxy.output.wait_for(r"for 'a': queued", start=mark)
            assert done == []  # it waited for the batch answer's end
            assert "preempting" not in "\n".join(proxy.output.lines)


async def test_a_completion_goes_on_from_its_prompt_and_text(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(PREEMPT)
    body = {"model": "a", "prompt": "Once upon a time", "max_tokens": LONG}
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(60):
            reference = (await client.post("/v1/completions", json=body)).json()
            answered = trio.Event()

            async def batch() -> None:
                response = await client.post("/v1/completions", json=body, headers=BATCH)
                assert response.status_code == 200, response.text
                answer = response.json()
                assert answer["object"] == "text_completion"
                assert answer["choices"][0]["text"] == reference["choices"][0]["text"]
                assert answer["usage"] == reference["usage"]
                answered.set()

            nursery.start_soon(batch)
            await wait_for_request(client, "a", "serving")
            await interrupt(proxy, client, "a", [])
            await answered.wait()
            [record] = [r for r in await activity_of(client, "a") if r["priority"] == -100]
            assert record["metadata"]["preemptions"] == 1
            assert record["completion_tokens"] == LONG


async def test_a_whole_answer_that_calls_a_tool_is_put_together_as_the_server_gives_it(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(PREEMPT)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    body = chat("a", max_tokens=8, tools=tools, tool_choice="required")
    async with proxy.client() as client:
        with trio.fail_after(60):
            plain = await client.post(
                "/v1/chat/completions", json=body, headers={"X-LlamaSwap-Preemptible": "no"}
            )
            built = await client.post("/v1/chat/completions", json=body)  # read as events
            assert built.status_code == plain.status_code == 200
            answers = [built.json(), plain.json()]
            for answer in answers:  # each has its own id, and its call's
                [call] = answer["choices"][0]["message"]["tool_calls"]
                assert call.pop("id") == "call-" + answer.pop("id")
                assert call["function"]["name"] == "lookup"
                del answer["created"], answer["timings"]  # measured: they differ
            assert answers[0] == answers[1]


SLOW_A = preempting(
    """
[models.a]
cmd = "${fake} --load-seconds 30"
[models.b]
cmd = "${fake}"
"""
)


async def test_a_batch_load_is_given_up_for_interactive_work(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(SLOW_A)
    async with proxy.client() as client, trio.open_nursery() as nursery:
        with trio.fail_after(20):  # well within a's 30 s load: it was not waited for
            mark = len(proxy.output.lines)
            failures: list[int] = []

            async def batch() -> None:
                response = await client.post(
                    "/v1/chat/completions", json=chat("a", max_tokens=4), headers=BATCH
                )
                failures.append(response.status_code)

            nursery.start_soon(batch)
            await wait_for_request(client, "a", "loading")
            await interrupt(proxy, client, "b", [])
            await proxy.output.wait_for(r"cancelling the load of 'a'", start=mark)
            # b was served first; the batch request waits again, for a new load of a.
            [entry] = await inflight(client)
            assert (entry["model"], entry["paused"], entry["preemptions"]) == ("a", True, 1)
            nursery.cancel_scope.cancel()
        assert failures == []  # it was never answered with an error
