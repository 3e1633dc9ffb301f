"""The keys llama-swap users bring: setParamsByID, model macros, typed macros, timeouts,
peer filters, CORS origins, logToStdout/logTimeFormat, and ${PORT} skipping busy ports."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import pytest

from llamaswap.config import Config, loads_config
from llamaswap.config.model import FilterConfig, LogToStdout, Timeouts
from llamaswap.errors import ConfigError
from tests.unit.ports import every_port_free


def load(text: str, environ: Mapping[str, str] | None = None) -> Config:
    return loads_config(
        textwrap.dedent(text), file="test.toml", environ=environ or {}, free=every_port_free
    )


def problems_of(text: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load(text, environ)
    return {problem.path: problem.message for problem in info.value.problems}


# --- setParamsByID ---------------------------------------------------------------------


def test_set_params_by_id_keys_take_macros_and_become_aliases() -> None:
    config = load(
        """
        [models.chat]
        cmd = "server --port ${PORT}"
        aliases = ["gpt"]

        [models.chat.filters.setParams]
        temperature = 0.7
        top_p = 0.9

        [models.chat.filters.setParamsByID."${MODEL_ID}"]
        reasoning = "medium"
        [models.chat.filters.setParamsByID."${MODEL_ID}:hot"]
        temperature = 1.5
        [models.chat.filters.setParamsByID.gpt]
        top_p = 0.5
        """
    )
    model = config.models["chat"]
    # The model's own ID and an existing alias are not added again.
    assert model.aliases == ("gpt", "chat:hot")
    assert config.resolve("chat:hot") == "chat"
    filters = model.filters
    assert filters.params_for("chat:hot") == {"temperature": 1.5, "top_p": 0.9}
    assert filters.params_for("chat") == {"temperature": 0.7, "top_p": 0.9, "reasoning": "medium"}
    assert filters.params_for("gpt") == {"temperature": 0.7, "top_p": 0.5}
    assert filters.params_for("other") == {"temperature": 0.7, "top_p": 0.9}


def test_params_for_without_by_id_is_set_params() -> None:
    filters = FilterConfig(set_params={"a": 1})
    assert filters.params_for("x") == {"a": 1}


def test_set_params_by_id_key_may_not_be_another_models_name() -> None:
    found = problems_of(
        """
        [models.a]
        cmd = "a --port ${PORT}"
        aliases = ["shared"]
        [models.b]
        cmd = "b --port ${PORT}"
        [models.b.filters.setParamsByID.a]
        x = 1
        [models.b.filters.setParamsByID.shared]
        x = 2
        """
    )
    assert found == {
        "models.b.filters.setParamsByID.a": "alias 'a' is already the ID of models.a",
        "models.b.filters.setParamsByID.shared": "alias 'shared' is already used by models.a",
    }


def test_set_params_by_id_keys_that_become_equal_are_an_error() -> None:
    found = problems_of(
        """
        [macros]
        hot = "chat:hot"
        [models.chat]
        cmd = "c --port ${PORT}"
        [models.chat.filters.setParamsByID."${hot}"]
        x = 1
        [models.chat.filters.setParamsByID."${MODEL_ID}:hot"]
        x = 2
        """
    )
    assert found == {
        'models.chat.filters.setParamsByID."${MODEL_ID}:hot"': (
            "becomes 'chat:hot', as another key does"
        )
    }


def test_set_params_by_id_values_must_be_tables() -> None:
    found = problems_of(
        """
        [models.chat]
        cmd = "c --port ${PORT}"
        filters = { setParamsByID = { "chat:hot" = 1 } }
        """
    )
    assert found == {'models.chat.filters.setParamsByID."chat:hot"': "expected a table, got 1"}


# --- model macros and typed macros ------------------------------------------------------


def test_model_macros_override_global_ones_within_that_model() -> None:
    config = load(
        """
        [macros]
        ctx = 4096
        server = "server --port ${PORT}"
        [models.big]
        cmd = "${server} --ctx ${ctx} --temp ${temp}"
        [models.big.macros]
        ctx = 16384
        temp = "0.7 --x ${ctx}"
        [models.small]
        cmd = "${server} --ctx ${ctx}"
        """
    )
    assert config.models["big"].cmd[3:] == ("--ctx", "16384", "--temp", "0.7", "--x", "16384")
    assert config.models["small"].cmd[3:] == ("--ctx", "4096")
    assert config.macros == {"ctx": "4096", "server": "server --port ${PORT}"}


def test_a_model_macro_overrides_a_global_one_inside_the_global_macros_that_use_it() -> None:
    """As llama-swap resolves them (its TestConfig_ModelMacroOverridesGlobal): a model's
    macro takes the place of the global one, also inside global macros built on it."""
    config = load(
        """
        [macros]
        tag = "global"
        msg = "value-${tag}"
        ctx = 4096
        server = "server --port ${PORT} --ctx-size ${ctx}"
        [models.big]
        cmd = "${server} ${msg}"
        macros = { ctx = 16384, tag = "model-level", extra = "${msg}" }
        metadata = { extra = "${extra}" }
        [models.small]
        cmd = "${server} ${msg}"
        """
    )
    assert config.models["big"].cmd[3:] == ("--ctx-size", "16384", "value-model-level")
    assert config.models["big"].metadata == {"extra": "value-model-level"}
    assert config.models["small"].cmd[3:] == ("--ctx-size", "4096", "value-global")
    assert config.macros["server"] == "server --port ${PORT} --ctx-size 4096"


def test_in_a_model_an_overriding_macro_takes_the_global_ones_place() -> None:
    """It may use the global macros above that place; a global macro that grows too long
    only with the model's values is reported in the model."""
    big = "x" * 40_000
    found = problems_of(
        f"""
        [macros]
        a = "1"
        b = "2"
        double = "${{b}}${{b}}"
        [models.m]
        cmd = "server ${{double}}"
        proxy = "http://127.0.0.1:9000"
        macros = {{ a = "${{b}}", b = "{big}" }}
        """
    )
    assert found == {
        "models.m.macros.a": "uses ${b}, which is defined after it; move b above it",
        "models.m.macros.double": (
            "expands to more than 65536 characters; macros may expand to at most that"
        ),
    }


