"""The config loader: defaults, a full example, error reporting, whole-config validation."""

from __future__ import annotations

import logging
import pathlib
import textwrap
from collections.abc import Mapping

import pytest

from llamaswap.config import (
    Capabilities,
    Config,
    FilterConfig,
    GroupConfig,
    LogLevel,
    ModelConfig,
    PeerConfig,
    load_config,
    loads_config,
)
from llamaswap.errors import ConfigError
from llamaswap.keypaths import did_you_mean
from tests.unit.ports import every_port_free


def load(text: str, environ: Mapping[str, str] | None = None) -> Config:
    return loads_config(
        textwrap.dedent(text), file="test.toml", environ=environ or {}, free=every_port_free
    )


def problems_of(text: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every problem reported for ``text``, as key path → message."""
    with pytest.raises(ConfigError) as info:
        load(text, environ)
    found: dict[str, str] = {}
    for problem in info.value.problems:
        assert problem.path not in found, f"two problems at {problem.path}"
        found[problem.path] = problem.message
    return found


MINIMAL = """
[models.m]
cmd = "server --port ${PORT}"
"""


# --- defaults and a full example -------------------------------------------------------------


def test_empty_file_gives_every_top_level_default() -> None:
    config = load("")
    assert config == Config()
    assert config.health_check_timeout == 120.0
    assert config.log_level is LogLevel.INFO
    assert config.start_port == 5800
    assert config.global_ttl == 0.0
    assert config.unload_timeout == 10.0
    assert config.api_keys == ()
    assert config.send_loading_state is False
    assert config.include_aliases_in_list is False
    assert config.max_body_bytes == 33_554_432
    assert config.macros == {}
    assert config.models == {}
    assert config.routing.router.use == "group"
    assert config.routing.router.settings.groups == {}
    assert config.routing.router.settings.matrix is None
    assert config.routing.scheduler.use == "fifo"
    assert config.routing.scheduler.settings.fifo.priority == {}
    assert config.routing.scheduler.settings.serial.aging_divisor == 60.0
    assert config.routing.scheduler.settings.serial.swap_affinity_bonus == 10
    assert config.routing.scheduler.settings.serial.max_queued == 100_000
    assert config.hooks.on_startup.preload == ()
    assert config.peers == {}


def test_model_defaults() -> None:
    model = load(MINIMAL).models["m"]
    assert model == ModelConfig(
        cmd=("server", "--port", "5800"),
        cmd_stop=None,
        proxy="http://127.0.0.1:5800",
        check_endpoint="/health",
        ttl=0.0,
        unload_timeout=10.0,
        aliases=(),
        env={},
        name=None,
        description=None,
        unlisted=False,
        use_model_name=None,
        concurrency_limit=None,  # fifo: 10; serial: none (it queues)
        filters=FilterConfig(strip_params=(), set_params={}),
        metadata={},
        send_loading_state=False,
    )
    assert model.health_url == "http://127.0.0.1:5800/health"


def test_spec_example_loads() -> None:
    config = load(
        """
        startPort = 5800

        [macros]
        fake = "python -m llamaswap.fake_server --port ${PORT} --model-name ${MODEL_ID}"

        [models.chat]
        cmd = "${fake} --load-seconds 2"
        aliases = ["gpt-4o-mini"]
        ttl = 300

        [models.coder]
        cmd = ["llama-server", "--port", "${PORT}", "-m", "/models/coder.gguf"]

        [routing.scheduler]
        use = "serial"

        [routing.scheduler.settings.serial]
        agingDivisor = "30s"
        swapAffinityBonus = 10
        """
    )
    chat, coder = config.models["chat"], config.models["coder"]
    assert chat.cmd == (
        *("python", "-m", "llamaswap.fake_server", "--port", "5800"),
        *("--model-name", "chat", "--load-seconds", "2"),
    )
    assert chat.proxy == "http://127.0.0.1:5800"
    assert chat.aliases == ("gpt-4o-mini",)
    assert chat.ttl == 300.0
    assert coder.cmd == ("llama-server", "--port", "5801", "-m", "/models/coder.gguf")
    assert coder.proxy == "http://127.0.0.1:5801"
    assert config.routing.scheduler.use == "serial"
    assert config.routing.scheduler.settings.serial.aging_divisor == 30.0
    assert config.resolve("gpt-4o-mini") == "chat"


def test_every_key_can_be_set() -> None:
    config = load(
        """
        healthCheckTimeout = "2m"
        logLevel = "debug"
        startPort = 9000
        globalTTL = 600
        unloadTimeout = 5
        apiKeys = ["k1", "k2"]
        sendLoadingState = true
        includeAliasesInList = true
        maxBodyBytes = 1024

        [models.chat]
        cmd = "server --port ${PORT}"
        cmdStop = "stop ${PID}"
        checkEndpoint = "none"
        aliases = ["c"]
        env = { A = "1" }
        name = "Chat"
        description = "a chat model"
        unlisted = true
        useModelName = "upstream-chat"
        concurrencyLimit = 3
        metadata = { size = 7, tags = ["x"] }
        filters = { stripParams = ["top_k"], setParams = { temperature = 0.5 } }

        [models.embed]
        cmd = ["embedder"]
        proxy = "https://embed.example:8443"
        ttl = 0
        unloadTimeout = "500ms"
        sendLoadingState = false

        [routing.router.settings.groups.big]
        members = ["chat"]
        swap = false
        exclusive = false
        persistent = true

        [routing.scheduler.settings.fifo.priority]
        c = 5
        embed = -1

        [hooks.on_startup]
        preload = ["embed"]

        [peers.gpu2]
        proxy = "http://gpu2:8080"
        apiKey = "secret"
        models = ["big-model"]
        """
    )
    assert config.health_check_timeout == 120.0
    assert config.log_level is LogLevel.DEBUG
    assert (config.start_port, config.global_ttl, config.unload_timeout) == (9000, 600.0, 5.0)
    assert config.api_keys == ("k1", "k2")
    assert config.send_loading_state is True
    assert config.include_aliases_in_list is True
    assert config.max_body_bytes == 1024
    chat = config.models["chat"]
    assert chat.cmd == ("server", "--port", "9000")
    assert chat.cmd_stop == ("stop", "${PID}")
    assert chat.health_url is None
    assert (chat.name, chat.description, chat.use_model_name) == (
        "Chat",
        "a chat model",
        "upstream-chat",
    )
    assert chat.unlisted is True
    assert chat.concurrency_limit == 3
    assert chat.ttl == 600.0  # globalTTL
    assert chat.unload_timeout == 5.0  # top-level unloadTimeout
    assert chat.send_loading_state is True  # top-level sendLoadingState
    assert chat.env == {"A": "1"}
    assert chat.metadata == {"size": 7, "tags": ["x"]}
    assert chat.filters == FilterConfig(strip_params=("top_k",), set_params={"temperature": 0.5})
    embed = config.models["embed"]
    assert embed.proxy == "https://embed.example:8443"
    assert (embed.ttl, embed.unload_timeout, embed.send_loading_state) == (0.0, 0.5, False)
    assert config.routing.router.settings.groups == {
        "big": GroupConfig(members=("chat",), swap=False, exclusive=False, persistent=True)
    }
    assert config.routing.scheduler.settings.fifo.priority == {"c": 5, "embed": -1}
    assert config.hooks.on_startup.preload == ("embed",)
    assert config.peers == {
        "gpu2": PeerConfig(proxy="http://gpu2:8080", models=("big-model",), api_key="secret")
    }


# --- reporting -------------------------------------------------------------------------------


def test_several_problems_are_reported_at_once() -> None:
    found = problems_of(
        """
        healthCheckTimout = 30

        [models.chat]
        cmd = "server --port ${PORT}"
        ttl = "5 minutes"

        [routing.scheduler]
        use = "seriel"
        """
    )
    assert found.pop("healthCheckTimout").startswith(
        "unknown key 'healthCheckTimout'; did you mean 'healthCheckTimeout'? "
        "this table's keys are "
    )
    assert found == {
        "models.chat.ttl": (
            "expected a number of seconds or a duration like \"90s\", got '5 minutes'"
        ),
        "routing.scheduler.use": (
            "expected one of 'fifo', 'serial', got 'seriel'; did you mean 'serial'?"
        ),
    }


def test_error_message_names_file_and_counts_problems() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config("startPort = 'x'\nlogLevel = 3\n", file="conf.toml", free=every_port_free)
    error = info.value
    assert error.file == "conf.toml"
    assert str(error).startswith("2 problems in conf.toml:\n")
    assert "  conf.toml: startPort: expected an integer, got 'x'" in str(error)


def test_whole_config_checks_still_run_when_a_value_has_the_wrong_type() -> None:
    found = problems_of(
        """
        [models.a]
        cmd = "a --port ${PORT}"
        ttl = "soon"
        aliases = ["x"]

        [models.b]
        cmd = "b --port ${PORT}"
        aliases = ["x"]
        """
    )
    assert set(found) == {"models.a.ttl", "models.b.aliases[0]"}


def test_references_to_an_invalid_model_are_not_reported_twice() -> None:
    found = problems_of(
        """
        [models.a]
        ttl = 5
        aliases = ["alpha"]

        [hooks.on_startup]
        preload = ["a", "alpha"]
        """
    )
    assert found == {"models.a.cmd": "required key is missing"}


def test_unknown_key_without_a_close_match_lists_the_known_keys() -> None:
    found = problems_of(MINIMAL + "zebra = 1\n")
    message = found["models.m.zebra"]
    assert message.startswith("unknown key 'zebra'; this table's keys are 'aliases', ")
    assert "'useModelName'" in message


def test_capabilities_take_llama_swap_s_keys_and_modalities() -> None:
    config = load(
        MINIMAL + 'capabilities = { in = ["text", "image"], out = ["text"], tools = true, '
        "context = 32768 }\n"
    )
    assert config.models["m"].capabilities == Capabilities(
        in_=("text", "image"), out=("text",), tools=True, context=32768
    )
    assert load(MINIMAL).models["m"].capabilities == Capabilities()  # context 0: not set
    assert problems_of(MINIMAL + 'capabilities = { in = ["video"], context = -1 }\n') == {
        "models.m.capabilities.in[0]": "expected one of 'text', 'audio', 'image', got 'video'",
        "models.m.capabilities.context": (
            "expected 0 (not set) or a number of tokens from 1 to 100000000, got -1"
        ),
    }


def test_unknown_key_with_a_close_match_suggests_it_before_the_known_keys() -> None:
    # "tll" is one letter from "ttl" but only 0.67 alike for difflib: it got the list alone.
    found = problems_of(MINIMAL + "tll = 5\n")
    assert found == {
        "models.m.tll": (
            "unknown key 'tll'; did you mean 'ttl'? this table's keys are 'aliases', "
            "'anthropic', 'capabilities', 'capture', 'checkEndpoint', 'cmd', 'cmdStop', "
            "'concurrencyLimit', 'description', 'env', 'files', 'filters', 'memory', "
            "'metadata', 'name', 'ollama', "
            "'preemptible', 'proxy', 'sendLoadingState', 'slotSavePath', 'slots', 'timeouts', "
            "'ttl', 'unlisted', 'unloadTimeout', 'useModelName'"
        )
    }


@pytest.mark.parametrize(
    ("word", "close"),
    [
        ("tll", "ttl"),  # a letter wrong
        ("ttll", "ttl"),  # a letter extra
        ("smt", None),  # nothing close: no guess
        ("clmd", "cmd"),
        ("nmae", "name"),  # two letters swapped
        ("evn", "env"),
    ],
)
def test_one_slip_of_the_finger_is_a_close_match(word: str, close: str | None) -> None:
    keys = ["cmd", "env", "name", "slots", "ttl"]
    assert did_you_mean(word, keys) == close


def test_unknown_key_is_reported_at_its_own_path() -> None:
    found = problems_of("[routing.scheduler.settings.serial]\nagingDivizor = 3\n")
    assert found == {
        "routing.scheduler.settings.serial.agingDivizor": (
            "unknown key 'agingDivizor'; did you mean 'agingDivisor'? this table's keys are "
            "'agingDivisor', 'maxPreemptions', 'maxQueued', 'preempt', 'slots', "
            "'swapAffinityBonus'"
        )
    }


def test_toml_syntax_error_gives_line_and_column() -> None:
    with pytest.raises(ConfigError) as info:
        loads_config(
            'startPort = 5800\nlogLevel = = "info"\n', file="bad.toml", free=every_port_free
        )
    (problem,) = info.value.problems
    assert (problem.line, problem.column) == (2, 12)
    assert problem.message.startswith("invalid TOML: ")
    assert problem.render("bad.toml").startswith("bad.toml:2:12: invalid TOML: ")


def test_a_byte_order_mark_before_the_toml_is_no_error(tmp_path: pathlib.Path) -> None:
    """As Windows editors save UTF-8: the mark is no part of the document."""
    path = tmp_path / "config.toml"
    path.write_text("\ufeffstartPort = 6000\n" + MINIMAL, encoding="utf-8")
    assert load_config(path, free=every_port_free).start_port == 6000


def test_load_config_reads_a_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINIMAL, encoding="utf-8")
    assert load_config(path, free=every_port_free).models["m"].cmd == ("server", "--port", "5800")


def test_load_config_missing_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, free=every_port_free)
    assert info.value.file == str(path)
    (problem,) = info.value.problems
    assert problem.message.startswith("cannot read the file: ")


def test_load_config_reports_the_file_name(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("logLevel = 'loud'\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, free=every_port_free)
    assert f"{path}: logLevel: expected one of" in str(info.value)


# --- inherited defaults ----------------------------------------------------------------------


def test_models_inherit_top_level_defaults_unless_set() -> None:
    config = load(
        """
        globalTTL = "5m"
        unloadTimeout = 3
        sendLoadingState = true

        [models.a]
        cmd = "a --port ${PORT}"

        [models.b]
        cmd = "b --port ${PORT}"
        ttl = 0
        unloadTimeout = 1
        sendLoadingState = false
        """
    )
    a, b = config.models["a"], config.models["b"]
    assert (a.ttl, a.unload_timeout, a.send_loading_state) == (300.0, 3.0, True)
    assert (b.ttl, b.unload_timeout, b.send_loading_state) == (0.0, 1.0, False)


def test_invalid_top_level_default_is_reported_once() -> None:
    found = problems_of(
        """
        globalTTL = "forever"
        sendLoadingState = "yes"

        [models.a]
        cmd = "a --port ${PORT}"

        [models.b]
        cmd = "b --port ${PORT}"
        """
    )
    assert found == {
        "globalTTL": "expected a number of seconds or a duration like \"90s\", got 'forever'",
        "sendLoadingState": "expected true or false, got 'yes'",
    }


# --- whole-config validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            MINIMAL + 'checkEndpoint = "health"\n',
            "models.m.checkEndpoint",
            "expected a path starting with '/' or \"none\", got 'health'",
        ),
        (
            MINIMAL + 'proxy = "localhost:8080"\n',
            "models.m.proxy",
            "expected an http:// or https:// URL, got 'localhost:8080'",
        ),
        (
            MINIMAL + "concurrencyLimit = 0\n",
            "models.m.concurrencyLimit",
            "expected a limit from 1 to 10000, got 0",
        ),
        ("startPort = 0\n", "startPort", "expected a port from 1 to 65535, got 0"),
        ("startPort = 70000\n", "startPort", "expected a port from 1 to 65535, got 70000"),
        (
            "maxBodyBytes = 0\n",
            "maxBodyBytes",
            "expected a size from 1 to 1073741824 bytes (1 GiB), got 0 bytes",
        ),
        (
            '[models."my\\tmodel"]\ncmd = "s --port ${PORT}"\n',
            'models."my\\u0009model"',
            "model ID 'my\\tmodel' must not be empty, start or end with a space, or hold "
            "whitespace but spaces",
        ),
        (
            MINIMAL + 'aliases = ["a b "]\n',
            "models.m.aliases[0]",
            "alias 'a b ' must not be empty, start or end with a space, or hold whitespace "
            "but spaces",
        ),
        (
            'logLevel = "verbose"\n',
            "logLevel",
            "expected one of 'debug', 'info', 'warn', 'error', got 'verbose'",
        ),
        (
            'logLevel = "warning"\n',
            "logLevel",
            "expected one of 'debug', 'info', 'warn', 'error', got 'warning'; "
            "did you mean 'warn'?",
        ),
        (
            '[routing.router]\nuse = "groups"\n',
            "routing.router.use",
            "expected one of 'group', 'matrix', got 'groups'; did you mean 'group'?",
        ),
        (
            '[routing.router]\nuse = "matrix"\n',
            "routing.router.settings.matrix",
            'required when routing.router.use = "matrix"; define vars and sets there',
        ),
        (
            "[routing.scheduler.settings.serial]\nswapAffinityBonus = -1\n",
            "routing.scheduler.settings.serial.swapAffinityBonus",
            "expected 0 or more, got -1",
        ),
        (
            "[routing.scheduler.settings.serial]\nagingDivisor = -1\n",
            "routing.scheduler.settings.serial.agingDivisor",
            "expected a duration of 0 seconds or more, got -1",
        ),
        ("[models.x]\nttl = 1\n", "models.x.cmd", "required key is missing"),
        ("[models]\nx = 5\n", "models.x", "expected a table, got 5"),
        ("models = 5\n", "models", "expected a table, got 5"),
        ('apiKeys = "k"\n', "apiKeys", "expected an array, got 'k'"),
        (MINIMAL + 'unlisted = "yes"\n', "models.m.unlisted", "expected true or false, got 'yes'"),
        (
            MINIMAL + "concurrencyLimit = true\n",
            "models.m.concurrencyLimit",
            "expected an integer, got True",
        ),
        (
            MINIMAL + "concurrencyLimit = 1.5\n",
            "models.m.concurrencyLimit",
            "expected an integer, got 1.5",
        ),
        (MINIMAL + "name = 5\n", "models.m.name", "expected a string, got 5"),
        (MINIMAL + 'aliases = ["ok", 5]\n', "models.m.aliases[1]", "expected a string, got 5"),
    ],
)
def test_single_problem(text: str, path: str, message: str) -> None:
    assert problems_of(text) == {path: message}


TWO_MODELS = """
[models.chat]
cmd = "chat --port ${PORT}"
aliases = ["gpt"]

[models.coder]
cmd = "coder --port ${PORT}"
"""


def test_alias_used_twice_is_reported_at_the_second_use() -> None:
    found = problems_of(
        """
        [models.a]
        cmd = "a --port ${PORT}"
        aliases = ["x"]

        [models.b]
        cmd = "b --port ${PORT}"
        aliases = ["x"]
        """
    )
    assert found == {"models.b.aliases[0]": "alias 'x' is already used by models.a"}


def test_alias_may_not_be_another_models_id() -> None:
    found = problems_of(TWO_MODELS + 'aliases = ["chat"]\n')
    assert found == {"models.coder.aliases[0]": "alias 'chat' is already the ID of models.chat"}


def test_group_members_must_be_known_models() -> None:
    found = problems_of(
        TWO_MODELS + '[routing.router.settings.groups.g1]\nmembers = ["chat", "codr", "gpt"]\n'
    )
    assert found == {
        "routing.router.settings.groups.g1.members[1]": (
            "unknown model 'codr'; did you mean 'coder'?"
        ),
        "routing.router.settings.groups.g1.members[2]": (
            "'gpt' is an alias; list the model ID 'chat'"
        ),
    }


def test_unknown_group_member_without_close_match_lists_models() -> None:
    found = problems_of(TWO_MODELS + '[routing.router.settings.groups.g1]\nmembers = ["zzz"]\n')
    assert found == {
        "routing.router.settings.groups.g1.members[0]": (
            "unknown model 'zzz'; known models: 'chat', 'coder'"
        )
    }


def test_a_model_is_in_one_group_at_most() -> None:
    found = problems_of(
        TWO_MODELS
        + """
        [routing.router.settings.groups.g1]
        members = ["chat"]
        [routing.router.settings.groups.g2]
        members = ["coder", "chat", "coder"]
        """
    )
    assert found == {
        "routing.router.settings.groups.g2.members[1]": (
            "model 'chat' is already in group 'g1'; a model may be in one group only"
        ),
        "routing.router.settings.groups.g2.members[2]": "model 'coder' is listed twice",
    }


def test_group_members_are_required() -> None:
    found = problems_of(TWO_MODELS + "[routing.router.settings.groups.g1]\nswap = false\n")
    assert found == {"routing.router.settings.groups.g1.members": "required key is missing"}


def test_fifo_priority_keys_are_models_or_aliases() -> None:
    found = problems_of(
        TWO_MODELS + "[routing.scheduler.settings.fifo.priority]\ngpt = 1\ncoder = 2\nchta = 3\n"
    )
    assert found == {
        "routing.scheduler.settings.fifo.priority.chta": (
            "unknown model or alias 'chta'; did you mean 'chat'?"
        )
    }


def test_a_model_named_twice_in_fifo_priority_is_reported() -> None:
    # By its ID and an alias: which priority counted was the order of the keys.
    found = problems_of(
        TWO_MODELS + "[routing.scheduler.settings.fifo.priority]\ngpt = 1\ncoder = 2\nchat = 3\n"
    )
    assert found == {
        "routing.scheduler.settings.fifo.priority.chat": (
            "names model 'chat', as 'gpt' does; keep one of them"
        )
    }


def test_preload_entries_are_models_or_aliases() -> None:
    found = problems_of(TWO_MODELS + '[hooks.on_startup]\npreload = ["gpt", "coder", "nope"]\n')
    assert found == {
        "hooks.on_startup.preload[2]": (
            "unknown model or alias 'nope'; known models and aliases: 'chat', 'coder', 'gpt'"
        )
    }


def test_ignore_paths_that_are_not_regular_expressions_are_reported_at_their_index() -> None:
    found = problems_of(TWO_MODELS + '[upstream]\nignorePaths = ["^/ws$", "(", "[a-"]\n')
    assert found == {
        "upstream.ignorePaths[1]": (
            "not a regular expression: missing ), unterminated subpattern at position 0"
        ),
        "upstream.ignorePaths[2]": (
            "not a regular expression: unterminated character set at position 0"
        ),
    }


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("[peers.p]\nmodels = ['m']\n", "peers.p.proxy", "required key is missing"),
        ("[peers.p]\nproxy = 'http://h:1'\n", "peers.p.models", "required key is missing"),
        (
            "[peers.p]\nproxy = 'http://h:1'\nmodels = []\n",
            "peers.p.models",
            "expected at least one model name",
        ),
        (
            "[peers.p]\nproxy = 'h:1'\nmodels = ['m']\n",
            "peers.p.proxy",
            "expected an http:// or https:// URL, got 'h:1'",
        ),
        (
            "[peers.'a/b']\nproxy = 'http://h:1'\nmodels = ['m']\n",
            'peers."a/b"',
            "peer ID 'a/b' must not be empty or contain '/' or whitespace",
        ),
        (
            "[peers.p]\nproxy = 'http://h:1'\nmodels = ['m', 3]\n",
            "peers.p.models[1]",
            "expected a string, got 3",
        ),
    ],
)
def test_peer_problems(text: str, path: str, message: str) -> None:
    assert problems_of(text) == {path: message}


def test_swap_affinity_bonus_above_99_is_capped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaswap.config"):
        config = load("[routing.scheduler.settings.serial]\nswapAffinityBonus = 150\n")
    assert config.routing.scheduler.settings.serial.swap_affinity_bonus == 99
    (record,) = caplog.records
    assert record.name == "llamaswap.config"
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "routing.scheduler.settings.serial.swapAffinityBonus = 150 is above 99; using 99"
    )


def test_swap_affinity_bonus_of_99_is_kept_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaswap.config"):
        config = load("[routing.scheduler.settings.serial]\nswapAffinityBonus = 99\n")
    assert config.routing.scheduler.settings.serial.swap_affinity_bonus == 99
    assert caplog.records == []
