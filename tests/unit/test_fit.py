"""The fit rule (resources/fit.py) and the swappers that apply it, as pure code."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest

from llamaswap.config.model import GroupConfig, MatrixConfig
from llamaswap.config.values import InvalidValue, parse_memory, parse_size
from llamaswap.observability.model_server import resident_capacity
from llamaswap.resources.fit import applies, fits_beside, make_room
from llamaswap.resources.oom import out_of_memory
from llamaswap.router.swappers import GroupSwapper, MatrixSwapper, TogetherSwapper, make_swapper
from llamaswap.router.swappers.together import mates
from llamaswap.schedulers import Swapper
from tests.unit.test_config import load

GiB = 2**30


class Figures:
    """A placement from plain tables: needs by model, budgets by device, costs."""

    def __init__(
        self,
        needs: Mapping[str, Mapping[str, int]],
        budgets: Mapping[str, int],
        costs: Mapping[str, float] | None = None,
    ) -> None:
        self.needs, self.budgets, self.costs = needs, budgets, costs or {}

    def need(self, model: str) -> Mapping[str, int] | None:
        return self.needs.get(model)

    def budget(self, device: str) -> int | None:
        return self.budgets.get(device)

    def cost(self, model: str) -> float:
        return self.costs.get(model, 1.0)


GPU24 = {"gpu0": 24 * GiB}


def figures(costs: Mapping[str, float] | None = None, /, **needs: int) -> Figures:
    return Figures({m: {"gpu0": n * GiB} for m, n in needs.items()}, GPU24, costs)


def test_a_target_that_fits_beside_the_running_models_evicts_nothing() -> None:
    assert make_room(figures(a=10, b=8, c=4), "c", {"a", "b"}) == frozenset()


def test_the_cheapest_set_that_makes_room_is_evicted() -> None:
    placement = figures({"a": 30.0, "b": 2.0, "c": 3.0}, a=12, b=6, c=6, t=10)
    # 24 GiB, 24 held: t needs 10. Freeing b + c (12 GiB, cost 5) beats a (cost 30).
    assert make_room(placement, "t", {"a", "b", "c"}) == frozenset({"b", "c"})
    # Made dear, b and c together cost more than a.
    placement = figures({"a": 4.0, "b": 2.0, "c": 3.0}, a=12, b=6, c=6, t=10)
    assert make_room(placement, "t", {"a", "b", "c"}) == frozenset({"a"})


def test_a_set_that_evicts_no_busy_model_beats_a_cheaper_one() -> None:
    placement = figures({"a": 1.0, "b": 50.0}, a=12, b=12, t=12)
    assert make_room(placement, "t", {"a", "b"}) == frozenset({"a"})
    assert make_room(placement, "t", {"a", "b"}, busy={"a"}) == frozenset({"b"})
    # Both busy: the cheapest still, and the ledger waits for it.
    assert make_room(placement, "t", {"a", "b"}, busy={"a", "b"}) == frozenset({"a"})


def test_spared_models_stay_and_with_no_room_every_candidate_goes() -> None:
    placement = figures(a=20, b=2, t=10)
    assert make_room(placement, "t", {"a", "b"}, spared={"a"}) == frozenset({"b"})
    assert make_room(figures(a=4, t=30), "t", {"a"}) == frozenset({"a"})


def test_a_running_model_of_unknown_memory_holds_the_whole_device() -> None:
    placement = figures(a=2, t=2)  # "u" has no figure
    assert make_room(placement, "t", {"a", "u"}) == frozenset({"u"})


def test_the_rule_applies_only_with_a_need_and_budgets_for_its_devices() -> None:
    placement = Figures({"t": {"gpu0": GiB, "gpu1": GiB}, "s": {"gpu0": GiB}}, GPU24)
    assert not applies(placement, "t")  # gpu1 has no budget
    assert make_room(placement, "t", {"s"}) is None
    assert applies(placement, "s")
    assert not applies(placement, "unknown")


def test_several_devices_must_all_fit() -> None:
    budgets = {"gpu0": 24 * GiB, "gpu1": 8 * GiB}
    needs = {
        "a": {"gpu0": 4 * GiB, "gpu1": 6 * GiB},
        "b": {"gpu0": 16 * GiB},
        "t": {"gpu0": 4 * GiB, "gpu1": 4 * GiB},
    }
    # gpu0 has room for t beside a and b (24 of 24), gpu1 does not beside a.
    assert make_room(Figures(needs, budgets), "t", {"a", "b"}) == frozenset({"a"})


def test_many_candidates_are_evicted_greedily_until_it_fits() -> None:
    needs = {f"m{i}": 1 for i in range(20)}
    placement = figures(t=10, **needs)
    # 20 of 24 GiB held; t needs 10: six models go.
    evicted = make_room(placement, "t", set(needs))
    assert evicted is not None
    assert len(evicted) == 6


def test_the_implicit_group_gives_way_to_the_fit_rule() -> None:
    swapper = GroupSwapper({}, figures({"a": 5.0}, a=10, b=8, c=10))
    assert swapper.eviction_for("b", {"a"}) == frozenset()  # they fit together
    assert swapper.eviction_for("c", {"a", "b"}) == {"b"}  # either makes room; b is cheaper
    # Without figures, one model at a time, as before.
    assert GroupSwapper({}).eviction_for("b", {"a"}) == {"a"}
    # A target of unknown memory: the implicit group's rules.
    assert GroupSwapper({}, figures(a=10)).eviction_for("x", {"a"}) == {"a"}


def test_an_explicit_group_applies_its_rules_then_the_fit_rule() -> None:
    groups = {
        "pair": GroupConfig(members=("a", "b"), swap=True, exclusive=False),
        "keep": GroupConfig(members=("k",), persistent=True),
    }
    swapper = GroupSwapper(groups, figures(a=10, b=10, k=10, x=10))
    assert swapper.eviction_for("b", {"a"}) == {"a"}  # swap = true: one of the pair
    # b does not fit beside k and x: x goes (k is persistent).
    assert swapper.eviction_for("b", {"a", "k", "x"}) == {"a", "x"}
    assert swapper.persistent == {"k"}


def test_the_matrix_evicts_more_where_its_set_leaves_no_room() -> None:
    matrix = MatrixConfig(vars={"a": "a", "b": "b"}, sets={"both": "a & b"})
    assert MatrixSwapper(matrix).eviction_for("a", {"b"}) == frozenset()
    assert MatrixSwapper(matrix, figures(a=20, b=10)).eviction_for("a", {"b"}) == {"b"}


def test_fits_beside_asks_only_whether_it_fits() -> None:
    assert fits_beside(figures(a=10, b=8, c=4), "c", {"a", "b"}) is True
    assert fits_beside(figures(a=10, b=8, c=8), "c", {"a", "b"}) is False
    assert fits_beside(figures(a=10), "x", {"a"}) is None  # x's need is unknown


MODELS = "abcdef"
GROUPS = {
    "pair": GroupConfig(members=("a", "b"), swap=True, exclusive=False),
    "free": GroupConfig(members=("c", "d"), swap=False, exclusive=False),
}
MATRIX = MatrixConfig(vars={m: m for m in MODELS}, sets={"ab": "a & b", "many": "c & d & e & f"})


#: Sizes in GiB of 24: all fit together; some do; few do; one of unknown memory (e).
NEEDS = [
    dict.fromkeys(MODELS, 4),
    {"a": 10, "b": 10, "c": 8, "d": 8, "e": 6, "f": 12},
    {"a": 16, "b": 2, "c": 12, "d": 12, "f": 20},
]


@pytest.mark.parametrize("needs", NEEDS)
@pytest.mark.parametrize(
    "policy", ["implicit", "groups", "matrix", "together-groups", "together-matrix"]
)
def test_runs_beside_is_eviction_for_stopping_nothing(needs: dict[str, int], policy: str) -> None:
    """Without persistent models (with them, nothing may be stopped for a model that does
    not fit), ``runs_beside`` says exactly where ``eviction_for`` stops nothing: every
    target against every running set."""
    placement = figures(**needs)
    swappers: dict[str, Swapper] = {
        "implicit": GroupSwapper({}, placement),
        "groups": GroupSwapper(GROUPS, placement),
        "matrix": MatrixSwapper(MATRIX, placement),
    }
    # Profiles with members (llama-swap's older form) over either: a model in two.
    together = mates([["a", "c"], ["a", "f"]])
    swappers["together-groups"] = TogetherSwapper(swappers["groups"], together, placement)
    swappers["together-matrix"] = TogetherSwapper(swappers["matrix"], together, placement)
    swapper = swappers[policy]
    for size in range(len(MODELS) + 1):
        for running in map(set, itertools.combinations(MODELS, size)):
            for target in MODELS:
                expected = not swapper.eviction_for(target, running)
                assert swapper.runs_beside(target, running) == expected, (target, running)


def test_profile_members_are_kept_together_only_where_memory_says_they_fit() -> None:
    """llama-swap's older profiles say "these run together"; declared memory says whether
    they can. The group runs one of its models at a time, but for a profile's members."""
    together = mates([["coder", "architect"]])
    groups = {"one": GroupConfig(members=("coder", "architect", "other"))}

    def evicted(placement: Figures | None, target: str, running: set[str]) -> set[str]:
        swapper = TogetherSwapper(GroupSwapper(groups, placement), together, placement)
        return set(swapper.eviction_for(target, running))

    fits = figures(coder=10, architect=10, other=4)
    assert evicted(fits, "coder", {"architect"}) == set()
    assert evicted(fits, "coder", {"architect", "other"}) == {"other"}
    too_big = figures(coder=16, architect=12, other=4)
    assert evicted(too_big, "coder", {"architect"}) == {"architect"}
    assert evicted(too_big, "coder", {"architect", "other"}) == {"architect", "other"}
    # Memory unknown (no figures, or none for the target): the profile is believed.
    assert evicted(None, "coder", {"architect"}) == set()
    unknown = Figures({"architect": {"gpu0": 20 * GiB}}, GPU24)
    assert evicted(unknown, "coder", {"architect"}) == set()
    # make_swapper hands the profile's swapper the placement.
    config = load(
        """
        [models.coder]
        cmd = "s --port ${PORT}"
        [models.architect]
        cmd = "s --port ${PORT}"
        [profiles.aider]
        members = ["coder", "architect"]
        """
    )
    assert make_swapper(config).eviction_for("coder", {"architect"}) == frozenset()
    assert make_swapper(config, too_big).eviction_for("coder", {"architect"}) == {"architect"}