def test_a_macro_that_is_one_number_macro_is_that_number() -> None:
    config = load(
        """
        [macros]
        base = 4
        limit = "${base}"
        [models.m]
        cmd = "server --port ${PORT}"
        concurrencyLimit = "${limit}"
        """
    )
    assert config.models["m"].concurrency_limit == 4


def test_model_macros_follow_the_global_rules() -> None:
    found = problems_of(
        """
        [models.m]
        cmd = "server ${nope}"
        proxy = "http://127.0.0.1:9000"
        macros = { PORT = "1", "bad name" = "x", later = "${after}", after = "y" }
        [models.n]
        cmd = "server"
        proxy = "http://127.0.0.1:9001"
        macros = "x"
        """
    )
    assert found == {
        "models.m.macros.PORT": "'PORT' is a built-in macro; choose another name",
        'models.m.macros."bad name"': (
            "invalid macro name 'bad name'; use letters, digits, '_' and '-'"
        ),
        "models.m.macros.later": "uses ${after}, which is defined after it; move after above it",
        "models.m.cmd": "unknown macro ${nope}; define it under [macros]",
        "models.n.macros": "expected a table of name = value, got 'x'",
    }


def test_a_value_that_is_one_number_macro_becomes_that_number() -> None:
    config = load(
        """
        startPort = "${port}"
        [macros]
        port = 9000
        n = 4
        t = 0.5
        on = true
        [models.m]
        cmd = ["server", "--port", "${PORT}", "-n", "${n}"]
        concurrencyLimit = "${n}"
        ttl = "${n}"
        sendLoadingState = "${on}"
        env = { PORT = "${PORT}", N = "${n}" }
        metadata = { port = "${PORT}", t = "${t}", list = ["${on}", "n=${n}"] }
        [models.m.filters.setParams]
        temperature = "${t}"
        """
    )
    model = config.models["m"]
    assert model.concurrency_limit == 4
    assert model.ttl == 4.0
    assert model.send_loading_state is True
    # Keys that take text read the macro's text, as plain strings.
    assert model.cmd == ("server", "--port", "9000", "-n", "4")
    assert [type(arg) for arg in model.cmd] == [str] * 5
    assert model.env == {"PORT": "9000", "N": "4"}
    assert type(model.env["PORT"]) is str
    assert model.metadata == {"port": 9000, "t": 0.5, "list": [True, "n=4"]}
    assert model.filters.set_params == {"temperature": 0.5}


def test_a_value_that_is_one_environment_variable_is_read_as_its_keys_type() -> None:
    """As llama-swap, which expands ${env.NAME} in the YAML text before reading it: a key
    that takes a number or a boolean reads the variable as one; any other key, the text."""
    environ = {"N": "4", "ON": "true", "PORT_BASE": "9000", "TEMP": "0.7", "TTL": "600"}
    config = load(
        """
        startPort = "${env.PORT_BASE}"
        sendLoadingState = "${env.ON}"
        [models.m]
        cmd = "server --port ${PORT} -n ${env.N}"
        concurrencyLimit = "${env.N}"
        unlisted = "${env.ON}"
        ttl = "${env.TTL}"
        env = { N = "${env.N}" }
        metadata = { n = "${env.N}" }
        filters.setParams = { temperature = "${env.TEMP}" }
        """,
        environ,
    )
    model = config.models["m"]
    assert (config.start_port, config.send_loading_state) == (9000, True)
    assert (model.concurrency_limit, model.unlisted, model.ttl) == (4, True, 600.0)
    assert model.cmd == ("server", "--port", "9000", "-n", "4")
    assert model.env == {"N": "4"}
    assert model.metadata == {"n": "4"}
    assert type(model.metadata["n"]) is str
    assert model.filters.set_params == {"temperature": "0.7"}
    found = problems_of(
        """
        [models.m]
        cmd = "server --port ${PORT}"
        concurrencyLimit = "${env.HOME}"
        """,
        {"HOME": "/home/me"},
    )
    assert found == {"models.m.concurrencyLimit": "expected an integer, got '/home/me'"}


