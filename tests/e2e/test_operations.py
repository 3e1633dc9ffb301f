"""Live operations end to end: /api/inflight, cancelling a request through the API wherever
it is, model state in /v1/models, /api/version and ``--version``."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import re
import sys
import time
import uuid
from typing import Any

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import alive, child_env, running, wait_until
from tests.e2e.test_proxy import chat, config

# One group (the default): a model must evict the others to load.
MODELS = config(
    """
[models.alpha]
cmd = "${fake}"
ttl = 300
[models.alpha.metadata]
family = "test"
[models.beta]
cmd = "${fake} --tokens-per-second 20"
[models.slow]
cmd = "${fake} --load-seconds 60"
"""
)

#: Fields every /api/inflight entry has.
FIELDS = {
    "id",
    "model",
    "state",
    "priority",
    "band",
    "score",
    "waited_ms",
    "started",
    "client",
    "route",
    "position",
    "eta_seconds",
    "preemptions",
    "paused",
    "paused_ms",
}


async def inflight(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await client.get("/api/inflight")
    assert response.status_code == 200
    entries: list[dict[str, Any]] = response.json()["inflight"]
    assert all(set(entry) == FIELDS for entry in entries)
    return entries


async def wait_for_request(client: httpx.AsyncClient, model: str, state: str) -> dict[str, Any]:
    """Poll /api/inflight until ``model`` has a request in ``state`` (bounded by the
    caller's ``fail_after``): there is no event to wait on from outside the proxy."""
    while True:
        for entry in await inflight(client):
            if (entry["model"], entry["state"]) == (model, state):
                return entry
        await trio.sleep(0.02)


def wall(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def cancelled_error(response: httpx.Response, request_id: int) -> None:
    """``response`` is the JSON error an operator's cancel gives."""
    assert response.status_code == 499
    assert response.json()["error"] == {
        "message": f"request #{request_id} was cancelled by an operator, via the API "
        f"(POST /api/inflight/{request_id}/cancel)",
        "type": "server_error",
        "code": "request_cancelled",
        "param": None,
    }


async def activity_of(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    (record,) = (await client.get("/api/activity", params={"model": model})).json()["activity"]
    assert isinstance(record, dict)
    return record


async def test_a_queued_request_is_listed_and_cancelled(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert await inflight(client) == []
            long = chat("beta", stream=True, max_tokens=400)  # 20 s unless stopped
            async with client.stream("POST", "/v1/chat/completions", json=long) as busy:
                assert busy.status_code == 200
                answers: list[httpx.Response] = []

                async def queued() -> None:
                    headers = {"X-LlamaSwap-Priority": "batch"}
                    body = chat("alpha")
                    answers.append(
                        await client.post("/v1/chat/completions", json=body, headers=headers)
                    )

                before = time.time()
                nursery.start_soon(queued)
                entry = await wait_for_request(client, "alpha", "queued")
                seen = time.time()
                assert entry["route"] == "POST /v1/chat/completions"
                assert entry["position"] == 1  # the only one waiting
                assert re.fullmatch(r"127\.0\.0\.1:\d+", entry["client"])
                assert (entry["priority"], entry["band"], entry["score"]) == (-100, "batch", None)
                assert before - 0.01 <= wall(entry["started"]) <= seen
                assert 0 <= entry["waited_ms"] <= (seen - before) * 1000

                # Oldest first; a queued request's wait grows, a served one's is fixed.
                serving, later = await inflight(client)
                assert (serving["model"], serving["state"]) == ("beta", "serving")
                assert serving["position"] is None
                assert serving["id"] < entry["id"] == later["id"]
                assert later["waited_ms"] > entry["waited_ms"]
                assert (await inflight(client))[0]["waited_ms"] == serving["waited_ms"]

                cancel = await client.post(f"/api/inflight/{entry['id']}/cancel")
                assert cancel.status_code == 200
                assert cancel.json() == {"cancelled": entry["id"], "state": "queued"}
                await wait_until(lambda: bool(answers), within=10)
                cancelled_error(answers[0], entry["id"])
                assert [e["model"] for e in await inflight(client)] == ["beta"]
                again = await client.post(f"/api/inflight/{entry['id']}/cancel")
                assert again.status_code == 404
            # beta is free: a queued alpha would load now. It left the queue: it must not.
            after = await client.post("/v1/chat/completions", json=chat("beta"))
            assert after.status_code == 200
            record = await activity_of(client, "alpha")
    assert "loading model 'alpha'" not in proxy.output.text()
    assert (record["status"], record["queue_wait_ms"]) == (499, None)
    assert "cancelled by an operator" in record["error"]
    assert record["request"] == entry["id"]  # the number it was cancelled by


@pytest.mark.parametrize("scheduler", ["fifo", "serial"])
async def test_a_loading_request_cancelled_kills_the_starting_process(
    proxy_factory: StartProxy, nursery: trio.Nursery, scheduler: str
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.slow]\ncmd = "${fake} --load-seconds 60"\n'
            f'[routing.scheduler]\nuse = "{scheduler}"'
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            answers: list[httpx.Response] = []

            async def request() -> None:
                answers.append(await client.post("/v1/chat/completions", json=chat("slow")))

            nursery.start_soon(request)
            pid = int((await proxy.output.wait_for(r"model 'slow': started pid (\d+)"))[1])
            entry = await wait_for_request(client, "slow", "loading")
            if scheduler == "serial":
                assert isinstance(entry["score"], float)
            mark = len(proxy.output.lines)
            cancel = await client.post(f"/api/inflight/{entry['id']}/cancel")
            assert cancel.json() == {"cancelled": entry["id"], "state": "loading"}
            await proxy.output.wait_for(r"cancelling the load of 'slow'", start=mark)
            await proxy.output.wait_for(r"model 'slow': stopped", start=mark)
            await wait_until(lambda: bool(answers), within=10)
            assert not alive(pid)
            assert await running(client) == {}
            assert await inflight(client) == []
            record = await activity_of(client, "slow")
    cancelled_error(answers[0], entry["id"])
    assert record["status"] == 499
    assert record["queue_wait_ms"] is not None  # dispatched: its load had started
    assert record["request"] == entry["id"]


async def test_a_streaming_request_cancelled_ends_with_an_error_event(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    chunks: list[bytes] = []
    async with proxy.client() as client:
        with trio.fail_after(30):
            body = chat("beta", stream=True, max_tokens=400)  # 20 s unless stopped
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                assert stream.status_code == 200
                async for chunk in stream.aiter_raw():
                    if not chunks:  # the answer has started: cancel it
                        entry = await wait_for_request(client, "beta", "serving")
                        cancel = await client.post(f"/api/inflight/{entry['id']}/cancel")
                        assert cancel.json() == {"cancelled": entry["id"], "state": "serving"}
                    chunks.append(chunk)
            # The upstream connection was closed, so the model server stopped generating.
            line = r"\[beta\] fake_server: client disconnected after (\d+) tokens"
            tokens = int((await proxy.output.wait_for(line))[1])
            assert tokens < 400
            # The model was already loaded for nobody in particular: it stays.
            beta = (await running(client))["beta"]
            assert (beta["state"], beta["in_flight"]) == ("ready", 0)
            record = await activity_of(client, "beta")
    events = b"".join(chunks).strip().split(b"\n\n")
    assert events[0].startswith(b'data: {"id"')
    assert b"[DONE]" not in events[-1]
    error = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "request_cancelled"
    assert f"request #{entry['id']} was cancelled by an operator" in error["message"]
    assert record["status"] == 200  # the status line had gone out
    assert "cancelled by an operator" in record["error"]


async def test_a_manual_load_is_listed_and_cancelled(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            answers: list[httpx.Response] = []

            async def load() -> None:
                answers.append(await client.post("/api/models/load/slow"))

            nursery.start_soon(load)
            pid = int((await proxy.output.wait_for(r"model 'slow': started pid (\d+)"))[1])
            entry = await wait_for_request(client, "slow", "loading")
            assert entry["route"] == "POST /api/models/load/slow"
            assert re.fullmatch(r"127\.0\.0\.1:\d+", entry["client"])
            cancel = await client.post(f"/api/inflight/{entry['id']}/cancel")
            assert cancel.json() == {"cancelled": entry["id"], "state": "loading"}
            await wait_until(lambda: bool(answers), within=10)
            await proxy.output.wait_for(r"model 'slow': stopped")
            assert not alive(pid)
            assert await running(client) == {}
            record = await activity_of(client, "slow")
    cancelled_error(answers[0], entry["id"])
    assert (record["path"], record["status"]) == ("/api/models/load/slow", 499)
    assert "cancelled by an operator" in record["error"]


async def test_a_manual_load_whose_client_leaves_is_recorded_as_such(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client, proxy.client() as leaving:
        with trio.fail_after(30):
            async with trio.open_nursery() as loading:
                loading.start_soon(leaving.post, "/api/models/load/slow")
                await wait_for_request(client, "slow", "loading")
                loading.cancel_scope.cancel()  # hangs up
            await proxy.output.wait_for(r"model 'slow': stopped")  # nobody else wanted it
            record = await activity_of(client, "slow")
    assert (record["path"], record["status"]) == ("/api/models/load/slow", 499)
    assert record["error"] == "client disconnected"


async def test_cancelling_what_is_not_in_flight_is_a_json_404(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            missing = await client.post("/api/inflight/12345/cancel")
            not_a_number = await client.post("/api/inflight/first/cancel")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "no request 12345 in flight; GET /api/inflight lists them",
        "type": "invalid_request_error",
        "code": "not_found",
        "param": None,
    }
    assert not_a_number.status_code == 404
    assert not_a_number.json()["error"]["code"] == "not_found"


async def test_get_unload_stops_every_model_as_llama_swap_s_does(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/beta")).status_code == 200
            assert [
                entry["model"] for entry in (await client.get("/running")).json()["running"]
            ] == ["beta"]
            unloaded = await client.get("/unload")
            assert (unloaded.status_code, unloaded.json()) == (200, {"unloaded": ["beta"]})
            assert (await client.get("/running")).json() == {"running": []}


async def test_models_list_their_state_before_and_after_a_load(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)

    async def meta(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
        listed = (await client.get("/v1/models")).json()["data"]
        return {entry["id"]: entry["meta"] for entry in listed}

    async with proxy.client() as client:
        with trio.fail_after(30):
            stopped = await meta(client)
            before = time.time()
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            after = time.time()
            loaded = await meta(client)
            alpha_running = await running(client)
            assert (await client.post("/api/models/load/beta")).status_code == 200
            beta_running = await running(client)
            beta_listed = (await meta(client))["beta"]["llamaswap"]
    # /running says each model's ttl as /v1/models does: null for none.
    assert (alpha_running["alpha"]["ttl"], beta_running["beta"]["ttl"]) == (300, None)
    assert beta_listed["ttl"] is None
    unknown: dict[str, Any] = {
        "memory": None,
        "memory_source": None,
        "memory_held": {},
    }  # no GPU probe
    nothing = {
        "state": "stopped",
        "loaded_since": None,
        "ttl": None,
        "ttl_left": None,
        "failure": None,
        **unknown,
    }
    assert stopped == {
        "alpha": {"family": "test", "llamaswap": {**nothing, "ttl": 300}},
        "beta": {"llamaswap": nothing},
        "slow": {"llamaswap": nothing},
    }
    alpha = loaded["alpha"]["llamaswap"]
    assert loaded["alpha"]["family"] == "test"
    assert (alpha["state"], alpha["ttl"]) == ("ready", 300)
    assert before - 0.01 <= wall(alpha["loaded_since"]) <= after
    assert 300 - (time.time() - before) <= alpha["ttl_left"] <= 300
    assert loaded["beta"] == {"llamaswap": nothing}


CLIENTS = config(
    """
[models.alpha]
cmd = "${fake}"
capabilities = { in = ["text", "image"], out = ["text"], tools = true }
[models.long]
cmd = "${fake}"
capabilities.context = 131072
[models.broken]
cmd = "${fake} --load-seconds 0.5 --fail-start"
"""
)


async def listed(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """``GET /v1/models`` as a map from ID to entry."""
    return {entry["id"]: entry for entry in (await client.get("/v1/models")).json()["data"]}


async def test_models_say_their_status_context_length_and_capabilities_where_clients_look(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(CLIENTS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            before = await listed(client)
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            loaded = await listed(client)
            # Its server's GET /props is read once it is ready, off the request path.
            await proxy.output.wait_for(r"model 'alpha': context length 4096 \(GET /props\)")
            read = await listed(client)
            assert (await client.post("/api/models/unload/alpha")).status_code == 200
            unloaded = await listed(client)
    assert {k: v for k, v in before["alpha"].items() if k != "meta"} == {
        "id": "alpha",
        "object": "model",
        "created": before["alpha"]["created"],
        "owned_by": "llamaswap",
        "name": "alpha",
        "description": "",
        "status": {"value": "unloaded"},
        "context_length": None,  # not loaded yet, and no capabilities.context
        "architecture": {
            "input_modalities": ["text", "image"],
            "output_modalities": ["text"],
            "modality": "text+image->text",
        },
        "capabilities": {"vision": True, "function_calling": True},
        "supported_parameters": ["tools", "tool_choice"],
    }
    assert before["long"]["context_length"] == 131072
    assert "capabilities" not in before["long"]
    assert loaded["alpha"]["status"] == {"value": "loaded"}
    assert loaded["alpha"]["meta"]["llamaswap"]["state"] == "ready"
    # The same command starts a server with the same context: kept after the unload.
    assert unloaded["alpha"]["status"] == {"value": "unloaded"}
    assert unloaded["alpha"]["context_length"] == 4096
    assert read["alpha"]["context_length"] == 4096  # the fake server's n_ctx


async def test_a_model_that_fails_to_start_reads_failed_until_its_next_start(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(CLIENTS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            failed = await client.post("/api/models/load/broken")
            entry = (await client.get("/v1/models/broken")).json()
            shown = await running(client)
            # The next start ends it: the model is starting, with no failure.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.post, "/api/models/load/broken")
                # Polled: nothing outside the proxy says "starting" as it happens.
                while (await running(client))["broken"]["state"] != "starting":  # noqa: ASYNC110
                    await trio.sleep(0.02)
                again = (await running(client))["broken"]
                listed_again = (await listed(client))["broken"]
    assert failed.status_code == 502
    error = failed.json()["error"]["message"]
    failure = entry["meta"]["llamaswap"]["failure"]
    assert failure == {
        "reason": "exited with status 1 while starting",
        "message": error,  # what its requests got
        "exit_code": 1,
        "output": failure["output"],
    }
    assert failure["output"][-1] == "error: failed to load model file 'broken.gguf'"
    assert 1 <= len(failure["output"]) <= 5
    assert entry["status"] == {"value": "failed", "failed": True, "exit_code": 1}
    assert entry["meta"]["llamaswap"]["state"] == "failed"
    assert list(shown) == ["broken"]  # listed in /running though nothing runs
    assert (shown["broken"]["state"], shown["broken"]["pid"]) == ("failed", None)
    assert shown["broken"]["failure"] == failure
    assert (again["state"], again["failure"]) == ("starting", None)
    assert listed_again["status"] == {"value": "loading"}


async def test_version_route_and_flag(proxy_factory: StartProxy) -> None:
    version = importlib.metadata.version("llamaswap")
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            answer = (await client.get("/api/version")).json()
    assert answer == {
        "version": version,
        "python": platform.python_version(),
        "trio": trio.__version__,
        "hypercorn": importlib.metadata.version("hypercorn"),
        "pid": proxy.process.pid,
    }
    # The line after "listening on" says it too, for `kill -HUP`.
    pid_line = rf"^llamaswap: pid {proxy.process.pid} \(SIGHUP reloads the config\)$"
    with trio.fail_after(30):
        await proxy.output.wait_for(pid_line)
    with trio.fail_after(30):
        flag = await trio.run_process(
            [sys.executable, "-m", "llamaswap", "--version"],
            capture_stdout=True,
            env=child_env(uuid.uuid4().hex),
        )
    assert flag.stdout.decode() == f"llamaswap {version}\n"
