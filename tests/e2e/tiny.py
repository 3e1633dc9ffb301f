"""Requests for the tiny generated models of the real-inference tiers (examples/tiny_model.py),
and what both tiers check with them alike."""

from __future__ import annotations

import httpx

from tests.e2e.harness import alive, pid_of, running

EOS = "2"  # the tiny models' end-of-text token id; a logit bias of -100 rules it out


def chat(model: str, max_tokens: int, **extra: object) -> dict[str, object]:
    """A greedy chat request that cannot end early: it runs to ``max_tokens``."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": {EOS: -100},
        **extra,
    }


def content(reply: httpx.Response) -> str:
    """A chat completion's text."""
    text = reply.json()["choices"][0]["message"]["content"]
    assert isinstance(text, str)
    return text


async def swap_between_the_two_models(client: httpx.AsyncClient) -> None:
    """tiny-a answers, then tiny-b: tiny-b's request evicts tiny-a, whose process ends."""
    first = await client.post("/v1/chat/completions", json=chat("tiny-a", 20))
    assert first.status_code == 200
    a_pid = await pid_of(client, "tiny-a")
    second = await client.post("/v1/chat/completions", json=chat("tiny-b", 20))
    assert second.status_code == 200
    assert second.json()["model"] == "tiny-b"
    assert set(await running(client)) == {"tiny-b"}
    assert not alive(a_pid)
    # Different weights, different greedy gibberish: the answer did come from the other file.
    assert content(first) != content(second)
