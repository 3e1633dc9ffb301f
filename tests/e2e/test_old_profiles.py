"""llama-swap's older profiles end to end: ``aider:coder`` then ``aider:architect`` leave
both running (no group lets them, the profile does), each answered by its own server."""

from __future__ import annotations

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import pid_of, running
from tests.e2e.test_proxy import chat, config

AIDER = config(
    """
[models.coder]
cmd = "${fake}"
[models.architect]
cmd = "${fake}"
[models.other]
cmd = "${fake}"
[profiles.aider]
members = ["coder", "architect"]
"""
)


async def test_a_profile_keeps_its_models_running_together(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(AIDER)
    async with proxy.client() as client:
        with trio.fail_after(30):
            listed = [entry["id"] for entry in (await client.get("/v1/models")).json()["data"]]
            assert listed == ["coder", "architect", "other", "aider:coder", "aider:architect"]
            profiles = (await client.get("/api/profiles")).json()["profiles"]
            assert profiles == [
                {
                    "name": "aider",
                    "description": None,
                    "pins": {},
                    "members": ["coder", "architect"],
                }
            ]

            first = await client.post("/v1/chat/completions", json=chat("aider:coder"))
            assert first.status_code == 200, first.text
            assert first.headers["x-fake-model"] == "coder"
            coder = await pid_of(client, "coder")

            second = await client.post("/v1/chat/completions", json=chat("aider:architect"))
            assert second.status_code == 200, second.text
            assert second.headers["x-fake-model"] == "architect"
            assert set(await running(client)) == {"coder", "architect"}
            assert await pid_of(client, "coder") == coder  # never stopped in between

            # A member by its plain name is the same process; a model outside the profile
            # swaps both out, as the group rules say (one model at a time without groups).
            third = await client.post("/v1/chat/completions", json=chat("coder"))
            assert third.headers["x-fake-model"] == "coder"
            assert await pid_of(client, "coder") == coder
            other = await client.post("/v1/chat/completions", json=chat("other"))
            assert other.headers["x-fake-model"] == "other"
            assert set(await running(client)) == {"other"}

            missing = await client.post("/v1/chat/completions", json=chat("aider:other"))
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "model_not_found"
            assert "profile 'aider' has no such model" in missing.json()["error"]["message"]
            unknown = await client.post("/v1/chat/completions", json=chat("nope:coder"))
            assert unknown.status_code == 404
