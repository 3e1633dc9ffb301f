"""``slotSavePath``: the real proxy saves a model's slots before a swap evicts it and restores
them after its next load, so the conversation's next turn skips its prefill (the fake
server's ``timings.prompt_n`` counts only what the restored slot did not hold); a reload
that removes the model deletes its files; ``slotSaveLimit`` bounds them; a server that
refuses is logged and the swap goes on. And the keeper's own time bound, against a server
that never answers. Real processes, sockets and clock; every wait bounded."""

from __future__ import annotations

import logging
import os
import re
import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llamaswap.config.model import Config, ModelConfig
from llamaswap.http.client import UpstreamPool
from llamaswap.process.slots import SlotKeeper, definition_tag, slot_file
from tests.e2e.conftest import StartProxy
from tests.e2e.harness import FAKE, free_port_base

FIRST = "tell me about rivers"  # 4 words
TOKENS = 5  # each answer's length


def config(slots: Path, *, kept: str = "ab", limit: str = "4GiB", refusing: str = "") -> str:
    """Models a, b, c and d on fake servers; those in ``kept`` have ``slotSavePath``, and
    their server its ``--slot-save-path`` (but those in ``refusing``: a server without
    it, which answers 501)."""
    folder = shlex.quote(str(slots))
    lines = [f'startPort = {free_port_base()}\nslotSaveLimit = "{limit}"\n']
    for model in "abcd":
        flag = f" --slot-save-path {folder}" if model in kept and model not in refusing else ""
        lines.append(f'[models.{model}]\ncmd = "{FAKE}{flag}"\n')
        if model in kept:
            lines.append(f'slotSavePath = "{slots}"\n')
    return "".join(lines)


async def ask(client: httpx.AsyncClient, model: str, *texts: str) -> tuple[str, dict[str, Any]]:
    """A chat of ``texts``, user and assistant in turn: its answer and its timings."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(texts)]
    body = {"model": model, "messages": messages, "max_tokens": TOKENS}
    reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-llamaswap-upstream"] == model
    document = reply.json()
    return document["choices"][0]["message"]["content"], document["timings"]


def files(slots: Path) -> dict[str, int]:
    """The slot files llamaswap named, by model, with their size."""
    found = {}
    for name in os.listdir(slots):
        match = re.fullmatch(r"llamaswap-(\w+)-[0-9a-f]{8}-slot0\.bin", name)
        assert match is not None, name
        found[match[1]] = (slots / name).stat().st_size
    return found


@pytest.fixture
def slots(tmp_path: Path) -> Path:
    """The slot directory (the proxy's config file is written to ``tmp_path``)."""
    folder = tmp_path / "slots"
    folder.mkdir()
    return folder


async def test_a_swap_saves_the_slots_and_the_next_load_restores_them(
    proxy_factory: StartProxy, slots: Path
) -> None:
    proxy = await proxy_factory(config(slots))
    async with proxy.client() as client:
        with trio.fail_after(60):
            answer, timings = await ask(client, "a", FIRST)
            assert (timings["cache_n"], timings["prompt_n"]) == (0, 4)
            await ask(client, "b", FIRST)  # evicts a, whose slot is saved first
            await proxy.output.wait_for(r"model 'a': saved 1 slot \(9 tokens\) to ")
            assert files(slots) == {"a": 9 * 1024}
            # a again (b saved, a restored): the next turn reads only its new words.
            _, timings = await ask(client, "a", FIRST, answer, "and lakes")
            assert (timings["cache_n"], timings["prompt_n"]) == (9, 2)
            await proxy.output.wait_for(r"model 'a': restored 1 slot \(9 tokens\) in ")
            assert files(slots) == {"a": 9 * 1024, "b": 9 * 1024}

            # c keeps no slots: the same conversation, after a swap, reads every word.
            answer, timings = await ask(client, "c", FIRST)
            _, timings = await ask(client, "a", FIRST)
            _, timings = await ask(client, "c", FIRST, answer, "and lakes")
            assert (timings["cache_n"], timings["prompt_n"]) == (0, 11)
    text = proxy.output.text()
    assert "slots" not in "".join(line for line in proxy.output.lines if "'c'" in line)
    assert "could not" not in text


async def test_a_restored_cache_outlives_a_load_that_served_nothing(
    proxy_factory: StartProxy, slots: Path
) -> None:
    # Loaded by name, a is restored and evicted again before serving: its server lists
    # the restored slot as unused (no task, no token count), yet it holds the cache, and
    # is saved again rather than lost.
    proxy = await proxy_factory(config(slots))
    async with proxy.client() as client:
        with trio.fail_after(60):
            answer, _ = await ask(client, "a", FIRST)
            await ask(client, "b", FIRST)
            assert (await client.post("/api/models/load/a")).status_code == 200
            assert (await client.post("/api/models/load/b")).status_code == 200
            mark = len(proxy.output.lines) - 1
            _, timings = await ask(client, "a", FIRST, answer, "and lakes")
            assert (timings["cache_n"], timings["prompt_n"]) == (9, 2)
    await proxy.output.wait_for(r"model 'a': restored 1 slot \(9 tokens\)", start=mark)
    assert proxy.output.text().count("model 'a': saved 1 slot (9 tokens)") == 2


async def test_a_reload_that_removes_a_model_deletes_its_files(
    proxy_factory: StartProxy, slots: Path
) -> None:
    proxy = await proxy_factory(config(slots))
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "a", FIRST)
            await ask(client, "b", FIRST)
            await ask(client, "a", FIRST)
            assert set(files(slots)) == {"a", "b"}
            # b is stopped: it is forgotten, and its files deleted, as the reload applies.
            proxy.config.write_text(config(slots).replace("[models.b]", "[models.x]"))
            answer = await client.post("/api/config/reload")
            assert answer.status_code == 200, answer.text
            assert answer.json()["changed"]["removed"] == ["b"]
            assert set(files(slots)) == {"a"}
    await proxy.output.wait_for(r"model 'b': removed from the configuration; deleted its 1 slot")


