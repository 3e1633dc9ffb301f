"""The scheduler seam: what a scheduler sees, and the decisions it returns.

A scheduler is a synchronous state machine. Events come in as method calls
(``on_request``, ``on_cancel``, ``on_finish``, ``on_swap_done``, ``on_model_state``,
``on_unload``, ``on_shutdown``), and each returns the scheduler's *decisions* as values
(``Grant``, ``Fail``, ``StartSwap``, ``CancelSwap``, ``JoinSwap``, ``Recheck``,
``Preempt``). The router
applies them; the scheduler itself touches nothing. It reads the world through ``World``
(time, model states, when a model became ready, the running set, in-flight counts), which
only answers questions.

Synchronous code cannot be interrupted in Trio, so a scheduler needs no lock and no task
of its own. **Never add an ``await`` to a scheduler method.** Slow work (a load) is a
``StartSwap`` decision; the router runs it in a task that reports back with
``on_swap_done``. Decisions are plain frozen values: tests assert them as they are, and
the router publishes them as the request-lifecycle events.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Set
from typing import Protocol, TypeAlias

import attrs

from llamaswap.config.model import Config
from llamaswap.errors import RequestError
from llamaswap.process.state import ModelState

from .priority import band_of

__all__ = [
    "BandStatistics",
    "CancelSwap",
    "Decision",
    "Fail",
    "Grant",
    "Handover",
    "JoinSwap",
    "Preempt",
    "Recheck",
    "RequestState",
    "Scheduler",
    "SchedulerCounts",
    "SchedulerStatistics",
    "StartSwap",
    "Swap",
    "Swapper",
    "Ticket",
    "World",
    "needs_slot",
]

#: Requests that generate nothing, though they are not pages: Anthropic clients count a
#: prompt's tokens before every turn.
_NO_SLOT = frozenset({"POST /v1/messages/count_tokens"})


def needs_slot(route: str) -> bool:
    """Whether a request to ``route`` (``"METHOD /path"``) is inference work that takes a
    model's slot (``Ticket.needs_slot``): not a page (GET, HEAD), nor a token count. Those
    go beside a generation, not after it."""
    method = route.partition(" ")[0]
    return method not in ("GET", "HEAD") and route not in _NO_SLOT


class RequestState(enum.Enum):
    """One admitted request's lifecycle (``Ticket.state``), the only record of it::

        QUEUED ──dispatch──▶ LOADING ──its load is done──▶ SERVING ──finished──▶ DONE
          ▲ └──────────────grant──────────────────────────────▲ │
          └───────────────checkpointed (preempted)───────────────┘
        QUEUED, LOADING ──fail──▶ FAILED ──its task has the error──▶ DONE
        QUEUED, LOADING ──cancelled while parked──▶ ABANDONED ──the scheduler is told──▶ DONE

    The scheduler moves it through the first line (its ``Ledger``); the router's
    ``Leases`` marks it FAILED as it wakes the task with the error, ABANDONED as the
    parked task is cancelled (Trio's abort callback: nothing else happens there), and
    DONE as it releases it.
    """

    QUEUED = "queued"  # waiting for the scheduler's decision
    LOADING = "loading"  # dispatched: waiting for its model's swap
    SERVING = "serving"  # granted: the request is being forwarded
    FAILED = "failed"  # woken with an error, its task not yet out of Router.acquire
    ABANDONED = "abandoned"  # cancelled while parked; the scheduler is not told yet
    DONE = "done"  # released


@attrs.define(eq=False)
class Ticket:
    """One admitted request, as the scheduler sees it.

    Attributes:
        model: the model ID (names and aliases are resolved before the scheduler).
        priority: from the ``X-LlamaSwap-Priority`` header.
        seq: arrival order, unique and increasing.
        arrival: arrival time (``World.now()`` clock).
        needs_slot: inference work; ``False`` for pages like GET ``/props`` that the
            ``serial`` scheduler lets through without the slot when their model is ready.
        effective_priority: what dispatch uses (``fifo`` adds its per-model priority).
        score: under ``serial``, the score at the pick; ``None`` if never picked.
        dispatched_at: when it left the queue (granted, or its load started or joined).
        granted_at: when it was granted (its serving time is counted from then).
        joined_load_at: when it first waited for its model's load (a trace's load span);
            ``None`` if its model was ready whenever it was dispatched.
        preemptible: its generation can be checkpointed and resumed (the forwarder knows
            from its route and body; ``serial`` with ``preempt`` reads it).
        preemptions: how often it was preempted so far.
        preempting: a ``Preempt`` for it was decided, and it has not come back yet.
        paused_at: when it was last checkpointed (it waits again from then); ``None`` if
            never.
        metadata: what the scheduler wants in the activity log (e.g. ``affinity``).

    A ticket is the scheduler's own record: plain data, no Trio object. Everyone else
    reads it through the router's ``RequestInfo`` snapshots.
    """

    model: str
    priority: int = 0
    seq: int = 0
    arrival: float = 0.0
    needs_slot: bool = True
    effective_priority: int = 0
    state: RequestState = RequestState.QUEUED
    score: float | None = None
    dispatched_at: float | None = None
    granted_at: float | None = None
    joined_load_at: float | None = None
    preemptible: bool = False
    preemptions: int = 0
    preempting: bool = False
    paused_at: float | None = None
    metadata: dict[str, object] = attrs.field(factory=dict, repr=False)

    @property
    def band(self) -> str:
        """The band of its effective priority: the one place a request's band is found."""
        return band_of(self.effective_priority)


