"""Macro expansion: user macros, ${env.NAME}, ${PYTHON}, ${MODEL_ID}, ${PORT} allocation,
${PID}."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping

import pytest

from llamaswap.config import Config, loads_config
from llamaswap.errors import ConfigError
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


def test_user_macro_may_use_earlier_macros_and_env() -> None:
    config = load(
        """
        [macros]
        models = "${env.MODEL_DIR}/gguf"
        base = "llama-server -m ${models}"
        threads = 8
        flash = true
        temp = 0.5

        [models.m]
        cmd = "${base}/m.gguf --port ${PORT} -t ${threads} --flash ${flash} --temp ${temp}"
        """,
        environ={"MODEL_DIR": "/srv"},
    )
    assert config.macros == {
        "models": "/srv/gguf",
        "base": "llama-server -m /srv/gguf",
        "threads": "8",
        "flash": "true",
        "temp": "0.5",
    }
    assert config.models["m"].cmd == (
        *("llama-server", "-m", "/srv/gguf/m.gguf", "--port", "5800"),
        *("-t", "8", "--flash", "true", "--temp", "0.5"),
    )


def test_macro_using_a_later_macro_is_an_error() -> None:
    found = problems_of('[macros]\na = "x ${b}"\nb = "y"\n')
    assert found == {"macros.a": "uses ${b}, which is defined after it; move b above it"}


def test_macro_using_itself_is_an_error() -> None:
    assert problems_of('[macros]\na = "x ${a}"\n') == {
        "macros.a": "a macro cannot use itself (${a})"
    }


@pytest.mark.parametrize(
    ("line", "path", "message"),
    [
        ("PORT = '1'", "macros.PORT", "'PORT' is a built-in macro; choose another name"),
        (
            "MODEL_ID = 'x'",
            "macros.MODEL_ID",
            "'MODEL_ID' is a built-in macro; choose another name",
        ),
        ("env = 'x'", "macros.env", "'env' is a built-in macro; choose another name"),
        ("PYTHON = 'x'", "macros.PYTHON", "'PYTHON' is a built-in macro; choose another name"),
        (
            "'a b' = 'x'",
            'macros."a b"',
            "invalid macro name 'a b'; use letters, digits, '_' and '-'",
        ),
        ("list = [1]", "macros.list", "expected a string, number or boolean, got an array [1]"),
    ],
)
def test_bad_macro_definitions(line: str, path: str, message: str) -> None:
    assert problems_of(f"[macros]\n{line}\n") == {path: message}


def test_python_macro_is_the_interpreter_running_llamaswap() -> None:
    """``${PYTHON}`` works anywhere, in a user macro too (the quickstart's ``fake``)."""
    config = load(
        """
        [macros]
        fake = "${PYTHON} -m llamaswap.fake_server --port ${PORT}"
        [models.m]
        cmd = "${fake} --model-name ${MODEL_ID}"
        [models.n]
        cmd = ["${PYTHON}", "-c", "pass"]
        proxy = "http://127.0.0.1:9"
        """
    )
    assert config.macros == {"fake": f"{sys.executable} -m llamaswap.fake_server --port ${{PORT}}"}
    assert config.models["m"].cmd == (
        *(sys.executable, "-m", "llamaswap.fake_server", "--port", "5800"),
        *("--model-name", "m"),
    )
    assert config.models["n"].cmd == (sys.executable, "-c", "pass")


def test_env_macro() -> None:
    config = load(
        """
        apiKeys = ["${env.KEY}"]
        [models.m]
        cmd = "server --port ${PORT}"
        env = { HOME = "${env.HOME}" }
        """,
        environ={"KEY": "s3cret", "HOME": "/home/me"},
    )
    assert config.api_keys == ("s3cret",)
    assert config.models["m"].env == {"HOME": "/home/me"}


def test_unset_env_variable_names_the_key_and_variable() -> None:
    found = problems_of(
        """
        [models.m]
        cmd = "server --port ${PORT} --key ${env.API_KEY}"
        """
    )
    assert found == {
        "models.m.cmd": "environment variable 'API_KEY' is not set (used as ${env.API_KEY})"
    }


def test_model_id_macro() -> None:
    config = load(
        """
        [models.qwen]
        cmd = "server --port ${PORT} --alias ${MODEL_ID}"
        name = "${MODEL_ID} (local)"
        """
    )
    assert config.models["qwen"].cmd[-1] == "qwen"
    assert config.models["qwen"].name == "qwen (local)"


def test_ports_are_allocated_in_sorted_model_id_order_only_where_cmd_uses_port() -> None:
    config = load(
        """
        startPort = 9000

        [macros]
        serve = "server --port ${PORT} --name ${MODEL_ID}"

        [models.zeta]
        cmd = ["server", "--port", "${PORT}"]

        [models.beta]
        cmd = "${serve}"
        cmdStop = "stop --port ${PORT} --pid ${PID}"
        env = ["LISTEN=127.0.0.1:${PORT}"]
        metadata = { port = "${PORT}" }

        [models.alpha]
        cmd = "server --port ${PORT}"

        [models.gamma]
        cmd = "remote-server"
        proxy = "http://10.0.0.5:8080"
        """
    )
    models = config.models
    assert models["alpha"].proxy == "http://127.0.0.1:9000"
    beta = models["beta"]
    assert beta.cmd == ("server", "--port", "9001", "--name", "beta")
    assert beta.proxy == "http://127.0.0.1:9001"
    assert beta.cmd_stop == ("stop", "--port", "9001", "--pid", "${PID}")
    assert beta.env == {"LISTEN": "127.0.0.1:9001"}
    assert beta.metadata == {"port": 9001}  # one macro of a number: the number
    assert models["gamma"].cmd == ("remote-server",)
    assert models["gamma"].proxy == "http://10.0.0.5:8080"
    assert models["zeta"].cmd == ("server", "--port", "9002")
    assert models["zeta"].proxy == "http://127.0.0.1:9002"


def test_a_reload_keeps_each_models_port_and_gives_new_ones_the_next_free() -> None:
    """``keep`` (the running configuration's ports): adding ``alpha``, first in sorted
    order, moves no other model; a kept port below a new startPort is not kept."""
    text = textwrap.dedent(
        """
        startPort = 9000
        [models.alpha]
        cmd = "server --port ${PORT}"
        [models.beta]
        cmd = "server --port ${PORT}"
        [models.gamma]
        cmd = "server --port ${PORT}"
        """
    )
    keep = {"beta": 9000, "gamma": 9001, "gone": 9002}
    twice = loads_config(
        text, environ={}, free=lambda host, port: True, keep={"alpha": 9001, "gamma": 9001}
    )  # alpha had 9001 by its own proxy: one port, one model
    assert {m: model.proxy[-4:] for m, model in twice.models.items()} == {
        "alpha": "9001",
        "beta": "9000",
        "gamma": "9002",
    }
    config = loads_config(text, environ={}, free=lambda host, port: True, keep=keep)
    assert {m: model.proxy[-4:] for m, model in config.models.items()} == {
        "alpha": "9002",
        "beta": "9000",
        "gamma": "9001",
    }
    moved = loads_config(
        text.replace("9000", "9001"), environ={}, free=lambda host, port: True, keep=keep
    )
    assert {m: model.proxy[-4:] for m, model in moved.models.items()} == {
        "alpha": "9002",  # 9001 is gamma's
        "beta": "9003",  # 9000 is below startPort now
        "gamma": "9001",
    }


def test_default_proxy_needs_port_in_cmd() -> None:
    found = problems_of('[models.m]\ncmd = "server --port 8080"\n')
    assert found == {
        "models.m.proxy": (
            "uses ${PORT} but models.m.cmd does not; "
            "put ${PORT} in cmd or set proxy to the server's address"
        )
    }


def test_explicit_proxy_with_port_needs_port_in_cmd() -> None:
    found = problems_of('[models.m]\ncmd = "server"\nproxy = "http://localhost:${PORT}/v1"\n')
    assert list(found) == ["models.m.proxy"]


def test_port_elsewhere_in_a_model_needs_port_in_cmd() -> None:
    found = problems_of(
        '[models.m]\ncmd = "server"\nproxy = "http://h:1"\nenv = { P = "${PORT}" }\n'
    )
    assert found == {
        "models.m.env.P": "uses ${PORT} but models.m.cmd does not; put ${PORT} in cmd"
    }


def test_pid_is_only_allowed_in_cmd_stop() -> None:
    found = problems_of('[models.m]\ncmd = "server --port ${PORT} --pid ${PID}"\n')
    assert found == {"models.m.cmd": "${PID} is only available in cmdStop"}


def test_pid_in_cmd_stop_array_is_kept() -> None:
    config = load('[models.m]\ncmd = "s --port ${PORT}"\ncmdStop = ["kill", "-INT", "${PID}"]\n')
    assert config.models["m"].cmd_stop == ("kill", "-INT", "${PID}")


def test_model_macros_are_errors_outside_models() -> None:
    found = problems_of(
        """
        apiKeys = ["${MODEL_ID}"]
        [peers.p]
        proxy = "http://h:${PORT}"
        models = ["m"]
        """
    )
    assert found == {
        "apiKeys[0]": "${MODEL_ID} is only available inside [models.ID]",
        "peers.p.proxy": "${PORT} is only available inside [models.ID]",
    }


def test_leftover_macro_is_an_error_at_its_key_path() -> None:
    found = problems_of(
        """
        [macros]
        fake = "fake-server"
        [models.m]
        cmd = "${fak} --port ${PORT}"
        aliases = ["${foo}"]
        ttl = "${bar}"
        """
    )
    assert found == {
        "models.m.cmd": "unknown macro ${fak}; did you mean ${fake}?",
        "models.m.aliases[0]": "unknown macro ${foo}; define it under [macros]",
        "models.m.ttl": "unknown macro ${bar}; define it under [macros]",
    }


def test_macros_are_not_expanded_in_table_keys() -> None:
    config = load('[models.m]\ncmd = "s --port ${PORT}"\nmetadata = { "${x}" = 1 }\n')
    assert config.models["m"].metadata == {"${x}": 1}


def test_macro_value_with_spaces_splits_in_a_string_cmd_but_not_in_an_array() -> None:
    config = load(
        """
        [macros]
        flags = "--ctx 4096 --port ${PORT}"
        [models.a]
        cmd = "server ${flags}"
        [models.b]
        cmd = ["server", "${flags}"]
        """
    )
    assert config.models["a"].cmd == ("server", "--ctx", "4096", "--port", "5800")
    assert config.models["b"].cmd == ("server", "--ctx 4096 --port 5801")


def test_ports_run_out_above_65535() -> None:
    found = problems_of(
        """
        startPort = 65535
        [models.a]
        cmd = "a --port ${PORT}"
        [models.b]
        cmd = "b --port ${PORT}"
        """
    )
    assert found == {
        "models.b.cmd": "no port left for ${PORT}: counting up from startPort passed 65535"
    }


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMASWAP_TEST_FLAG", "--verbose")
    config = loads_config(
        '[models.m]\ncmd = "s --port ${PORT} ${env.LLAMASWAP_TEST_FLAG}"\n', free=every_port_free
    )
    assert config.models["m"].cmd == ("s", "--port", "5800", "--verbose")


def test_using_an_invalid_macro_is_reported_once() -> None:
    found = problems_of('[macros]\nbad = [1]\ngood = "x ${bad}"\n')
    assert found == {"macros.bad": "expected a string, number or boolean, got an array [1]"}


def test_using_an_invalid_macro_in_a_model_is_reported_once() -> None:
    found = problems_of('[macros]\nPORT = "1"\n[models.m]\ncmd = "s --port ${PORT} ${PORT}"\n')
    assert list(found) == ["macros.PORT"]
    found = problems_of('[macros]\nx = {}\n[models.m]\ncmd = "s --port ${PORT} ${x}"\n')
    assert found == {"macros.x": "expected a string, number or boolean, got a table"}


def test_a_top_level_macro_using_a_model_s_macro_is_reported_once_where_it_is() -> None:
    # Each model re-expands the top-level macros it does not define (they may use its
    # own): that did not report the same mistake again, under a key that is not there.
    found = problems_of(
        """
        [macros]
        serve = "s --port ${PORT} --ctx ${ctx}"
        again = "${serve} --more"
        [models.a]
        cmd = "${again}"
        macros.ctx = "4096"
        [models.b]
        cmd = "${serve}"
        """
    )
    assert found == {"macros.serve": "unknown macro ${ctx}; define it under [macros]"}


def test_macros_in_cmd_comment_lines_are_not_expanded() -> None:
    # llama-swap drops comment lines before expanding macros: a multi-line macro, or one
    # that is not defined, in a comment changes nothing.
    config = load(
        """
        [macros]
        server = '''llama-server
          --port ${PORT}'''
        [models.a]
        cmd = '''
          # ${server} --model old.gguf  (kept for reference; ${undefined} too)
          ${server} --model a.gguf
        '''
        """
    )
    assert config.models["a"].cmd[:2] == ("llama-server", "--port")
    assert config.models["a"].cmd[3:] == ("--model", "a.gguf")
