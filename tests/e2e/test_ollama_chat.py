"""Ollama's API through the proxy, with the ``ollama`` Python package: chat, generate and
embeddings translated to the fake server's OpenAI routes (``ollama = "translate"``, the
default), passed through with ``"native"``, and the errors Ollama's clients can read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import ollama
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess, alive, open_raw_request, running
from tests.e2e.test_proxy import config

MODELS = config(
    """
[models.chat]
cmd = "${fake}"
[models.tools]
cmd = "${fake}"
filters.setParams = { tool_choice = "required" }
[models.crashing]
cmd = "${fake} --crash-after-tokens 3"
[models.native]
cmd = "${fake}"
ollama = "native"
[models.emb]
cmd = "${fake}"
[routing.router.settings.groups.all]
members = ["chat", "tools", "crashing", "native", "emb"]
swap = false
"""
)

ASK = [{"role": "user", "content": "hello there"}]


@asynccontextmanager
async def client(proxy: ProxyProcess, **headers: str) -> AsyncIterator[ollama.AsyncClient]:
    """The ``ollama`` package's client of ``proxy`` (it has no ``async with`` of its own)."""
    ask = ollama.AsyncClient(host=proxy.url, headers=headers)
    try:
        yield ask
    finally:
        await ask.close()  # type: ignore[no-untyped-call]


