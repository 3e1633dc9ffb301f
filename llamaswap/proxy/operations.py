"""Live operations: what is in flight, cancelling one request, model state, the version.

``GET /api/inflight`` lists every request the scheduler has admitted and not yet released,
from the router's ``RequestInfo`` snapshots, each with the estimate of when it starts
(``observability/estimates.py``); ``POST /api/inflight/{id}/cancel`` ends one
through its lease, exactly as a client disconnect would (``Lease.cancel``), and its client
gets a ``RequestCancelled`` error. Requests to peers bypass the scheduler and hold no
lease, so they are not listed and cannot be cancelled here.

The router's times are Trio's clock; what is shown is wall-clock time, converted at the
moment of answering (``to_wall_clock``).
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import trio
from quart import Response
from quart_trio import QuartTrio

from llamaswap._version import versions
from llamaswap.errors import NotFound, RequestCancelled
from llamaswap.observability.estimates import estimates
from llamaswap.process import ModelStatistics
from llamaswap.router import Router
from llamaswap.router.lease import RequestInfo
from llamaswap.schedulers import RequestState

__all__ = [
    "client_address",
    "inflight_entry",
    "iso_time",
    "json_response",
    "model_status",
    "register",
    "to_wall_clock",
]


def to_wall_clock(t: float, *, now: float, wall_now: float) -> float:
    """Trio time ``t`` as a Unix timestamp, given the same instant on both clocks.

    Trio's clock has an arbitrary origin (and is a mock clock in tests): only
    differences from ``now`` carry over to the wall clock.
    """
    return wall_now - (now - t)


def iso_time(timestamp: float) -> str:
    """A Unix timestamp as UTC ISO 8601 with milliseconds, as the activity log writes it."""
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def client_address(client: tuple[str, int] | None) -> str | None:
    """An ASGI scope's ``client`` as ``host:port`` (``[host]:port`` for IPv6)."""
    if not client:
        return None
    host, port = client
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def inflight_entry(
    info: RequestInfo,
    *,
    now: float,
    wall_now: float,
    position: int | None = None,
    eta_seconds: float | None = None,
) -> dict[str, Any]:
    """One ``/api/inflight`` entry. ``waited_ms`` runs until the request is dispatched
    (served, or its load started or joined), as the activity log's ``queue_wait_ms``;
    ``position`` is its 1-based place in the order the scheduler will serve the queue;
    ``eta_seconds``, the estimated seconds until it starts (0 once served; ``None``: no
    estimate); ``preemptions``, how often it was checkpointed for more urgent work, and
    ``paused`` with ``paused_ms``, whether it waits again after one, and since when."""
    paused_for = info.paused_for(now)
    return {
        "id": info.id,
        "model": info.model,
        "state": info.state,
        "priority": info.effective_priority,
        "band": info.band,
        "score": info.score,
        "waited_ms": round(info.waited(now) * 1000, 3),
        "started": iso_time(to_wall_clock(info.arrival, now=now, wall_now=wall_now)),
        "client": info.client,
        "route": info.route,
        "position": position,
        "eta_seconds": None if eta_seconds is None else round(eta_seconds, 3),
        "preemptions": info.preemptions,
        "paused": info.paused,
        "paused_ms": None if paused_for is None else round(paused_for * 1000, 3),
    }


def model_status(
    stats: ModelStatistics, ttl: float, *, now: float, wall_now: float
) -> dict[str, Any]:
    """A model's ``meta.llamaswap`` in ``/v1/models``.

    ``ttl`` is null when the model has none; ``ttl_left`` is null unless the idle countdown
    is running (the model is ready, has a TTL and no request in flight).
    """
    loaded_since = None
    if stats.ready_since is not None:
        loaded_since = iso_time(to_wall_clock(stats.ready_since, now=now, wall_now=wall_now))
    left = stats.ttl_left(now) if ttl > 0 else None
    return {
        "state": stats.state.value,
        "loaded_since": loaded_since,
        "ttl": ttl if ttl > 0 else None,
        "ttl_left": None if left is None else round(left, 3),
    }


def json_response(document: Any, status: int = 200) -> Response:
    """``document`` as a JSON answer."""
    return Response(json.dumps(document), status=status, content_type="application/json")


#: Lease states of a request still running (not failed, left, or released).
_LIVE = (RequestState.QUEUED, RequestState.LOADING, RequestState.SERVING)
_LIVE_NAMES = frozenset(state.value for state in _LIVE)


def register(quart: QuartTrio, router: Router) -> None:
    """Add ``/api/inflight``, ``/api/inflight/{id}/cancel`` and ``/api/version``."""

    @quart.get("/api/inflight")
    async def inflight() -> Response:
        now, wall_now = trio.current_time(), time.time()
        found = estimates(router)  # its order is Router.queue_order()'s
        order = {request_id: place for place, request_id in enumerate(found.order, 1)}
        entries = [
            inflight_entry(
                info,
                now=now,
                wall_now=wall_now,
                position=order.get(info.id),
                eta_seconds=found.start(info.id, now),
            )
            for info in router.requests()
            if info.state in _LIVE_NAMES
        ]
        return json_response({"inflight": entries})

    @quart.post("/api/inflight/<int:request_id>/cancel")
    async def cancel(request_id: int) -> Response:
        lease = router.lease_by_id(request_id)
        info = None if lease is None or lease.state not in _LIVE else lease.info()
        if lease is None or info is None:
            raise NotFound(f"no request {request_id} in flight; GET /api/inflight lists them")
        # Synchronous: the request's own task unwinds (leaves the queue, drops its load,
        # closes its upstream connection) and answers its client with the error.
        lease.cancel(RequestCancelled(request_id))
        return json_response({"cancelled": request_id, "state": info.state})

    @quart.get("/api/version")
    async def version() -> Response:
        return json_response(versions())
