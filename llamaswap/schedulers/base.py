"""The scheduler seam: what a scheduler sees, decides and may do.

A scheduler is a synchronous state machine. Events come in as method calls
(``on_request``, ``on_cancel``, ``on_serve_done``, ``on_swap_done``, ``on_model_state``,
``on_unload``, ``on_shutdown``); side effects go out through ``Effects``, its only window
onto processes and waiting tasks. Synchronous code cannot be interrupted in Trio, so a
scheduler needs no lock and no task of its own. **Never add an ``await`` to a scheduler
method.** Slow work (a load) goes behind ``Effects.start_swap``, whose task reports back
with ``on_swap_done``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Set
from typing import Protocol

import attrs

from llamaswap.errors import RequestError
from llamaswap.process.state import ModelState

from .waitqueue import Waiter

__all__ = [
    "BandStatistics",
    "Effects",
    "Scheduler",
    "SchedulerStatistics",
    "Swap",
    "Swapper",
    "Ticket",
    "TicketState",
]


class TicketState(enum.Enum):
    QUEUED = "queued"  # waiting for the scheduler's decision
    LOADING = "loading"  # dispatched: waiting for its model's swap
    SERVING = "serving"  # granted: the request is being forwarded
    DONE = "done"  # finished, failed, or abandoned


@attrs.define(eq=False)
class Ticket:
    """One admitted request, as the scheduler sees it.

    Attributes:
        model: the model ID (names and aliases are resolved before the scheduler).
        priority: from the ``X-LlamaSwap-Priority`` header.
        seq: arrival order, unique and increasing.
        arrival: arrival time (``Effects.now()`` clock).
        needs_slot: inference work; ``False`` for pages like GET ``/props`` that the
            ``serial`` scheduler lets through without the slot when their model is ready.
        effective_priority: what dispatch uses (``fifo`` adds its per-model priority).
        score: under ``serial``, the score at the pick; ``None`` if never picked.
        dispatched_at: when it left the queue (granted, or its load started or joined).
        metadata: what the scheduler wants in the activity log (e.g. ``affinity``).
        waiter: where the request's task is parked (the router's; tests leave it unset).
    """

    model: str
    priority: int = 0
    seq: int = 0
    arrival: float = 0.0
    needs_slot: bool = True
    effective_priority: int = 0
    state: TicketState = TicketState.QUEUED
    score: float | None = None
    dispatched_at: float | None = None
    metadata: dict[str, object] = attrs.field(factory=dict, repr=False)
    waiter: Waiter | None = attrs.field(default=None, repr=False)

    @property
    def queue_wait(self) -> float | None:
        return None if self.dispatched_at is None else self.dispatched_at - self.arrival


@attrs.define(eq=False)
class Swap:
    """A load in progress: stop ``evict`` (in parallel), then make ``target`` ready."""

    target: str
    evict: frozenset[str]
    waiters: list[Ticket] = attrs.field(factory=list)


class Swapper(Protocol):
    """The eviction policy: a pure function of the target and the running set."""

    def eviction_for(self, target: str, running: Set[str]) -> frozenset[str]:
        """The models in ``running`` that must stop before ``target`` can run."""


class Effects(Protocol):
    """Everything a scheduler may do to the world. Every method is synchronous.

    **Effects never call back into the scheduler synchronously**: their consequences
    come back later as events. That is what makes a scheduler method atomic.
    """

    def now(self) -> float: ...

    def model_state(self, model: str) -> ModelState: ...

    def running_models(self) -> Set[str]:
        """Every model whose process is not stopped (starting, ready or stopping)."""

    def start_swap(self, swap: Swap) -> None:
        """Start a task that performs ``swap`` and then calls ``on_swap_done``."""

    def cancel_swap(self, swap: Swap, reason: str) -> None:
        """Abandon ``swap``: its task is cancelled and a start in progress is killed."""

    def grant(self, ticket: Ticket) -> None:
        """Let the request be served now (its model is ready)."""

    def fail(self, ticket: Ticket, error: RequestError) -> None:
        """Answer the request with ``error``."""


@attrs.frozen
class BandStatistics:
    depth: int = 0
    oldest_wait: float = 0.0
    dispatched: int = 0


@attrs.frozen
class SchedulerStatistics:
    name: str
    waiting: int
    loading: int
    serving: int
    swaps: tuple[str, ...]
    bands: Mapping[str, BandStatistics]
    aging_changed_picks: int = 0
    affinity_changed_picks: int = 0
    slot_holder: str | None = None


class Scheduler(Protocol):
    """Decides which waiting request goes next. See the module docstring for the rules."""

    name: str

    def on_request(self, ticket: Ticket) -> None:
        """Admit ``ticket`` or raise ``ConcurrencyLimit``; may grant it at once."""

    def on_cancel(self, ticket: Ticket) -> None:
        """The ticket's client left before it was granted (queued, or waiting for a load)."""

    def on_serve_done(self, ticket: Ticket) -> None:
        """A granted ticket finished (successfully or not)."""

    def on_swap_done(self, swap: Swap, error: RequestError | None) -> None:
        """A swap's task ended: its target is ready, or ``error`` says why not."""

    def on_model_state(self, model: str, state: ModelState) -> None:
        """A model's state changed (including crashes and TTL unloads)."""

    def on_unload(self, models: Collection[str]) -> None:
        """``models`` are being unloaded: fail their waiting requests with ``ModelUnloaded``."""

    def on_shutdown(self, error: RequestError) -> None:
        """Fail every waiting request with ``error``; refuse new ones with it too."""

    def position(self, ticket: Ticket) -> int | None:
        """1-based place among the queued requests in pick order; ``None`` once dispatched."""

    def statistics(self) -> SchedulerStatistics: ...
