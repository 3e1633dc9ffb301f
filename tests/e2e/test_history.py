"""Looking back at requests through the real proxy: the activity statistics, and the
captures of what requests sent and were answered."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from llamaswap.proxy.forward import SMALL_BODY
from tests.e2e.conftest import StartProxy
from tests.e2e.test_activity_store import STORED, activity, streamed_timings
from tests.e2e.test_fake_server import fake_server, wait_healthy
from tests.e2e.test_proxy import chat, config
from tests.e2e.test_reload import rewrite


async def test_statistics_per_model_over_the_window(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(STORED)
    async with proxy.client() as client:
        with trio.fail_after(30):
            for tokens in (2, 4, 6):
                answer = await client.post(
                    "/v1/chat/completions", json=chat("alpha", max_tokens=tokens)
                )
                assert answer.status_code == 200
            assert await streamed_timings(client, chat("alpha", stream=True, max_tokens=4))
            missing = await client.post("/v1/chat/completions", json=chat("nope"))
            assert missing.status_code == 404
            records = await activity(client, model="alpha")
            answer = await client.get("/api/activity/stats", params={"window": "15m"})
            assert answer.status_code == 200
            document = answer.json()
            bad = await client.get("/api/activity/stats", params={"window": "a while"})
    assert (document["window_seconds"], document["records"], document["truncated"]) == (
        900.0,
        5,
        False,
    )
    assert document["since"] < records[-1]["time"]
    assert list(document["models"]) == ["alpha"]  # the 404 reached no model
    alpha = document["models"]["alpha"]
    assert (alpha["requests"], alpha["errors"]) == (4, 0)

    def spread(field: str) -> dict[str, Any]:
        values = sorted(r[field] for r in records)
        return {"count": 4, "p50": values[1], "p95": values[3], "p99": values[3]}

    for field in ("queue_wait_ms", "ttft_ms", "generation_tokens_per_second", "duration_ms"):
        assert alpha[field] == spread(field), field
    assert alpha["completion_tokens"] == 2 + 4 + 6  # the stream sent no usage
    assert alpha["cached_tokens"] == alpha["draft_tokens"] == 0
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "window"


CAPTURING = config(
    """
