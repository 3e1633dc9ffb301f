"""Value syntaxes: durations, command lines, environment tables and lists."""

from __future__ import annotations

import math

import pytest

from llamaswap.config import loads_config
from llamaswap.config.values import InvalidValue, parse_command, parse_duration, parse_env
from llamaswap.errors import ConfigError
from tests.unit.ports import every_port_free


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        loads_config(text, environ={}, free=every_port_free)
    return {problem.path: problem.message for problem in info.value.problems}


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        (15, 15.0),
        (2.5, 2.5),
        (0, 0.0),
        ("500ms", 0.5),
        ("90s", 90.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1h0m2s", 3602.0),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("30", 30.0),
        (" 2m ", 120.0),
    ],
)
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw) == seconds


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("5 minutes", "expected a number of seconds or a duration like \"90s\", got '5 minutes'"),
        ("", "expected a number of seconds or a duration like \"90s\", got ''"),
        ("1x", "expected a number of seconds or a duration like \"90s\", got '1x'"),
        ("s", "expected a number of seconds or a duration like \"90s\", got 's'"),
        ("1m 30s", "expected a number of seconds or a duration like \"90s\", got '1m 30s'"),
        ("-5s", "expected a number of seconds or a duration like \"90s\", got '-5s'"),
        (-1, "expected a duration of 0 seconds or more, got -1"),
        (True, 'expected a number of seconds or a duration like "90s", got True'),
        ([1], 'expected a number of seconds or a duration like "90s", got an array [1]'),
        (math.inf, 'expected a number of seconds or a duration like "90s", got inf'),
    ],
)
def test_bad_durations(raw: object, message: str) -> None:
    with pytest.raises(InvalidValue) as info:
        parse_duration(raw)
    assert str(info.value) == message


def test_duration_keys_in_a_config() -> None:
    config = loads_config(
        """
        healthCheckTimeout = "1m30s"
        globalTTL = "1h"
        unloadTimeout = "500ms"
        [models.m]
        cmd = "s --port ${PORT}"
        ttl = 45
        [routing.scheduler.settings.serial]
        agingDivisor = 0
        """,
        environ={},
        free=every_port_free,
    )
    assert (config.health_check_timeout, config.global_ttl, config.unload_timeout) == (
        90.0,
        3600.0,
        0.5,
    )
    assert config.models["m"].ttl == 45.0
    assert config.routing.scheduler.settings.serial.aging_divisor == 0.0


def test_health_check_timeout_type_error() -> None:
    assert problems_of('healthCheckTimeout = "abc"\n') == {
        "healthCheckTimeout": "expected a number of seconds or a duration like \"90s\", got 'abc'"
    }


def test_command_string_with_comments_continuations_and_quotes() -> None:
    text = """
        # the server binary
        llama-server \\
          --model "/models/my model.gguf" \\
          # a comment between continued lines
          --alias 'it''s' \\
          --chat-template "{{ a }}" --flag=x\\ y
        --last
    """
    assert parse_command(text) == (
        "llama-server",
        "--model",
        "/models/my model.gguf",
        "--alias",
        "its",
        "--chat-template",
        "{{ a }}",
        "--flag=x y",
        "--last",
    )


def test_command_hash_inside_a_line_is_not_a_comment() -> None:
    assert parse_command("server --tag #1") == ("server", "--tag", "#1")


def test_command_array_is_used_as_is() -> None:
    assert parse_command(["server", "--name", "a b", "#x"]) == ("server", "--name", "a b", "#x")


@pytest.mark.parametrize(
    ("cmd", "path", "message"),
    [
        ('""', "models.m.cmd", "the command is empty; give the program to run and its arguments"),
        (
            '"# only a comment"',
            "models.m.cmd",
            "the command is empty; give the program to run and its arguments",
        ),
        ("[]", "models.m.cmd", "the command is empty; give the program to run and its arguments"),
        ('["server", 5]', "models.m.cmd[1]", "expected a string, got 5"),
        ("5", "models.m.cmd", "expected a command line string or an array of strings, got 5"),
        (
            '"server \\"--port"',
            "models.m.cmd",
            "cannot split the command line: no closing quotation",
        ),
    ],
)
def test_bad_commands(cmd: str, path: str, message: str) -> None:
    text = f'[models.m]\nproxy = "http://h:1"\ncmd = {cmd}\n'
    assert problems_of(text) == {path: message}


def test_bad_cmd_stop_is_reported_at_its_path() -> None:
    assert problems_of('[models.m]\ncmd = "s --port ${PORT}"\ncmdStop = ""\n') == {
        "models.m.cmdStop": "the command is empty; give the program to run and its arguments"
    }


def test_env_table_and_list_forms() -> None:
    assert parse_env({"A": "1", "B": ""}) == {"A": "1", "B": ""}
    assert parse_env(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


def test_env_problems_are_reported_per_entry() -> None:
    found = problems_of(
        '[models.m]\ncmd = "s --port ${PORT}"\nenv = ["A=1", "B=2", "C", 4, "A=3"]\n'
    )
    assert found == {
        "models.m.env[2]": "expected \"NAME=value\", got 'C'",
        "models.m.env[3]": 'expected "NAME=value", got 4',
        "models.m.env[4]": "variable 'A' is set twice",
    }


def test_env_table_values_must_be_strings() -> None:
    found = problems_of('[models.m]\ncmd = "s --port ${PORT}"\nenv = { FOO = 1, BAR = "x" }\n')
    assert found == {"models.m.env.FOO": "expected a string, got 1"}


NUL = "contains a NUL character ('\\x00'): the operating system cannot pass one to a program"


def test_a_nul_character_in_what_reaches_a_program_is_a_config_problem() -> None:
    # A TOML escape, or a macro that expands to one: exec would refuse it at the first load.
    text = """
[macros]
z = "\\u0000"
[models.m]
cmd = "s\\u0000 --port ${PORT}"
cmdStop = ["kill", "${z}"]
env = { A = "b${z}", "X\\u0000" = "y" }
[models.n]
cmd = "s --port ${PORT}"
env = ["A=\\u0000", "B\\u0000=1"]
"""
    assert problems_of(text) == {
        "models.m.cmd": NUL,
        "models.m.cmdStop": NUL,
        "models.m.env.A": NUL,
        'models.m.env."X\\u0000"': "invalid environment variable name 'X\\x00'",
        "models.n.env[0]": NUL,
        "models.n.env[1]": "expected \"NAME=value\", got 'B\\x00=1'",
    }


def test_env_of_the_wrong_type() -> None:
    found = problems_of('[models.m]\ncmd = "s --port ${PORT}"\nenv = "A=1"\n')
    assert found == {
        "models.m.env": "expected a table of strings or an array of \"NAME=value\", got 'A=1'"
    }


def test_multi_line_literal_string_command_in_a_config() -> None:
    text = """
[models.m]
cmd = '''
server \\
  --port ${PORT} \\
  # a comment line between continued lines
  -m "/models/my model.gguf"
'''
"""
    config = loads_config(text, environ={}, free=every_port_free)
    assert config.models["m"].cmd == ("server", "--port", "5800", "-m", "/models/my model.gguf")
