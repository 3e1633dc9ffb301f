"""Leases: where a request's task waits, and the one count of requests in flight.

A *lease* is one admitted request's hold on its model, owned by the router. Its ticket
is the request's one record: its state (``RequestState``, drawn in
``schedulers/base.py``) is the request's lifecycle, which the lease does not keep again.
The lease adds what only the router needs: the parked task, the cancel scope, and what
the HTTP side knows (client, route).

While the request waits (QUEUED, LOADING) its task is parked Trio-natively
(``wait_task_rescheduled``, like ``trio.ParkingLot``) until the router applies the
scheduler's ``Grant`` or ``Fail``.
**The abort callback of a parked task only unparks it and notes the request abandoned:
no scheduler code runs inside Trio's cancellation delivery.** The router tells the
scheduler about every abandoned lease before it delivers any other event, so no decision
is ever made about a request whose client has gone. **A woken lease is never abandoned**:
whatever was granted belongs to the request, which releases it in ``finally``.

``Leases`` keeps the single count of granted, unreleased requests per model. Busy-eviction
(through the scheduler's ``World``), the TTL clock (through the supervisor) and the
shutdown drain all read this one count.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from typing import final

import attrs
import outcome
import trio

from llamaswap.errors import RequestError
from llamaswap.schedulers import RequestState, Ticket

__all__ = ["Lease", "Leases", "RequestInfo", "ticket_info"]


@attrs.frozen
class RequestInfo:
    """A snapshot of one admitted request: what the proxy, the metrics and the API read."""

    id: int
    model: str
    priority: int  # the header's
    effective_priority: int  # what the scheduler dispatches by
    band: str
    state: str  # queued, loading, serving, done
    arrival: float
    dispatched_at: float | None
    score: float | None
    metadata: Mapping[str, object]
    client: str | None = None  # "host:port" of the HTTP client, when known
    route: str = ""  # e.g. "POST /v1/chat/completions"
    preemptions: int = 0  # how often it was checkpointed so far
    paused_at: float | None = None  # when it was last checkpointed
    granted_at: float | None = None  # when it was (last) granted
    joined_load_at: float | None = None  # when it first waited for its model's load

    @property
    def paused(self) -> bool:
        """Waiting again after it was preempted, to go on where it stopped."""
        return self.preemptions > 0 and self.state in ("queued", "loading")

    def paused_for(self, now: float) -> float | None:
        """Seconds since it was checkpointed, while it is ``paused``; else ``None``."""
        if not self.paused or self.paused_at is None:
            return None
        return now - self.paused_at

    @property
    def queue_wait(self) -> float | None:
        """Seconds from arrival to dispatch; ``None`` while it waits."""
        return None if self.dispatched_at is None else self.dispatched_at - self.arrival

    def waited(self, now: float) -> float:
        """Seconds in the queue: so far while it waits, then fixed at its dispatch."""
        return (now if self.dispatched_at is None else self.dispatched_at) - self.arrival


def ticket_info(ticket: Ticket, *, client: str | None = None, route: str = "") -> RequestInfo:
    """The snapshot of ``ticket`` (the scheduler's record) that everyone else reads."""
    return RequestInfo(
        id=ticket.seq,
        model=ticket.model,
        priority=ticket.priority,
        effective_priority=ticket.effective_priority,
        band=ticket.band,
        state=ticket.state.value,
        arrival=ticket.arrival,
        dispatched_at=ticket.dispatched_at,
        score=ticket.score,
        metadata=dict(ticket.metadata),
        client=client,
        route=route,
        preemptions=ticket.preemptions,
        paused_at=ticket.paused_at,
        granted_at=ticket.granted_at,
        joined_load_at=ticket.joined_load_at,
    )


@final
class Lease:
    """One admitted request's hold on its model. Made by ``Router.lease``.

    ``client`` and ``route`` are what the HTTP side knows and the scheduler does not:
    they are only shown (``RequestInfo``, ``GET /api/inflight``).
    """

    def __init__(self, ticket: Ticket, *, client: str | None = None, route: str = "") -> None:
        self.ticket = ticket
        self.client = client
        self.route = route
        #: The name of the scheduler that has it, from its admission on (a reload that
        #: switches schedulers moves a waiting one to the new scheduler).
        self.scheduler: str | None = None
        #: Cancelling it ends the request wherever it is (``cancel``).
        self.scope = trio.CancelScope()
        self.cancel_error: RequestError | None = None
        self._preemption: trio.CancelScope | None = None
        self._abandoned: collections.deque[Lease] | None = None
        self._task: trio.lowlevel.Task | None = None
        self._outcome: outcome.Outcome[None] | None = None

    @property
    def id(self) -> int:
        return self.ticket.seq

    @property
    def state(self) -> RequestState:
        """The request's state: its ticket's."""
        return self.ticket.state

    @property
    def woken(self) -> bool:
        return self._outcome is not None

    def info(self) -> RequestInfo:
        return ticket_info(self.ticket, client=self.client, route=self.route)

    def cancel(self, error: RequestError) -> None:
        """End the request wherever it is, as a disconnect would; its client gets ``error``.

        *Cancellation*: this cancels ``scope``; ``Router.acquire`` turns that into ``error``.
        """
        if self.cancel_error is None:
            self.cancel_error = error
        self.scope.cancel(reason=str(error))

    def preemption(self) -> trio.CancelScope:
        """A new cancel scope that a preemption of this request cancels: the forwarder
        reads its upstream in it, and never writes to its client in it (a write cut short
        would close the client's connection). Cancelled already if the scheduler has
        decided its checkpoint (``Ticket.preempting``, cleared as it comes back)."""
        scope = self._preemption = trio.CancelScope()
        if self.ticket.preempting:
            scope.cancel(reason="preempted")
        return scope

    def pin(self) -> None:
        """It cannot be checkpointed (any more): its answer began a tool call, say."""
        self.ticket.preemptible = False

    def preempt(self) -> None:
        """The scheduler decided ``Preempt``: end the generation at the next read."""
        if self._preemption is not None:
            self._preemption.cancel(reason="preempted")

    def _wake(self, state: RequestState, error: RequestError | None = None) -> None:
        if self._outcome is not None:
            raise RuntimeError(f"request #{self.id} woken twice")
        self.ticket.state = state
        self._outcome = outcome.Value(None) if error is None else outcome.Error(error)
        if self._task is not None:
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        """Park until granted; raises the error it was failed with. A lease woken already
        (granted or failed as it was admitted) returns at once, without a checkpoint (a
        trip through Trio's scheduler; the request's own I/O comes next anyway).

        *Cancellation*: cancelled while parked, the lease becomes ABANDONED at once (and
        ``Cancelled`` is raised). Once woken it is no longer cancellable here.
        """
        if self._outcome is None:
            self._task = trio.lowlevel.current_task()

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                # Trio's cancellation delivery: note it, nothing that could raise.
                self._task = None
                self.ticket.state = RequestState.ABANDONED
                assert self._abandoned is not None
                self._abandoned.append(self)
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        assert self._outcome is not None
        self._outcome.unwrap()


@final
class Leases:
    """Every admitted request, and how many there are per model, and in flight."""

    def __init__(self) -> None:
        self._leases: dict[Ticket, Lease] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()
        #: Leases cancelled while parked whose cancel the scheduler has not heard yet.
        self.abandoned: collections.deque[Lease] = collections.deque()
        self._drained = trio.Event()
        self._drained.set()

    def __iter__(self) -> Iterator[Lease]:
        """Every admitted, unreleased request, oldest first."""
        return iter(list(self._leases.values()))

    def in_flight(self, model: str) -> int:
        return self._in_flight[model]

    def waiting(self, ticket: Ticket) -> bool:
        """Whether ``ticket``'s request is parked (or about to be), neither woken nor gone.
        (Its state may say SERVING or FAILED already: the scheduler decided, and the
        router is applying the decision.)"""
        lease = self._leases.get(ticket)
        return lease is not None and not lease.woken and ticket.state is not RequestState.ABANDONED

    def add(self, lease: Lease) -> None:
        lease._abandoned = self.abandoned
        self._leases[lease.ticket] = lease

    def grant(self, ticket: Ticket) -> bool:
        """Wake ``ticket``'s request, granted; False if it is not waiting any more."""
        if not self.waiting(ticket):
            return False
        self._leases[ticket]._wake(RequestState.SERVING)
        if not self._in_flight:
            self._drained = trio.Event()
        self._in_flight[ticket.model] += 1
        return True

    def fail(self, ticket: Ticket, error: RequestError) -> bool:
        """Wake ``ticket``'s request with ``error``; False if it is not waiting any more."""
        if not self.waiting(ticket):
            return False
        self._leases[ticket]._wake(RequestState.FAILED, error)
        return True

    def preempt(self, ticket: Ticket) -> bool:
        """Tell ``ticket``'s serving request to checkpoint; False if it is not serving."""
        lease = self._leases.get(ticket)
        if lease is None or lease.state is not RequestState.SERVING:
            return False
        lease.preempt()
        return True

    def pause(self, lease: Lease) -> None:
        """The serving request was checkpointed: count it out, and let it park again."""
        self._count_out(lease.ticket.model)
        lease._preemption = None
        lease._outcome = None

    def release(self, lease: Lease) -> None:
        """The request is over: forget it, and count it out if it was granted."""
        if lease.state is RequestState.SERVING:
            self._count_out(lease.ticket.model)
        lease.ticket.state = RequestState.DONE
        self._leases.pop(lease.ticket, None)

    def _count_out(self, model: str) -> None:
        self._in_flight[model] -= 1
        if not self._in_flight[model]:
            del self._in_flight[model]
            if not self._in_flight:
                self._drained.set()

    async def drained(self) -> None:
        """Return once no request is in flight."""
        await self._drained.wait()
