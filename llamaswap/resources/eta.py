"""When will a waiting request start? An estimate from learned load and serve times.

The problem
-----------
A request that waits (in the queue, or for its model to load) is shown to people and
programs: the loading stream ("loading coder, about 12 s to go"), ``/api/inflight``'s
``eta_seconds``, the queue events, a 429's ``Retry-After``. Each wants one number: the
seconds until the request is granted. The scheduler knows the order it will serve the
queue in (``Scheduler.queued()``, as things stand now), ``Resources`` knows how long each
model's loads and requests took lately (``book.py``: the median of the last five), and
the router knows what is being served and loaded, and since when.

The walk
--------
``estimate`` replays that order on those figures, once, in O(n log n):

1. A request **being served** ends ``serve - elapsed`` from now (at least 0: an overdue
   one may end any moment). Its slot is busy until then.
2. A request **waiting for a load** starts when its model's load ends: ``load - elapsed``
   from now, at least 0 (a load not begun yet, its evictions still stopping, takes the
   whole ``load``). It holds a slot from now on, until its start plus its ``serve``.
3. The **queued** requests, in the scheduler's order, each start no earlier than the one
   before it:

   * its model is loaded (ready, or loading): it starts once that model is ready and a
     slot is free, that is once the earliest of the slot-holding work ends while every
     slot is taken (``serial``'s ``slots``; ``fifo`` has no limit: it serves a ready
     model's requests in parallel);
   * its model is not loaded: a **swap**. Everything ahead of it drains first (the last
     of the work on the slots ends), then its model loads (``load``); from then on that
     model alone is loaded.

   Either way it then holds a slot until its start plus its model's ``serve``.

A page (``needs_slot`` false: ``GET /props``) takes no slot and counts as 0 s of work; it
still waits for its model, and a page for a model not loaded still costs a swap.

**A figure not known makes every estimate that depends on it unknown** (``None``),
never a guess: a model's own figure is used, else ``default`` (the caller passes the
median of the other models' figures, or nothing when no model has one). Internally an
unknown duration is infinite: a slot held for an unknown time is taken to free last.

What it ignores
---------------
Arrivals to come (a later, better request that will overtake), the order changing as
affinity changes after a swap (the order is the scheduler's now), ``minResidency`` holds,
models that run side by side (a swap is taken to drain the whole box and to leave only
its model loaded, as one GPU with one model at a time does; under ``fifo`` with groups
that run together it overestimates), a server that slows down when it serves several
requests at once, TTL unloads, failures and crashes, requests to peers. It is an
estimate: shown as "about", and refreshed as things happen.

Rejected alternatives
---------------------
*A simulation* (``llamaswap simulate``'s engine) would model arrivals and scoring, at a
cost per call far above one pass; the numbers shown are rough anyway, being medians of
five. *Per-request history* (this prompt's length) is not known before it is served.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence

import attrs

__all__ = ["Estimate", "Figures", "Serving", "Waiting", "estimate", "retry_after"]

#: The largest ``Retry-After`` said, in seconds.
MAX_RETRY_AFTER = 3600


@attrs.frozen
class Figures:
    """How long one model's work takes, in seconds; ``None``: not known.

    ``load``: from its server's start to ready; ``serve``: one request, from its grant to
    its end.
    """

    load: float | None = None
    serve: float | None = None


@attrs.frozen
class Serving:
    """A request being served: granted at ``since``. ``slot``: it takes a slot (not a
    page)."""

    id: int
    model: str
    since: float
    slot: bool = True


@attrs.frozen
class Waiting:
    """A request not yet granted. ``loading``: dispatched, waiting for its model's load;
    otherwise queued. ``slot``: it takes a slot (not a page)."""

    id: int
    model: str
    loading: bool = False
    slot: bool = True


@attrs.frozen
class Estimate:
    """A request's estimate, in seconds from now; ``None``: not known (a figure is
    missing). ``start``: until it is granted (0 once it is served); ``end``: until it
    ends."""

    start: float | None
    end: float | None


def estimate(
    now: float,
    *,
    serving: Sequence[Serving] = (),
    waiting: Sequence[Waiting] = (),
    ready: Collection[str] = (),
    loading: Mapping[str, float] | None = None,
    figures: Mapping[str, Figures] | None = None,
    default: Figures | None = None,
    slots: int | None = None,
    model_slots: Mapping[str, int] | None = None,
) -> dict[int, Estimate]:
    """Each request's estimate, by ID; see the module docstring.

    Args:
        now: the time the estimate is for (the clock of every time given).
        serving: the requests being served.
        waiting: the requests waiting for a load (in any order), and the queued ones in
            the order the scheduler will serve them.
        ready: the models ready now.
        loading: the models whose server is starting, and when their load began.
        figures: each model's figures; one missing (or ``None``) is ``default``'s.
        slots: requests served at once (``serial``), ``None`` for no limit (``fifo``);
            ``model_slots``: a model's own count, while it is the one loaded.
    """
    figures = figures or {}
    model_slots = model_slots or {}
    fallback = default or Figures()

    def load(model: str) -> float:
        own = figures.get(model)
        seconds = own.load if own is not None and own.load is not None else fallback.load
        return math.inf if seconds is None else seconds

    def serve(model: str) -> float:
        own = figures.get(model)
        seconds = own.serve if own is not None and own.serve is not None else fallback.serve
        return math.inf if seconds is None else seconds

    # Times are seconds from now: each figure is added as it is, so that what the
    # figures say comes out exactly.
    found: dict[int, Estimate] = {}
    # When each piece of slot-holding work ends; a heap.
    busy: list[float] = []
    # When each loaded model is (or will be) ready.
    ready_at = dict.fromkeys(ready, 0.0)
    for model, began in (loading or {}).items():
        ready_at[model] = max(0.0, load(model) - (now - began))
    for served in serving:
        end = 0.0
        if served.slot:
            end = max(0.0, serve(served.model) - (now - served.since))
            heapq.heappush(busy, end)
        found[served.id] = _estimate(0.0, end)
    for request in waiting:
        if request.loading:
            start = ready_at.setdefault(request.model, load(request.model))
            end = start + serve(request.model) if request.slot else start
            if request.slot:
                heapq.heappush(busy, end)
            found[request.id] = _estimate(start, end)
    last = 0.0  # the start of the queued request before
    for request in waiting:
        if request.loading:
            continue
        model = request.model
        if model not in ready_at:  # a swap: what is ahead drains, then the model loads
            drained = max(last, *busy) if busy else last
            busy = []
            ready_at = {model: drained + load(model)}
        start = max(last, ready_at[model])
        end = start
        if request.slot:
            limit = model_slots.get(model, slots)
            while limit is not None and len(busy) >= limit:
                start = max(start, heapq.heappop(busy))  # the earliest slot to free
            end = start + serve(model)
            heapq.heappush(busy, end)
        last = start
        found[request.id] = _estimate(start, end)
    return found


def _estimate(start: float, end: float) -> Estimate:
    return Estimate(None if math.isinf(start) else start, None if math.isinf(end) else end)


def retry_after(seconds: float | None) -> int | None:
    """``seconds`` as a ``Retry-After`` value: whole seconds, rounded up, from 1 to
    ``MAX_RETRY_AFTER``; ``None`` stays ``None`` (no estimate)."""
    if seconds is None:
        return None
    return min(MAX_RETRY_AFTER, max(1, math.ceil(seconds)))