def test_a_string_macro_stays_a_string() -> None:
    found = problems_of(
        """
        [macros]
        n = "4"
        [models.m]
        cmd = "server --port ${PORT}"
        concurrencyLimit = "${n}"
        """
    )
    assert found == {"models.m.concurrencyLimit": "expected an integer, got '4'"}


def test_a_typed_macro_out_of_range_names_the_range() -> None:
    found = problems_of(
        """
        [macros]
        n = 0
        [models.m]
        cmd = "server --port ${PORT}"
        concurrencyLimit = "${n}"
        """
    )
    assert found == {"models.m.concurrencyLimit": "expected a limit from 1 to 10000, got 0"}


# --- timeouts and peer filters ----------------------------------------------------------


def test_timeouts_for_models_and_peers() -> None:
    config = load(
        """
        [models.m]
        cmd = "server --port ${PORT}"
        [models.m.timeouts]
        connect = 30
        responseHeader = "1m"
        idleConn = 90
        keepalive = 30
        tlsHandshake = 5
        [peers.p]
        proxy = "https://p.example"
        models = ["x"]
        timeouts = { responseHeader = 0 }
        [peers.p.filters]
        stripParams = ["temperature"]
        setParams = { provider = { zdr = true } }
        """
    )
    assert config.models["m"].timeouts == Timeouts(
        connect=30, tls_handshake=5, response_header=60, idle_conn=90, keepalive=30
    )
    peer = config.peers["p"]
    assert peer.timeouts == Timeouts()
    assert peer.filters == FilterConfig(("temperature",), {"provider": {"zdr": True}})


def test_strip_params_may_be_one_comma_separated_string_split_after_macros() -> None:
    """llama-swap's spelling (its TestConfig_ModelFilters): blanks and repeats are dropped,
    and a macro may hold several names."""
    config = load(
        """
        [macros]
        default_strip = "temperature, top_p"
        [models.m]
        cmd = "server --port ${PORT}"
        filters.stripParams = "model, top_k, top_k, temperature, ${default_strip}, , ,"
        [models.n]
        cmd = "server --port ${PORT}"
        filters.stripParams = "${env.STRIP}"
        """,
        environ={"STRIP": "seed,min_p"},
    )
    assert config.models["m"].filters.strip_params == ("model", "top_k", "temperature", "top_p")
    assert config.models["n"].filters.strip_params == ("seed", "min_p")
    found = problems_of(
        """
        [models.m]
        cmd = "server --port ${PORT}"
        filters.stripParams = ["a", 1]
        [models.n]
        cmd = "server --port ${PORT}"
        filters.stripParams = 2
        """
    )
    assert found == {
        "models.m.filters.stripParams[1]": "expected a string, got 1",
        "models.n.filters.stripParams": (
            "expected an array of strings or one comma-separated string, got 2"
        ),
    }


def test_free_form_tables_hold_only_what_json_can() -> None:
    """``metadata`` and ``setParams`` are sent as JSON: NaN, infinities and TOML dates
    would make answers no JSON parser reads (``/v1/models``) or a 500."""
    found = problems_of(
        """
        [models.m]
        cmd = "server --port ${PORT}"
        metadata = { released = 2024-01-01, ok = 1.5, deep = [1, { y = -inf }] }
        filters.setParams = { temperature = nan }
        """
    )
    assert found == {
        "models.m.metadata.released": (
            'JSON has no dates or times: write it as a string, "2024-01-01"'
        ),
        "models.m.metadata.deep[1].y": "JSON has no -inf: write a finite number",
        "models.m.filters.setParams.temperature": "JSON has no nan: write a finite number",
    }


def test_timeouts_defaults() -> None:
    timeouts = load('[models.m]\ncmd = "s --port ${PORT}"\n').models["m"].timeouts
    assert (timeouts.connect, timeouts.tls_handshake) == (10.0, 10.0)
    assert (timeouts.response_header, timeouts.idle_conn, timeouts.keepalive) == (0, 4.0, 0)


