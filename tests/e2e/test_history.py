"""Looking back at requests through the real proxy: the activity statistics."""

from __future__ import annotations

from typing import Any

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_activity_store import STORED, activity, streamed_timings
from tests.e2e.test_proxy import chat


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
