"""The group swapper (SPEC §3.3): which running models must stop for a target to run.

Each model belongs to one group; models in no group form an implicit group that swaps
and is exclusive, so with no groups at all exactly one model runs at a time.

* ``swap = true``: one member of the group runs at a time;
* ``exclusive = true``: loading a member stops the models of every other group...
* ...except ``persistent`` groups, which no other group can stop.

Where the target's memory is known (``resources/fit.py``), the fit rule decides on top:
the implicit group's rules give way to it (its models run together where they fit), and
an explicit group's rules apply first, then the fit rule evicts more if the target still
does not fit. ``persistent`` groups' models are never evicted by either.

A pure function of (target, running, busy, the placement's figures): no state, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import final

from llamaswap.config.model import GroupConfig
from llamaswap.resources.fit import Placement, applies, fits_beside, make_room

__all__ = ["DEFAULT_GROUP", "GroupSwapper"]

DEFAULT_GROUP = "(default)"
_IMPLICIT = GroupConfig(members=())


@final
class GroupSwapper:
    def __init__(
        self, groups: Mapping[str, GroupConfig], placement: Placement | None = None
    ) -> None:
        self._groups = dict(groups)
        self._group_of = {
            member: name for name, group in groups.items() for member in group.members
        }
        self._placement = placement
        self.persistent = frozenset(
            member for group in groups.values() if group.persistent for member in group.members
        )

    def group_of(self, model: str) -> str:
        return self._group_of.get(model, DEFAULT_GROUP)

    def _config(self, name: str) -> GroupConfig:
        return self._groups.get(name, _IMPLICIT)

    def eviction_for(
        self, target: str, running: Set[str], busy: Set[str] = frozenset()
    ) -> frozenset[str]:
        home = self.group_of(target)
        placement = self._placement
        if placement is None or not applies(placement, target):
            return self._by_rules(target, running, home)
        # Its memory is known: the implicit group's rules give way to the fit rule.
        by_rules = frozenset() if home == DEFAULT_GROUP else self._by_rules(target, running, home)
        room = make_room(placement, target, running - by_rules, busy=busy, spared=self.persistent)
        return by_rules | (room or frozenset())

    def runs_beside(self, target: str, running: Set[str]) -> bool:
        home = self.group_of(target)
        placement = self._placement
        if placement is None or not applies(placement, target):
            return not self._by_rules(target, running, home)
        if home != DEFAULT_GROUP and self._by_rules(target, running, home):
            return False
        return fits_beside(placement, target, running) is not False

    def _by_rules(self, target: str, running: Set[str], home: str) -> frozenset[str]:
        config = self._config(home)
        evict = set()
        for model in running:
            if model == target:
                continue
            group = self.group_of(model)
            if group == home:
                if config.swap:
                    evict.add(model)
            elif config.exclusive and not self._config(group).persistent:
                evict.add(model)
        return frozenset(evict)
