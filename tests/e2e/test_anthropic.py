"""Anthropic Messages through the proxy, with the official Anthropic SDK: the fake server's
own ``/v1/messages`` (``anthropic = "native"``) and its chat completions
(``anthropic = "translate"``); and which responses say they come from a model server."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import h11
import pytest
import trio
from anthropic.types import (
    DocumentBlockParam,
    MessageParam,
    PlainTextSourceParam,
    ToolChoiceToolParam,
    ToolParam,
    ToolResultBlockParam,
)

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess, open_raw_request
from tests.e2e.test_proxy import config
from tests.e2e.test_upstream_pool import Peer, start_server

MODELS = config(
    """
[models.native]
cmd = "${fake} --load-seconds 0.1"
[models.translated]
cmd = "${fake} --load-seconds 0.1"
anthropic = "translate"
[models.slow]
cmd = "${fake} --tokens-per-second 20"
anthropic = "translate"
[models.crashing]
cmd = "${fake} --crash-after-tokens 3"
anthropic = "translate"
[models.crashing-native]
cmd = "${fake} --crash-after-tokens 3"
"""
)

ASK: list[MessageParam] = [{"role": "user", "content": "hello there"}]


def sdk(proxy: ProxyProcess) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", ["native", "translated"])
async def test_the_sdk_plain_and_streaming(proxy_factory: StartProxy, model: str) -> None:
    proxy = await proxy_factory(MODELS)
    # What the fake server was asked: /v1/messages itself, or chat completions for it.
    route = "/v1/messages" if model == "native" else "/v1/chat/completions"
    with trio.fail_after(30):
        async with sdk(proxy) as client:
            raw = await client.messages.with_raw_response.create(
                model=model, max_tokens=6, system="Be brief.", messages=ASK
            )
            assert raw.headers["x-llamaswap-upstream"] == model
            message = await raw.parse()
            await proxy.output.wait_for(rf"\[{model}\] fake_server: request POST {route} ")
            assert message.type == "message"
            assert message.role == "assistant"
            assert message.model == model
            assert message.stop_reason == "max_tokens"
            assert [block.type for block in message.content] == ["text"]
            text = message.content[0].text  # type: ignore[union-attr]
            assert len(text.split()) == 6
            # The fake counts words: "Be brief." and "hello there".
            assert (message.usage.input_tokens, message.usage.output_tokens) == (4, 6)

            deltas: list[str] = []
            async with client.messages.stream(
                model=model, max_tokens=6, system="Be brief.", messages=ASK
            ) as stream:
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        deltas.append(event.delta.text)
                streamed = await stream.get_final_message()
            assert len(deltas) == 6  # one event per token, as they came
            assert streamed.content[0].text == "".join(deltas) == text  # type: ignore[union-attr]
            assert streamed.stop_reason == "max_tokens"
            assert (streamed.usage.input_tokens, streamed.usage.output_tokens) == (4, 6)
        async with proxy.client() as http:
            records = (await http.get("/api/activity")).json()["activity"]
    # The usage the model server reported is recorded, whichever way it was asked.
    assert [(r["path"], r["completion_tokens"]) for r in records[:2]] == [
        ("/v1/messages", 6),
        ("/v1/messages", 6),
    ]


WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "the weather in a city",
    "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
}


@pytest.mark.parametrize("model", ["native", "translated"])
async def test_tool_use(proxy_factory: StartProxy, model: str) -> None:
    # The fake server calls the tool it is made to, with {"text": <its words>}: in its own
    # /v1/messages, or as a chat completion's tool call that llamaswap translates.
    proxy = await proxy_factory(MODELS)
    choice: ToolChoiceToolParam = {"type": "tool", "name": "get_weather"}
    ask: dict[str, Any] = {
        "model": model,
        "max_tokens": 4,
        "system": "Use the tool.",
        "tools": [WEATHER],
        "tool_choice": choice,
    }
    with trio.fail_after(30):
        async with sdk(proxy) as client:
            message = await client.messages.create(messages=ASK, **ask)
            assert message.stop_reason == "tool_use"
            [call] = message.content
            assert call.type == "tool_use"
            assert call.name == "get_weather"
            assert list(call.input) == ["text"]
            assert len(call.input["text"].split()) == 4

            # Streamed, the arguments arrive as input_json_delta pieces and add up.
            pieces: list[str] = []
            async with client.messages.stream(messages=ASK, **ask) as stream:
                async for event in stream:
                    if event.type == "content_block_delta":
                        assert event.delta.type == "input_json_delta"
                        pieces.append(event.delta.partial_json)
                streamed = await stream.get_final_message()
            assert len(pieces) == 6  # the object's opening, a word each, its closing
            assert streamed.stop_reason == "tool_use"
            [streamed_call] = streamed.content
            assert streamed_call.type == "tool_use"
            assert (streamed_call.name, streamed_call.input) == (call.name, call.input)

            # The tool's result goes back as a "tool" message, and its image in a user
            # message after it; the model answers in text.
            result: ToolResultBlockParam = {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": [
                    {"type": "text", "text": "sunny"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA="},
                    },
                ],
            }
            turns: list[MessageParam] = [
                *ASK,
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [result]},
            ]
            answer = await client.messages.create(
                model=model, max_tokens=3, tools=[WEATHER], messages=turns
            )
            assert answer.stop_reason == "max_tokens"
            assert [block.type for block in answer.content] == ["text"]
            # Any tool, {"type": "any"}, is the first.
            first = await client.messages.create(
                messages=ASK, **{**ask, "tool_choice": {"type": "any"}}
            )
            assert first.content[0].type == "tool_use"
            assert first.content[0].name == "get_weather"
    route = "/v1/messages" if model == "native" else "/v1/chat/completions"
    await proxy.output.wait_for(rf"\[{model}\] fake_server: request POST {route}")


async def test_count_tokens_under_translate(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    with trio.fail_after(30):
        async with sdk(proxy) as client:
            raw = await client.messages.with_raw_response.count_tokens(
                model="translated", system="x" * 40, messages=ASK
            )
            # llamaswap's own estimate ("x"*40, "user", "hello there": 55 characters)...
            assert (await raw.parse()).input_tokens == 14
            assert "x-llamaswap-upstream" not in raw.headers
        async with proxy.client() as http:
            # ... answered without starting the model.
            assert (await http.get("/running")).json() == {"running": []}


async def test_errors_under_translate(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    with trio.fail_after(30):
        async with sdk(proxy) as client:
            # The model server's own refusal passes through, and says whose it is.
            with pytest.raises(anthropic.BadRequestError) as refused:
                await client.messages.create(model="translated", max_tokens=-1, messages=ASK)
            assert refused.value.response.headers["x-llamaswap-upstream"] == "translated"
            assert "max_tokens must be a non-negative integer" in refused.value.message
            # What llamaswap cannot translate is its own 400.
            source: PlainTextSourceParam = {
                "type": "text",
                "media_type": "text/plain",
                "data": "a letter",
            }
            block: DocumentBlockParam = {"type": "document", "source": source}
            document: MessageParam = {"role": "user", "content": [block]}
            with pytest.raises(anthropic.BadRequestError) as untranslatable:
                await client.messages.create(model="translated", max_tokens=5, messages=[document])
            assert "x-llamaswap-upstream" not in untranslatable.value.response.headers
            assert "'document' block cannot be translated" in untranslatable.value.message


@pytest.mark.parametrize("model", ["crashing", "crashing-native"])
async def test_a_stream_that_breaks_off_ends_with_an_error_event(
    proxy_factory: StartProxy, model: str
) -> None:
    # Read raw: the SDK raises on the error event, but leaves its generators to the GC.
    proxy = await proxy_factory(MODELS)
    body = {"model": model, "max_tokens": 10, "messages": ASK, "stream": True}
    async with proxy.client() as client:
        with trio.fail_after(30):
            async with client.stream("POST", "/v1/messages", json=body) as response:
                assert response.status_code == 200
                text = (await response.aread()).decode()
    *_, last = text.strip().split("\n\n")
    name, data = last.split("\n")
    assert name == "event: error"
    error = json.loads(data.removeprefix("data: "))
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert "broke off mid-response" in error["error"]["message"]
    # The text that came before it is all there: three tokens.
    assert text.count("event: content_block_delta") == 3


async def test_hanging_up_a_translated_stream_stops_the_generation(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    body = {"model": "slow", "max_tokens": 1000, "messages": ASK, "stream": True}
    with trio.fail_after(30):
        stream = await open_raw_request(proxy.url, "/v1/messages", json.dumps(body).encode())
        received = b""
        async with stream:
            while received.count(b"event: content_block_delta") < 3:
                chunk = await stream.receive_some()
                assert chunk, "the stream ended before the hang-up"
                received += chunk
        # The proxy closed its connection to the model server, which stopped at once
        # (1000 tokens at 20 a second would take 50 s).
        match = await proxy.output.wait_for(
            r"\[slow\] fake_server: client disconnected after (\d+) tokens"
        )
        assert int(match[1]) < 100


async def test_the_upstream_header_marks_relayed_responses_only(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            ok = await client.post(
                "/v1/chat/completions",
                json={"model": "native", "messages": ASK, "max_tokens": 2},
            )
            assert ok.status_code == 200
            assert ok.headers["x-llamaswap-upstream"] == "native"
            # The model server has no such route: its 404, marked as its own.
            theirs = await client.get("/upstream/native/no/such/route")
            assert theirs.status_code == 404
            assert theirs.headers["x-llamaswap-upstream"] == "native"
            rerank = await client.post("/v1/rerank", json={"model": "native", "query": "q"})
            assert rerank.status_code == 404
            assert rerank.headers["x-llamaswap-upstream"] == "native"
            # llamaswap's own 404s carry no such header.
            ours = await client.post("/v1/messages", json={"model": "nobody", "messages": ASK})
            assert ours.status_code == 404
            assert ours.json()["error"]["code"] == "model_not_found"
            assert "x-llamaswap-upstream" not in ours.headers
            unrouted = await client.get("/no/such/route")
            assert unrouted.status_code == 404
            assert "x-llamaswap-upstream" not in unrouted.headers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_answer_too_deep_to_translate_is_a_502_or_an_error_event(
    proxy_factory: StartProxy, nursery: trio.Nursery, stream: bool
) -> None:
    """A model server whose answer is valid JSON, but nested deeper than Python parses."""
    deep = b"[" * 100_000 + b"]" * 100_000
    answer = b"data: " + deep + b"\n\n" if stream else deep
    kind = b"text/event-stream" if stream else b"application/json"

    async def script(peer: Peer, index: int) -> None:
        assert await peer.request() is not None
        headers = [(b"content-type", kind), (b"content-length", str(len(answer)).encode())]
        await peer.send(h11.Response(status_code=200, headers=headers), h11.Data(data=answer))
        await peer.send(h11.EndOfMessage())

    server = await start_server(nursery, script)
    proxy = await proxy_factory(
        config(
            f'[models.deep]\ncmd = "${{fake}}"\nproxy = "{server.url}"\n'
            'checkEndpoint = "none"\nanthropic = "translate"'  # the script is the server
        )
    )
    body = {"model": "deep", "max_tokens": 5, "messages": ASK, "stream": stream}
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post("/v1/messages", json=body)
    if stream:  # no text came: a whole, empty message
        assert response.status_code == 200
        names = [line for line in response.text.split("\n") if line.startswith("event: ")]
        assert (names[0], names[-1]) == ("event: message_start", "event: message_stop")
    else:
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "upstream_error"
        assert "cannot translate its answer: maximum recursion depth" in error["message"]
    assert "Traceback" not in proxy.output.text()
