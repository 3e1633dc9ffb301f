"""Matrix set expressions: the parser, expansion to combinations, and config validation."""

from __future__ import annotations

import textwrap

import pytest

from llamaswap.config import loads_config
from llamaswap.config.matrix_expr import (
    And,
    MatrixExprError,
    Name,
    Or,
    SetRef,
    check_sets,
    expand_sets,
    parse_expr,
)
from llamaswap.errors import ConfigError
from tests.unit.ports import every_port_free

VARS = {"a": "model-a", "b": "model-b", "c": "model-c", "d": "model-d"}


def combos(*groups: str) -> tuple[frozenset[str], ...]:
    """``combos("ab", "c")`` → ({model-a, model-b}, {model-c})."""
    return tuple(frozenset(f"model-{letter}" for letter in group) for group in groups)


def test_parse_tree_and_precedence() -> None:
    assert parse_expr("a | b & c") == Or((Name("a"), And((Name("b"), Name("c")))))
    assert parse_expr("(a | b) & +other") == And((Or((Name("a"), Name("b"))), SetRef("other")))
    assert parse_expr(" a ") == Name("a")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("a", combos("a")),
        ("a & b", combos("ab")),
        ("a | b", combos("a", "b")),
        ("a & (b | c)", combos("ab", "ac")),
        ("a | b & c", combos("a", "bc")),
        ("(a | b) & (c | d)", combos("ac", "ad", "bc", "bd")),
        ("a | a", combos("a")),
        ("a & a", combos("a")),
        ("(a & b) | (b & a) | c", combos("ab", "c")),
    ],
)
def test_expansion(expression: str, expected: tuple[frozenset[str], ...]) -> None:
    assert expand_sets({"s": expression}, VARS) == {"s": expected}


def test_set_reference_splices_the_other_sets_combinations() -> None:
    sets = {"all": "+pair | d", "pair": "a & (b | c)", "wide": "+pair & d"}
    assert expand_sets(sets, VARS) == {
        "all": combos("ab", "ac", "d"),
        "pair": combos("ab", "ac"),
        "wide": combos("abd", "acd"),
    }


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "the expression is empty"),
        ("   ", "the expression is empty"),
        ("a &", "expected a var name, '+set' or '(' but found the end of the expression"),
        ("a & | b", "expected a var name, '+set' or '(' but found '|' at column 5"),
        ("(a | b", "expected ')' but found the end of the expression"),
        ("a b", "unexpected 'b' at column 3; join names with '&' or '|'"),
        ("a )", "unexpected ')' at column 3; join names with '&' or '|'"),
        ("+", "expected a set name after '+' but found the end of the expression"),
        ("+ (a)", "expected a set name after '+' but found '(' at column 3"),
    ],
)
def test_syntax_errors(expression: str, message: str) -> None:
    with pytest.raises(MatrixExprError) as info:
        parse_expr(expression)
    assert info.value.message == message


def test_check_sets_reports_each_bad_set_once() -> None:
    sets = {
        "ok": "a & b",
        "typo": "a & bb",
        "uses_typo": "+typo | c",
        "missing": "+nope",
        "loop1": "+loop2",
        "loop2": "c | +loop1",
        "self": "+self",
    }
    expanded, errors = check_sets(sets, VARS)
    assert expanded == {"ok": combos("ab")}
    assert [(error.set_name, error.message) for error in errors] == [
        ("typo", "unknown var 'bb'; known vars: 'a', 'b', 'c', 'd'"),
        (
            "missing",
            "unknown set '+nope'; known sets: 'loop1', 'loop2', 'ok', 'self', 'typo', 'uses_typo'",
        ),
        ("loop1", "sets refer to each other in a cycle: loop1 -> loop2 -> loop1"),
        ("self", "sets refer to each other in a cycle: self -> self"),
    ]


def test_expand_sets_raises_the_first_error() -> None:
    with pytest.raises(MatrixExprError) as info:
        expand_sets({"s": "a & zz"}, VARS)
    assert info.value.set_name == "s"
    assert str(info.value) == "set 's': unknown var 'zz'; known vars: 'a', 'b', 'c', 'd'"


MODELS = """
[models.chat]
cmd = "chat --port ${PORT}"
[models.embed]
cmd = "embed --port ${PORT}"
[models.coder]
cmd = "coder --port ${PORT}"
[routing.router]
use = "matrix"
"""


def test_matrix_config_loads() -> None:
    config = loads_config(
        MODELS
        + textwrap.dedent(
            """
            [routing.router.settings.matrix]
            vars = { c = "chat", e = "embed", k = "coder" }
            evict_costs = { c = 3 }
            sets = { work = "(c | k) & e" }
            """
        ),
        environ={},
        free=every_port_free,
    )
    matrix = config.routing.router.settings.matrix
    assert matrix is not None
    assert matrix.evict_costs == {"c": 3}
    assert expand_sets(matrix.sets, matrix.vars) == {
        "work": (frozenset({"chat", "embed"}), frozenset({"coder", "embed"}))
    }


def test_matrix_problems_are_reported_at_their_paths() -> None:
    text = MODELS + textwrap.dedent(
        """
        [routing.router.settings.matrix]
        vars = { c = "chat", e = "embd" }
        evict_costs = { c = 0, x = 2, e = "high" }
        sets = { s1 = "c & (e", s2 = "c & q" }
        """
    )
    with pytest.raises(ConfigError) as info:
        loads_config(text, environ={}, free=every_port_free)
    found = {problem.path: problem.message for problem in info.value.problems}
    base = "routing.router.settings.matrix"
    assert found == {
        f"{base}.evict_costs.e": "expected an integer, got 'high'",
        f"{base}.vars.e": "unknown model 'embd'; did you mean 'embed'?",
        f"{base}.evict_costs.c": "expected a cost from 1 to 1000000, got 0",
        f"{base}.evict_costs.x": "unknown var 'x'; known vars: 'c', 'e'",
        f"{base}.sets.s1": "expected ')' but found the end of the expression",
        f"{base}.sets.s2": "unknown var 'q'; known vars: 'c', 'e'",
    }
