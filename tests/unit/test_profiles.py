"""Profiles and selectors: the strategies, name resolution and validation, as pure code."""

from __future__ import annotations

import pytest

from llamaswap.errors import BadRequest, ModelNotFound
from llamaswap.process import ModelState
from llamaswap.router.names import Local, Names, Peer
from llamaswap.router.selectors import spillover, warm
from tests.fakes import FakeLoads
from tests.unit.test_config import load, problems_of

READY, STARTING, STOPPING = ModelState.READY, ModelState.STARTING, ModelState.STOPPING

CONFIG = """
[models.big]
cmd = "server --port ${PORT}"
aliases = ["gpt-oss"]
[models.small]
cmd = "server --port ${PORT}"
[models.small.filters.setParamsByID.small-hot]
temperature = 1.5
[models.tiny]
cmd = "server --port ${PORT}"
[peers.gpu2]
proxy = "http://10.0.0.2:8080"
models = ["remote"]

[selectors.coding]
strategy = "warm"
targets = ["big", "small"]
name = "Coding"
description = "the best model loaded"
metadata = {purpose = "coding"}
[selectors.plan]
strategy = "pin"
targets = ["gpu2/remote", "big"]
[selectors.burst]
strategy = "spillover"
targets = ["small", "tiny"]
settings.spillover = 2

[profiles.work]
description = "day time"
pins = {llm = "coding", small = "", big = "small-hot", "org/x" = "tiny"}
"""


def test_warm_takes_the_first_ready_then_starting_then_the_first() -> None:
    models = ["a", "b", "c"]
    assert warm(models, FakeLoads()) == 0
    assert warm(models, FakeLoads({"c": STARTING, "a": STOPPING})) == 2
    assert warm(models, FakeLoads({"b": STARTING, "c": STARTING})) == 1
    assert warm(models, FakeLoads({"b": STARTING, "c": READY})) == 2
    assert warm(models, FakeLoads({"b": READY, "c": READY})) == 1


def test_spillover_fills_each_target_in_order_then_the_least_busy() -> None:
    models = ["a", "b", "c"]
    assert spillover(models, 2, FakeLoads()) == 0
    assert spillover(models, 2, FakeLoads(wanted_by={"a": 1})) == 0
    assert spillover(models, 2, FakeLoads(wanted_by={"a": 2})) == 1
    assert spillover(models, 2, FakeLoads(wanted_by={"a": 2, "b": 2})) == 2
    # Drained at the front: back to the first.
    assert spillover(models, 2, FakeLoads(wanted_by={"a": 0, "b": 2, "c": 1})) == 0
    # All full: the fewest, the first of those tied.
    assert spillover(models, 2, FakeLoads(wanted_by={"a": 5, "b": 3, "c": 3})) == 1


def test_selectors_pick_per_request_from_what_the_router_knows() -> None:
    loads = FakeLoads()
    names = Names(load(CONFIG), loads)
    assert names.route("coding") == ("big", Local("big"))
    loads.states["small"] = READY
    assert names.route("coding") == ("small", Local("small"))  # warm: the ready one
    route = names.route("plan")
    assert route[0] == "gpu2/remote"
    assert isinstance(route[1], Peer)
    assert names.route("burst") == ("small", Local("small"))
    loads.wanted_by["small"] = 2
    assert names.route("burst") == ("tiny", Local("tiny"))
    assert names.selector("coding") is not None
    assert names.selector("big") is None


def test_a_profile_pins_names_before_selectors_and_aliases() -> None:
    config = load(CONFIG)
    loads = FakeLoads()
    assert Names(config, loads).route("big") == ("big", Local("big"))
    names = Names(config, loads, "work")
    assert names.profile == "work"
    assert names.route("llm") == ("big", Local("big"))  # a pin to a selector
    assert names.route("big") == ("small-hot", Local("small"))  # to a setParamsByID alias
    assert names.route("gpt-oss") == ("gpt-oss", Local("big"))  # not pinned: as it was
    with pytest.raises(ModelNotFound, match="turned off by the active profile 'work'"):
        names.resolve("small")
    found = names.selector("llm")
    assert found is not None
    assert found[0] == "coding"
    # /upstream/: pins apply, selectors do not; a pin's name may hold a "/".
    assert names.resolve_path("org", "x/health") == (Local("tiny"), "/health")
    with pytest.raises(BadRequest, match="'llm' is a selector"):
        names.resolve_path("llm", "health")
    with pytest.raises(ModelNotFound):
        names.resolve_path("small", "health")


def test_selectors_and_profiles_are_checked_with_key_paths() -> None:
    found = problems_of("""
        [models.a]
        cmd = "s --port ${PORT}"
        aliases = ["a2"]
        [peers.p]
        proxy = "http://10.0.0.2:8080"
        models = ["r"]
        [selectors.r]
        strategy = "pin"
        targets = ["a"]
        [selectors.s]
        strategy = "warm"
        targets = ["p/r", "a", "a2", "r", "nope"]
        [selectors.t]
        strategy = "fastest"
        targets = []
        [selectors.u]
        strategy = "spillover"
        targets = ["a"]
        settings.spillover = 0
        [profiles.x]
        pins = {m = "zz", n = "", " bad" = "a"}
        """)
    assert found == {
        "selectors.r": "'r' is already the name of a peer's model",
        "selectors.s.targets[0]": "'p/r' is a peer's model; strategy 'warm' reads the state "
        'of local models only ("pin" takes any model)',
        "selectors.s.targets[2]": "model 'a' is already a target",
        "selectors.s.targets[3]": "'r' is a selector; a selector's targets are models",
        "selectors.s.targets[4]": "unknown model or alias 'nope'; "
        "known models and aliases: 'a', 'a2', 'p/r', 'r'",
        "selectors.t.strategy": found["selectors.t.strategy"],
        "selectors.u.settings.spillover": found["selectors.u.settings.spillover"],
        "profiles.x.pins.m": found["profiles.x.pins.m"],
        'profiles.x.pins." bad"': found['profiles.x.pins." bad"'],
    }
    assert "'fastest'" in found["selectors.t.strategy"]
    assert found["profiles.x.pins.m"].startswith("unknown model, alias or selector 'zz'")
