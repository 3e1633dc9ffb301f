"""Requests for the tiny generated models of the real-inference tiers (examples/tiny_model.py)."""

from __future__ import annotations

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