def test_max_lora_counts_the_models_that_fit_together() -> None:
    """Twelve 2 GiB models fill 24 GiB (with ``eviction_for`` each further one took the
    exact search over twelve, 4096 subsets: 0.9 s for 100 models; ``runs_beside`` only
    adds up)."""
    models = [f"m{i:02}" for i in range(100)]
    swapper = GroupSwapper({}, figures(**dict.fromkeys(models, 2)))
    assert resident_capacity(swapper, models) == 12


def test_sizes_read_as_people_write_them() -> None:
    assert parse_size("22GiB") == 22 * GiB
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(1000) == 1000
    assert parse_memory("8GiB") == {"gpu0": 8 * GiB}
    assert parse_memory({"gpu1": "4GiB", "cpu": 10}) == {"gpu1": 4 * GiB, "cpu": 10}
    for bad in ("22Gx", "-1", True, 1.5, "2PiB"):
        with pytest.raises(InvalidValue):
            parse_size(bad)


@pytest.mark.parametrize(
    "line",
    [
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "ggml_vulkan: Device memory allocation failed: ErrorOutOfDeviceMemory",
        "hipMalloc failed: out of memory",
        "failed to allocate compute buffers",
        "Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
    ],
)
def test_out_of_memory_signs(line: str) -> None:
    assert out_of_memory(line)


def test_ordinary_lines_are_not_out_of_memory() -> None:
    for line in ("main: server is listening on http://127.0.0.1:5800", "load time = 10 ms"):
        assert not out_of_memory(line)
