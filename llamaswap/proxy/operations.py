"""Live operations: what is in flight, cancelling one request, model state, the version,
the active profile.

``GET /api/inflight`` lists every request the scheduler has admitted and not yet released,
from the router's ``RequestInfo`` snapshots, each with the estimate of when it starts
(``observability/estimates.py``); ``POST /api/inflight/{id}/cancel`` ends one
through its lease, exactly as a client disconnect would (``Lease.cancel``), and its client
gets a ``RequestCancelled`` error. Requests to peers bypass the scheduler and hold no
lease, so they are not listed and cannot be cancelled here.

``GET /api/profiles`` lists the configured profiles and which one is active;
``PUT /api/profiles/active`` (``{"profile": NAME}``, or ``null`` for none) switches it
(``Router.set_profile``): requests resolved from then on see its pins.

The router's times are Trio's clock; what is shown is wall-clock time, converted at the
moment of answering (``to_wall_clock``).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from llamaswap._version import versions
from llamaswap.config import Capabilities
from llamaswap.errors import BadRequest, NotFound, RequestCancelled
from llamaswap.observability.estimates import estimates
from llamaswap.process import ModelStatistics
from llamaswap.router import Router
from llamaswap.router.lease import RequestInfo
from llamaswap.schedulers import RequestState

from .extract import Payload

__all__ = [
    "CLIENT_STATUS",
    "capability_fields",
    "client_address",
    "client_status",
    "inflight_entry",
    "iso_time",
    "json_response",
    "listed_names",
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
    stats: ModelStatistics, ttl: float | None, *, now: float, wall_now: float
) -> dict[str, Any]:
    """A model's ``meta.llamaswap`` in ``/v1/models``.

    ``ttl`` is null when the model has none; ``ttl_left`` is null unless the idle countdown
    is running (the model is ready, has a TTL and no request in flight); ``failure`` is
    null unless its state is ``failed``.
    """
    loaded_since = None
    if stats.ready_since is not None:
        loaded_since = iso_time(to_wall_clock(stats.ready_since, now=now, wall_now=wall_now))
    left = None if ttl is None else stats.ttl_left(now)
    return {
        "state": stats.shown_state,
        "loaded_since": loaded_since,
        "ttl": ttl,
        "ttl_left": None if left is None else round(left, 3),
        "failure": stats.failure_json(),
    }


#: ``status.value`` in ``/v1/models``, by the state shown: the words of llama.cpp's
#: router, which Open WebUI reads (a model stopping is no longer usable: ``unloaded``).
CLIENT_STATUS = {
    "starting": "loading",
    "ready": "loaded",
    "stopping": "unloaded",
    "stopped": "unloaded",
    "failed": "failed",
}


def client_status(stats: ModelStatistics) -> dict[str, Any]:
    """A model's ``status`` in ``/v1/models``: its ``value`` and, after a failed start,
    ``failed`` and ``exit_code``, as llama.cpp's router adds them."""
    status: dict[str, Any] = {"value": CLIENT_STATUS[stats.shown_state]}
    if stats.failure is not None:
        status |= {"failed": True, "exit_code": stats.failure.exit_code}
    return status


def capability_fields(capabilities: Capabilities) -> dict[str, Any]:
    """What a model's ``capabilities`` add to its ``/v1/models`` entry, named as llama-swap
    names them (OpenRouter's names): ``architecture`` with the modalities it reads and
    writes, ``capabilities`` with what those and ``tools``/``reranker`` make it able to
    do, and ``supported_parameters`` for ``tools``; each only when it says something."""
    read, written = capabilities.in_, capabilities.out
    fields: dict[str, Any] = {}
    architecture: dict[str, Any] = {}
    if read:
        architecture["input_modalities"] = list(read)
    if written:
        architecture["output_modalities"] = list(written)
    if read and written:
        architecture["modality"] = f"{'+'.join(read)}->{'+'.join(written)}"
    if architecture:
        fields["architecture"] = architecture
    able = {
        "vision": "image" in read,
        "audio_transcriptions": "audio" in read and "text" in written,
        "audio_speech": "text" in read and "audio" in written,
        "image_generation": "text" in read and "image" in written,
        "image_to_image": "image" in read and "image" in written,
        "function_calling": capabilities.tools,
        "reranker": capabilities.reranker,
    }
    if any(able.values()):
        fields["capabilities"] = {name: True for name, yes in able.items() if yes}
    if capabilities.tools:
        fields["supported_parameters"] = ["tools", "tool_choice"]
    return fields


def listed_names(router: Router) -> list[str]:
    """The names ``/v1/models`` lists (and ``/api/tags``), in its order."""
    config = router.config  # the current one: a reload applies at once
    names = router.names
    listed: list[str] = []
    for model_id, model in config.models.items():
        if not model.unlisted:
            listed += [model_id, *(model.aliases if config.include_aliases_in_list else ())]
    # A node behind a gateway lists its own models: the gateway learns what each node
    # serves from here (docs/scale-out.md).
    listed += () if config.gateway.node else names.peer_models()
    listed += [name for name, selector in config.selectors.items() if not selector.unlisted]
    # llama-swap's older profiles: each member as PROFILE:MODEL, unless it is unlisted.
    listed += [name for name, model_id in names.members() if not config.models[model_id].unlisted]
    # The active profile's names, each as what it reaches; none for a name it turns off.
    listed += [name for name in names.pins if name not in listed]
    return [name for name in listed if names.pins.get(name) != ""]


def json_response(document: Any, status: int = 200) -> Response:
    """``document`` as a JSON answer."""
    return Response(json.dumps(document), status=status, content_type="application/json")


#: Lease states of a request still running (not failed, left, or released).
_LIVE = (RequestState.QUEUED, RequestState.LOADING, RequestState.SERVING)
_LIVE_NAMES = frozenset(state.value for state in _LIVE)


def register(quart: QuartTrio, router: Router) -> None:
    """Add ``/api/inflight``, ``/api/inflight/{id}/cancel``, ``/api/version`` and
    ``/api/profiles``."""

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
        return json_response({**versions(), "pid": os.getpid()})  # for `kill -HUP`

    @quart.get("/api/profiles")
    async def profiles() -> Response:
        return json_response(profiles_document(router))

    @quart.put("/api/profiles/active")
    async def activate_profile() -> Response:
        body = Payload(
            await request.get_data(True, False, False), request.content_type or ""
        ).json()
        profile = body.get("profile", ...)
        if not (profile is None or isinstance(profile, str)):
            message = 'expected {"profile": NAME} or {"profile": null}'
            raise BadRequest(message, param="profile")
        router.set_profile(profile)
        return json_response(profiles_document(router))


def profiles_document(router: Router) -> dict[str, Any]:
    """``GET /api/profiles``: every profile, with its pins and members, and the active
    one's name."""
    return {
        "active": router.names.profile,
        "profiles": [
            {
                "name": name,
                "description": profile.description,
                "pins": dict(profile.pins),
                "members": list(profile.members),
            }
            for name, profile in router.config.profiles.items()
        ],
    }
