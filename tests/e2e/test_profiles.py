"""Profiles and selectors end to end: the API switches the active profile, every route
sees its pins, the event stream says so, and a selector serves from the warm model."""

from __future__ import annotations

import json
from contextlib import aclosing

import httpx
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_live import LiveStream
from tests.e2e.test_proxy import chat, config

MODELS = config(
    """
[models.alpha]
cmd = "${fake}"
[models.beta]
cmd = "${fake}"
[routing.router.settings.groups.both]
members = ["alpha", "beta"]
swap = false

[selectors.best]
strategy = "warm"
targets = ["alpha", "beta"]
description = "whichever is loaded"

[profiles.beta-day]
description = "everything on beta"
pins = {alpha = "beta", coder = "best", off = ""}
"""
)


async def ids(client: httpx.AsyncClient) -> list[str]:
    return [entry["id"] for entry in (await client.get("/v1/models")).json()["data"]]


async def served_by(client: httpx.AsyncClient, name: str) -> str:
    response = await client.post("/v1/chat/completions", json=chat(name))
    assert response.status_code == 200, response.text
    running = (await client.get("/running")).json()["running"]
    return ",".join(sorted(entry["model"] for entry in running))


async def next_event(stream: LiveStream, kind: str) -> dict[str, object]:
    while (line := await stream.next_line()) is not None:
        if line.startswith("data: ") and json.loads(line[6:])["type"] == kind:
            event: dict[str, object] = json.loads(line[6:])
            return event
    raise AssertionError(f"the stream ended before a {kind!r} event")


async def test_a_profile_switched_at_run_time_pins_names_on_every_route(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(MODELS)
    events = await LiveStream.open(proxy.url, "/api/events")
    async with proxy.client() as client, aclosing(events):
        with trio.fail_after(30):
            assert (await next_event(events, "snapshot"))["profile"] is None
            profiles = (await client.get("/api/profiles")).json()
            assert profiles == {
                "active": None,
                "profiles": [
                    {
                        "name": "beta-day",
                        "description": "everything on beta",
                        "pins": {"alpha": "beta", "coder": "best", "off": ""},
                        "members": [],
                    }
                ],
            }
            assert await ids(client) == ["alpha", "beta", "best"]
            best = (await client.get("/v1/models/best")).json()
            assert best["description"] == "whichever is loaded"
            assert best["meta"]["llamaswap"]["selector"]["strategy"] == "warm"
            assert (
                await client.post("/v1/chat/completions", json=chat("coder"))
            ).status_code == 404

            answer = await client.put("/api/profiles/active", json={"profile": "beta-day"})
            assert answer.json()["active"] == "beta-day"
            assert await next_event(events, "profileChanged") == {
                "type": "profileChanged",
                "profile": "beta-day",
            }
            assert await ids(client) == ["alpha", "beta", "best", "coder"]
            assert (await client.get("/v1/models/alpha")).json()["meta"]["llamaswap"][
                "state"
            ] == "stopped"
            assert await served_by(client, "alpha") == "beta"  # pinned
            assert await served_by(client, "coder") == "beta"  # pinned to a warm selector
            off = await client.post("/v1/chat/completions", json=chat("off"))
            assert off.status_code == 404
            assert "turned off by the active profile 'beta-day'" in off.json()["error"]["message"]

            unknown = await client.put("/api/profiles/active", json={"profile": "night"})
            assert unknown.status_code == 400
            assert (await client.put("/api/profiles/active", json={})).status_code == 400
            none = await client.put("/api/profiles/active", json={"profile": None})
            assert none.json()["active"] is None
            assert (await next_event(events, "profileChanged"))["profile"] is None
            assert await served_by(client, "alpha") == "alpha,beta"
