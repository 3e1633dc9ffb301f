"""Hostile or absurd configs: each gets clear problems at their key paths, quickly.

Whatever ``check-config`` accepts, the server must be able to run: every numeric key has a
finite range, and input built to exhaust the loader (deep nesting, huge numbers, macro
bombs, pathological matrix expressions) is one problem, not a traceback or a long wait.
"""

from __future__ import annotations

import logging
import textwrap

import pytest

from llamaswap.config import Config, loads_config
from llamaswap.config.matrix_expr import MatrixExprError, check_sets, parse_expr
from llamaswap.config.values import InvalidValue, parse_command
from llamaswap.errors import ConfigError, ConfigProblem
from tests.unit.ports import every_port_free

MINIMAL = '[models.m]\ncmd = "server --port ${PORT}"\n'
SERIAL = "routing.scheduler.settings.serial"
MATRIX = "routing.router.settings.matrix"


def load(text: str) -> Config:
    return loads_config(textwrap.dedent(text), file="test.toml", environ={}, free=every_port_free)


def problems(text: str) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return list(info.value.problems)


def problems_of(text: str) -> dict[str, str]:
    """Every problem reported for ``text``, as key path → message."""
    found: dict[str, str] = {}
    for problem in problems(text):
        assert problem.path not in found, f"two problems at {problem.path}"
        found[problem.path] = problem.message
    return found


# --- documents built to exhaust the parser or the loader --------------------------------------


def test_inline_arrays_nested_beyond_what_toml_parses_are_one_problem() -> None:
    (problem,) = problems("a = " + "[" * 500 + "]" * 500 + "\n")
    assert problem.path == ""
    assert problem.message.startswith("invalid TOML: arrays or inline tables nest too deeply")


def test_values_nested_more_than_100_levels_are_one_problem() -> None:
    metadata = "[" * 150 + "]" * 150
    found = problems_of(MINIMAL + f"metadata = {{ x = {metadata} }}\n")
    assert found == {
        "models.m.metadata": (
            "nested more than 100 levels deep (tables, arrays and dotted keys all count); "
            "flatten it"
        )
    }


def test_a_key_with_a_thousand_dotted_parts_is_one_problem() -> None:
    found = problems_of(".".join(["a"] * 1000) + " = 1\n")
    assert list(found) == ["a.a.a"]
    assert found["a.a.a"].startswith("nested more than 100 levels deep")


def test_nesting_up_to_the_limit_is_accepted() -> None:
    metadata = "[" * 97 + "]" * 97  # models.m.metadata.x + 97 arrays = 100 levels
    config = load(MINIMAL + f"metadata = {{ x = {metadata} }}\n")
    assert "x" in config.models["m"].metadata


def test_an_integer_too_long_for_python_is_one_problem_with_its_line() -> None:
    (problem,) = problems(MINIMAL + "concurrencyLimit = " + "1" * 5000 + "\n")
    assert problem.message == "invalid TOML: an integer has more than 4300 digits"
    assert (problem.line, problem.column) == (3, 20)


def test_a_huge_integer_duration_is_a_problem_not_an_overflow() -> None:
    found = problems_of("globalTTL = 1" + "0" * 400 + "\n")
    assert list(found) == ["globalTTL"]
    assert found["globalTTL"].startswith("expected a duration from 0 to 2592000 seconds")


def test_parentheses_nested_too_deeply_are_one_problem() -> None:
    expression = "(" * 3000 + "a" + ")" * 3000
    found = problems_of(
        MINIMAL + f"[{MATRIX}]\nvars = {{ a = 'm' }}\nsets = {{ s = '{expression}' }}\n"
    )
    assert found == {f"{MATRIX}.sets.s": "parentheses nest more than 20 levels deep"}


def test_parentheses_up_to_the_limit_parse() -> None:
    assert parse_expr("(" * 20 + "a" + ")" * 20) == parse_expr("a")
    with pytest.raises(MatrixExprError, match="parentheses nest more than 20 levels deep"):
        parse_expr("(" * 21 + "a" + ")" * 21)


def test_a_long_chain_of_set_references_expands_without_recursion() -> None:
    count = 3000
    sets = {f"s{index}": f"+s{index + 1} | b" for index in range(count)}
    sets[f"s{count}"] = "a"
    expanded, errors = check_sets(sets, {"a": "model-a", "b": "model-b"})
    assert errors == []
    assert expanded["s0"] == (frozenset({"model-a"}), frozenset({"model-b"}))


def test_a_long_cycle_of_set_references_is_one_error() -> None:
    count = 3000
    sets = {f"s{index}": f"+s{(index + 1) % count}" for index in range(count)}
    expanded, errors = check_sets(sets, {"a": "model-a"})
    assert expanded == {}
    (error,) = errors
    assert error.set_name == "s0"
    assert error.message.startswith("sets refer to each other in a cycle: s0 -> s1 -> s2")


