"""The matrix swapper as a pure function, one test per rule, and a brute-force cross-check."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence, Set

from hypothesis import given, settings
from hypothesis import strategies as st

from llamaswap.config import loads_config
from llamaswap.config.model import MatrixConfig
from llamaswap.router.swappers import make_swapper
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.router.swappers.matrix import MatrixSwapper
from tests.unit.ports import every_port_free


def matrix(sets: Mapping[str, str], **costs: int) -> MatrixSwapper:
    """Vars ``a``..``f`` name the models ``a``..``f`` themselves."""
    variables = {name: name for name in "abcdef"}
    return MatrixSwapper(MatrixConfig(vars=variables, evict_costs=costs, sets=sets))


PAIR_AND_SOLO = matrix({"pair": "a & b", "solo": "c"})


def test_models_in_one_set_run_together() -> None:
    assert PAIR_AND_SOLO.eviction_for("b", {"a"}) == frozenset()
    assert PAIR_AND_SOLO.eviction_for("a", {"b"}) == frozenset()


def test_a_model_outside_the_chosen_set_is_evicted() -> None:
    assert PAIR_AND_SOLO.eviction_for("c", {"a", "b"}) == {"a", "b"}
    assert PAIR_AND_SOLO.eviction_for("a", {"c"}) == {"c"}
    assert PAIR_AND_SOLO.eviction_for("a", {"b", "c"}) == {"c"}


def test_nothing_running_or_only_the_target_evicts_nothing() -> None:
    assert PAIR_AND_SOLO.eviction_for("c", set()) == frozenset()
    assert PAIR_AND_SOLO.eviction_for("c", {"c"}) == frozenset()
    assert PAIR_AND_SOLO.eviction_for("a", {"a", "b"}) == frozenset()


def test_any_subset_of_a_set_may_run() -> None:
    swapper = matrix({"trio": "a & b & c"})
    assert swapper.eviction_for("a", {"c"}) == frozenset()
    assert swapper.eviction_for("a", set()) == frozenset()


def test_a_model_in_no_set_runs_alone() -> None:
    assert PAIR_AND_SOLO.eviction_for("d", {"a", "b"}) == {"a", "b"}
    # ...and a model in no set is evicted by any other load (it is in no set with it).
    assert PAIR_AND_SOLO.eviction_for("a", {"b", "d"}) == {"d"}


def test_a_model_in_no_var_runs_alone_and_any_load_evicts_it() -> None:
    swapper = matrix({"x": "a & b", "y": "a & c"}, c=2)
    assert swapper.eviction_for("outsider", {"a", "c"}) == {"a", "c"}
    # The outsider goes whichever set is chosen; the choice is made on the others (b, 1).
    assert swapper.eviction_for("a", {"b", "c", "outsider"}) == {"b", "outsider"}


def test_the_cheapest_set_wins() -> None:
    swapper = matrix({"with_b": "a & b", "with_c": "a & c"}, b=5)
    assert swapper.eviction_for("a", {"b", "c"}) == {"c"}  # keeps b, the dear one
    swapper = matrix({"with_b": "a & b", "with_c": "a & c"}, c=5)
    assert swapper.eviction_for("a", {"b", "c"}) == {"b"}


def test_costs_add_up_over_the_evicted_models() -> None:
    swapper = matrix({"with_d": "a & d", "with_bc": "a & b & c"}, d=3)
    assert swapper.eviction_for("a", {"b", "c", "d"}) == {"b", "c"}  # 1 + 1 < 3
    swapper = matrix({"with_d": "a & d", "with_bc": "a & b & c"}, d=2)
    assert swapper.eviction_for("a", {"b", "c", "d"}) == {"b", "c"}  # a tie: first defined
    swapper = matrix({"with_bc": "a & b & c", "with_d": "a & d"}, d=2)
    assert swapper.eviction_for("a", {"b", "c", "d"}) == {"d"}


def test_ties_go_to_the_first_defined_set() -> None:
    first_b = matrix({"with_b": "a & b", "with_c": "a & c"})
    first_c = matrix({"with_c": "a & c", "with_b": "a & b"})
    assert first_b.eviction_for("a", {"b", "c"}) == {"c"}
    assert first_c.eviction_for("a", {"b", "c"}) == {"b"}


def test_within_a_set_the_first_combination_wins_a_tie() -> None:
    swapper = matrix({"either": "a & (c | b)"})
    assert swapper.eviction_for("a", {"b", "c"}) == {"b"}


def test_set_references_compose() -> None:
    swapper = matrix({"pair": "a & b", "plus_c": "+pair & c | d"})
    assert swapper.candidates("c") == [frozenset("abc")]
    assert swapper.eviction_for("c", {"a", "b", "d"}) == {"d"}
    assert swapper.eviction_for("d", {"a", "b", "c"}) == {"a", "b", "c"}


def test_a_combination_offered_twice_is_a_candidate_once() -> None:
    swapper = matrix({"x": "a & b", "y": "b & a | a & c"})
    assert swapper.candidates("a") == [frozenset("ab"), frozenset("ac")]


def test_two_vars_for_one_model_cost_the_dearer() -> None:
    config = MatrixConfig(
        vars={"a": "a", "b": "b", "big": "c", "c": "c"},
        evict_costs={"big": 4, "c": 2},
        sets={"x": "a & b", "y": "a & c"},
    )
    assert MatrixSwapper(config).cost("c") == 4
    assert MatrixSwapper(config).eviction_for("a", {"b", "c"}) == {"b"}


# ------------------------------------------------------------------ busy models


def test_a_set_that_evicts_nothing_busy_wins_over_a_cheaper_one() -> None:
    swapper = matrix({"with_b": "a & b", "with_c": "a & c"}, c=5)
    assert swapper.eviction_for("a", {"b", "c"}) == {"b"}  # cheapest
    assert swapper.eviction_for("a", {"b", "c"}, busy={"b"}) == {"c"}  # b is serving


def test_among_sets_that_evict_nothing_busy_the_cheapest_wins() -> None:
    swapper = matrix({"with_d": "a & d", "with_b": "a & b & d", "with_c": "a & c & d"}, b=3)
    running = {"b", "c", "d"}
    assert swapper.eviction_for("a", running, busy={"d"}) == {"c"}  # keeps d and b
    assert swapper.eviction_for("a", running, busy={"c", "d"}) == {"b"}


def test_when_every_set_evicts_a_busy_model_the_cheapest_is_chosen() -> None:
    swapper = matrix({"with_b": "a & b", "with_c": "a & c"}, c=5)
    assert swapper.eviction_for("a", {"b", "c"}, busy={"b", "c"}) == {"b"}
    swapper = matrix({"with_b": "a & b", "with_c": "a & c"}, b=5)
    assert swapper.eviction_for("a", {"b", "c"}, busy={"b", "c"}) == {"c"}


def test_a_busy_model_does_not_save_itself_from_a_model_that_runs_alone() -> None:
    assert PAIR_AND_SOLO.eviction_for("c", {"a", "b"}, busy={"a"}) == {"a", "b"}


def test_the_group_swapper_ignores_busy() -> None:
    swapper = GroupSwapper({})
    assert swapper.eviction_for("a", {"b"}, busy={"b"}) == {"b"}


# ------------------------------------------------------------------ the config


def test_use_matrix_builds_the_matrix_swapper() -> None:
    config = loads_config(
        """
        [models.chat]
        cmd = "server --port ${PORT}"
        [models.embed]
        cmd = "server --port ${PORT}"
        [models.big]
        cmd = "server --port ${PORT}"
        [routing.router]
        use = "matrix"
        [routing.router.settings.matrix]
        vars = { c = "chat", e = "embed", b = "big" }
        evict_costs = { b = 3 }
        sets = { daily = "c & e", solo = "b" }
        """,
        free=every_port_free,
    )
    swapper = make_swapper(config)
    assert isinstance(swapper, MatrixSwapper)
    assert swapper.eviction_for("chat", {"embed"}) == frozenset()
    assert swapper.eviction_for("chat", {"big"}) == {"big"}
    assert swapper.cost("big") == 3


# ------------------------------------------------- brute force, by the definition

MODELS = "abcd"  # few models, so that sets overlap and choices are close


def brute_force(
    combinations: Sequence[frozenset[str]],
    costs: Mapping[str, int],
    target: str,
    running: Set[str],
    busy: Set[str],
) -> frozenset[str]:
    """Try every subset of the other running models as the eviction: it is allowed if what
    remains, with the target, fits in one combination (or is the target alone when no
    combination holds it). Best: evicts nothing busy, then cheapest, then the earliest
    combination that allows it."""
    others = sorted(running - {target})
    fits_somewhere = any(target in combo for combo in combinations)
    best: tuple[tuple[bool, int, int], frozenset[str]] | None = None
    for size in range(len(others) + 1):
        for evict in map(frozenset, itertools.combinations(others, size)):
            remaining = (set(others) - evict) | {target}
            if fits_somewhere:
                allowed = [i for i, combo in enumerate(combinations) if remaining <= combo]
                if not allowed:
                    continue
                index = allowed[0]
            elif remaining != {target}:
                continue
            else:
                index = 0
            key = (bool(evict & busy), sum(costs.get(m, 1) for m in evict), index)
            if best is None or key < best[0]:
                best = (key, evict)
    assert best is not None  # evicting everything else is always allowed
    return best[1]


combination = st.frozensets(st.sampled_from(MODELS), min_size=1, max_size=3)
named_sets = st.lists(st.lists(combination, min_size=1, max_size=3), min_size=1, max_size=5)


@st.composite
def situations(draw: st.DrawFn) -> tuple[str, frozenset[str], frozenset[str]]:
    """A target, the running models (z: in no set, no var), and the busy ones among them."""
    target = draw(st.sampled_from(MODELS + "z"))
    running = draw(st.frozensets(st.sampled_from(MODELS + "z"), min_size=1))
    busy = draw(st.frozensets(st.sampled_from(sorted(running))))
    return target, running, busy


@settings(max_examples=1000, deadline=None)
@given(named_sets, st.dictionaries(st.sampled_from(MODELS), st.integers(1, 4)), situations())
def test_the_choice_equals_the_brute_force_best(
    sets: list[list[frozenset[str]]],
    costs: dict[str, int],
    situation: tuple[str, frozenset[str], frozenset[str]],
) -> None:
    target, running, busy = situation
    # Each set as an expression: its combinations joined by '|', each an '&' of vars.
    expressions = {
        f"s{i}": " | ".join(" & ".join(sorted(combo)) for combo in combos)
        for i, combos in enumerate(sets)
    }
    config = MatrixConfig(vars={m: m for m in MODELS}, evict_costs=costs, sets=expressions)
    flat = [combo for combos in sets for combo in combos]
    expected = brute_force(flat, costs, target, running, busy)
    assert MatrixSwapper(config).eviction_for(target, running, busy) == expected
