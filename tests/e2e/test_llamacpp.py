"""Real llama.cpp inference under the proxy: llama-cpp-python's server on tiny models.

The models are written by ``examples/tiny_model.py`` (random weights, about 120 KB each)
and served by ``examples/llama-cpp-python.toml``, pointed at them: so these tests are also
the proof that the example does what docs/llama-cpp-python.md says. Everything here is
real: the llama.cpp code, the processes, the sockets and the clock.

Needs the ``llamacpp`` extra (``pip install -e '.[llamacpp]'``); skipped without it.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import anthropic
import pytest
import trio
from anthropic.types import MessageParam

from tests.benchmarks.bench_proxy import cpu_seconds
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import (
    REPO,
    alive,
    free_port_base,
    open_raw_request,
    pid_of,
    running,
    survivors,
    wait_until,
)
from tests.e2e.tiny import chat, swap_between_the_two_models

pytest.importorskip("gguf", reason="needs the gguf package: pip install -e '.[llamacpp]'")
pytest.importorskip(
    "llama_cpp.server.app", reason="needs llama-cpp-python[server]: pip install -e '.[llamacpp]'"
)

pytestmark = pytest.mark.llamacpp

EXAMPLE = REPO / "examples" / "llama-cpp-python.toml"


@pytest.fixture
def config(tiny_models: Path) -> str:
    """The example config, on free ports, with its models taken from ``tiny_models``."""
    text = EXAMPLE.read_text()
    text, ports = re.subn(r"(?m)^startPort = \d+$", f"startPort = {free_port_base()}", text)
    folder = shlex.quote(str(tiny_models))
    text, paths = re.subn(r"--model examples/models/", f"--model {folder}/", text)
    assert (ports, paths) == (1, 2), "the example config changed shape: update this fixture"
    return text


async def test_chat_with_real_usage_streaming_and_not(
    proxy_factory: StartProxy, config: str
) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            response = await client.post("/v1/chat/completions", json=chat("gpt-4o-mini", 40))
            assert response.status_code == 200
            assert set(await running(client)) == {"tiny-a"}  # the alias reached tiny-a
            reply = response.json()
            assert reply["model"] == "gpt-4o-mini"  # llama-cpp-python echoes the name asked for
            text = reply["choices"][0]["message"]["content"]
            assert text
            usage = reply["usage"]
            assert usage["prompt_tokens"] > 0
            assert 0 < usage["completion_tokens"] <= 41
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

            # llama-cpp-python reports no usage in a stream; the same greedy request must
            # stream the same text, one token per chunk.
            pieces: list[str] = []
            body = chat("tiny-a", 40, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                async for line in stream.aiter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
                        if delta.get("content"):
                            pieces.append(delta["content"])
            assert "".join(pieces) == text
            assert abs(len(pieces) - usage["completion_tokens"]) <= 1


async def test_anthropic_messages_translated(proxy_factory: StartProxy, config: str) -> None:
    # llama-cpp-python has no /v1/messages: the example config has llamaswap translate. A
    # Messages request has no logit_bias, so a filter rules out the end token.
    assert config.count('anthropic = "translate"') == 2
    greedy_filter = '[models.tiny-a]\nfilters.setParams = { logit_bias = { "2" = -100 } }\n'
    proxy = await proxy_factory(config.replace("[models.tiny-a]\n", greedy_filter))
    ask: list[MessageParam] = [{"role": "user", "content": "hello"}]
    greedy = {"temperature": 0}  # sent as extra_body: this SDK has no temperature argument
    sdk = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="unused", max_retries=0)
    async with sdk as client:
        with trio.fail_after(120):
            message = await client.messages.create(
                model="tiny-a", max_tokens=20, system="Be brief.", messages=ask, extra_body=greedy
            )
            assert message.model == "tiny-a"
            assert message.stop_reason == "max_tokens"  # the end token was ruled out
            [block] = message.content
            assert block.type == "text"
            assert block.text
            assert message.usage.input_tokens > 0
            assert 0 < message.usage.output_tokens <= 21

            # The same greedy request, streamed: the same text, a piece per event.
            pieces: list[str] = []
            async with client.messages.stream(
                model="tiny-a", max_tokens=20, system="Be brief.", messages=ask, extra_body=greedy
            ) as stream:
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        pieces.append(event.delta.text)
                streamed = await stream.get_final_message()
            assert "".join(pieces) == block.text
            assert streamed.content[0].text == block.text  # type: ignore[union-attr]
            assert streamed.stop_reason == "max_tokens"
            assert abs(len(pieces) - message.usage.output_tokens) <= 1


async def test_swap_between_the_two_models(proxy_factory: StartProxy, config: str) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            await swap_between_the_two_models(client)
    await proxy.output.wait_for(r"model 'tiny-a': stopping \(evicted for 'tiny-b'\)")


async def test_client_hanging_up_mid_stream_stops_the_generation(
    proxy_factory: StartProxy, config: str
) -> None:
    proxy = await proxy_factory(config)  # at debug level: model output is in proxy.output
    async with proxy.client() as client:
        with trio.fail_after(120):
            assert (await client.post("/api/models/load/tiny-a")).status_code == 200
            pid = await pid_of(client, "tiny-a")
            # 3000 tokens (the example's n_ctx is 4096) take this server seconds: a hang-up
            # after 20 chunks comes in the middle.
            body = json.dumps(chat("tiny-a", 3000, stream=True)).encode()
            stream = await open_raw_request(proxy.url, "/v1/chat/completions", body)
            received = b""
            async with stream:
                while received.count(b"data: {") < 20:
                    chunk = await stream.receive_some()
                    assert chunk, "the stream ended before the hang-up"
                    received += chunk
                mark = len(proxy.output.lines)
            # The proxy closes its upstream connection, and llama-cpp-python's server notices
            # between two tokens, cancels the generation and prints this (app.py,
            # get_event_publisher), unbuffered thanks to the config's PYTHONUNBUFFERED.
            await proxy.output.wait_for(r"\[tiny-a\] Disconnected from client", start=mark)
            # And it stopped working: a process generating tokens burns a core; this one
            # is idle now. (One second of CPU per second while generating; allow a fifth.)
            before = cpu_seconds(pid)
            await trio.sleep(1.0)
            assert cpu_seconds(pid) - before < 0.2
            # And it serves the next request.
            after = await client.post("/v1/chat/completions", json=chat("tiny-a", 5))
            assert after.status_code == 200


async def test_unload_stops_the_server(proxy_factory: StartProxy, config: str) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            assert (await client.post("/api/models/load/tiny-b")).json()["state"] == "ready"
            pid = await pid_of(client, "tiny-b")
            unloaded = await client.post("/api/models/unload")
            assert unloaded.json() == {"unloaded": ["tiny-b"]}
            assert await running(client) == {}
            await wait_until(lambda: not alive(pid), within=10)
            # Unloaded is not broken: the next request starts it again.
            again = await client.post("/v1/chat/completions", json=chat("tiny-b", 5))
            assert again.status_code == 200
            assert await pid_of(client, "tiny-b") != pid


async def test_sigterm_leaves_no_server_process(proxy_factory: StartProxy, config: str) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            response = await client.post("/v1/chat/completions", json=chat("tiny-a", 5))
            assert response.status_code == 200
            pid = await pid_of(client, "tiny-a")
    assert await proxy.terminate() == 0
    assert not alive(pid)
    assert survivors(proxy.marker) == []
