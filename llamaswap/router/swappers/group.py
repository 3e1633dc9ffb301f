"""The group swapper (SPEC §3.3): which running models must stop for a target to run.

Each model belongs to one group; models in no group form an implicit group that swaps
and is exclusive, so with no groups at all exactly one model runs at a time.

* ``swap = true``: one member of the group runs at a time;
* ``exclusive = true``: loading a member stops the models of every other group...
* ...except ``persistent`` groups, which no other group can stop.

A pure function of (target, running): no state, no logging. Busy models change nothing:
the rules leave no choice of what to evict.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import final

from llamaswap.config.model import GroupConfig

__all__ = ["DEFAULT_GROUP", "GroupSwapper"]

DEFAULT_GROUP = "(default)"
_IMPLICIT = GroupConfig(members=())


@final
class GroupSwapper:
    def __init__(self, groups: Mapping[str, GroupConfig]) -> None:
        self._groups = dict(groups)
        self._group_of = {
            member: name for name, group in groups.items() for member in group.members
        }

    def group_of(self, model: str) -> str:
        return self._group_of.get(model, DEFAULT_GROUP)

    def _config(self, name: str) -> GroupConfig:
        return self._groups.get(name, _IMPLICIT)

    def eviction_for(
        self, target: str, running: Set[str], busy: Set[str] = frozenset()
    ) -> frozenset[str]:
        home = self.group_of(target)
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
