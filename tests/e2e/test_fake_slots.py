"""The fake server's slots over real HTTP: ``timings.prompt_n`` counts only what its slot's cache
did not hold, and a slot saved by one process (``--slot-save-path``) and restored into a
fresh one keeps that (docs/fake_server.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from tests.e2e.test_fake_server import CHAT, fake_server, wait_healthy


def turn(*texts: str) -> dict[str, Any]:
    """A chat whose messages alternate user, assistant, user, ..."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]
    return {"model": "m", "messages": messages, "max_tokens": 5}


async def ask(client: httpx.AsyncClient, *texts: str) -> tuple[str, dict[str, Any]]:
    reply = await client.post(CHAT, json=turn(*texts))
    assert reply.status_code == 200, reply.text
    document = reply.json()
    return document["choices"][0]["message"]["content"], document["timings"]


async def test_a_restored_slot_spares_a_fresh_server_the_prefill(tmp_path: Path) -> None:
    first = "tell me about rivers"
    with trio.fail_after(30):
        async with (
            fake_server("--model-name", "m", "--slot-save-path", str(tmp_path)) as fake,
            httpx.AsyncClient(base_url=fake.url) as client,
        ):
            await wait_healthy(client, fake.url)
            answer, timings = await ask(client, first)
            assert (timings["cache_n"], timings["prompt_n"]) == (0, 4)
            # The next turn: the slot holds the first question and its answer.
            second, timings = await ask(client, first, answer, "and lakes")
            assert (timings["cache_n"], timings["prompt_n"]) == (4 + 5, 2)
            slots = (await client.get("/slots")).json()
            assert [(s["id"], s["n_prompt_tokens"]) for s in slots] == [(0, 4 + 5 + 2 + 5)]
            saved = await client.post("/slots/0?action=save", json={"filename": "s.bin"})
            assert saved.json()["n_saved"] == 16
            refused = await client.post("/slots/0?action=save", json={"filename": "../s.bin"})
            assert (refused.status_code, refused.json()["error"]["message"]) == (
                400,
                "Invalid filename",
            )

        third = (first, answer, "and lakes", second, "and seas")
        async with (
            fake_server("--model-name", "m", "--slot-save-path", str(tmp_path)) as fresh,
            httpx.AsyncClient(base_url=fresh.url) as client,
        ):
            await wait_healthy(client, fresh.url)
            # A fresh server processes the whole conversation...
            _, cold = await ask(client, *third)
            assert (cold["cache_n"], cold["prompt_n"]) == (0, 18)
            # ... and with the first one's slot restored, only what it did not hold.
            restored = await client.post("/slots/0?action=restore", json={"filename": "s.bin"})
            assert restored.json()["n_restored"] == 16
            _, warm = await ask(client, *third)
            assert (warm["cache_n"], warm["prompt_n"]) == (16, 2)


async def test_without_a_slot_save_path_slot_actions_are_refused() -> None:
    with trio.fail_after(30):
        async with fake_server() as fake, httpx.AsyncClient(base_url=fake.url) as client:
            await wait_healthy(client, fake.url)
            refused = await client.post("/slots/0?action=save", json={"filename": "s.bin"})
            assert refused.status_code == 501
            assert "--slot-save-path" in refused.json()["error"]["message"]
            assert (await client.get("/slots")).status_code == 200