def test_timeouts_problems() -> None:
    found = problems_of(
        """
        [models.m]
        cmd = "server --port ${PORT}"
        timeouts = { connect = -1, keepalive = 0.5, dial = 3, idleConn = "2d" }
        [peers.p]
        proxy = "http://p:1"
        models = ["x"]
        filters = { setParamsByID = { y = { a = 1 } } }
        """
    )
    assert found == {
        "models.m.timeouts.connect": "expected a duration of 0 seconds or more, got -1",
        "models.m.timeouts.keepalive": (
            "expected 0 (off) or a duration from 1 to 7200 seconds (2 hours), got 0.5 seconds"
        ),
        "models.m.timeouts.idleConn": (
            "expected 0 (no limit) or a duration from 0.001 to 86400 seconds (1 day), "
            "got 172800 seconds"
        ),
        "models.m.timeouts.dial": (
            "unknown key 'dial'; this table's keys are 'connect', 'idleConn', 'keepalive', "
            "'responseHeader', 'tlsHandshake'"
        ),
        "peers.p.filters.setParamsByID": (
            "only models take setParamsByID (a peer's models have no aliases here); use setParams"
        ),
    }


# --- top-level keys ---------------------------------------------------------------------


def test_cors_and_log_keys() -> None:
    config = load(
        """
        corsOrigins = ["http://localhost:3000", "https://app.example"]
        logToStdout = "both"
        logTimeFormat = "rfc3339"
        """
    )
    assert config.cors_origins == ("http://localhost:3000", "https://app.example")
    assert config.log_to_stdout is LogToStdout.BOTH
    assert config.log_time_format == "rfc3339"
    default = load("")
    assert (default.cors_origins, default.log_to_stdout, default.log_time_format) == (
        ("*",),
        LogToStdout.PROXY,
        None,  # logging's own timestamp
    )


def test_cors_and_log_key_problems() -> None:
    found = problems_of(
        """
        corsOrigins = ["http://localhost:3000/app", "localhost", "*"]
        logToStdout = "stderr"
        logTimeFormat = "RFC3339"
        """
    )
    origin = 'expected "*" or an origin like "http://localhost:3000" (no path), got '
    assert found["corsOrigins[0]"] == origin + "'http://localhost:3000/app'"
    assert found["corsOrigins[1]"] == origin + "'localhost'"
    assert found["logToStdout"] == (
        "expected one of 'proxy', 'upstream', 'both', 'none', got 'stderr'"
    )
    assert found["logTimeFormat"].endswith("got 'RFC3339'; did you mean 'rfc3339'?")
    assert len(found) == 4


# --- ${PORT} skips ports in use ---------------------------------------------------------


def test_port_skips_a_port_in_use() -> None:
    probed: list[tuple[str, int]] = []

    def free(host: str, port: int) -> bool:
        probed.append((host, port))
        return port != 7000  # another program holds 7000

    config = loads_config(
        """
        startPort = 7000
        [models.a]
        cmd = "server --port ${PORT}"
        [models.b]
        cmd = "server --port ${PORT}"
        [models.c]
        cmd = "server --port ${PORT}"
        proxy = "http://10.1.2.3:${PORT}"
        """,
        free=free,
    )
    a, b, c = (config.models[name] for name in "abc")
    assert a.proxy == "http://127.0.0.1:7001"
    assert b.proxy == "http://127.0.0.1:7002"
    # A proxy on another machine is not probed from here.
    assert c.proxy == "http://10.1.2.3:7003"
    assert probed == [("127.0.0.1", 7000), ("127.0.0.1", 7001), ("127.0.0.1", 7002)]


def test_port_probe_is_injectable() -> None:
    config = loads_config(
        '[models.a]\ncmd = "s --port ${PORT}"\n[models.b]\ncmd = "s --port ${PORT}"\n',
        free=lambda host, port: port % 2 == 1,
    )
    assert config.models["a"].proxy == "http://127.0.0.1:5801"
    assert config.models["b"].proxy == "http://127.0.0.1:5803"


# --- defaultModel ---------------------------------------------------------------------


def test_a_request_naming_no_model_goes_to_the_default_or_the_only_model() -> None:
    one = load('[models.only]\ncmd = "s --port ${PORT}"\n')
    assert one.fallback_model() == "only"
    two = '[models.a]\ncmd = "s --port ${PORT}"\naliases = ["x"]\n[models.b]\ncmd = "s ${PORT}"\n'
    assert load(two).fallback_model() is None
    assert load('defaultModel = "x"\n' + two).fallback_model() == "x"


def test_the_default_model_must_name_a_model() -> None:
    problems = problems_of('defaultModel = "nope"\n[models.a]\ncmd = "s --port ${PORT}"\n')
    assert list(problems) == ["defaultModel"]
    assert "'nope'" in problems["defaultModel"]
