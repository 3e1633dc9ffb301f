"""llama-swap's keys over real HTTP: setParamsByID, peer filters, timeouts, CORS, and the
``/upstream/{model}`` redirect."""

from __future__ import annotations

import re

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_fake_server import fake_server, wait_healthy
from tests.e2e.test_proxy import chat, config


async def completion_tokens(client: httpx.AsyncClient, model: str) -> int:
    response = await client.post("/v1/chat/completions", json=chat(model))
    assert response.status_code == 200, response.text
    tokens = response.json()["usage"]["completion_tokens"]
    assert isinstance(tokens, int)
    return tokens


async def test_set_params_by_id_sets_keys_for_the_name_requested(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            """
[models.alpha]
cmd = "${fake} --max-tokens 7"
[models.alpha.filters]
setParams = { max_tokens = 5 }
[models.alpha.filters.setParamsByID."${MODEL_ID}:short"]
max_tokens = 2
"""
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert await completion_tokens(client, "alpha:short") == 2
            assert await completion_tokens(client, "alpha") == 5
            models = (await client.get("/v1/models")).json()["data"]
            assert [entry["id"] for entry in models] == ["alpha"]


async def test_peer_filters_and_timeouts_apply_to_requests_for_the_peer(
    proxy_factory: StartProxy,
) -> None:
    async with fake_server("--max-tokens", "9", "--tokens-per-second", "100") as fake:
        url = f"http://127.0.0.1:{fake.port}"
        async with httpx.AsyncClient(timeout=10) as direct:
            with trio.fail_after(10):
                await wait_healthy(direct, url)
        proxy = await proxy_factory(
            config(
                f"""
[peers.far]
proxy = "{url}"
models = ["remote"]
filters = {{ stripParams = ["max_tokens"] }}
[peers.near]
proxy = "{url}"
models = ["other"]
filters = {{ setParams = {{ max_tokens = 4 }} }}
[peers.impatient]
proxy = "{url}"
models = ["slow"]
timeouts = {{ responseHeader = 0.1 }}
"""
            )
        )
        async with proxy.client() as client:
            with trio.fail_after(30):
                response = await client.post(
                    "/v1/chat/completions", json=chat("far/remote", max_tokens=3)
                )
                assert response.json()["usage"]["completion_tokens"] == 9  # stripped
                response = await client.post(
                    "/v1/chat/completions", json=chat("near/other", max_tokens=3)
                )
                assert response.json()["usage"]["completion_tokens"] == 4  # set
                response = await client.post(
                    "/v1/chat/completions", json=chat("impatient/slow", max_tokens=50)
                )  # half a second of tokens before the answer's head
                assert response.status_code == 502
                assert "no response within 0.1 s" in response.json()["error"]["message"]


async def test_response_header_timeout_gives_502(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config(
            """
[models.slow]
cmd = "${fake} --tokens-per-second 10"
timeouts = { responseHeader = 0.3 }
[models.quick]
cmd = "${fake} --tokens-per-second 10"
"""
        )
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.post("/v1/chat/completions", json=chat("slow", max_tokens=20))
            assert response.status_code == 502
            message = response.json()["error"]["message"]
            assert "no response within 0.3 s (timeouts.responseHeader)" in message
            # Streamed, the head comes at once: the limit is on the head only.
            response = await client.post(
                "/v1/chat/completions", json=chat("slow", max_tokens=10, stream=True)
            )
            assert response.status_code == 200
            assert response.text.rstrip().endswith("data: [DONE]")
            assert await completion_tokens(client, "quick") > 0  # no limit by default


async def test_cors_preflight_needs_no_key_and_answers_carry_the_origin(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.alpha]\ncmd = "${fake}"\n', apiKeys=["sk-1"]))
    preflight = {
        "Origin": "http://localhost:3000",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, bad header",
    }
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.options("/v1/chat/completions", headers=preflight)
            assert response.status_code == 204
            assert response.headers["access-control-allow-origin"] == "*"
            assert "POST" in response.headers["access-control-allow-methods"]
            assert response.headers["access-control-allow-headers"] == (
                "authorization, content-type"
            )
            assert response.headers["access-control-max-age"] == "86400"
            headers = {"Origin": "http://localhost:3000", "Authorization": "Bearer sk-1"}
            response = await client.post(
                "/v1/chat/completions", json=chat("alpha"), headers=headers
            )
            assert response.status_code == 200
            # The model server's own (the fake names the page, as llama-server does).
            assert response.headers.get_list("access-control-allow-origin") == [
                "http://localhost:3000"
            ]
            response = await client.get("/v1/models", headers={"Origin": "http://x"})
            assert response.status_code == 401  # the key is still needed for the request
            assert response.headers["access-control-allow-origin"] == "*"
            response = await client.get("/v1/models", headers={"Authorization": "Bearer sk-1"})
            assert "access-control-allow-origin" not in response.headers  # not from a page


async def test_cors_origins_restrict_who_may_call(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(
        config('[models.alpha]\ncmd = "${fake}"\n', corsOrigins=["http://app.local"])
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            ask = {"Access-Control-Request-Method": "POST"}
            allowed = await client.options(
                "/v1/models", headers={**ask, "Origin": "http://app.local"}
            )
            assert allowed.status_code == 204
            assert allowed.headers["access-control-allow-origin"] == "http://app.local"
            other = await client.options("/v1/models", headers={**ask, "Origin": "http://evil"})
            assert other.status_code == 204
            assert "access-control-allow-origin" not in other.headers
            response = await client.get("/health", headers={"Origin": "http://app.local"})
            assert response.headers["access-control-allow-origin"] == "http://app.local"
            assert response.headers["vary"] == "Origin"
            # The answer depends on Origin whatever the request: a cache must know it.
            for headers in ({"Origin": "http://evil"}, {}):
                response = await client.get("/health", headers=headers)
                assert "access-control-allow-origin" not in response.headers
                assert response.headers["vary"] == "Origin"


async def test_upstream_without_trailing_slash_redirects(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config('[models."org/alpha"]\ncmd = "${fake}"\n'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            response = await client.get("/upstream/org/alpha?x=1")
            assert response.status_code == 301
            assert response.headers["location"] == "/upstream/org/alpha/?x=1"
            assert (await client.get("/running")).json()["running"] == []  # nothing loaded
            response = await client.post("/upstream/org/alpha", content=b"{}")
            assert response.status_code == 308
            followed = await client.get("/upstream/org/alpha", follow_redirects=True)
            assert "no route for GET /" in followed.text  # the fake server's answer for "/"
            assert followed.url.path == "/upstream/org/alpha/"
            response = await client.get("/upstream/org/alpha/health")
            assert response.status_code == 200


async def test_log_to_stdout_upstream_shows_only_model_output(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config(
            '[models.alpha]\ncmd = "${fake}"\n',
            logToStdout="upstream",
            logTimeFormat="rfc3339",
        ).replace("logLevel = 'debug'", "logLevel = 'info'"),
        log_level="info",
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert await completion_tokens(client, "alpha") > 0
            line = await proxy.output.wait_for(r"\[alpha\] fake_server: request POST")
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)"
    assert re.match(rf"{stamp} DEBUG llamaswap\.process\.output: \[alpha\]", line.string)
    # llamaswap's own lines ("loading model 'alpha'", at info) are not shown.
    assert "loading model" not in proxy.output.text()


async def test_log_to_stdout_proxy_hides_model_output_below_debug(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config('[models.alpha]\ncmd = "${fake}"\n', logTimeFormat=""), log_level="info"
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert await completion_tokens(client, "alpha") > 0
            line = await proxy.output.wait_for(r"loading model 'alpha'")
            assert (await client.post("/api/models/unload")).status_code == 200
            # Stopped: its output has all been read by now.
            await proxy.output.wait_for(r"model 'alpha': stopped")
    assert line.string.startswith("INFO llamaswap")  # no timestamp
    assert "[alpha] fake_server" not in proxy.output.text()
