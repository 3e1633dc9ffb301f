"""The router's requests, estimated: when each waiting one starts, and when a 429's
client may come back.

``resources/eta.py`` does the walk (and explains it); ``estimates(router)`` reads its
inputs from the router: the scheduler's order (``Scheduler.queued()``), the requests
loading and served (``Router.dispatched()``, with their ``granted_at``), which models are
ready or starting and since when, each model's load and serve figures (``Resources``;
a model without one of its own takes the median of the other models' figures), and
``serial``'s slots.

One estimate is a pass over every admitted request and the sort of the queue:
O(n log n). ``/api/inflight`` and the coalesced queue events take a fresh one each time
(they build as much already). A 429's ``Retry-After`` and the loading stream's lines come
per refused request and per waiting client each second: they read an ``Estimator``'s,
taken again once it is ``MAX_AGE`` old (or lacks the request asked about), so that a flood
of refusals costs one walk per ``MAX_AGE``, not one per refusal. An older estimate is
moved on by the time since it was taken.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import final

import attrs

from llamaswap.errors import ConcurrencyLimit, QueueFull, RequestError
from llamaswap.process import ModelState
from llamaswap.resources import eta
from llamaswap.router import Router
from llamaswap.schedulers import RequestState, Ticket
from llamaswap.schedulers.serial import SerialScheduler

__all__ = ["MAX_AGE", "Estimates", "Estimator", "estimates"]

#: Seconds an ``Estimator``'s estimate is used for before it is taken again.
MAX_AGE = 0.5


@attrs.frozen
class Estimates:
    """Every admitted request's estimate (``eta.Estimate``), taken at ``now``.

    ``models``: each request's model; ``order``: the queued requests' IDs, first served
    first (``Router.queue_order()``); ``loading``: the IDs of those waiting for a load."""

    now: float
    by_id: Mapping[int, eta.Estimate]
    models: Mapping[int, str]
    order: Sequence[int]
    loading: Sequence[int] = ()

    def start(self, request_id: int, now: float) -> float | None:
        """Seconds from ``now`` until the request starts (0 once it is served); ``None``
        when it has no estimate (a figure is not known, or the request was not there)."""
        found = self.by_id.get(request_id)
        if found is None or found.start is None:
            return None
        return max(0.0, found.start - (now - self.now))

    def retry_after(self, error: RequestError, now: float) -> int | None:
        """The ``Retry-After`` of a 429, in whole seconds (``eta.retry_after``): for
        ``ConcurrencyLimit``, until the first of its model's requests ends; for
        ``QueueFull``, until the first queued request starts. ``None``: no estimate."""
        moved = now - self.now
        if isinstance(error, ConcurrencyLimit):
            ends = [
                found.end
                for request_id, found in self.by_id.items()
                if found.end is not None and self.models.get(request_id) == error.model
            ]
            return eta.retry_after(max(0.0, min(ends) - moved)) if ends else None
        if isinstance(error, QueueFull) and self.order:
            start = self.start(self.order[0], now)
            return None if start is None else eta.retry_after(start)
        return None


def estimates(router: Router, *, queued: Sequence[Ticket] | None = None) -> Estimates:
    """Every admitted request of ``router``, estimated now. ``queued``: the scheduler's
    ``queued()``, when the caller has it already."""
    now = router.now()
    scheduler = router.scheduler
    if queued is None:
        queued = scheduler.queued()
    dispatched = router.dispatched()
    serving: list[eta.Serving] = []
    waiting: list[eta.Waiting] = []
    for t in dispatched:
        if t.state is RequestState.SERVING and t.granted_at is not None:
            serving.append(eta.Serving(t.seq, t.model, t.granted_at, slot=t.needs_slot))
        elif t.state is RequestState.LOADING:
            waiting.append(eta.Waiting(t.seq, t.model, loading=True, slot=t.needs_slot))
    waiting += [eta.Waiting(t.seq, t.model, slot=t.needs_slot) for t in queued]
    models = {ticket.seq: ticket.model for ticket in (*dispatched, *queued)}
    ready: set[str] = set()
    loading: dict[str, float] = {}
    for model in router.running_models():
        stats = router.statistics(model)
        if stats.state is ModelState.READY:
            ready.add(model)
        elif stats.state is ModelState.STARTING and stats.starting_since is not None:
            loading[model] = stats.starting_since
    resources = router.resources
    known = {
        model: eta.Figures(resources.load_seconds(model), resources.serve_seconds(model))
        for model in router.known_models()
    }
    loads = [f.load for f in known.values() if f.load is not None]
    serves = [f.serve for f in known.values() if f.serve is not None]
    default = eta.Figures(
        statistics.median(loads) if loads else None,
        statistics.median(serves) if serves else None,
    )
    slots: int | None = None
    model_slots: dict[str, int] = {}
    if isinstance(scheduler, SerialScheduler):
        slots = 1
        model_slots = {model: scheduler.slots(model) for model in set(models.values())}
    found = eta.estimate(
        now,
        serving=serving,
        waiting=waiting,
        ready=ready,
        loading=loading,
        figures=known,
        default=default,
        slots=slots,
        model_slots=model_slots,
    )
    order = [ticket.seq for ticket in queued]
    return Estimates(now, found, models, order, [w.id for w in waiting if w.loading])


@final
class Estimator:
    """``estimates(router)``, taken again once ``max_age`` old; see the module docstring."""

    def __init__(self, router: Router, *, max_age: float = MAX_AGE) -> None:
        self._router = router
        self._max_age = max_age
        self._last: Estimates | None = None

    def current(self, request_id: int | None = None) -> Estimates:
        """An estimate at most ``max_age`` old, and one that has ``request_id`` if given."""
        last, now = self._last, self._router.now()
        if (
            last is None
            or not 0 <= now - last.now < self._max_age
            or (request_id is not None and request_id not in last.by_id)
        ):
            last = self._last = estimates(self._router)
        return last

    def start(self, request_id: int) -> float | None:
        """Seconds until the request starts (``Estimates.start``)."""
        return self.current(request_id).start(request_id, self._router.now())

    def set_retry_after(self, error: RequestError) -> None:
        """Give a 429's error its ``retry_after`` (left ``None`` without an estimate)."""
        if isinstance(error, ConcurrencyLimit | QueueFull) and error.retry_after is None:
            error.retry_after = self.current().retry_after(error, self._router.now())
