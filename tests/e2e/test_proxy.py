"""The proxy end to end: the real CLI, real fake model servers, real HTTP, real clock."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import (
    FAKE,
    ProxyProcess,
    alive,
    free_port_base,
    open_raw_request,
    running,
    survivors,
    wait_until,
)
from tests.e2e.test_fake_server import fake_server, wait_healthy


def config(models: str, **top: object) -> str:
    lines = [f"startPort = {free_port_base()}", "logLevel = 'debug'"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in top.items()]
    lines += ["[macros]", f"fake = {json.dumps(FAKE)}", models]
    return "\n".join(lines)


TWO_MODELS = config(
    """
[models.alpha]
cmd = "${fake} --load-seconds 0.2"
aliases = ["gpt-4o-mini"]
[models.beta]
cmd = "${fake} --load-seconds 0.2 --tokens-per-second 40"
"""
)


def chat(model: str, **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


async def test_swap_keeps_one_model_alive_in_the_default_group(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            first = await client.post("/v1/chat/completions", json=chat("gpt-4o-mini"))
            assert first.status_code == 200
            assert first.json()["model"] == "alpha"
            assert first.json()["usage"]["completion_tokens"] > 0
            assert len(first.headers.get_list("server")) == 1
            assert len(first.headers.get_list("date")) == 1
            alpha_pid = (await running(client))["alpha"]["pid"]
            assert isinstance(alpha_pid, int)
            assert alive(alpha_pid)
            second = await client.post("/v1/chat/completions", json=chat("beta"))
            assert second.status_code == 200
            assert second.json()["model"] == "beta"
            assert set(await running(client)) == {"beta"}
            assert not alive(alpha_pid)


async def test_a_model_id_with_spaces_is_served_by_name_alias_and_path(
    proxy_factory: StartProxy,
) -> None:
    """As llama-swap users name them ("Qwen3 30B A3B"): in bodies, lists and URL paths."""
    quoted = FAKE.replace("${MODEL_ID}", "'${MODEL_ID}'")  # one argument, spaces and all
    proxy = await proxy_factory(
        config(f'[models."Qwen3 30B A3B"]\ncmd = {json.dumps(quoted)}\naliases = ["qwen 30b"]')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            listed = (await client.get("/v1/models")).json()["data"]
            assert [entry["id"] for entry in listed] == ["Qwen3 30B A3B"]
            answer = await client.post("/v1/chat/completions", json=chat("qwen 30b"))
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == "Qwen3 30B A3B"
            assert answer.headers["x-llamaswap-upstream"] == "Qwen3 30B A3B"
            health = await client.get("/upstream/Qwen3%2030B%20A3B/health")
            assert health.status_code == 200, health.text
            assert set(await running(client)) == {"Qwen3 30B A3B"}


async def test_streaming_arrives_incrementally(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    arrivals: list[float] = []
    async with proxy.client() as client:
        with trio.fail_after(30):
            body = chat("beta", stream=True, max_tokens=20)
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                assert response.headers["x-accel-buffering"] == "no"
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        arrivals.append(trio.current_time())
    assert len(arrivals) >= 20
    # 20 tokens at 40/s take 0.5 s: the first chunk must not wait for the last.
    assert arrivals[-1] - arrivals[0] >= 0.3


async def test_unknown_model_and_bad_bodies(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    async with proxy.client() as client:
        missing = await client.post("/v1/chat/completions", json=chat("nope"))
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        malformed = await client.post("/v1/chat/completions", content=b"{not json")
        assert malformed.status_code == 400
        assert malformed.json()["error"]["type"] == "invalid_request_error"
        no_model = await client.post("/v1/chat/completions", json={"messages": []})
        assert no_model.status_code == 400
        assert no_model.json()["error"]["param"] == "model"
        nowhere = await client.get("/v2/nothing")
        assert nowhere.status_code == 404
        assert nowhere.json()["error"]["code"] == "not_found"
        wrong_method = await client.get("/v1/chat/completions")
        assert wrong_method.status_code == 405
        assert wrong_method.json()["error"]["code"] == "method_not_allowed"
        assert wrong_method.headers["allow"] == "POST"
        management = await client.delete("/v1/models")  # a Quart route: the same answer
        assert management.status_code == 405
        assert management.json()["error"]["code"] == "method_not_allowed"
        assert set(management.headers["allow"].split(", ")) == {"GET", "HEAD", "OPTIONS"}
    assert "loading model" not in proxy.output.text()


async def test_head_on_a_get_route_is_forwarded_as_head(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            got = await client.get("/props", params={"model": "alpha"})
            head = await client.head("/props", params={"model": "alpha"})
            wrong = await client.delete("/props", params={"model": "alpha"})
    assert got.status_code == 200
    assert got.json()["model"] == "alpha"
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["x-llamaswap-upstream"] == "alpha"
    assert wrong.status_code == 405
    assert wrong.headers["allow"] == "GET, HEAD, POST"
    assert "[alpha] " in proxy.output.text()  # the model server saw the HEAD


async def test_failed_start_answers_502_with_the_output_tail(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models.broken]\ncmd = "${fake} --fail-start"'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post("/v1/chat/completions", json=chat("broken"))
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "model_start_failed"
    assert "exited with status 1 while starting" in error["message"]
    assert "failed to load model file" in error["message"]
    async with proxy.client() as client:
        (record,) = (await client.get("/api/activity")).json()["activity"]
    assert (record["status"], record["scheduler"], record["model"]) == (502, "fifo", "broken")
    assert record["queue_wait_ms"] is not None


async def test_a_port_another_server_holds_fails_the_start_instead_of_using_it(
    proxy_factory: StartProxy,
) -> None:
    async with fake_server("--model-name", "squatter") as squatter:
        url = f"http://127.0.0.1:{squatter.port}"
        async with httpx.AsyncClient() as direct:
            with trio.fail_after(30):
                await wait_healthy(direct, url)
        model = (
            f'[models.m]\ncmd = "python -m llamaswap.fake_server --port {squatter.port}"\n'
            f'proxy = "{url}"'
        )
        proxy = await proxy_factory(config(model))
        async with proxy.client() as client:
            with trio.fail_after(30):
                response = await client.post("/v1/chat/completions", json=chat("m"))
        assert response.status_code == 502
        message = response.json()["error"]["message"]
        assert f"{url}/health answers before the model was started" in message
        assert message.endswith("; stop that process, or change startPort or models.m.proxy")
        assert "model 'm': started pid" not in proxy.output.text()
        assert squatter.process.returncode is None  # not ours to stop


async def leaving_while_queued_loads_nothing(
    proxy: ProxyProcess, leave: Callable[[httpx.AsyncClient, int], Awaitable[None]]
) -> None:
    """While ``beta`` streams, ``leave(client, mark)`` queues a request for ``alpha``
    (which would evict the busy ``beta``) and goes away once the proxy's log after
    ``mark`` says it is queued. Once ``beta`` drains, ``alpha`` must never load."""
    async with proxy.client() as client:
        with trio.fail_after(30):
            long = chat("beta", stream=True, max_tokens=40)  # about a second of streaming
            async with client.stream("POST", "/v1/chat/completions", json=long) as busy:
                assert busy.status_code == 200
                await leave(client, len(proxy.output.lines))
                async for _ in busy.aiter_bytes():
                    pass
            # beta drained: a queued alpha would start now. It must not.
            after = await client.post("/v1/chat/completions", json=chat("beta"))
            assert after.status_code == 200
    assert "loading model 'alpha'" not in proxy.output.text()


QUEUED_ALPHA = r"request #\d+ for 'alpha': queued"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", chat("alpha")),
        ("GET", "/upstream/alpha/health", None),
        ("POST", "/upstream/alpha/v1/chat/completions", chat("alpha")),
    ],
)
async def test_disconnect_while_queued_never_starts_the_model(
    proxy_factory: StartProxy,
    nursery: trio.Nursery,
    method: str,
    path: str,
    body: dict[str, object] | None,
) -> None:
    proxy = await proxy_factory(TWO_MODELS)

    async def leave(client: httpx.AsyncClient, mark: int) -> None:
        with trio.CancelScope() as waiting:

            async def leave_once_queued() -> None:
                await proxy.output.wait_for(QUEUED_ALPHA, start=mark)
                waiting.cancel()

            nursery.start_soon(leave_once_queued)
            await client.request(method, path, json=body)
        assert waiting.cancelled_caught

    await leaving_while_queued_loads_nothing(proxy, leave)


async def test_a_large_upload_that_leaves_while_queued_never_starts_the_model(
    proxy_factory: StartProxy,
) -> None:
    # Over SMALL_BODY, an /upstream body streams through once the model is ready; while
    # it waits, the proxy must still read ahead to see the client go.
    proxy = await proxy_factory(TWO_MODELS)

    async def leave(_: httpx.AsyncClient, mark: int) -> None:
        path = "/upstream/alpha/v1/chat/completions"
        upload = await open_raw_request(proxy.url, path, b" " * 400_000)
        await proxy.output.wait_for(QUEUED_ALPHA, start=mark)
        await upload.aclose()

    await leaving_while_queued_loads_nothing(proxy, leave)


@pytest.mark.parametrize("scheduler", ["fifo", "serial"])
async def test_abandoned_load_kills_the_starting_process(
    proxy_factory: StartProxy, nursery: trio.Nursery, scheduler: str
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.slow]\ncmd = "${fake} --load-seconds 60"\n'
            '[models.fast]\ncmd = "${fake}"\n'
            f'[routing.scheduler]\nuse = "{scheduler}"'
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            with trio.CancelScope() as request:

                async def leave_once_started() -> None:
                    await proxy.output.wait_for(r"model 'slow': started pid \d+")
                    request.cancel()

                nursery.start_soon(leave_once_started)
                await client.post("/v1/chat/completions", json=chat("slow"))
            match = await proxy.output.wait_for(r"model 'slow': started pid (\d+)")
            # The slot (serial) and the reservation (fifo) free at once: another model
            # loads while 'slow' is still being stopped.
            fast = await client.post("/v1/chat/completions", json=chat("fast"))
            assert fast.status_code == 200
            await proxy.output.wait_for(r"model 'slow': stopped")
            assert not alive(int(match[1]))
            assert set(await running(client)) == {"fast"}


async def test_unload_stops_models_and_fails_waiters(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    proxy = await proxy_factory(
        config('[models.slow]\ncmd = "${fake} --load-seconds 60"\n[models.fast]\ncmd = "${fake}"')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/fast")).json()["state"] == "ready"
            assert set(await running(client)) == {"fast"}
            unloaded = await client.post("/api/models/unload")
            assert unloaded.json() == {"unloaded": ["fast"]}
            assert await running(client) == {}

            outcome: list[httpx.Response] = []

            async def wait_for_slow() -> None:
                outcome.append(await client.post("/v1/chat/completions", json=chat("slow")))

            nursery.start_soon(wait_for_slow)
            await proxy.output.wait_for(r"model 'slow': started pid")
            assert (await client.post("/api/models/unload/slow")).status_code == 200
            await wait_until(lambda: bool(outcome), within=10)
    assert outcome[0].status_code == 503
    assert "unloaded" in outcome[0].json()["error"]["message"]


async def test_concurrency_limit_answers_429_before_any_byte(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config('[models.one]\ncmd = "${fake} --tokens-per-second 20"\nconcurrencyLimit = 1')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            body = chat("one", stream=True, max_tokens=20)
            async with client.stream("POST", "/v1/chat/completions", json=body) as first:
                assert first.status_code == 200
                second = await client.post("/v1/chat/completions", json=chat("one"))
                assert second.status_code == 429
                assert second.headers["retry-after"] == "1"
                assert second.json()["error"]["code"] == "concurrency_limit"
                await first.aread()


#: The SDK stops reading at [DONE], or at an error, without exhausting its own async
#: generators (and those of the HTTP client it bundles); Trio's finalizer reports that as a
#: ResourceWarning about the SDK's internals, not ours.
sdk_generators_left_open = pytest.mark.filterwarnings(
    "ignore:Async generator '(openai|httpx2|httpcore2)\\.:ResourceWarning"
)


@sdk_generators_left_open
async def test_openai_sdk_streaming_and_not(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    sdk = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    with trio.fail_after(30):
        completion = await sdk.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content
        stream = await sdk.chat.completions.create(
            model="beta",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=5,
        )
        async with stream:
            pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
        assert "".join(p or "" for p in pieces)
        models = await sdk.models.list()
        assert {m.id for m in models.data} == {"alpha", "beta"}
    await sdk.close()


@sdk_generators_left_open
async def test_openai_sdk_responses_api_streaming_and_not(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    sdk = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    with trio.fail_after(30):
        response = await sdk.responses.create(model="gpt-4o-mini", input="hi")
        assert response.model == "alpha"  # the alias's model, as it answered
        async with await sdk.responses.create(
            model="beta", input="hi", max_output_tokens=5, stream=True
        ) as stream:
            events = [event async for event in stream]
        deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
        assert len(deltas) == 5
        assert events[-1].type == "response.incomplete"
        assert events[-1].response.output_text == "".join(deltas)
        async with proxy.client() as client:
            records = (await client.get("/api/activity")).json()["activity"]
    await sdk.close()
    # The usage each model server reported is recorded, streamed or not.
    assert [(r["model"], r["path"], r["completion_tokens"]) for r in records] == [
        ("beta", "/v1/responses", 5),
        ("alpha", "/v1/responses", 16),
    ]


async def test_a_model_is_retrieved_by_any_name_a_request_may_use(
    proxy_factory: StartProxy,
) -> None:
    """``GET /v1/models/{name}`` (the SDK's ``models.retrieve``) answers the list's entry,
    for aliases and unlisted models too, and a 404 ``model_not_found`` for the rest."""
    proxy = await proxy_factory(
        config(
            '[models.alpha]\ncmd = "${fake}"\naliases = ["gpt-4o-mini"]\nname = "Alpha"\n'
            "[models.alpha.metadata]\nsize = 7\n"
            '[models."org/model"]\ncmd = "${fake}"\n'
            '[models.hidden]\ncmd = "${fake}"\nunlisted = true\n'
            '[peers.gpu2]\nproxy = "http://127.0.0.1:9"\nmodels = ["coder"]'
        )
    )
    sdk = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused")
    async with proxy.client() as client:
        with trio.fail_after(30):
            listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
            assert set(listed) == {"alpha", "org/model", "gpu2/coder"}
            for name, entry in listed.items():
                assert (await client.get(f"/v1/models/{name}")).json() == entry
                assert (await client.get(f"/models/{name}")).json() == entry
                retrieved = await sdk.models.retrieve(name)  # sent as /v1/models/org/model
                assert retrieved.model_dump(exclude_unset=True) == entry
            assert listed["alpha"]["meta"]["size"] == 7
            assert listed["gpu2/coder"]["meta"] == {"peer": "gpu2"}
            # Not listed, but usable: answered with the name asked for.
            alias = (await client.get("/v1/models/gpt-4o-mini")).json()
            assert alias == {**listed["alpha"], "id": "gpt-4o-mini"}
            hidden = (await client.get("/v1/models/hidden")).json()
            assert hidden["id"] == "hidden"
            assert hidden["meta"]["llamaswap"]["state"] == "stopped"
            bare = (await client.get("/v1/models/coder")).json()
            assert bare == {**listed["gpu2/coder"], "id": "coder"}
            # A model's state is live, as in the list.
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            loaded = (await client.get("/v1/models/alpha")).json()["meta"]["llamaswap"]
            assert loaded["state"] == "ready"
            for missing in ("nope", "gpu2/nope", "alpha/extra"):
                answer = await client.get(f"/v1/models/{missing}")
                assert answer.status_code == 404
                error = answer.json()["error"]
                assert error["code"] == "model_not_found"
                assert error["type"] == "invalid_request_error"
                assert repr(missing) in error["message"]
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("nope")
    await sdk.close()


async def test_sigterm_stops_every_model(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/beta")).status_code == 200
            pid = (await running(client))["beta"]["pid"]
    assert await proxy.terminate() == 0
    assert isinstance(pid, int)
    assert not alive(pid)
    assert survivors(proxy.marker) == []


async def test_signals_during_the_shutdown_do_not_cut_it_short(proxy_factory: StartProxy) -> None:
    """SIGHUP (whose default ends a process) and a second SIGTERM while a model that
    ignores SIGTERM is being stopped: the shutdown goes on to its end, and exits 0."""
    proxy = await proxy_factory(
        config('[models.stubborn]\ncmd = "${fake} --ignore-sigterm"\nunloadTimeout = 3\n')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/stubborn")).status_code == 200
            pid = (await running(client))["stubborn"]["pid"]
    with trio.fail_after(20):
        proxy.process.send_signal(signal.SIGTERM)
        await proxy.output.wait_for("received SIGTERM: shutting down")
        for signum in (signal.SIGHUP, signal.SIGTERM):
            proxy.process.send_signal(signum)
            await proxy.output.wait_for(f"received {signum.name}: already shutting down")
        assert await proxy.process.wait() == 0
    # llamaswap's own stop ran to its end: the polite request, then SIGKILL.
    assert "'stubborn': still running 3s after the stop request" in proxy.output.text()
    assert isinstance(pid, int)
    assert not alive(pid)
    assert survivors(proxy.marker) == []


async def test_ctrl_c_during_the_shutdown_stops_at_once(proxy_factory: StartProxy) -> None:
    """A model that ignores SIGTERM, with an unloadTimeout of ten minutes: a second
    Ctrl-C does not wait for it (it waited the ten minutes), but kills it, and exits 0."""
    proxy = await proxy_factory(
        config('[models.stubborn]\ncmd = "${fake} --ignore-sigterm"\nunloadTimeout = 600\n')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/stubborn")).status_code == 200
            pid = (await running(client))["stubborn"]["pid"]
    with trio.fail_after(30):
        proxy.process.send_signal(signal.SIGINT)
        await proxy.output.wait_for("received SIGTERM, ignoring it")  # the model's own line
        proxy.process.send_signal(signal.SIGINT)
        assert await proxy.process.wait() == 0
    assert "received SIGINT during the shutdown: stopping at once" in proxy.output.text()
    assert "model 'stubborn': stopping at once; sending SIGKILL" in proxy.output.text()
    assert isinstance(pid, int)
    assert not alive(pid)
    assert survivors(proxy.marker) == []


@pytest.mark.slow
async def test_models_outlive_idle_time_but_die_with_a_killed_llamaswap(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(TWO_MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/alpha")).status_code == 200
            pid = (await running(client))["alpha"]["pid"]
    assert isinstance(pid, int)
    # Idle time is the subject here: Trio retires an idle worker thread after about 10 s,
    # and a parent-death signal tied to the forking thread would kill the model with it.
    await trio.sleep(30)
    assert alive(pid)
    os.kill(proxy.process.pid, signal.SIGKILL)
    await wait_until(lambda: not alive(pid), within=2)
    await wait_until(lambda: not survivors(proxy.marker), within=2)


async def test_requests_still_running_after_the_shutdown_grace_end_with_a_clear_error(
    proxy_factory: StartProxy, nursery: trio.Nursery
) -> None:
    # Ten tokens a second, 600 tokens: a minute of generation, far past unloadTimeout.
    proxy = await proxy_factory(
        config('[models.slow]\ncmd = "${fake} --tokens-per-second 10"', unloadTimeout=1)
    )
    streamed: list[bytes] = []
    answered: list[httpx.Response] = []
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/api/models/load/slow")).status_code == 200

            async def plain() -> None:
                body = chat("slow", max_tokens=600)
                answered.append(await client.post("/v1/chat/completions", json=body))

            nursery.start_soon(plain)
            body = chat("slow", stream=True, max_tokens=600)
            async with client.stream("POST", "/v1/chat/completions", json=body) as stream:
                async for chunk in stream.aiter_raw():
                    if not streamed:  # both requests are being served: stop llamaswap
                        async with proxy.client() as probe:
                            while (await running(probe))["slow"]["in_flight"] != 2:  # noqa: ASYNC110
                                await trio.sleep(0.05)  # polling HTTP, bounded by fail_after
                        proxy.process.send_signal(signal.SIGTERM)
                    streamed.append(chunk)
            with trio.fail_after(10):
                assert await proxy.process.wait() == 0
            await wait_until(lambda: bool(answered), within=5)
    last = b"".join(streamed).strip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: {")
    error = json.loads(last[len(b"data: ") :])["error"]
    assert error["code"] == "shutting_down"
    assert "still running after unloadTimeout (1s)" in error["message"]
    assert answered[0].status_code == 503
    assert answered[0].json()["error"]["code"] == "shutting_down"