async def test_chat_and_generate_whole_and_streamed(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    batch = {"X-LlamaSwap-Priority": "batch"}
    with trio.fail_after(30):
        async with client(proxy, **batch) as ask:
            whole = await ask.chat(model="chat", messages=ASK, options={"num_predict": 5})
            await proxy.output.wait_for(
                r"\[chat\] fake_server: request POST /v1/chat/completions "
            )
            assert whole.model == "chat"
            assert (whole.done, whole.done_reason) == (True, "length")
            assert len((text := whole.message.content or "").split()) == 5
            # The fake counts words: "hello there", then its five.
            assert (whole.prompt_eval_count, whole.eval_count) == (2, 5)
            assert whole.total_duration
            assert whole.eval_duration

            parts = [
                part
                async for part in await ask.chat(
                    model="chat", messages=ASK, options={"num_predict": 5}, stream=True
                )
            ]
            *pieces, last = parts
            assert len(pieces) == 5  # a line a token, as they came
            assert "".join(part.message.content or "" for part in pieces) == text
            assert not any(part.done for part in pieces)
            assert (last.done, last.done_reason, last.eval_count) == (True, "length", 5)

            generated = await ask.generate(model="chat", prompt="hello there", system="Be brief.")
            await proxy.output.wait_for(
                r"\[chat\] fake_server: request POST /v1/chat/completions "
            )
            assert generated.done
            assert generated.prompt_eval_count == 4  # with the system prompt
            streamed = [
                part.response or ""
                async for part in await ask.generate(
                    model="chat", prompt="hello there", system="Be brief.", stream=True
                )
            ]
            assert "".join(streamed) == generated.response
            raw = await ask.generate(model="chat", prompt="hello there", raw=True)
            await proxy.output.wait_for(r"\[chat\] fake_server: request POST /v1/completions ")
            assert raw.response
            assert raw.done
    async with proxy.client() as http:
        records = (await http.get("/api/activity")).json()["activity"]
    # Recorded as any request (newest first): its route, its band, and the usage the model
    # server reported (the fake counts only what it generates when not asked to stream).
    found = [(r["path"], r["priority"], r["completion_tokens"]) for r in records[:5]]
    assert found == [
        ("/api/generate", -100, raw.eval_count),
        ("/api/generate", -100, generated.eval_count),
        ("/api/generate", -100, generated.eval_count),
        ("/api/chat", -100, 5),
        ("/api/chat", -100, 5),
    ]


async def test_embeddings_are_the_openai_routes_vectors(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    with trio.fail_after(30):
        async with client(proxy) as ask:
            embedded = await ask.embed(model="emb", input=["a cat", "a dog"])
            older = await ask.embeddings(model="emb", prompt="a cat")
            async with proxy.client() as http:
                direct = await http.post("/v1/embeddings", json={"model": "emb", "input": "a dog"})
    assert embedded.model == "emb"
    assert len(embedded.embeddings) == 2
    assert list(older.embedding) == list(embedded.embeddings[0])
    assert list(embedded.embeddings[1]) == direct.json()["data"][0]["embedding"]


async def test_tool_calls_come_back_whole_with_their_arguments_as_an_object(
    proxy_factory: StartProxy,
) -> None:
    # The model's filter makes the fake server call the first tool, with {"text": <words>}.
    proxy = await proxy_factory(MODELS)
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "the weather in a city",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
    with trio.fail_after(30):
        async with client(proxy) as ask:
            answer = await ask.chat(
                model="tools", messages=ASK, tools=[weather], options={"num_predict": 4}
            )
            [call] = answer.message.tool_calls or []
            assert call.function.name == "get_weather"
            assert len(call.function.arguments["text"].split()) == 4
            streamed = [
                part
                async for part in await ask.chat(
                    model="tools",
                    messages=ASK,
                    tools=[weather],
                    options={"num_predict": 4},
                    stream=True,
                )
            ]
            calls = [call for part in streamed for call in part.message.tool_calls or []]
            assert [(c.function.name, c.function.arguments) for c in calls] == [
                ("get_weather", call.function.arguments)
            ]
            # The answer goes back as a tool message: the fake server answers in text then.
            history: list[dict[str, Any]] = [
                *ASK,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
            ]
            after = await ask.chat(model="chat", messages=history)
            assert after.message.content
            assert not after.message.tool_calls


async def test_a_stream_that_breaks_off_ends_with_an_error_line(proxy_factory: StartProxy) -> None:
    # Read raw: the ollama package raises on the error line, but leaves its generators to
    # the GC. What it would raise is made from the line, as it does.
    proxy = await proxy_factory(MODELS)
    body = {"model": "crashing", "messages": ASK, "options": {"num_predict": 10}}
    async with proxy.client() as http:
        with trio.fail_after(30):
            async with http.stream("POST", "/api/chat", json=body) as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "application/x-ndjson"
                text = (await response.aread()).decode()
    *parts, last = [json.loads(line) for line in text.splitlines()]
    assert len(parts) == 3  # the three tokens before it are all there
    assert not any(part["done"] for part in parts)
    assert list(last) == ["error"]
    raised = ollama.ResponseError(last["error"])
    assert "broke off mid-response" in raised.error


async def test_errors_carry_their_message_as_ollamas_clients_read_it(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    with trio.fail_after(30):
        async with client(proxy) as ask:
            with pytest.raises(ollama.ResponseError) as info:
                await ask.chat(model="nope", messages=ASK)
            assert info.value.status_code == 404
            assert info.value.error.startswith("model 'nope' not found")
            with pytest.raises(ollama.ResponseError) as info:
                await ask.generate(model="chat", prompt="def f(", suffix="return 1")
            assert info.value.status_code == 400
            assert "/infill" in info.value.error
            async with proxy.client() as http:
                # curl -d, as Ollama's own examples use it, says it is a form: it is read as JSON.
                body = json.dumps({"model": "chat", "prompt": "hi", "stream": False})
                form = {"content-type": "application/x-www-form-urlencoded"}
                answer = await http.post("/api/generate", content=body, headers=form)
                assert answer.status_code == 200
                assert answer.json()["done"] is True
                broken = await http.post("/api/chat", content=b"{", headers=form)
    assert broken.status_code == 400
    assert isinstance(broken.json()["error"], str)


async def test_nothing_to_generate_loads_the_model_and_asks_it_nothing(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    with trio.fail_after(30):
        async with client(proxy) as ask:
            loaded = await ask.generate(model="chat")
            assert (loaded.done, loaded.done_reason, loaded.response) == (True, "load", "")
            chatted = await ask.chat(model="emb", messages=[])
            assert (chatted.done_reason, chatted.message.content) == ("load", "")
            async with proxy.client() as http:
                running = (await http.get("/running")).json()["running"]
    assert {(entry["model"], entry["state"]) for entry in running} == {
        ("chat", "ready"),
        ("emb", "ready"),
    }
    assert "fake_server: request POST" not in proxy.output.text()


async def test_native_passes_ollamas_request_through(proxy_factory: StartProxy) -> None:
    # A model server that is itself Ollama would answer it; the fake server answers 404.
    proxy = await proxy_factory(MODELS)
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        with trio.fail_after(30):
            answer = await http.post(
                "/api/chat", json={"model": "native", "messages": ASK, "stream": False}
            )
            await proxy.output.wait_for(r"\[native\] fake_server: request POST /api/chat ")
    assert answer.status_code == 404
    assert answer.headers["x-llamaswap-upstream"] == "native"


async def test_a_client_that_leaves_mid_stream_stops_the_generation(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.slow]\ncmd = "${fake} --tokens-per-second 20"\n'))
    body = {"model": "slow", "messages": ASK, "options": {"num_predict": 200}}
    async with proxy.client() as http:
        with trio.fail_after(30):
            stream = await open_raw_request(proxy.url, "/api/chat", json.dumps(body).encode())
            received = b""
            while b'"done": false}\n' not in received:  # the first line of the answer
                received += await stream.receive_some()
            await stream.aclose()
            # Gone after one line: the model server sees its client leave too.
            await proxy.output.wait_for(r"\[slow\] fake_server: client disconnected after \d+")
            while not (records := (await http.get("/api/activity")).json()["activity"]):  # noqa: ASYNC110 (recorded as the request task ends: no event to wait on)
                await trio.sleep(0.02)
            [record] = records
            assert record["error"] == "client disconnected"
            assert (await running(http))["slow"]["in_flight"] == 0


async def test_a_client_that_leaves_while_its_load_only_request_waits_stops_the_load(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    # An empty prompt only loads the model; left before the load ends, it is abandoned,
    # as any request's load is, and the starting process is stopped.
    text = '[models.slow]\ncmd = "${fake} --load-seconds 60"\n'
    proxy = await proxy_factory(config(text))
    async with proxy.client() as http:
        with trio.fail_after(30):
            with trio.CancelScope() as request:

                async def leave_once_started() -> None:
                    await proxy.output.wait_for(r"model 'slow': started pid \d+")
                    request.cancel()

                nursery.start_soon(leave_once_started)
                await http.post("/api/generate", json={"model": "slow"})
            assert request.cancelled_caught
            started = await proxy.output.wait_for(r"model 'slow': started pid (\d+)")
            await proxy.output.wait_for(r"model 'slow': stopped")
            assert not alive(int(started[1]))
            assert await running(http) == {}