[models.alpha]
cmd = "${fake} --tokens-per-second 500"
[models.beta]
cmd = "${fake}"
capture = false
""",
    apiKeys=["sk-capture-1"],
    capture=True,
    captureMaxBytes=1024,
)
KEY = {"x-api-key": "sk-capture-1"}


async def record_of(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    """The newest activity record of ``model``."""
    (record,) = await activity(client, model=model, limit="1")
    return record


async def test_captures_hold_what_was_sent_and_answered_without_credentials(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(CAPTURING)
    async with proxy.client(headers=KEY) as client:
        with trio.fail_after(30):
            body = json.dumps(chat("alpha", max_tokens=3)).encode()
            cookie = {"cookie": "session=s3cret", "content-type": "application/json"}
            answer = await client.post(
                "/v1/chat/completions?trace=1", content=body, headers=cookie
            )
            assert answer.status_code == 200
            record = await record_of(client, "alpha")
            captured = (await client.get(f"/api/captures/{record['id']}")).json()
            # A stream: the answer as the client read it, events and all.
            stream = chat("alpha", stream=True, max_tokens=200)
            async with client.stream("POST", "/v1/chat/completions", json=stream) as streamed:
                events = b"".join([chunk async for chunk in streamed.aiter_raw()])
            streamed_record = await record_of(client, "alpha")
            long = (await client.get(f"/api/captures/{streamed_record['id']}")).json()
            # A model with capture = false, and a capture that is not there.
            other = await client.post("/v1/chat/completions", json=chat("beta"))
            assert other.status_code == 200
            beta = await record_of(client, "beta")
            uncaptured = await client.get(f"/api/captures/{beta['id']}")
            refused = await client.get(
                f"/api/captures/{record['id']}", headers={"x-api-key": "no"}
            )
    assert (record["captured"], streamed_record["captured"], beta["captured"]) == (
        True,
        True,
        False,
    )
    request = captured["request"]
    assert (request["method"], request["path"], request["query"]) == (
        "POST",
        "/v1/chat/completions",
        "trace=1",
    )
    assert request["body"] == {"size": len(body), "kept": len(body), "text": body.decode()}
    names = [name for name, _ in request["headers"]]
    assert "content-type" in names
    assert not {"x-api-key", "cookie", "authorization"} & set(names)
    secrets = {"s3cret", "sk-capture-1"}
    assert [secret for secret in secrets if secret in json.dumps(captured)] == []
    response = captured["response"]
    assert response["status"] == 200
    assert ["content-type", "application/json"] in response["headers"]
    assert response["body"] == {
        "size": len(answer.content),
        "kept": len(answer.content),
        "text": answer.text,
    }
    # Cut at captureMaxBytes, counted whole.
    assert len(events) > 1024
    assert long["response"]["body"] == {
        "size": len(events),
        "kept": 1024,
        "text": events[:1024].decode(),
    }
    assert uncaptured.status_code == 404
    assert uncaptured.json()["error"]["code"] == "not_found"
    assert refused.status_code == 401


async def test_an_upload_streamed_through_is_captured_as_it_passes(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(CAPTURING)
    # Larger than SMALL_BODY: /upstream streams it to the model server once it is loaded.
    text = "word " * 60_000
    body = json.dumps(chat("alpha", max_tokens=1, messages=[{"role": "user", "content": text}]))
    async with proxy.client(headers=KEY) as client:
        with trio.fail_after(30):
            answer = await client.post(
                "/upstream/alpha/v1/chat/completions",
                content=body.encode(),
                headers={"content-type": "application/json"},
            )
            assert answer.status_code == 200
            record = await record_of(client, "alpha")
            captured = (await client.get(f"/api/captures/{record['id']}")).json()
    assert len(body) > SMALL_BODY
    assert captured["request"]["path"] == "/upstream/alpha/v1/chat/completions"
    assert captured["request"]["body"] == {"size": len(body), "kept": 1024, "text": body[:1024]}


async def test_requests_to_a_peer_follow_the_top_level_capture(
    proxy_factory: StartProxy,
) -> None:
    async with fake_server() as fake:
        url = f"http://127.0.0.1:{fake.port}"
        async with httpx.AsyncClient(timeout=10) as direct:
            with trio.fail_after(10):
                await wait_healthy(direct, url)
        peer = f"""
[peers.far]
proxy = "{url}"
models = ["remote"]
apiKey = "sk-peer-1"
filters = {{ stripParams = ["max_tokens"] }}
"""
        proxy = await proxy_factory(config(peer, capture=True))
        async with proxy.client() as client:
            with trio.fail_after(30):
                body = chat("far/remote", max_tokens=3)
                answer = await client.post("/v1/chat/completions", json=body)
                assert answer.status_code == 200
                record = await record_of(client, "far/remote")
                captured = (await client.get(f"/api/captures/{record['id']}")).json()
    # The client's request, as it sent it (the peer got it without max_tokens, with its key).
    assert json.loads(captured["request"]["body"]["text"]) == body
    assert captured["response"]["body"]["text"] == answer.text
    assert "sk-peer-1" not in json.dumps(captured)


async def test_a_reload_that_turns_capture_on_applies_to_the_next_request(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config('[models.alpha]\ncmd = "${fake}"'))
    async with proxy.client() as client:
        with trio.fail_after(30):
            assert (await client.post("/v1/chat/completions", json=chat("alpha"))).is_success
            before = await record_of(client, "alpha")
            # The top-level key before the first table: alpha inherits it.
            rewrite(proxy.config, "capture = true\n" + proxy.config.read_text())
            reloaded = (await client.post("/api/config/reload")).json()
            assert (await client.post("/v1/chat/completions", json=chat("alpha"))).is_success
            after = await record_of(client, "alpha")
            captured = await client.get(f"/api/captures/{after['id']}")
    assert reloaded["changed"]["updated"] == ["alpha"]  # the same process: no restart
    assert (before["captured"], after["captured"]) == (False, True)
    assert captured.json()["response"]["status"] == 200
