"""llama.cpp's own clients see the same server through llamaswap (issue 31 §2): the same
requests, sent to llama-server directly and through llamaswap (one model, so requests
that name none are served by it), get the same status, the fields that matter and the
same bodies (less what differs on every call: ids, times)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import free_port_base, running
from tests.e2e.tiny import EOS

pytest.importorskip("gguf", reason="needs the gguf package: pip install -e '.[llamaserver]'")

pytestmark = pytest.mark.llamaserver

GREEDY = {"temperature": 0, "seed": 1, "logit_bias": [[EOS, False]]}
MESSAGES = [{"role": "user", "content": "hello"}]

#: (method, path, body): what llama-server's own clients send, naming no model.
REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/completion", {"prompt": "hello", "n_predict": 6, **GREEDY}),
    ("POST", "/completions", {"prompt": "hello", "max_tokens": 6, **GREEDY}),
    ("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 6, **GREEDY}),
    ("POST", "/chat/completions", {"messages": MESSAGES, "max_tokens": 6, **GREEDY}),
    ("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6, **GREEDY}),
    ("POST", "/tokenize", {"content": "hello world"}),
    ("POST", "/detokenize", {"tokens": [1, 2, 3]}),
    ("POST", "/apply-template", {"messages": MESSAGES}),
    ("GET", "/props", None),
    ("POST", "/chat/completions/input_tokens", {"messages": MESSAGES}),
    ("POST", "/v1/chat/completions/input_tokens", {"messages": MESSAGES}),
    ("POST", "/v1/responses/input_tokens", {"input": "hello world"}),
    ("POST", "/responses/input_tokens", {"input": "hello world"}),
    ("POST", "/tokenize", {"no_content": True}),  # llama-server's own error
    ("POST", "/completion", {"n_predict": 2}),  # no prompt: its own error
]
#: Fields that differ from one call to the next, whoever sends it (the prompt cache's
#: hits depend on the request before).
VOLATILE = frozenset(
    {"id", "created", "timings", "system_fingerprint", "prompt_tokens_details", "tokens_cached"}
)
#: Response fields compared (the rest may differ: Date, llamaswap's X-LlamaSwap-Upstream).
#: The CORS ones are llama-server's own: llamaswap never widens or replaces them.
FIELDS = (
    "content-type",
    "server",
    "access-control-allow-origin",
    "access-control-allow-credentials",
)
#: Every request comes from a page, as a chat UI's would.
PAGE = {"Origin": "http://localhost:3000"}


def stable(value: Any) -> Any:
    """``value`` without the volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(item) for item in value]
    return value


def summary(answer: httpx.Response) -> tuple[int, str, dict[str, str], Any]:
    body: Any = answer.text
    if answer.headers.get("content-type", "").startswith("application/json"):
        body = stable(answer.json())
    fields = {name: answer.headers.get(name, "") for name in FIELDS}
    return answer.status_code, answer.reason_phrase, fields, body


@pytest.fixture
def one_model(macros: str, tiny_models: Path) -> str:
    folder = shlex.quote(str(tiny_models / "tiny-a.gguf"))
    return f"""
healthCheckTimeout = 120
startPort = {free_port_base()}

[macros]
{macros}

[models.tiny-a]
cmd = "${{llama-server}} --host 127.0.0.1 --port ${{PORT}} -c 2048 -np 1 -m {folder}"
env = {{ LD_LIBRARY_PATH = "${{llama-libs}}" }}
"""


async def test_the_same_requests_get_the_same_answers_directly_and_through_llamaswap(
    proxy_factory: StartProxy, one_model: str
) -> None:
    proxy = await proxy_factory(one_model)
    async with proxy.client() as through:
        with trio.fail_after(120):
            assert (await through.post("/api/models/load/tiny-a")).status_code == 200
        address = (await running(through))["tiny-a"]["proxy"]
        assert isinstance(address, str)
        async with httpx.AsyncClient(base_url=address, timeout=60) as direct:
            for method, path, body in REQUESTS:
                with trio.fail_after(60):
                    asked = {"json": body, "headers": PAGE}
                    expected = summary(await direct.request(method, path, **asked))
                    got = summary(await through.request(method, path, **asked))
                assert got == expected, (method, path)
