"""What the router tells its observers, as typed values on one stream (``Router.observe``).

Each is frozen and says one thing that happened, in the order it happened: a model's
state, its process starting, a line of its output, its being forgotten, a decision
applied, a request admitted or released. The metrics, the activity feed, the event hub
and the live logs all subscribe to this one stream and pick the kinds they need.
**An observer is called synchronously, inside the router's step: it must not block or
raise.**
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs

from llamaswap.process import LogLine, ModelState
from llamaswap.schedulers import Decision

from .lease import Lease

__all__ = [
    "EVENT_KINDS",
    "DecisionApplied",
    "ModelForgotten",
    "ModelOutput",
    "ModelSpawned",
    "ModelStateChanged",
    "Observer",
    "ProfileChanged",
    "RequestChange",
    "RequestChanged",
    "RouterEvent",
]


@attrs.frozen
class ModelStateChanged:
    """A model's supervisor moved to ``state``."""

    model: str
    state: ModelState


@attrs.frozen
class ModelSpawned:
    """A model's server process runs (it is starting; its PID is known)."""

    model: str


@attrs.frozen
class ModelOutput:
    """A line its server printed."""

    model: str
    line: LogLine


@attrs.frozen
class ModelForgotten:
    """A model a reload removed is gone: stopped, nothing in flight, no load naming it."""

    model: str


@attrs.frozen
class DecisionApplied:
    """The router applied one of the scheduler's decisions."""

    decision: Decision


@attrs.frozen
class ProfileChanged:
    """``profile`` is the active profile now (None: none), switched or dropped by a reload."""

    profile: str | None


RequestChange = Literal["queued", "paused", "done", "failed", "cancelled"]


@attrs.frozen
class RequestChanged:
    """A request was admitted (``queued``), checkpointed and waiting again (``paused``),
    or released: ``done`` after a grant, ``failed``, or ``cancelled`` while it waited.
    ``lease.info()`` is its snapshot, taken only by an observer that needs it (most
    requests have nobody watching)."""

    change: RequestChange
    lease: Lease


RouterEvent = (
    ModelStateChanged
    | ModelSpawned
    | ModelOutput
    | ModelForgotten
    | DecisionApplied
    | RequestChanged
    | ProfileChanged
)

#: Every kind, for an observer that names none.
EVENT_KINDS: tuple[type[RouterEvent], ...] = (
    ModelStateChanged,
    ModelSpawned,
    ModelOutput,
    ModelForgotten,
    DecisionApplied,
    RequestChanged,
    ProfileChanged,
)

Observer = Callable[[RouterEvent], None]