@attrs.define(eq=False)
class Swap:
    """A load in progress: stop ``evict`` (in parallel), then make ``target`` ready.
    ``retry``: why this is the second try of a load (its first ran out of memory)."""

    target: str
    evict: frozenset[str]
    waiters: list[Ticket] = attrs.field(factory=list)
    retry: str | None = None


class Swapper(Protocol):
    """The eviction policy: a pure function of the target, the running set and which
    running models are busy. ``persistent``: the models it never evicts."""

    persistent: frozenset[str]

    def eviction_for(
        self, target: str, running: Set[str], busy: Set[str] = frozenset()
    ) -> frozenset[str]:
        """The models in ``running`` that must stop before ``target`` can run.

        ``busy`` are the running models that could not stop without a wait: those with
        requests in flight (never evicted before they drain) and those being loaded (a
        swap that evicts one waits for its load to end). A policy with a choice should
        prefer not to need them stopped (``matrix`` does; ``group`` has no choice to make
        and ignores it).
        """

    def runs_beside(self, target: str, running: Set[str]) -> bool:
        """Whether ``target`` can run with all of ``running``: its rules stop none of
        them, and where the memory rule applies it fits beside them. ``eviction_for``'s
        question without its search for the best models to stop (``max_lora`` asks it
        of every model)."""


class World(Protocol):
    """What a scheduler may ask about the world. Every method is a synchronous query."""

    def now(self) -> float: ...

    def model_state(self, model: str) -> ModelState: ...

    def ready_since(self, model: str) -> float | None:
        """When ``model`` last became ready (``now()``'s clock); ``None`` if it is not ready."""

    def running_models(self) -> Set[str]:
        """Every model whose process is not stopped (starting, ready or stopping)."""

    def in_flight(self, model: str) -> int:
        """Granted requests of ``model`` not yet finished (the router's single count)."""


@attrs.frozen
class Grant:
    """Serve ``ticket`` now: its model is ready."""

    ticket: Ticket


@attrs.frozen
class Fail:
    """Answer ``ticket`` with ``error``; it is no longer admitted."""

    ticket: Ticket
    error: RequestError


@attrs.frozen
class StartSwap:
    """Start a task that stops ``swap.evict``, makes ``swap.target`` ready, then reports
    ``on_swap_done``."""

    swap: Swap


@attrs.frozen
class CancelSwap:
    """Abandon ``swap``: its task is cancelled and a start in progress is killed."""

    swap: Swap
    reason: str


@attrs.frozen
class JoinSwap:
    """``ticket`` now waits for ``swap`` (it is loading). Nothing to apply: an event."""

    ticket: Ticket
    swap: Swap


@attrs.frozen
class Recheck:
    """Call ``on_recheck`` at time ``at``: a load held back by a model's ``minResidency``
    may go then. Nothing else would wake the scheduler, which only hears events."""

    at: float


@attrs.frozen
class Preempt:
    """Checkpoint ``ticket``, which is serving: end its generation, keep what it made, and
    bring it back to the scheduler (``on_preempted``) to be resumed when picked again."""

    ticket: Ticket


Decision: TypeAlias = Grant | Fail | StartSwap | CancelSwap | JoinSwap | Recheck | Preempt


@attrs.frozen
class BandStatistics:
    depth: int = 0
    oldest_wait: float = 0.0
    dispatched: int = 0
    preempted: int = 0  # ``Preempt`` decisions for requests of the band


@attrs.frozen
class SchedulerStatistics:
    name: str
    waiting: int
    loading: int
    swaps: tuple[str, ...]
    bands: Mapping[str, BandStatistics]
    aging_changed_picks: int = 0
    affinity_changed_picks: int = 0
    slot_holder: str | None = None


@attrs.frozen
class Handover:
    """Every request a scheduler has, handed to the one a reload switches to
    (``Scheduler.surrender``, then ``adopt``): after it, the old scheduler has nothing.

    ``waiting``: not dispatched, oldest first, with their reservations freed (``QUEUED``);
    the new scheduler admits each again, or fails it. ``dispatched``: loading or serving,
    oldest first; the new scheduler accounts for them as its own running work (they hold
    their reservations and, under ``serial``, their slots). ``swaps``: the loads in
    progress, whose waiters are among ``dispatched``; the new scheduler owns them.
    """

    waiting: tuple[Ticket, ...] = ()
    dispatched: tuple[Ticket, ...] = ()
    swaps: tuple[Swap, ...] = ()


