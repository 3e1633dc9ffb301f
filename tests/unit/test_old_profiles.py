"""llama-swap's older profile form (``[profiles.NAME] members``): names, evictions and
validation, as pure code."""

from __future__ import annotations

import pytest

from llamaswap.config.model import GroupConfig
from llamaswap.errors import ModelNotFound
from llamaswap.router.names import Local, Names
from llamaswap.router.swappers import GroupSwapper, TogetherSwapper, make_swapper
from llamaswap.router.swappers.together import mates
from tests.fakes import FakeLoads
from tests.unit.test_config import load, problems_of

CONFIG = """
[models.coder]
cmd = "server --port ${PORT}"
aliases = ["qwen-coder"]
[models.architect]
cmd = "server --port ${PORT}"
[models."QwQ:32b"]
cmd = "server --port ${PORT}"
[models.other]
cmd = "server --port ${PORT}"

[profiles.aider]
members = ["coder", "architect"]
[profiles.think]
members = ["QwQ:32b", "coder"]
"""


def test_profile_colon_model_reaches_the_member_under_its_own_name() -> None:
    names = Names(load(CONFIG), FakeLoads())
    assert names.route("aider:coder") == ("coder", Local("coder"))
    assert names.route("aider:architect") == ("architect", Local("architect"))
    # An alias of a member after the prefix: the model server gets the alias, as sent.
    assert names.route("aider:qwen-coder") == ("qwen-coder", Local("coder"))
    # The first ":" splits: a member's ID may hold one, and so may a plain model's name.
    assert names.route("think:QwQ:32b") == ("QwQ:32b", Local("QwQ:32b"))
    assert names.route("QwQ:32b") == ("QwQ:32b", Local("QwQ:32b"))
    assert names.upstream("aider:coder") == Local("coder")
    assert names.resolve_path("aider:architect", "health") == (Local("architect"), "/health")
    assert names.members() == [
        ("aider:coder", "coder"),
        ("aider:architect", "architect"),
        ("think:QwQ:32b", "QwQ:32b"),
        ("think:coder", "coder"),
    ]


def test_a_model_outside_the_profile_or_an_unknown_profile_is_not_found() -> None:
    names = Names(load(CONFIG), FakeLoads())
    with pytest.raises(ModelNotFound) as info:
        names.route("aider:other")
    assert str(info.value) == (
        "model 'aider:other' not found: profile 'aider' has no such model "
        "(its models: 'coder', 'architect')"
    )
    with pytest.raises(ModelNotFound, match="profile 'aider' has no such model"):
        names.route("aider:nope")
    with pytest.raises(ModelNotFound, match="not found; GET /v1/models lists the models"):
        names.route("nope:coder")
    with pytest.raises(ModelNotFound):
        names.upstream("aider:other")


def test_mates_are_pairwise_across_profiles() -> None:
    assert mates([["a", "b"], ["a", "c"], ["d"]]) == {
        "a": {"b", "c"},
        "b": {"a"},
        "c": {"a"},
    }


def test_members_never_evict_each_other_and_the_rules_decide_the_rest() -> None:
    swapper = TogetherSwapper(GroupSwapper({}), mates([["coder", "architect"]]))
    # With no groups one model runs at a time, except the profile's models together.
    assert swapper.eviction_for("coder", {"architect"}) == frozenset()
    assert swapper.eviction_for("architect", {"coder"}) == frozenset()
    assert swapper.eviction_for("coder", {"architect", "other"}) == {"other"}
    assert swapper.eviction_for("other", {"architect", "coder"}) == {"architect", "coder"}


def test_a_persistent_group_still_stays_and_a_mate_of_a_mate_is_no_mate() -> None:
    inner = GroupSwapper(
        {"embed": GroupConfig(members=("e",), persistent=True, exclusive=False, swap=False)}
    )
    swapper = TogetherSwapper(inner, mates([["a", "b"], ["a", "c"]]))
    assert swapper.persistent == {"e"}
    assert swapper.eviction_for("a", {"b", "c", "e"}) == frozenset()
    assert swapper.eviction_for("b", {"a", "c", "e"}) == {"c"}


def test_make_swapper_wraps_only_when_a_profile_has_members() -> None:
    assert isinstance(make_swapper(load(CONFIG)), TogetherSwapper)
    plain = load('[models.a]\ncmd = "s --port ${PORT}"\n[profiles.p]\npins = {x = "a"}')
    assert isinstance(make_swapper(plain), GroupSwapper)
    matrix = make_swapper(
        load(
            CONFIG
            + """
            [routing.router]
            use = "matrix"
            [routing.router.settings.matrix]
            vars = {c = "coder", a = "architect", o = "other"}
            sets = {solo = "c | a | o"}
            """.replace("\n            ", "\n")
        )
    )
    assert matrix.eviction_for("coder", {"architect", "other"}) == {"other"}


def test_members_are_checked_with_key_paths() -> None:
    found = problems_of("""
        [models.a]
        cmd = "s --port ${PORT}"
        aliases = ["a2"]
        [models."p:a"]
        cmd = "s --port ${PORT}"
        [profiles.p]
        members = ["a", "a2", "nope", "a"]
        [profiles."x:y"]
        members = ["a"]
        [profiles.q]
        pins = {m = "p:a2"}
        [profiles.r]
        pins = {n = "p:zz"}
        """)
    assert found == {
        "profiles.p.members[0]": "'p:a' is already a name (a model, alias, selector, peer "
        "model or pin); rename the profile or that name",
        "profiles.p.members[1]": "'a2' is an alias; list the model ID 'a'",
        "profiles.p.members[2]": "unknown model 'nope'; known models: 'a', 'p:a'",
        "profiles.p.members[3]": "model 'a' is listed twice",
        'profiles."x:y"': "a profile with members is reached as NAME:MODEL: its name 'x:y' "
        "must not contain ':'",
        "profiles.r.pins.n": found["profiles.r.pins.n"],
    }
    assert found["profiles.r.pins.n"].startswith("unknown model, alias or selector 'p:zz'")
