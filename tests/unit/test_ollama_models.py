"""What Ollama's model routes say of a model (``proxy/ollama_models.py``), as pure code."""

from __future__ import annotations

from llamaswap.config import Capabilities
from llamaswap.proxy.ollama_models import capabilities, details, digest
from tests.unit.test_config import load


def test_capability_words_follow_the_configs_capabilities() -> None:
    assert capabilities(Capabilities()) == ["completion"]
    assert capabilities(Capabilities(in_=("text", "image"), tools=True)) == [
        "completion",
        "tools",
        "vision",
    ]
    assert capabilities(Capabilities(reranker=True)) == []


def test_details_name_a_gguf_format_only_where_the_command_names_a_gguf_file() -> None:
    config = load(
        """
        [models.a]
        cmd = "llama-server --port ${PORT} -m /models/Qwen3-8B-Q4_K_M.gguf"
        [models.b]
        cmd = "vllm serve Qwen/Qwen3-8B --port ${PORT}"
        """
    )
    assert details(config.models["a"])["format"] == "gguf"
    assert details(config.models["b"]) == details(None)
    assert set(details(None).values()) == {"", None}  # nothing it does not know


def test_a_digest_is_stable_and_differs_by_what_it_describes() -> None:
    assert digest("a", "cmd") == digest("a", "cmd")
    assert len({digest("a", "cmd"), digest("b", "cmd"), digest("a", "other"), digest("acmd")}) == 4
    assert all(c in "0123456789abcdef" for c in digest("a"))
    assert len(digest("a")) == 64
