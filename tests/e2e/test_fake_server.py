"""The fake model server as the proxy sees it: a real process, real HTTP, the real clock.

Every test starts ``python -m llamaswap.fake_server --port 0`` and learns the port from its
first stdout line. Synchronisation is by the server's own output lines and by polling, never by
sleeping; every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, final

import httpx
import openai
import pytest
import trio
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from llamaswap.fake_server import parse_args
from llamaswap.resources.probe import FAKE_GPU_ENV, FileProbe

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(
    r"fake_server: listening on http://127\.0\.0\.1:(?P<port>\d+) model=(?P<model>\S+) "
    r"pid=(?P<pid>\d+)"
)
CHAT = "/v1/chat/completions"


@final
class FakeProcess:
    """A running fake server: its process, its port and a reader for its stdout lines."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.port = 0  # known once the first line is read
        self._stdout = bytearray()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def readline(self) -> str:
        """The next stdout line without its newline; "" once stdout is closed."""
        assert self.process.stdout is not None
        while b"\n" not in self._stdout:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                last = self._stdout.decode()
                self._stdout.clear()
                return last
            self._stdout += data
        line, _, rest = self._stdout.partition(b"\n")
        self._stdout[:] = rest
        return line.decode()

    async def expect_line(self, prefix: str) -> str:
        """Skip stdout lines until one starts with ``prefix``; fail at end of output."""
        while True:
            line = await self.readline()
            if not line:
                pytest.fail(f"fake server output ended before a line starting with {prefix!r}")
            if line.startswith(prefix):
                return line

    async def stderr(self) -> str:
        """Everything the process writes to stderr, read until it closes stderr."""
        assert self.process.stderr is not None
        chunks = []
        while data := await self.process.stderr.receive_some(65536):
            chunks.append(data)
        return b"".join(chunks).decode()


@asynccontextmanager
async def fake_server(*args: str) -> AsyncIterator[FakeProcess]:
    """Start a fake server on a free port; always kill and reap it on the way out."""
    pythonpath = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
    command = [sys.executable, "-m", "llamaswap.fake_server", "--port", "0", *args]
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        fake = FakeProcess(process)
        first = await fake.readline()
        match = LISTENING.fullmatch(first)
        assert match is not None, f"unexpected first line {first!r}"
        assert int(match["pid"]) == process.pid
        fake.port = int(match["port"])
        yield fake
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.wait()
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    await pipe.aclose()


async def wait_healthy(client: httpx.AsyncClient, url: str) -> None:
    while True:
        if (await client.get(f"{url}/health")).status_code == 200:
            return
        await trio.sleep(0.02)  # the poll interval, not a wait for something to happen


async def collect_sse(client: httpx.AsyncClient, body: dict[str, Any], into: list[str]) -> None:
    """Append each SSE payload of a streamed chat completion to ``into`` as it arrives."""
    async with client.stream("POST", CHAT, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                into.append(line[len("data: ") :])


def chat_body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "ignored", "messages": [{"role": "user", "content": text}], **extra}


