"""Ollama's model routes (``/api/tags``, ``/api/ps``, ``/api/show``) through a real proxy,
read with the ``ollama`` Python package; their keys and browser rules."""

from __future__ import annotations

import datetime

import httpx
import ollama
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.test_ollama_chat import client
from tests.e2e.test_proxy import config

MODELS = """
[models.chat]
cmd = "${fake} --model-name qwen"
aliases = ["qwen"]
ttl = 600
[models.chat.capabilities]
in = ["text", "image"]
out = ["text"]
tools = true
context = 32768
[models.sorter]
cmd = "${fake}"
capabilities.reranker = true
[models.hidden]
cmd = "${fake}"
unlisted = true
[routing.router.settings.groups.all]
members = ["chat", "sorter", "hidden"]
swap = false
"""


def when(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_tags_ps_and_show_with_the_ollama_client(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(config(MODELS, includeAliasesInList=True))
    with trio.fail_after(30):
        async with client(proxy) as ask:
            listed = await ask.list()
            # /v1/models' names, in its order: aliases too, the unlisted model not.
            async with proxy.client() as http:
                openai = [entry["id"] for entry in (await http.get("/v1/models")).json()["data"]]
            assert [model.model for model in listed.models] == openai == ["chat", "qwen", "sorter"]
            chat, alias, _ = listed.models
            assert chat.digest
            assert len(chat.digest) == 64
            assert alias.digest != chat.digest  # a name of its own
            assert chat.details is not None
            assert chat.details.format == ""  # its cmd names no .gguf file
            assert (await ask.ps()).models == []

            before = datetime.datetime.now(datetime.timezone.utc)
            await ask.chat(model="chat", messages=[{"role": "user", "content": "hi"}])
            [running] = (await ask.ps()).models
            assert running.model == "chat"
            assert running.expires_at is not None
            # Idle from now, its ttl of 600 s unloads it then.
            left = (running.expires_at - before).total_seconds()
            assert 599 <= left <= 630, left

            shown = await ask.show("qwen")
            assert shown.capabilities == ["completion", "tools", "vision"]
            assert shown.modelinfo == {
                "general.architecture": "llamaswap",
                "llamaswap.context_length": 32768,  # the config's, over the server's 4096
            }
            reranker = await ask.show("sorter")
            assert reranker.capabilities == []
            # Never loaded, and no context in its config: its length is not known.
            assert reranker.modelinfo == {"general.architecture": "llamaswap"}
            with pytest.raises(ollama.ResponseError) as info:
                await ask.show("nope")
    assert info.value.status_code == 404
    assert info.value.error.startswith("model 'nope' not found")


async def test_a_gguf_command_says_its_format(proxy_factory: StartProxy) -> None:
    text = config('[models.m]\ncmd = "${fake} --model-name x /models/Q.GGUF"\n')
    proxy = await proxy_factory(text)
    async with proxy.client() as http:
        with trio.fail_after(30):
            [model] = (await http.get("/api/tags")).json()["models"]
    assert model["details"]["format"] == "gguf"


async def test_the_routes_take_the_api_key_and_say_a_missing_one_as_ollama_does(
    proxy_factory: StartProxy,
) -> None:
    proxy = await proxy_factory(config(MODELS, apiKeys=["sk-1"]))
    with trio.fail_after(30):
        async with client(proxy, Authorization="Bearer sk-1") as ask:
            assert len((await ask.list()).models) == 2
        async with client(proxy) as ask:
            with pytest.raises(ollama.ResponseError) as info:
                await ask.list()
            assert info.value.status_code == 401
            assert info.value.error.startswith("missing or invalid API key")
            with pytest.raises(ollama.ResponseError) as info:
                await ask.chat(model="chat", messages=[])
            assert info.value.status_code == 401


async def test_another_sites_page_may_read_them_as_it_may_read_the_model_list(
    proxy_factory: StartProxy,
) -> None:
    # corsOrigins' default "*" applies, as to /v1/models; a POST /api/show changes nothing.
    proxy = await proxy_factory(config(MODELS))
    page = {"Origin": "https://chat.example", "Sec-Fetch-Site": "cross-site"}
    async with httpx.AsyncClient(base_url=proxy.url) as http:
        with trio.fail_after(30):
            tags = await http.get("/api/tags", headers=page)
            shown = await http.post("/api/show", json={"model": "chat"}, headers=page)
            management = await http.get("/running", headers=page)
    assert tags.status_code == shown.status_code == 200
    assert tags.headers["access-control-allow-origin"] == "*"
    assert shown.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in management.headers
