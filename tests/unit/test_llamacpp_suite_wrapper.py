"""The wrapper of tests/benchmarks/llamacpp_server_suite.py: what it makes of the argument
lists llama.cpp's server test suite starts ``llama-server`` with (issue 31 §2)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from llamaswap.config import loads_config
from llamaswap.config.model import LogToStdout
from tests.benchmarks.llamacpp_server_suite import (
    llamaswap_config,
    local_args,
    model_names,
    names_sent,
    upstream_args,
)

TINY = "/models/tiny.gguf"


def test_hub_models_become_the_tiny_model() -> None:
    args = ["--port", "8080", "--hf-repo", "ggml-org/models", "--hf-file", "x.gguf", "-c", "512"]
    assert local_args(args, TINY) == ["--port", "8080", "-c", "512", "--model", TINY]


def test_a_local_model_is_kept_and_a_hub_projector_dropped() -> None:
    args = ["--model", "/here.gguf", "-mmu", "https://example.com/p.gguf", "--jinja"]
    assert local_args(args, TINY) == ["--model", "/here.gguf", "--jinja"]


def test_a_draft_from_a_hub_or_missing_becomes_the_tiny_model() -> None:
    assert local_args(["-hfd", "ggml-org/draft"], TINY) == ["--model-draft", TINY]
    assert local_args(["--model-draft", "/no/such.gguf"], TINY) == ["--model-draft", TINY]


def test_the_upstream_listens_on_llamaswaps_port_on_loopback() -> None:
    args = ["--port", "8080", "--host", "0.0.0.0", "-m", TINY]
    assert upstream_args(args) == ["--port", "${PORT}", "--host", "127.0.0.1", "-m", TINY]


def test_the_alias_names_the_model_and_every_other_name_reaches_it() -> None:
    args = ["--alias", "tinyllama-2,fim,code"]
    assert model_names(args, ["test", "fim"]) == ("tinyllama-2", ["fim", "code", "test"])
    assert model_names([], ["test"]) == ("tinyllama", ["test"])


def test_the_config_is_valid_and_serves_the_suites_arguments() -> None:
    args = ["--port", "8080", "--alias", "a", "--chat-template", 'say "hi"\n', "-m", TINY]
    config = loads_config(llamaswap_config("/bin/llama-server", "/libs", args, ["gpt-4.1"]))
    model = config.models["a"]
    assert model.aliases == ("gpt-4.1",)
    assert config.hooks.on_startup.preload == ("a",)
    assert config.log_to_stdout is LogToStdout.BOTH
    assert 'say "hi"\n' in model.cmd


def test_names_sent_reads_bodies_keywords_and_parametrized_columns(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        textwrap.dedent(
            """
            @pytest.mark.parametrize("model,prompt", [("codellama70b", "hi"), (None, "x")])
            def test_a(model, prompt):
                server.make_request("POST", "/v1/chat/completions", data={"model": "test"})
                client.completions.create(model="davinci-002", prompt="x")
            """
        )
    )
    assert names_sent([source]) == ["codellama70b", "davinci-002", "test"]
