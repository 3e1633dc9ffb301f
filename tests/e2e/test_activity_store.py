"""The activity log in a SQLite file, through the real proxy: it survives a restart.

Requests go through one proxy, which is stopped with SIGTERM; a second proxy on the same
config lists them, with the token speeds and cached tokens the fake model server reported.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import REPO, child_env
from tests.e2e.test_proxy import chat, config

STORED = config(
    """
[models.alpha]
cmd = "${fake} --tokens-per-second 200"
[models.beta]
cmd = "${fake}"
[store]
path = "activity.db"
maxRows = 1000
maxAge = "1d"
"""
)


async def activity(client: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    response = await client.get("/api/activity", params=params)
    assert response.status_code == 200, response.text
    records: list[dict[str, Any]] = response.json()["activity"]
    return records


async def streamed_timings(client: httpx.AsyncClient, body: dict[str, object]) -> Any:
    """Stream a chat completion; the ``timings`` of its last event."""
    timings = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"timings"' in line:
                timings = json.loads(line.removeprefix("data: "))["timings"]
    return timings


async def test_activity_survives_a_restart_with_token_speeds(
    proxy_factory: StartProxy, tmp_path: Path
) -> None:
    first = await proxy_factory(STORED)
    async with first.client() as client:
        with trio.fail_after(30):
            answer = await client.post("/v1/chat/completions", json=chat("alpha", max_tokens=8))
            assert answer.status_code == 200
            sent = answer.json()["timings"]
            options = {"include_usage": True}
            body = chat("alpha", stream=True, max_tokens=4, stream_options=options)
            streamed = await streamed_timings(client, body)
            missing = await client.post("/v1/chat/completions", json=chat("nope"))
            assert missing.status_code == 404
            embedded = await client.post("/v1/embeddings", json={"model": "beta", "input": "x"})
            assert embedded.status_code == 200
            before = await activity(client)
    assert [(r["id"], r["model"], r["status"]) for r in before] == [
        (4, "beta", 200),
        (3, "", 404),
        (2, "alpha", 200),
        (1, "alpha", 200),
    ]
    speeds = [(r["prompt_tokens_per_second"], r["generation_tokens_per_second"]) for r in before]
    assert speeds == [
        (None, None),  # embeddings report no timings
        (None, None),
        (streamed["prompt_per_second"], streamed["predicted_per_second"]),
        (sent["prompt_per_second"], sent["predicted_per_second"]),
    ]
    # The prompt tokens the server found in its cache (none: each prompt is new to it).
    cached = [r["cached_tokens"] for r in before]
    assert cached == [None, None, streamed["cache_n"], sent["cache_n"]] == [None, None, 0, 0]
    # The answer's first byte: of a stream (4 tokens at 200 per second), before its end.
    assert 0 < before[2]["ttft_ms"] < before[2]["duration_ms"]
    assert before[1]["ttft_ms"] is None  # llamaswap's own 404: no model server answered
    # 8 tokens at 200 per second take at least 40 ms: at most 200 tokens/s, and more than 0.
    assert 0 < sent["predicted_per_second"] <= 200.0
    assert before[2]["completion_tokens"] == 4  # the streamed usage chunk
    assert await first.terminate() == 0

    # The relative path is relative to the config file's directory, not the proxy's.
    assert (tmp_path / "activity.db").is_file()
    second = await proxy_factory(STORED)
    assert second.config != first.config  # a second file, in the same directory
    async with second.client() as client:
        with trio.fail_after(30):
            assert await activity(client) == before
            assert [r["id"] for r in await activity(client, model="alpha")] == [2, 1]
            assert [r["id"] for r in await activity(client, status="4xx")] == [3]
            assert [r["id"] for r in await activity(client, status="200", limit="2")] == [4, 2]
            assert await activity(client, until=before[-1]["time"]) == []
            since = await activity(client, since=before[-1]["time"], model="alpha")
            assert [r["id"] for r in since] == [2, 1]
            again = await client.post("/v1/chat/completions", json=chat("beta"))
            assert again.status_code == 200
            after = await activity(client)
            assert [r["id"] for r in after] == [5, 4, 3, 2, 1]  # IDs go on
            assert after[1:] == before
            timings = again.json()["timings"]
            assert after[0]["generation_tokens_per_second"] == timings["predicted_per_second"]


async def test_bad_filters_are_400_with_the_parameter(proxy_factory: StartProxy) -> None:
    for text in (STORED, config('[models.alpha]\ncmd = "${fake}"')):  # SQLite, then memory
        proxy = await proxy_factory(text)
        async with proxy.client() as client:
            with trio.fail_after(30):
                for params, param in [
                    ({"status": "20x"}, "status"),
                    ({"since": "last week"}, "since"),
                    ({"band": "urgent"}, "band"),
                    ({"limit": "-1"}, "limit"),
                    ({"mdoel": "alpha"}, "mdoel"),
                ]:
                    response = await client.get("/api/activity", params=params)
                    assert response.status_code == 400, (params, response.text)
                    error = response.json()["error"]
                    assert (error["type"], error["param"]) == ("invalid_request_error", param)
                response = await client.get("/api/activity", params={"band": "normal"})
                assert response.json() == {"activity": []}


async def test_a_store_that_cannot_be_opened_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "llamaswap.toml"
    path.write_text(STORED.replace('path = "activity.db"', 'path = "missing/activity.db"'))
    argv = [sys.executable, "-m", "llamaswap", "--config", str(path), "--listen", "127.0.0.1:0"]
    with trio.fail_after(20):
        result = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False,
            env=child_env(uuid.uuid4().hex), cwd=REPO,
        )  # fmt: skip
    assert result.returncode == 2
    assert b"listening on" not in result.stdout
    assert b"Traceback" not in result.stderr
    expected = (
        f"{path}: store.path: cannot use {str(tmp_path / 'missing' / 'activity.db')!r} as the "
        "activity store: unable to open database file"
    )
    assert expected in result.stderr.decode()
