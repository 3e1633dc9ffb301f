"""A 429's Retry-After is estimated from what the proxy learned (resources/eta.py): the
real proxy and fake model server, the real clock."""

from __future__ import annotations

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_proxy import chat, config

#: 60 tokens at 20 a second: each request is served for 3 s (and a little).
SERVE = 3.0


async def test_concurrency_limit_says_when_the_request_in_service_is_due(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(
        config('[models.one]\ncmd = "${fake} --tokens-per-second 20"\nconcurrencyLimit = 1')
    )
    async with proxy.client() as client:
        with trio.fail_after(30):
            # Before any request was served there is no estimate: 1, as ever.
            body = chat("one", stream=True, max_tokens=60)
            async with client.stream("POST", "/v1/chat/completions", json=body) as first:
                refused = await client.post("/v1/chat/completions", json=chat("one"))
                assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
                await first.aread()
            # One request served for SERVE s is the figure: the next one in service is due
            # SERVE s after its grant, less the time it took to be refused.
            async with client.stream("POST", "/v1/chat/completions", json=body) as second:
                assert second.status_code == 200
                refused = await client.post("/v1/chat/completions", json=chat("one"))
                assert refused.status_code == 429
                assert refused.json()["error"]["code"] == "concurrency_limit"
                assert 2 <= int(refused.headers["retry-after"]) <= SERVE + 1
                await second.aread()