def sse_payloads(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


async def test_health_is_503_while_loading_then_200() -> None:
    with trio.fail_after(15):
        spawned = trio.current_time()
        async with fake_server("--load-seconds", "1.0") as fake, httpx.AsyncClient() as client:
            response = await client.get(f"{fake.url}/health")
            assert response.status_code == 503
            assert response.json() == {"status": "loading"}
            assert (await client.get(f"{fake.url}/v1/models")).status_code == 503

            await wait_healthy(client, fake.url)
            assert trio.current_time() - spawned >= 1.0
            response = await client.get(f"{fake.url}/health")
            assert response.json() == {"status": "ok"}
            assert response.headers["x-fake-model"] == "fake"

            assert (await client.get(f"{fake.url}/v1/models")).status_code == 200

            healthy = await fake.expect_line("fake_server: healthy at ")
            assert re.fullmatch(r"fake_server: healthy at \d+\.\d{6}", healthy)
            # Each request is logged but the readiness polls, as llama-server does.
            request = await fake.expect_line("fake_server: request ")
            assert re.fullmatch(r"fake_server: request GET /v1/models at \d+\.\d{6}", request)


async def test_chat_completion_is_deterministic_with_usage() -> None:
    with trio.fail_after(15):
        async with (
            fake_server("--model-name", "m1", "--max-tokens", "5") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            response = await client.post(CHAT, json=chat_body("one two three"))
            assert response.status_code == 200
            assert response.headers["x-fake-model"] == "m1"
            body = response.json()
            assert body["object"] == "chat.completion"
            assert body["model"] == "m1"
            choice = body["choices"][0]
            assert choice["message"]["role"] == "assistant"
            assert len(choice["message"]["content"].split()) == 5
            assert choice["finish_reason"] == "stop"
            usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
            assert body["usage"] == usage

            again = (await client.post(CHAT, json=chat_body("one two three"))).json()
            assert again["choices"] == body["choices"]
            other = (await client.post(CHAT, json=chat_body("something else"))).json()
            assert other["choices"][0]["message"]["content"] != choice["message"]["content"]

            limited = (await client.post(CHAT, json=chat_body("hi", max_tokens=2))).json()
            assert len(limited["choices"][0]["message"]["content"].split()) == 2
            assert limited["choices"][0]["finish_reason"] == "length"
            assert limited["usage"]["completion_tokens"] == 2


async def test_chat_streaming_sends_one_token_per_chunk_and_usage() -> None:
    request = chat_body("tell me", max_tokens=4)
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            expected = (await client.post(CHAT, json=request)).json()
            streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
            response = await client.post(CHAT, json=streamed)
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            no_usage = await client.post(CHAT, json={**request, "stream": True})

    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    tokens, finish, usage = chunks[:4], chunks[4], chunks[5]
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(chunk["choices"][0]["delta"]["content"] for chunk in tokens)
    assert content == expected["choices"][0]["message"]["content"]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    assert len(chunks) == 6
    assert all("usage" not in chunk for chunk in chunks[:5])

    plain = [json.loads(payload) for payload in sse_payloads(no_usage.text)[:-1]]
    assert len(plain) == 5
    assert all("usage" not in chunk for chunk in plain)


async def test_streaming_arrives_incrementally_at_the_token_rate() -> None:
    tokens, rate = 10, 20.0
    expected = tokens / rate
    arrivals: list[float] = []
    with trio.fail_after(15):
        async with (
            fake_server("--tokens-per-second", str(rate)) as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            body = chat_body("pace me", max_tokens=tokens, stream=True)
            async with client.stream("POST", CHAT, json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        arrivals.append(trio.current_time())
    assert len(arrivals) == tokens
    # Token i is due at (i + 1) / rate after the request: first at 0.05 s, last at 0.5 s.
    assert arrivals[-1] - arrivals[0] >= 0.6 * (expected - 1 / rate)


@pytest.mark.parametrize("parallel", [1, 0])
async def test_parallel_makes_a_second_completion_wait_for_the_first(parallel: int) -> None:
    events: list[str] = []
    first_started = trio.Event()

    async def stream(name: str, tokens: int) -> None:
        body = chat_body(name, max_tokens=tokens, stream=True)
        async with client.stream("POST", CHAT, json=body) as response:
            async for line in response.aiter_lines():
                if '"content"' in line and f"{name} first" not in events:
                    events.append(f"{name} first")
                    first_started.set()
        events.append(f"{name} done")

    with trio.fail_after(15):
        args = ["--tokens-per-second", "20", "--parallel", str(parallel)]
        async with (
            fake_server(*args) as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(stream, "A", 10)  # 0.5 s of generation
            await first_started.wait()
            nursery.start_soon(stream, "B", 1)
    if parallel == 1:  # B waits for A's slot
        assert events == ["A first", "A done", "B first", "B done"]
    else:  # no limit: B is served beside A, and done long before it
        assert events == ["A first", "B first", "B done", "A done"]


async def test_text_completions_streaming_and_not() -> None:
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            request = {"prompt": "once upon a time", "max_tokens": 3}
            plain = (await client.post("/v1/completions", json=request)).json()
            streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
            response = await client.post("/v1/completions", json=streamed)

    assert plain["object"] == "text_completion"
    assert len(plain["choices"][0]["text"].split()) == 3
    assert plain["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
    assert text == plain["choices"][0]["text"]
    assert chunks[-1]["usage"] == plain["usage"]


async def test_embeddings_are_deterministic() -> None:
    with trio.fail_after(15):
        async with (
            fake_server("--embedding-size", "4") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            first = (await client.post("/v1/embeddings", json={"input": "hello world"})).json()
            second = (await client.post("/v1/embeddings", json={"input": "hello world"})).json()
            batch = (await client.post("/v1/embeddings", json={"input": ["a", "b c"]})).json()

    assert first == second
    assert first["object"] == "list"
    assert first["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    vector = first["data"][0]["embedding"]
    assert len(vector) == 4
    assert all(isinstance(value, float) for value in vector)
    assert [item["index"] for item in batch["data"]] == [0, 1]
    assert batch["data"][0]["embedding"] != batch["data"][1]["embedding"]
    assert batch["usage"]["prompt_tokens"] == 3


async def test_embeddings_in_base64_are_the_same_floats() -> None:
    # The Node OpenAI SDK asks for base64 by default, and so does the Python one.
    with trio.fail_after(15):
        async with fake_server("--model-name", "tiny") as fake:
            async with openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="unused") as client:
                decoded = await client.embeddings.create(model="tiny", input=["a", "b c"])
            async with httpx.AsyncClient(base_url=fake.url) as http:
                floats = (await http.post("/v1/embeddings", json={"input": ["a", "b c"]})).json()
                raw = await http.post(
                    "/v1/embeddings", json={"input": "a", "encoding_format": "base64"}
                )
                refused = await http.post(
                    "/v1/embeddings", json={"input": "a", "encoding_format": "binary"}
                )
    assert isinstance(raw.json()["data"][0]["embedding"], str)
    for item, expected in zip(decoded.data, floats["data"], strict=True):
        assert item.embedding == pytest.approx(expected["embedding"], abs=1e-7)
    assert refused.status_code == 400


async def test_the_responses_api_streaming_and_not() -> None:
    ask = {"model": "tiny", "instructions": "Be brief.", "input": "hi there"}
    with trio.fail_after(15):
        async with fake_server("--model-name", "tiny") as fake:
            async with openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="unused") as client:
                response = await client.responses.create(
                    model="tiny", instructions="Be brief.", input="hi there"
                )
                limited = await client.responses.create(
                    model="tiny", input="hi there", max_output_tokens=3
                )
                chat = await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi there"}]
                )
            # Streamed through httpx (the SDK's reader leaves its generators open under
            # Trio), each event checked against the SDK's own types.
            async with httpx.AsyncClient(base_url=fake.url) as http:
                streamed = await http.post("/v1/responses", json={**ask, "stream": True})

    # The words a chat completion gets for the same question.
    assert response.output_text == chat.choices[0].message.content
    assert (response.status, response.model) == ("completed", "tiny")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 16)
    assert (limited.status, limited.usage and limited.usage.output_tokens) == ("incomplete", 3)
    assert limited.incomplete_details is not None
    assert limited.incomplete_details.reason == "max_output_tokens"
    assert response.output_text.startswith(limited.output_text)

    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_json(payload) for payload in sse_payloads(streamed.text)]
    names = [line[len("event: ") :] for line in streamed.text.splitlines() if line[:6] == "event:"]
    assert names == [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) == 16  # one event per token
    last = events[-1]
    assert last.type == "response.completed"
    assert last.response.output_text == "".join(deltas) == response.output_text
    assert last.response.usage == response.usage


async def test_models_props_not_found_and_bad_json() -> None:
    with trio.fail_after(15):
        async with (
            fake_server("--model-name", "qwen") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            models = await client.get("/v1/models")
            props = await client.get("/props")
            missing = await client.get("/nope")
            bad = await client.post(CHAT, content=b"{not json")
            no_messages = await client.post(CHAT, json={"max_tokens": 1})

    model = {"id": "qwen", "object": "model", "created": 0, "owned_by": "fake"}
    assert models.json() == {"object": "list", "data": [model]}
    assert props.json()["model"] == "qwen"
    assert props.json()["default_generation_settings"]["n_ctx"] == 4096  # as llama-server's
    assert missing.status_code == 404
    assert "error" in missing.json()
    for response in (bad, no_messages):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_fail_start_exits_1_with_the_error_on_stderr() -> None:
    with trio.fail_after(15):
        async with fake_server("--fail-start", "--load-seconds", "0.2") as fake:
            assert await fake.process.wait() == 1
            assert "error: failed to load model file 'fake.gguf'" in await fake.stderr()


async def test_crash_after_tokens_ends_the_stream_and_exits_3() -> None:
    payloads: list[str] = []
    with trio.fail_after(15):
        async with (
            fake_server("--crash-after-tokens", "3") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            body = chat_body("crash", max_tokens=10, stream=True)
            with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never ends
                await collect_sse(client, body, payloads)
            assert await fake.process.wait() == 3
            assert "crashing after 3 tokens" in await fake.stderr()
    assert len(payloads) == 3
    assert all(json.loads(payload)["choices"][0]["delta"]["content"] for payload in payloads)


async def test_sigterm_exits_0() -> None:
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            await wait_healthy(client, fake.url)
            fake.process.send_signal(signal.SIGTERM)
            await fake.expect_line("fake_server: received SIGTERM")
            assert await fake.process.wait() == 0


async def test_ignore_sigterm_survives_sigterm_but_not_sigkill() -> None:
    with trio.fail_after(15):
        async with (
            fake_server("--ignore-sigterm") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            await wait_healthy(client, fake.url)
            fake.process.send_signal(signal.SIGTERM)
            line = await fake.expect_line("fake_server: received SIGTERM")
            assert "ignoring" in line
            assert (await client.get("/health")).status_code == 200
            assert fake.process.returncode is None
            fake.process.kill()
            assert await fake.process.wait() == -signal.SIGKILL


async def test_client_disconnect_mid_stream_is_logged_and_stops_generation() -> None:
    body = json.dumps(chat_body("long", max_tokens=1000, stream=True)).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with trio.fail_after(15):
        async with fake_server("--tokens-per-second", "50") as fake:
            # A bare socket, so that "going away" is exactly closing it after three tokens.
            async with await trio.open_tcp_stream("127.0.0.1", fake.port) as stream:
                await stream.send_all(head.encode() + body)
                received = b""
                while received.count(b"data: {") < 3:
                    data = await stream.receive_some(65536)
                    assert data, "the server closed the stream early"
                    received += data
            line = await fake.expect_line("fake_server: client disconnected after ")
            match = re.fullmatch(r"fake_server: client disconnected after (\d+) tokens", line)
            assert match is not None
            assert 3 <= int(match[1]) < 1000
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{fake.url}/health")).status_code == 200


async def test_openai_client_understands_the_responses() -> None:
    usage = {"include_usage": True}
    request = chat_body("hi there", max_tokens=3, stream=True, stream_options=usage)
    with trio.fail_after(15):
        async with fake_server("--model-name", "tiny") as fake:
            async with openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="unused") as client:
                completion = await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi there"}], max_tokens=3
                )
                embedding = await client.embeddings.create(model="tiny", input="x")
            # The SDK's own stream reader stops at [DONE] without exhausting its async
            # generators (a ResourceWarning under Trio), so the chunks go through its types.
            async with httpx.AsyncClient(base_url=fake.url) as http:
                streamed = await http.post(CHAT, json=request)

    assert completion.model == "tiny"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 5
    payloads = sse_payloads(streamed.text)
    chunks = [ChatCompletionChunk.model_validate_json(payload) for payload in payloads[:-1]]
    content = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert content == completion.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    assert len(embedding.data[0].embedding) == 8


# --- --memory: the GPU probe's test double ------------------------------------------------

GiB = 2**30


def gpu_folder(folder: Path, **totals: int) -> Path:
    """A ``FileProbe`` folder whose ``devices.json`` lists ``totals`` (bytes by device)."""
    folder.mkdir()
    devices = {name: {"total": total, "name": "Fake GPU"} for name, total in totals.items()}
    (folder / "devices.json").write_text(json.dumps(devices))
    return folder


def test_memory_takes_one_size_or_sizes_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAKE_GPU_ENV, raising=False)
    assert parse_args(["--port", "0"]).memory == {}
    assert parse_args(["--port", "0", "--memory", "8GiB"]).memory == {"gpu0": 8 * GiB}
    both = parse_args(["--port", "0", "--memory", "gpu0=6GiB, gpu1=512MiB"])
    assert both.memory == {"gpu0": 6 * GiB, "gpu1": 512 * 2**20}
    assert both.gpu_dir is None  # nowhere to allocate: --memory does nothing
    monkeypatch.setenv(FAKE_GPU_ENV, "/tmp/fake-gpu")
    assert parse_args(["--port", "0", "--memory", "1GiB"]).gpu_dir == "/tmp/fake-gpu"
    explicit = ["--port", "0", "--memory", "1GiB", "--gpu-dir", "/elsewhere"]
    assert parse_args(explicit).gpu_dir == "/elsewhere"
    for bad in ("8 gigs", "gpu0=", "gpu0=1GiB,gpu0=2GiB", "=1GiB"):
        with pytest.raises(SystemExit):
            parse_args(["--port", "0", "--memory", bad])


async def test_memory_is_allocated_once_loaded_and_given_back_on_sigterm(tmp_path: Path) -> None:
    gpu = gpu_folder(tmp_path / "gpu", gpu0=16 * GiB)
    args = ("--memory", "8GiB", "--gpu-dir", str(gpu), "--load-seconds", "1")
    with trio.fail_after(15):
        async with fake_server(*args) as fake, httpx.AsyncClient(base_url=fake.url) as client:
            own = gpu / f"{fake.process.pid}.json"
            assert (await client.get("/health")).status_code == 503
            assert not own.exists()  # loading: nothing allocated yet
            await fake.expect_line("fake_server: healthy at ")
            assert json.loads(own.read_text()) == {"gpu0": 8 * GiB}
            reading = FileProbe(gpu).read()
            assert reading.processes == {fake.process.pid: {"gpu0": 8 * GiB}}
            (device,) = reading.devices
            assert (device.name, device.label, device.total, device.used) == (
                "gpu0",
                "Fake GPU",
                16 * GiB,
                8 * GiB,
            )
            fake.process.send_signal(signal.SIGTERM)
            assert await fake.process.wait() == 0
            assert not own.exists()
    assert sorted(path.name for path in gpu.iterdir()) == [".lock", "devices.json"]


async def test_memory_beyond_a_device_fails_as_llama_cpp_does(tmp_path: Path) -> None:
    gpu = gpu_folder(tmp_path / "gpu", gpu0=16 * GiB, gpu1=4 * GiB)
    # A file left by a process that has gone (SIGKILLed) holds nothing.
    gone = await trio.run_process(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_stdout=True
    )
    (gpu / f"{int(gone.stdout)}.json").write_text(json.dumps({"gpu0": 16 * GiB}))
    with trio.fail_after(15):
        async with fake_server("--memory", "gpu0=10GiB,gpu1=1GiB", "--gpu-dir", str(gpu)) as a:
            await a.expect_line("fake_server: healthy at ")
            async with fake_server("--memory", "gpu0=4GiB,gpu1=6GiB", "--gpu-dir", str(gpu)) as b:
                assert await b.process.wait() == 1
                assert (await b.stderr()).splitlines() == [
                    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 6144.00 MiB on "
                    "device 1: cudaMalloc failed: out of memory",
                    f"alloc_tensor_range: failed to allocate CUDA1 buffer of size {6 * GiB}",
                    "llama_model_load: error loading model: unable to allocate CUDA1 buffer",
                    "llama_model_load_from_file_impl: failed to load model",
                ]
                assert not (gpu / f"{b.process.pid}.json").exists()
            async with fake_server("--memory", "7GiB", "--gpu-dir", str(gpu)) as c:
                assert await c.process.wait() == 1  # 10 + 7 > 16 on gpu0
                assert "on device 0: cudaMalloc failed: out of memory" in await c.stderr()
            a.process.kill()  # SIGKILL: its file stays, and counts for nothing
            await a.process.wait()
            assert (gpu / f"{a.process.pid}.json").exists()
            assert FileProbe(gpu).read().processes == {}
            async with fake_server("--memory", "16GiB", "--gpu-dir", str(gpu)) as d:
                await d.expect_line("fake_server: healthy at ")
                assert FileProbe(gpu).read().processes == {d.process.pid: {"gpu0": 16 * GiB}}


async def answer_and_tokens(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The whole answer to ``body``, and its tokens as the stream sends them."""
    whole = (await client.post(path, json=body)).json()
    response = await client.post(path, json={**body, "stream": True})
    chunks = [json.loads(payload) for payload in sse_payloads(response.text)[:-1]]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    if path == CHAT:
        tokens = [choice["delta"]["content"] for choice in choices if "content" in choice["delta"]]
    else:
        tokens = [choice["text"] for choice in choices if choice["finish_reason"] is None]
    return whole, tokens


async def continued(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """``body``'s answer in one piece, and the text of its stream (checked against it)."""
    plain = (await client.post(path, json=body)).json()
    _, tokens = await answer_and_tokens(client, path, body)
    choice = plain["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert "".join(tokens) == text
    return plain, text


async def test_a_chat_prefill_continues_the_answer_token_for_token() -> None:
    length = 10
    question = chat_body("tell me a story", max_tokens=length)
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            whole, tokens = await answer_and_tokens(client, CHAT, question)
            assert len(tokens) == length
            assert "".join(tokens) == whole["choices"][0]["message"]["content"]
            for k in (0, 1, length // 2, length):
                prefill = "".join(tokens[:k])
                messages = [*question["messages"], {"role": "assistant", "content": prefill}]
                resumed = {**question, "messages": messages, "max_tokens": length - k}
                plain, text = await continued(client, CHAT, resumed)
                assert prefill + text == whole["choices"][0]["message"]["content"]
                prompt = 4 + len(prefill.split())  # the server sees the prefill too
                usage = {"prompt_tokens": prompt, "completion_tokens": length - k}
                assert plain["usage"] == {**usage, "total_tokens": prompt + length - k}
            # A prefill that is not the answer's start continues from itself, each time alike.
            messages = [*question["messages"], {"role": "assistant", "content": "Well,"}]
            odd = {**question, "messages": messages, "max_tokens": 3}
            _, text = await continued(client, CHAT, odd)
            assert text.startswith(" ")
            assert len(text.split()) == 3
            assert (await continued(client, CHAT, odd))[1] == text


async def test_a_completion_prompt_with_the_answer_appended_continues_it() -> None:
    length, prompt = 10, "once upon a time"
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            request = {"prompt": prompt, "max_tokens": length}
            whole, tokens = await answer_and_tokens(client, "/v1/completions", request)
            assert "".join(tokens) == whole["choices"][0]["text"]
            for k in (0, 1, length // 2, length):
                generated = "".join(tokens[:k])
                resumed = {"prompt": prompt + generated, "max_tokens": length - k}
                plain, text = await continued(client, "/v1/completions", resumed)
                assert generated + text == whole["choices"][0]["text"]
                assert plain["usage"]["prompt_tokens"] == len((prompt + generated).split())
                assert plain["usage"]["completion_tokens"] == length - k


async def test_ignore_prefill_answers_the_conversation_from_scratch() -> None:
    question = chat_body("tell me a story", max_tokens=6)
    with trio.fail_after(15):
        async with (
            fake_server("--ignore-prefill") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            whole, tokens = await answer_and_tokens(client, CHAT, question)
            prefill = {"role": "assistant", "content": "".join(tokens[:2])}
            resumed = {**question, "messages": [*question["messages"], prefill]}
            plain, text = await continued(client, CHAT, resumed)
    assert text == whole["choices"][0]["message"]["content"]
    assert plain["usage"]["prompt_tokens"] == 4 + 2  # received, though not continued


def test_ignore_prefill_is_off_unless_asked_for() -> None:
    assert not parse_args(["--port", "0"]).ignore_prefill
    assert parse_args(["--port", "0", "--ignore-prefill"]).ignore_prefill


async def native(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """llama.cpp's ``/completion``: the whole answer, and the text its stream sends (the
    stream checked against it: one event per token, then the final one, no ``[DONE]``)."""
    plain = (await client.post("/completion", json=body)).json()
    response = await client.post("/completion", json={**body, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(payload) for payload in sse_payloads(response.text)]
    *pieces, final = events
    assert [event["stop"] for event in pieces] == [False] * plain["tokens_predicted"]
    assert [event["tokens_predicted"] for event in pieces] == list(range(1, len(pieces) + 1))
    assert final["stop"] is True
    assert final["content"] == ""
    assert final["tokens_predicted"] == plain["tokens_predicted"]
    assert final["tokens_evaluated"] == plain["tokens_evaluated"]
    assert final["timings"]["predicted_n"] == plain["tokens_predicted"]
    text = "".join(event["content"] for event in pieces)
    assert text == plain["content"]
    return plain, text


async def test_llama_cpp_completion_route_streaming_and_not() -> None:
    prompt = "once upon a time"
    request = {"prompt": prompt, "n_predict": 5, "temperature": 0.7, "cache_prompt": True}
    with trio.fail_after(15):
        async with (
            fake_server("--tokens-per-second", "200", "--max-tokens", "6") as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            await wait_healthy(client, fake.url)
            plain, _ = await native(client, request)
            openai_shaped = await client.post(
                "/v1/completions", json={"prompt": prompt, "max_tokens": 5}
            )
            unlimited, _ = await native(client, {"prompt": prompt, "n_predict": -1})
            absent, _ = await native(client, {"prompt": prompt})
            bad = await client.post("/completion", json={"prompt": prompt, "n_predict": "5"})

    assert plain["content"] == openai_shaped.json()["choices"][0]["text"]  # the same words
    assert plain["stop"] is True
    assert plain["stop_type"] == "limit"
    assert (plain["tokens_predicted"], plain["tokens_evaluated"]) == (5, 4)
    assert plain["model"] == "fake"
    assert plain["timings"]["prompt_n"] == 4
    assert plain["timings"]["predicted_n"] == 5
    assert plain["timings"]["predicted_per_second"] <= 200 * 1.01  # paced as streaming is
    assert unlimited["tokens_predicted"] == absent["tokens_predicted"] == 6  # --max-tokens
    assert unlimited["stop_type"] == "eos"
    assert unlimited["content"].startswith(plain["content"])
    assert bad.status_code == 400


async def test_llama_cpp_completion_continues_a_prompt_with_the_answer_appended() -> None:
    length, prompt = 8, "once upon a time"
    with trio.fail_after(15):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            whole, _ = await native(client, {"prompt": prompt, "n_predict": length})
            _, tokens = await answer_and_tokens(
                client, "/v1/completions", {"prompt": prompt, "max_tokens": length}
            )
            assert "".join(tokens) == whole["content"]
            for k in (0, 3):
                generated = "".join(tokens[:k])
                resumed = {"prompt": prompt + generated, "n_predict": length - k}
                plain, text = await native(client, resumed)
                assert generated + text == whole["content"]
                assert plain["tokens_predicted"] == length - k
                assert plain["tokens_evaluated"] == len((prompt + generated).split())
