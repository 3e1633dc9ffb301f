"""The fit rule (docs/resources.md): which idle models a load evicts so that its model fits.

The problem. Groups and matrix sets say by hand what fits together. Where the memory each
model needs is known (declared as ``memory``, or learned from the GPU after a load) and
each device has a budget, llamaswap can work it out: a load needs its model's bytes free
on every device it uses, and makes room by stopping running models.

The rule. For a target whose need is known on devices that all have a budget:

* a running model holds what it needs (its declared or learned figure); one whose figure
  is unknown may hold anything, so it holds the whole of every device the target needs;
* if the target fits beside everything running, nothing is evicted;
* otherwise the *cheapest set* of candidates (running models that may be evicted: not
  ``persistent``) whose stop makes it fit is evicted. A set that evicts no busy model (one
  serving requests, or being loaded: the load would have to wait for it) beats one that
  does, then the lowest cost, then the fewest models, then the names in order;
* if no set makes it fit, every candidate is evicted and the load is tried anyway (an
  out-of-memory failure is then retried once, ``Ledger.finish_swap``).

A model's cost is its measured load time weighted by its waiting demand, ``load * (1 +
waiting requests)``: evicting a model that requests wait for means loading it again soon.

Design. Pure: the figures come in through ``Placement``, a synchronous view, so the rule
is tested as plain code. The search tries every subset of the candidates up to
``EXACT_UP_TO`` of them (2^n sets of a handful of running models), and beyond that evicts
greedily, dearest memory per cost first.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence, Set
from typing import Protocol

__all__ = ["EXACT_UP_TO", "Placement", "applies", "fits_beside", "make_room"]

#: Up to this many candidates, every subset is tried; beyond, a greedy pass.
EXACT_UP_TO = 12

Sizes = Mapping[str, int]


class Placement(Protocol):
    """What the fit rule reads: figures by model, budgets by device. Synchronous."""

    def need(self, model: str) -> Sizes | None:
        """Bytes ``model`` needs by device; ``None`` when unknown."""

    def budget(self, device: str) -> int | None:
        """Bytes models may use on ``device`` (its total less headroom); ``None`` if the
        device is unknown."""

    def cost(self, model: str) -> float:
        """What evicting ``model`` costs (its load time weighted by its waiting demand)."""


def applies(placement: Placement, target: str) -> bool:
    """Whether the fit rule decides for ``target``: its need is known, and every device it
    needs has a budget."""
    need = placement.need(target)
    return need is not None and all(placement.budget(device) is not None for device in need)


def make_room(
    placement: Placement,
    target: str,
    running: Collection[str],
    *,
    busy: Set[str] = frozenset(),
    spared: Set[str] = frozenset(),
) -> frozenset[str] | None:
    """The models of ``running`` to stop so that ``target`` fits; ``None`` where the rule
    does not apply (``applies``). ``spared`` are never chosen (``persistent``)."""
    room = _room(placement, target, running)
    if room is None:
        return None
    budgets, held = room
    if _fits(held.values(), budgets):
        return frozenset()
    candidates = sorted(model for model in held if model not in spared)
    kept = [size for model, size in held.items() if model in spared]
    if len(candidates) > EXACT_UP_TO:
        return _greedy(placement, candidates, held, kept, budgets, busy)
    best: tuple[bool, float, int, tuple[str, ...]] | None = None
    for size in range(1, len(candidates) + 1):
        for chosen in itertools.combinations(candidates, size):
            evicted = set(chosen)
            rest = [held[m] for m in candidates if m not in evicted]
            if not _fits([*kept, *rest], budgets):
                continue
            key = (
                any(m in busy for m in chosen),
                sum(placement.cost(m) for m in chosen),
                size,
                chosen,
            )
            if best is None or key < best:
                best = key
    return frozenset(best[3] if best is not None else candidates)


def fits_beside(placement: Placement, target: str, running: Collection[str]) -> bool | None:
    """Whether ``target`` fits beside all of ``running``; ``None`` where the rule does not
    apply. ``make_room``'s first question, without its search for what to stop."""
    room = _room(placement, target, running)
    return None if room is None else _fits(room[1].values(), room[0])


def _room(
    placement: Placement, target: str, running: Collection[str]
) -> tuple[dict[str, int], dict[str, dict[str, float]]] | None:
    """What the others may hold on each device ``target`` needs, and what each of the
    others (``running`` less ``target``) holds there; ``None`` where the rule does not
    apply."""
    need = placement.need(target)
    if need is None:
        return None
    budgets: dict[str, int] = {}
    for device, size in need.items():
        budget = placement.budget(device)
        if budget is None:
            return None
        if size:
            budgets[device] = budget - size  # what the others may hold
    others = [model for model in running if model != target]
    return budgets, {model: _held(placement.need(model), budgets) for model in others}


def _held(figure: Sizes | None, devices: Mapping[str, int]) -> dict[str, float]:
    """What a running model holds on each device the target needs (all of it if unknown)."""
    if figure is None:
        return {device: float("inf") for device in devices}
    return {device: float(figure.get(device, 0)) for device in devices}


def _fits(held: Collection[Mapping[str, float]], room: Mapping[str, int]) -> bool:
    return all(sum(h[device] for h in held) <= free for device, free in room.items())


def _greedy(
    placement: Placement,
    candidates: list[str],
    held: Mapping[str, Mapping[str, float]],
    kept: Sequence[Mapping[str, float]],
    room: Mapping[str, int],
    busy: Set[str],
) -> frozenset[str]:
    """Evict idle models before busy ones, most memory per cost first, until it fits."""

    def order(model: str) -> tuple[bool, float, str]:
        freed = sum(held[model].values())
        return (model in busy, -freed / max(placement.cost(model), 1e-9), model)

    remaining = dict.fromkeys(candidates)
    evicted: list[str] = []
    for model in sorted(candidates, key=order):
        if _fits([*kept, *(held[m] for m in remaining)], room):
            break
        del remaining[model]
        evicted.append(model)
    return frozenset(evicted)