def test_a_set_with_too_many_combinations_is_an_error() -> None:
    variables = {f"v{index}": f"model-{index}" for index in range(24)}
    pairs = " & ".join(f"(v{2 * index} | v{2 * index + 1})" for index in range(12))  # 4096
    expanded, errors = check_sets({"big": pairs, "ok": "v0 & v1"}, variables)
    assert list(expanded) == ["ok"]
    assert [(error.set_name, error.message) for error in errors] == [
        ("big", "expands to more than 1000 combinations of models; list fewer alternatives")
    ]


def test_a_macro_expansion_bomb_is_stopped_at_the_first_macro_too_long() -> None:
    lines = ["[macros]", 'm0 = "' + "x" * 16 + '"']
    lines += [f'm{index} = "${{m{index - 1}}}${{m{index - 1}}}"' for index in range(1, 40)]
    lines += ["[models.a]", 'cmd = "s --port ${PORT} ${m39}"']
    found = problems_of("\n".join(lines) + "\n")
    # m12 is 16 * 2**12 = 65,536 characters: the most a macro may expand to.
    assert found == {
        "macros.m13": "expands to more than 65536 characters; macros may expand to at most that"
    }


def test_a_value_using_long_macros_many_times_is_stopped() -> None:
    macros = f'[macros]\nlong = "{"x" * 40_000}"\n'
    found = problems_of(macros + '[models.a]\ncmd = "s --port ${PORT} ${long} ${long}"\n')
    assert found == {
        "models.a.cmd": (
            "expands to more than 65536 characters with its macros; "
            "macros may expand to at most that"
        )
    }


def test_a_command_line_longer_than_64_kib_is_refused_before_splitting() -> None:
    with pytest.raises(InvalidValue) as info:
        parse_command("server " + "x" * 70_000)
    assert (
        str(info.value) == "the command line is 70007 characters long; at most 65536 are allowed"
    )
    with pytest.raises(InvalidValue, match="at most 65536 are allowed"):
        parse_command(["server", "x" * 40_000, "y" * 40_000])


# --- numeric ranges: whatever check-config accepts, the server runs ---------------------------


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            "healthCheckTimeout = 0\n",
            "healthCheckTimeout",
            "expected a duration from 1 to 86400 seconds (1 day), got 0 seconds",
        ),
        (
            "healthCheckTimeout = '25h'\n",
            "healthCheckTimeout",
            "expected a duration from 1 to 86400 seconds (1 day), got 90000 seconds",
        ),
        (
            "globalTTL = 1e300\n",
            "globalTTL",
            "expected a duration from 0 to 2592000 seconds (30 days), got 1e+300 seconds",
        ),
        (
            "unloadTimeout = 3601\n",
            "unloadTimeout",
            "expected a duration from 0 to 3600 seconds (1 hour), got 3601 seconds",
        ),
        (
            MINIMAL + "ttl = 2592000.5\n",
            "models.m.ttl",
            "expected a duration from 0 to 2592000 seconds (30 days), got 2592000.5 seconds",
        ),
        (
            MINIMAL + "unloadTimeout = '2h'\n",
            "models.m.unloadTimeout",
            "expected a duration from 0 to 3600 seconds (1 hour), got 7200 seconds",
        ),
        (
            "maxBodyBytes = 0\n",
            "maxBodyBytes",
            "expected a size from 1 to 1073741824 bytes (1 GiB), got 0 bytes",
        ),
        (
            "maxBodyBytes = 1073741825\n",
            "maxBodyBytes",
            "expected a size from 1 to 1073741824 bytes (1 GiB), got 1073741825 bytes",
        ),
        (
            "startPort = " + "9" * 4000 + "\n",
            "startPort",
            "expected a port from 1 to 65535, got a 4000-digit number",
        ),
        (
            MINIMAL + "concurrencyLimit = 10001\n",
            "models.m.concurrencyLimit",
            "expected a limit from 1 to 10000, got 10001",
        ),
        (
            MINIMAL + "concurrencyLimit = 0\n",
            "models.m.concurrencyLimit",
            "expected a limit from 1 to 10000, got 0",
        ),
        (
            MINIMAL + "[routing.scheduler.settings.fifo.priority]\nm = 1000001\n",
            "routing.scheduler.settings.fifo.priority.m",
            "expected a priority from -1000000 to 1000000, got 1000001",
        ),
        (
            MINIMAL + f"[{MATRIX}]\nvars = {{ a = 'm' }}\nevict_costs = {{ a = 1000001 }}\n",
            f"{MATRIX}.evict_costs.a",
            "expected a cost from 1 to 1000000, got 1000001",
        ),
        (
            f"[{SERIAL}]\nagingDivisor = 1e300\n",
            f"{SERIAL}.agingDivisor",
            "expected 0 (no aging) or a duration from 0.001 to 86400 seconds (1 day), "
            "got 1e+300 seconds",
        ),
        (
            f"[{SERIAL}]\nagingDivisor = 1e-12\n",
            f"{SERIAL}.agingDivisor",
            "expected 0 (no aging) or a duration from 0.001 to 86400 seconds (1 day), "
            "got 1e-12 seconds",
        ),
        (
            f"[{SERIAL}]\nmaxQueued = 0\n",
            f"{SERIAL}.maxQueued",
            "expected a number of requests from 1 to 10000000, got 0",
        ),
        (
            f"[{SERIAL}]\nslots = 257\n",
            f"{SERIAL}.slots",
            "expected a number of slots from 1 to 256, got 257",
        ),
    ],
)
def test_numbers_out_of_range(text: str, path: str, message: str) -> None:
    assert problems_of(text) == {path: message}


