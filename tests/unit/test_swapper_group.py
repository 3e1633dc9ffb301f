from __future__ import annotations

from llamaswap.config.model import GroupConfig
from llamaswap.router.swappers.group import GroupSwapper


def test_no_groups_means_one_model_at_a_time() -> None:
    swapper = GroupSwapper({})
    assert swapper.eviction_for("a", {"b", "c"}) == {"b", "c"}
    assert swapper.eviction_for("a", {"a"}) == frozenset()
    assert swapper.eviction_for("a", set()) == frozenset()


def test_swap_false_lets_members_run_together() -> None:
    swapper = GroupSwapper({"g": GroupConfig(members=("a", "b"), swap=False)})
    assert swapper.eviction_for("a", {"b"}) == frozenset()
    # the group is exclusive: models of other groups (here the implicit one) stop
    assert swapper.eviction_for("a", {"b", "x"}) == {"x"}


def test_non_exclusive_group_leaves_other_groups_running() -> None:
    swapper = GroupSwapper(
        {
            "g1": GroupConfig(members=("a", "b"), exclusive=False),
            "g2": GroupConfig(members=("c",), exclusive=False),
        }
    )
    assert swapper.eviction_for("a", {"b", "c"}) == {"b"}
    assert swapper.eviction_for("c", {"a"}) == frozenset()


def test_persistent_group_is_never_evicted_by_other_groups() -> None:
    swapper = GroupSwapper(
        {
            "embed": GroupConfig(members=("e",), persistent=True, exclusive=False),
            "chat": GroupConfig(members=("a", "b")),
        }
    )
    assert swapper.eviction_for("a", {"e", "b"}) == {"b"}
    assert swapper.eviction_for("x", {"e", "a"}) == {"a"}  # implicit group is exclusive
    assert swapper.group_of("x") == "(default)"