@attrs.frozen
class SchedulerCounts:
    """The counters in a scheduler's statistics: requests dispatched and preempted by band,
    and the picks aging and affinity changed.

    A scheduler counts from when it is made. A reload that switches schedulers retires
    one, and ``surrender()`` leaves it nothing, so its counts are final from then on: the
    router adds them up (``Router.retired_counts``), and the counters in ``/metrics`` are
    those plus the current scheduler's, never going back.
    """

    dispatched: Mapping[str, int] = attrs.field(factory=dict)
    aging_changed_picks: int = 0
    affinity_changed_picks: int = 0
    preempted: Mapping[str, int] = attrs.field(factory=dict)

    @classmethod
    def of(cls, statistics: SchedulerStatistics) -> SchedulerCounts:
        bands = statistics.bands
        return cls(
            {band: numbers.dispatched for band, numbers in bands.items()},
            statistics.aging_changed_picks,
            statistics.affinity_changed_picks,
            {band: numbers.preempted for band, numbers in bands.items()},
        )

    def __add__(self, other: SchedulerCounts) -> SchedulerCounts:
        return SchedulerCounts(
            _sum(self.dispatched, other.dispatched),
            self.aging_changed_picks + other.aging_changed_picks,
            self.affinity_changed_picks + other.affinity_changed_picks,
            _sum(self.preempted, other.preempted),
        )


def _sum(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {key: a.get(key, 0) + b.get(key, 0) for key in {*a, *b}}


class Scheduler(Protocol):
    """Decides which waiting request goes next. See the module docstring for the rules.

    Every event returns the decisions it made, in order. Only ``on_request`` raises on
    purpose (``ConcurrencyLimit``, or the shutdown error), before deciding anything.
    """

    name: str

    def on_request(self, ticket: Ticket) -> list[Decision]:
        """Admit ``ticket`` or raise ``ConcurrencyLimit``; may grant it at once."""

    def admitted(self, model: str) -> int:
        """The requests for ``model`` admitted and not yet released: waiting, loading or
        serving. The one count of them: ``concurrencyLimit``, the TTL and the dashboard
        read it."""

    def adopt(self, handover: Handover) -> list[Decision]:
        """Take over what another scheduler gave up (``surrender``: a reload switched
        schedulers). Its loading and serving requests and its loads become this one's
        running work, which what it grants next must wait for (a ``serial`` slot taken by
        them is taken). Its waiting requests are taken as if they had arrived together:
        each is admitted, or failed with what ``on_request`` would raise, and only then
        does anything go out, by this scheduler's own order."""

    def on_cancel(self, ticket: Ticket) -> list[Decision]:
        """The ticket's client left before it was granted (queued, or waiting for a load)."""

    def on_finish(self, ticket: Ticket) -> list[Decision]:
        """A granted ticket finished (successfully or not); ``World.in_flight`` already
        counts it out."""

    def on_preempted(self, ticket: Ticket) -> list[Decision]:
        """A serving ticket was checkpointed (``Preempt``; ``World.in_flight`` already
        counts it out): it waits again, keeping its arrival, its reservation and its first
        dispatch, and goes on from where it stopped once granted again."""

    def on_swap_done(self, swap: Swap, error: RequestError | None) -> list[Decision]:
        """A swap's task ended: its target is ready, or ``error`` says why not (also one
        it cancelled, or another scheduler did before a reload handed its work over)."""

    def on_model_state(self, model: str, state: ModelState) -> list[Decision]:
        """A model's state changed (including crashes and TTL unloads)."""

    def on_recheck(self) -> list[Decision]:
        """The time of a ``Recheck`` came: a model's ``minResidency`` is over, and what it
        held back may go now."""

    def on_unload(self, models: Collection[str], reason: str = "unloaded") -> list[Decision]:
        """``models`` are being unloaded: fail their waiting requests with ``ModelUnloaded``."""

    def on_shutdown(self, error: RequestError) -> list[Decision]:
        """Fail every waiting request with ``error``; refuse new ones with it too."""

    def on_reconfigure(self, config: Config, swapper: Swapper) -> list[Decision]:
        """A reload: new limits, priorities, settings and eviction policy, at once."""

    def surrender(self) -> Handover:
        """Give up every request and load (a reload switches schedulers), with no decision
        about them: this scheduler is left with nothing, and its counts
        (``SchedulerCounts``) are final from then on."""

    def queued(self) -> list[Ticket]:
        """Every request not yet dispatched, in the order it would serve them as things
        stand now (for positions, the queue view and the events; O(n log n))."""

    def scores(self, tickets: list[Ticket]) -> list[float | None]:
        """Each ticket's score as the next pick would see it; ``None`` where this
        scheduler does not score (``fifo``)."""

    def statistics(self) -> SchedulerStatistics: ...