async def test_the_files_are_kept_within_slot_save_limit(
    proxy_factory: StartProxy, slots: Path
) -> None:
    # Each file holds 9 tokens, 9 KiB: two fit in 20 KiB, not three.
    proxy = await proxy_factory(config(slots, kept="abd", limit="20KiB"))
    async with proxy.client() as client:
        with trio.fail_after(60):
            answer, _ = await ask(client, "a", FIRST)
            await ask(client, "b", FIRST)  # saves a
            await ask(client, "d", FIRST)  # saves b: 18 KiB
            assert set(files(slots)) == {"a", "b"}
            await ask(client, "b", FIRST)  # saves d: 27 KiB, so a's (the oldest) goes
            await proxy.output.wait_for(
                r"slot files over slotSaveLimit \(20480 bytes\): deleted 1"
            )
            assert set(files(slots)) == {"b", "d"}
            # a comes back with nothing to restore: its next turn reads every word.
            _, timings = await ask(client, "a", FIRST, answer, "and lakes")
            assert (timings["cache_n"], timings["prompt_n"]) == (0, 11)


async def test_a_server_that_refuses_is_logged_and_the_swap_goes_on(
    proxy_factory: StartProxy, slots: Path
) -> None:
    # a's server has no --slot-save-path: llama-server, and the fake, answer 501.
    proxy = await proxy_factory(config(slots, refusing="a"))
    async with proxy.client() as client:
        with trio.fail_after(60):
            await ask(client, "a", FIRST)
            await ask(client, "b", FIRST)
    line = await proxy.output.wait_for(r"model 'a': could not save its slots: .*")
    assert "saving slot 0: the server answered 501: This server does not support slots" in line[0]
    assert "(saved 0 slots (0 tokens)); it will prefill again" in line[0]
    assert files(slots) == {}


async def test_a_server_that_never_answers_costs_the_keeper_its_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A server that accepts and never answers: the save gives up after its timeout,
    # says so once, and returns; nothing raises.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    definition = ModelConfig(
        cmd=("server",), proxy=f"http://127.0.0.1:{port}", slot_save_path=str(tmp_path)
    )
    (tmp_path / slot_file("m", definition, 0)).write_bytes(b"x")
    caplog.set_level(logging.INFO, logger="llamaswap.process.slots")
    async with trio.open_nursery() as nursery, UpstreamPool() as pool:
        nursery.start_soon(trio.serve_listeners, hold, listeners)
        keeper = SlotKeeper(pool, timeout=0.5)
        with trio.fail_after(10):
            began = trio.current_time()
            await keeper.save("m", definition, Config(models={"m": definition}), loading="x")
            assert 0.5 <= trio.current_time() - began < 5
            began = trio.current_time()
            await keeper.restore("m", definition)
            assert 0.5 <= trio.current_time() - began < 5
        nursery.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    tag = definition_tag("m", definition)
    assert warnings == [
        "model 'm': could not save its slots: gave up after 0.5s (saved 0 slots (0 tokens)); "
        "it will prefill again",
        "model 'm': could not restore its slots: gave up after 0.5s (restored 0 slots (0 tokens))",
    ]
    assert accepted  # it did try
    assert os.listdir(tmp_path) == [f"llamaswap-m-{tag}-slot0.bin"]  # the last file kept