def test_numbers_at_the_ends_of_their_ranges_are_accepted() -> None:
    config = load(
        f"""
        healthCheckTimeout = "24h"
        globalTTL = "720h"
        unloadTimeout = "1h"
        maxBodyBytes = 1073741824
        startPort = 65000

        [models.m]
        cmd = "server --port ${{PORT}}"
        concurrencyLimit = 10000

        [routing.scheduler.settings.fifo.priority]
        m = -1000000

        [{SERIAL}]
        agingDivisor = "1ms"
        """
    )
    assert config.health_check_timeout == 86400.0
    assert config.models["m"].ttl == 2592000.0
    assert config.routing.scheduler.settings.serial.aging_divisor == 0.001
    assert load(f"[{SERIAL}]\nagingDivisor = '24h'\n").routing.scheduler.settings.serial == (
        load(f"[{SERIAL}]\nagingDivisor = 86400\n").routing.scheduler.settings.serial
    )


def test_an_out_of_range_top_level_default_is_reported_once() -> None:
    found = problems_of(
        "globalTTL = 1e300\nunloadTimeout = 1e9\n"
        "[models.a]\ncmd = 'a --port ${PORT}'\n[models.b]\ncmd = 'b --port ${PORT}'\n"
    )
    assert list(found) == ["globalTTL", "unloadTimeout"]


def test_a_huge_swap_affinity_bonus_warns_without_printing_its_digits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaswap.config"):
        config = load(f"[{SERIAL}]\nswapAffinityBonus = {'9' * 4000}\n")
    assert config.routing.scheduler.settings.serial.swap_affinity_bonus == 99
    (record,) = caplog.records
    assert record.getMessage() == f"{SERIAL}.swapAffinityBonus is far above 99; using 99"


# --- API keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ('apiKeys = [""]\n', "apiKeys[0]", "an empty API key can never be sent; remove it"),
        (
            'apiKeys = ["ok", " padded"]\n',
            "apiKeys[1]",
            "an API key must be printable ASCII without spaces: it travels in an HTTP header",
        ),
        (
            'apiKeys = ["clé"]\n',
            "apiKeys[0]",
            "an API key must be printable ASCII without spaces: it travels in an HTTP header",
        ),
        (
            "[peers.p]\nproxy = 'http://h:1'\nmodels = ['m']\napiKey = ''\n",
            "peers.p.apiKey",
            "an empty API key can never be sent; remove it",
        ),
        (
            "[peers.p]\nproxy = 'http://h:1'\nmodels = ['m']\napiKey = \"a\\nb\"\n",
            "peers.p.apiKey",
            "an API key must be printable ASCII without spaces: it travels in an HTTP header",
        ),
    ],
)
def test_api_keys_that_can_never_match_are_refused(text: str, path: str, message: str) -> None:
    assert problems_of(text) == {path: message}


def test_api_keys_do_not_appear_in_messages() -> None:
    (problem,) = problems('apiKeys = ["se cret"]\n')
    assert "se cret" not in problem.message


def test_sets_that_take_too_many_steps_to_expand_are_one_error() -> None:
    variables = {f"v{index}": f"model-{index}" for index in range(9)} | {"w": "model-w"}
    sets = {"base": " & ".join(f"(v{index} | w)" for index in range(9))}  # 512 combinations
    sets |= {f"square{index}": "+base & +base" for index in range(6)}  # 262,144 steps each
    expanded, errors = check_sets(sets, variables)
    assert list(expanded) == ["base", "square0", "square1", "square2"]
    assert [(error.set_name, error.message) for error in errors] == [
        ("square3", "the sets take more than 1000000 steps to expand; list fewer alternatives")
    ]


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            MINIMAL + 'proxy = "http://127.0.0.1:99999"\n',
            "models.m.proxy",
            "expected a port from 1 to 65535 in the URL, got 'http://127.0.0.1:99999'",
        ),
        (
            MINIMAL + 'proxy = "http://127.0.0.1:0"\n',
            "models.m.proxy",
            "expected a port from 1 to 65535 in the URL, got 'http://127.0.0.1:0'",
        ),
        (
            "[peers.p]\nproxy = 'http://h:abc'\nmodels = ['m']\n",
            "peers.p.proxy",
            "expected a port from 1 to 65535 in the URL, got 'http://h:abc'",
        ),
        (
            "[peers.p]\nproxy = 'http://[::1'\nmodels = ['m']\n",
            "peers.p.proxy",
            "expected an http:// or https:// URL, got 'http://[::1'",
        ),
        (
            "[peers.p]\nproxy = 'http://:80'\nmodels = ['m']\n",
            "peers.p.proxy",
            "expected an http:// or https:// URL, got 'http://:80'",
        ),
    ],
)
def test_urls_whose_port_cannot_be_used_are_refused(text: str, path: str, message: str) -> None:
    assert problems_of(text) == {path: message}
