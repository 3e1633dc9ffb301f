"""Profiles whose models run together (llama-swap's older profile form), over any swapper.

The problem. llama-swap's first profiles, ``profiles: {aider: [coder, architect]}``, say
"these models fit on the GPU at once": a request names ``aider:coder``, and loading
``coder`` must not unload ``architect``, nor ``architect`` unload ``coder``. The group and
matrix rules cannot say it for models they already place elsewhere (a model is in one
group at most; with no groups, exactly one model runs).

The rule. ``[profiles.NAME] members = [...]`` makes its members *mates*: whatever the group
or matrix rules would stop for a target, its mates are kept. Everything else the rules
decide as before: loading ``coder`` still stops a model outside the profile that the rules
stop, and a persistent group still stays. The relation is pairwise: a model in two
profiles keeps the members of both, and two models that only share a mate still evict
each other as the rules say.

**Memory is a fact, the profile a belief**: where the placement's figures say the target
does not fit beside the mates kept, the mates are stopped as the rules (the fit rule
among them) chose; where the figures are unknown, the profile is believed.

Prior art. llama-swap stopped every running model when a request named another profile,
and started the profile's models one by one as requests named them. Here nothing is
started before it is asked for either (the second member loads when a request names it),
but the mates survive whichever name a request uses (``coder`` or ``aider:coder``): one
process serves both names, so there is no second copy to swap to.

Rejected: loading every member when one is asked for (the first request would wait for
all the loads, or the loads would run outside the scheduler's view of swaps), and
keeping mates only for requests that name the profile (the scheduler decides per model,
not per request: affinity and the swap a request joins would differ for one model's
requests).

A pure function of (target, running, busy), like the swappers it wraps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import final

from llamaswap.resources.fit import Placement, fits_beside
from llamaswap.schedulers.base import Swapper

__all__ = ["TogetherSwapper", "mates"]


def mates(profiles: Iterable[Iterable[str]]) -> dict[str, frozenset[str]]:
    """Each model in a profile → the other models of every profile it is in."""
    found: dict[str, set[str]] = {}
    for members in profiles:
        group = set(members)
        for model in group:
            found.setdefault(model, set()).update(group - {model})
    return {model: frozenset(others) for model, others in found.items() if others}


@final
class TogetherSwapper:
    """``inner``'s evictions, less the target's mates (``mates``) where they fit beside it
    (``placement``)."""

    def __init__(
        self,
        inner: Swapper,
        mates: Mapping[str, frozenset[str]],
        placement: Placement | None = None,
    ) -> None:
        self.inner = inner
        self.persistent = inner.persistent
        self._mates = dict(mates)
        self._placement = placement

    def mates(self, model: str) -> frozenset[str]:
        return self._mates.get(model, frozenset())

    def eviction_for(
        self, target: str, running: Set[str], busy: Set[str] = frozenset()
    ) -> frozenset[str]:
        evicted = self.inner.eviction_for(target, running, busy)
        kept = evicted & self.mates(target)
        placement = self._placement
        if kept and placement is not None:
            beside = running - (evicted - kept)
            if fits_beside(placement, target, beside) is False:
                return evicted  # the mates do not fit beside it: memory wins
        return evicted - kept

    def runs_beside(self, target: str, running: Set[str]) -> bool:
        """``eviction_for`` stops none of ``running``. Asked of ``inner`` without the
        mates, a matrix could answer yes where its cheapest set (mates counted) still
        stops a model, so this one asks the search itself; when ``target`` has no mates
        it is ``inner``'s own quick answer."""
        if not self.mates(target):
            return self.inner.runs_beside(target, running)
        return not self.eviction_for(target, running)
