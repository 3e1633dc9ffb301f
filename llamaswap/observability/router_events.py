"""What the router does, as events on the hub: models, requests, the queue, activity.

Everything here is derived from the router's one stream of events (``Router.observe``,
``router/events.py``), in the order they happen:

- ``model``: everything the dashboard shows of a model (``_model``): its state and PID
  (``failed``, and why, after a failed start: ``ModelStatistics.failure``), its TTL
  countdown (the time left, or paused while requests want it), how long it has been
  loading or ready, its requests in flight and waiting. Sent at once on a
  supervisor's state change (``ModelStateChanged``) and while a model starts, when its
  process runs (``ModelSpawned``), so that every state is seen, in order with the
  requests' events. A request's admission, grant and release change the counts and the
  TTL: they mark the model changed, and the hub coalesces those (one event per model at
  most every 100 ms), built once the router's step is over, when its supervisor has
  heard of the change too. **The times are read from the router's own statistics, never
  re-derived here.**
- ``request``: a request's lifecycle. ``queued`` at admission, ``paused`` when it
  was checkpointed and waits again, and ``done`` / ``cancelled`` at release come from
  ``RequestChanged``; ``loading`` (``JoinSwap``), ``serving`` (``Grant``),
  ``preempting`` (``Preempt``: it still serves until its task checkpoints it) and
  ``failed`` (``Fail``, with the error) from the scheduler's decisions as the router
  applies them (``DecisionApplied``). A scheduler decides in one synchronous step and the
  router applies its decisions in order, so **every request's events arrive in
  lifecycle order**: ``queued``, then ``loading`` if it waited for a load, then
  ``serving`` and ``done``, or ``failed`` or ``cancelled``; a preempted one goes
  ``serving``, ``preempting``, ``paused`` and round again from ``loading`` or
  ``serving``. Each carries ``preemptions``, ``paused`` and ``paused_ms``, as
  ``/api/inflight`` does.
- ``queue``: per-band depth and oldest wait, the waiting requests in serve order and,
  under ``serial``, their scores, and when each waiting request (queued or loading) is
  estimated to start (``estimates.py``: one pass over the queue, so it is here, on the
  coalesced event, and not on every request's); every request event or decision marks
  it changed, and the hub coalesces the changes (at most one per 100 ms).
- ``load``: a load the scheduler started (``StartSwap``): its model, the models it
  evicts, and ``retry``, why it is a second try (its first ran out of memory), or null.
- ``activity``: each finished request's activity record (``ActivityLog.add_listener``).
- ``profileChanged``: the active profile is now ``profile`` (null: none), switched with
  ``PUT /api/profiles/active`` or dropped by a reload (``ProfileChanged``).

``snapshot()`` is the first event a subscriber gets: all of the above as it stands, so
that a client that connects late needs no other call. Durations are in milliseconds;
a request's ``waited_ms`` is its time in the queue, as in ``/api/inflight``. Times are
durations measured when the event is built (``ttl_left_ms``, ``loaded_for_ms``): the
client's clock is not Trio's, nor need it agree with this machine's.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, final

import trio

from llamaswap.process import ModelState
from llamaswap.router.events import (
    DecisionApplied,
    ModelSpawned,
    ModelStateChanged,
    ProfileChanged,
    RequestChanged,
    RouterEvent,
)
from llamaswap.router.lease import Lease, RequestInfo, ticket_info
from llamaswap.schedulers import (
    Decision,
    Fail,
    Grant,
    JoinSwap,
    Preempt,
    RequestState,
    StartSwap,
    Ticket,
)

from .activity import ActivityLog, ActivityRecord
from .estimates import estimates
from .events import Event, EventHub

if TYPE_CHECKING:
    from llamaswap.router import Router

__all__ = ["RouterEvents"]

#: Activity records in a snapshot, newest first.
SNAPSHOT_ACTIVITY = 20

_QUEUE = "queue"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@final
class RouterEvents:
    """Publishes ``router``'s events on ``hub``; ``connect`` subscribes to its sources."""

    def __init__(self, hub: EventHub, router: Router, activity: ActivityLog) -> None:
        self._hub = hub
        self._router = router
        self._activity = activity
        self._last_queue: Event | None = None

    def connect(self) -> None:
        """Follow the router and the activity log (once, before ``Router.run``)."""
        kinds = (ModelStateChanged, ModelSpawned, RequestChanged, DecisionApplied, ProfileChanged)
        self._router.observe(self.on_event, *kinds)
        self._activity.add_listener(self.on_activity)

    # ---------------------------------------------------------------- events

    def snapshot(self) -> Event:
        """Every model, the queue, every request in flight, the latest activity.

        Built for each new subscriber, whose view of the queue is now its own: the next
        queue event goes out whatever was sent before it."""
        self._last_queue = None
        router = self._router
        now = trio.current_time()
        return {
            "type": "snapshot",
            "scheduler": router.scheduler.name,
            "profile": router.names.profile,
            "models": [self._model(model) for model in router.shown_models()],
            "queue": self._queue_state(),
            "requests": [_from_info(info, info.state, now) for info in router.requests()],
            "activity": [record.to_json() for record in self._activity.recent(SNAPSHOT_ACTIVITY)],
        }

    def on_event(self, event: RouterEvent) -> None:
        if isinstance(event, (ModelStateChanged, ModelSpawned)):  # a spawn: its PID
            self._publish_model(event.model)
        elif isinstance(event, RequestChanged):
            self.on_request(event.change, event.lease)
        elif isinstance(event, DecisionApplied):
            self.on_decision(event.decision)
        elif isinstance(event, ProfileChanged):
            self._hub.publish({"type": "profileChanged", "profile": event.profile})

    def on_request(self, event: str, lease: Lease) -> None:
        if not self._hub.active:
            return
        self._hub.publish_soon(_QUEUE, self._queue_event)
        self._model_soon(lease.ticket.model)  # wanted by one more, or one fewer
        if event != "failed":  # published with its error when the Fail was applied
            self._hub.publish(_from_info(lease.info(), event, trio.current_time()))

    def on_decision(self, decision: Decision) -> None:
        if not self._hub.active:
            return
        self._hub.publish_soon(_QUEUE, self._queue_event)
        if isinstance(decision, JoinSwap):
            self._hub.publish(_from_ticket(decision.ticket, "loading"))
        elif isinstance(decision, Grant):
            self._hub.publish(_from_ticket(decision.ticket, "serving"))
            self._model_soon(decision.ticket.model)  # one more in flight
        elif isinstance(decision, Fail):
            self._hub.publish(_from_ticket(decision.ticket, "failed", str(decision.error)))
        elif isinstance(decision, Preempt):
            # Serving: it will checkpoint. Loading: its load was given up; it waits again.
            serving = decision.ticket.state is RequestState.SERVING
            self._hub.publish(_from_ticket(decision.ticket, "preempting" if serving else "paused"))
        elif isinstance(decision, StartSwap):
            swap = decision.swap
            evict = sorted(swap.evict)
            self._hub.publish(
                {"type": "load", "model": swap.target, "evict": evict, "retry": swap.retry}
            )

    def on_activity(self, record: ActivityRecord) -> None:
        if self._hub.active:
            self._hub.publish({"type": "activity", "record": record.to_json()})

    # --------------------------------------------------------------- private

    def _publish_model(self, model: str) -> None:
        if self._hub.active:
            self._hub.publish({"type": "model", **self._model(model)})

    def _model_soon(self, model: str) -> None:
        self._hub.publish_soon(f"model {model}", partial(self._model_event, model))

    def _model_event(self, model: str) -> Event | None:
        """``model`` as it is now, unless a reload removed it and it is forgotten."""
        if model not in self._router.known_models():
            return None
        return {"type": "model", **self._model(model)}

    def _model(self, model: str) -> dict[str, Any]:
        router = self._router
        stats = router.statistics(model)
        ttl = router.definition(model).idle_ttl
        now = trio.current_time()
        left = None if ttl is None else stats.ttl_left(now)
        return {
            "model": model,
            "state": stats.shown_state,
            "pid": stats.pid,
            "ttl": ttl,
            "ttl_left_ms": None if left is None else _ms(left),
            # Ready with a ttl that does not run: requests for it wait or are served.
            "ttl_paused": stats.state is ModelState.READY and ttl is not None and left is None,
            "loading_for_ms": _since(stats.starting_since, now),
            "loaded_for_ms": _since(stats.ready_since, now),
            "in_flight": stats.in_flight,
            "waiting": max(0, router.wanted(model) - stats.in_flight),
            "failure": stats.failure_json(),
        }

    def _queue_state(self) -> dict[str, Any]:
        scheduler = self._router.scheduler
        stats = scheduler.statistics()
        bands = {
            band: {"depth": band_stats.depth, "oldest_wait_ms": _ms(band_stats.oldest_wait)}
            for band, band_stats in stats.bands.items()
        }
        queued = scheduler.queued()  # first served first
        found = estimates(self._router, queued=queued)
        now = found.now
        return {
            "waiting": stats.waiting,
            "loading": stats.loading,
            "bands": bands,
            "order": [ticket.seq for ticket in queued],  # the waiting IDs (Router.queue_order)
            "scores": [
                None if score is None else round(score, 3) for score in scheduler.scores(queued)
            ],
            "eta_ms": {  # every waiting request's, by ID: those loading, then the queued
                request_id: None if (start := found.start(request_id, now)) is None else _ms(start)
                for request_id in (*found.loading, *found.order)
            },
        }

    def _queue_event(self) -> Event | None:
        """The queue now, unless it is what was sent last, to every subscriber (an empty
        queue stays quiet)."""
        event = {"type": "queue", **self._queue_state()}
        if event == self._last_queue:
            return None
        self._last_queue = event
        return event


def _since(moment: float | None, now: float) -> float | None:
    return None if moment is None else _ms(now - moment)


def _from_info(info: RequestInfo, state: str, now: float, error: str | None = None) -> Event:
    return {
        "type": "request",
        "id": info.id,
        "model": info.model,
        "state": state,
        "priority": info.effective_priority,
        "band": info.band,
        "score": info.score,
        "waited_ms": _ms(info.waited(now)),  # as in /api/inflight
        "preemptions": info.preemptions,
        "paused": info.paused,
        "paused_ms": None if (paused := info.paused_for(now)) is None else _ms(paused),
        "error": error,
    }


def _from_ticket(ticket: Ticket, state: str, error: str | None = None) -> Event:
    return _from_info(ticket_info(ticket), state, trio.current_time(), error)
