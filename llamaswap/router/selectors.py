"""Which target a selector sends a request to (``[selectors.NAME]``, docs/configuration.md).

A selector is a virtual model name; each request for it goes to one of its ``targets``,
picked here, once, when its name is resolved (``Names.route``). From then on the request
is a request for that model like any other: the scheduler queues, ages and serves it by
its priority, and never hears of the selector.

The strategies are pure functions over what the router knows at that moment (``Loads``:
each model's state, and its requests admitted and not released). They keep no state of
their own: a request counts for its target as soon as the scheduler admits it, so the
next request's choice sees it, and a finished one stops counting when it is released.
(llama-swap's spillover keeps its own reservation counts; ours are the scheduler's one
count, ``Router.wanted``.)

- ``pin``: always the first target; the others are for the reader.
- ``warm``: the first target that is ready, else the first already starting, else the
  first: never a load when a target can serve, never a second load while one runs.
- ``spillover``: the first target with fewer than ``spillover`` requests (waiting or in
  flight), in order; when every target has that many, the one with the fewest (the first
  of those tied). A burst fills the first model, then the next; as they drain, requests
  go back to the first.

``warm`` and ``spillover`` read a target's state and count, which only local models
have: their targets are local models (``config/validate.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llamaswap.process import ModelState

__all__ = ["Loads", "spillover", "warm"]


class Loads(Protocol):
    """What a strategy reads of the models (``Router`` is one)."""

    def model_state(self, model: str) -> ModelState: ...

    def wanted(self, model: str) -> int:
        """The requests for ``model`` admitted and not released."""
        ...


def warm(models: Sequence[str], loads: Loads) -> int:
    """The index of the first of ``models`` ready, else starting, else 0."""
    for state in (ModelState.READY, ModelState.STARTING):
        for index, model in enumerate(models):
            if loads.model_state(model) is state:
                return index
    return 0


def spillover(models: Sequence[str], limit: int, loads: Loads) -> int:
    """The index of the first of ``models`` with fewer than ``limit`` requests, else of
    the first with the fewest."""
    counts = [loads.wanted(model) for model in models]
    for index, count in enumerate(counts):
        if count < limit:
            return index
    return counts.index(min(counts))
