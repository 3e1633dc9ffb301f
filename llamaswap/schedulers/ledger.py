"""The bookkeeping every scheduler shares: admissions, active swaps, and the decisions made.

A scheduler owns a ``Ledger`` and decides *when*; the ledger keeps the counts right and
writes the decisions down (``Grant``, ``Fail``, ``StartSwap``, ``CancelSwap``,
``JoinSwap``) in its outbox, which each event hands to the router with ``take()``.
``fifo`` and ``serial`` differ only in their queues and in when they dispatch, so the
accounting below — admission, swaps, the residency rule, failing what waits on unload and
shutdown, band statistics — is written once.

**Invariants** (checked by the tests of both schedulers):

* ``admitted[m]`` = the requests for ``m`` queued + loading + serving, the one count of
  them (``Scheduler.admitted``: the TTL and the dashboard read it too); a request beyond
  the model's limit (its ``concurrencyLimit``, else the scheduler's default, if any) is
  refused before anything is sent (429).
* A model with requests in flight is never evicted. In flight is the router's count
  (``World.in_flight``) plus the grants decided in this event and not yet applied.
* A model that became ready less than ``minResidency`` ago and still has requests queued
  is not evicted for a request of the same band as the best of them, or a lower one
  (``held_until``): the load waits, and a ``Recheck`` at the residency's end wakes the
  scheduler, since no event would. A higher band may evict it at once.
* One active swap per target model; every ticket in ``LOADING`` is a waiter of the swap
  for its model, and a swap with no waiters left is cancelled at once.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Protocol, final

import attrs

from llamaswap.errors import ConcurrencyLimit, ModelStartFailed, ModelUnloaded, RequestError
from llamaswap.process.state import ModelState

from .base import (
    BandStatistics,
    CancelSwap,
    Decision,
    Fail,
    Grant,
    Handover,
    JoinSwap,
    Preempt,
    Recheck,
    RequestState,
    StartSwap,
    Swap,
    Swapper,
    Ticket,
    World,
)
from .priority import BANDS

__all__ = ["Ledger", "Plan", "Queue"]

#: Each band's height: a higher band has a larger number.
_HEIGHT = {band: -index for index, band in enumerate(BANDS)}


class Queue(Protocol):
    """Where a scheduler keeps the tickets it has not dispatched yet."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Ticket]:
        """Every queued ticket, in no particular order."""

    def remove(self, ticket: Ticket) -> bool:
        """Take ``ticket`` out; False if it was not queued."""


@attrs.frozen
class Plan:
    """What running ``target`` now would take."""

    ready: bool  # the target is ready
    evict: frozenset[str]  # models that must stop first
    collides: bool  # it would fight a swap in progress
    busy: bool  # it would evict a model that is serving requests

    @property
    def blocked(self) -> bool:
        return self.collides or self.busy

    @property
    def immediate(self) -> bool:
        return self.ready and not self.evict and not self.collides


@final
class Ledger:
    def __init__(
        self,
        world: World,
        swapper: Swapper,
        limits: Mapping[str, int],
        *,
        default_limit: int | None = None,
        min_residency: float = 0.0,
    ) -> None:
        self.configure(swapper, limits, min_residency)
        self.default_limit = default_limit  # for a model with no limit of its own
        self.world = world
        #: The tickets admitted per model (a set: releasing one twice changes nothing).
        self.admitted: dict[str, set[Ticket]] = {}
        self.swaps: dict[str, Swap] = {}
        self.dispatched: collections.Counter[str] = collections.Counter()
        self.preempted: collections.Counter[str] = collections.Counter()
        self.closed: RequestError | None = None
        self._outbox: list[Decision] = []
        self._granting: collections.Counter[str] = collections.Counter()
        #: The times of the ``Recheck``s decided and not yet past: one for each.
        self._rechecks: set[float] = set()

    def configure(
        self, swapper: Swapper, limits: Mapping[str, int], min_residency: float = 0.0
    ) -> None:
        """The eviction policy, the per-model limits and ``minResidency`` (again, on a
        reload)."""
        self.swapper = swapper
        self.limits = limits
        self.min_residency = min_residency

    def preempt(self, ticket: Ticket) -> None:
        """Checkpoint the serving ``ticket`` (``Preempt``), counted by its band."""
        ticket.preempting = True
        self.preempted[ticket.band] += 1
        self._outbox.append(Preempt(ticket))

    def take_back(self, ticket: Ticket) -> None:
        """Give up the load the ``LOADING`` ``ticket`` waits for (``Preempt``, counted by
        its band): it leaves the swap, whose last waiter cancels it, and waits again, as
        a checkpointed request does (``requeue``)."""
        self.leave_swap(ticket)
        self.preempted[ticket.band] += 1
        self.requeue(ticket)
        self._outbox.append(Preempt(ticket))

    def take(self) -> list[Decision]:
        """The decisions made since the last call, in order; the event's return value."""
        decisions, self._outbox = self._outbox, []
        self._granting.clear()
        return decisions

    # ------------------------------------------------------------ admission

    def admit(self, ticket: Ticket) -> None:
        """Count ``ticket`` in, or raise (429, or the shutdown error) before any byte."""
        if self.closed is not None:
            raise self.closed
        limit = self.limits.get(ticket.model, self.default_limit)
        admitted = self.admitted.setdefault(ticket.model, set())
        if limit is not None and len(admitted) >= limit:
            raise ConcurrencyLimit(ticket.model, limit)
        admitted.add(ticket)

    def release(self, ticket: Ticket) -> None:
        """The ticket is finished, failed or abandoned: its reservation frees."""
        admitted = self.admitted.get(ticket.model)
        if admitted is not None:
            admitted.discard(ticket)
            if not admitted:
                del self.admitted[ticket.model]
        ticket.state = RequestState.DONE

    # ------------------------------------------------------------- outcomes

    def mark_dispatched(self, ticket: Ticket) -> None:
        if ticket.dispatched_at is None:
            ticket.dispatched_at = self.world.now()
            self.dispatched[ticket.band] += 1

    def grant(self, ticket: Ticket) -> None:
        self.mark_dispatched(ticket)
        ticket.granted_at = self.world.now()
        ticket.state = RequestState.SERVING
        self._granting[ticket.model] += 1
        self._outbox.append(Grant(ticket))

    def requeue(self, ticket: Ticket) -> None:
        """A preempted ticket waits again: it keeps its arrival (aging goes on counting),
        its reservation and its first dispatch; it is granted anew."""
        ticket.state = RequestState.QUEUED
        ticket.preemptions += 1
        ticket.preempting = False
        ticket.score = None
        ticket.granted_at = None
        ticket.paused_at = self.world.now()

    def fail(self, ticket: Ticket, error: RequestError) -> None:
        self.release(ticket)
        self._outbox.append(Fail(ticket, error))

    def busy(self, model: str) -> bool:
        """Whether ``model`` is serving requests (or was just granted some)."""
        return bool(self.world.in_flight(model) or self._granting[model])

    # ----------------------------------------------------------------- swaps

    def loads(self) -> list[Swap]:
        """Every swap in progress. Not the cancelled ones, whose tasks may still be winding
        down: what they blocked goes on at once."""
        return list(self.swaps.values())

    def running(self) -> set[str]:
        """Models whose process is not stopped, plus the targets of swaps in progress."""
        running = set(self.world.running_models())
        running.update(swap.target for swap in self.loads())
        return running

    def evictions(self, target: str, running: set[str] | None = None) -> frozenset[str]:
        """What the swapper would stop for ``target`` to run now, told which of the others
        it would have to wait for: those serving requests, and those being loaded."""
        others = (self.running() if running is None else running) - {target}
        loading = {swap.target for swap in self.loads()}
        busy = frozenset(model for model in others if model in loading or self.busy(model))
        return self.swapper.eviction_for(target, others, busy)

    def plan(self, target: str) -> Plan:
        evict = self.evictions(target)
        return Plan(
            ready=self.world.model_state(target) is ModelState.READY,
            evict=evict,
            collides=self._collides(target, evict),
            busy=any(self.busy(model) for model in evict),
        )

    def held_until(self, ticket: Ticket, evict: Collection[str]) -> float | None:
        """When the first model of ``evict`` that ``minResidency`` keeps from ``ticket``
        may go; ``None`` if none is kept.

        A model is kept while it became ready less than ``min_residency`` ago and has a
        request queued (not dispatched yet) of ``ticket``'s band or a higher one: evicting
        it would throw away a load that work is waiting for, for work no more urgent.
        """
        if not self.min_residency:
            return None
        now, height = self.world.now(), _HEIGHT[ticket.band]
        ends = []
        for model in evict:
            since = self.world.ready_since(model)
            if since is None or now >= since + self.min_residency:
                continue
            waiting = self.admitted.get(model, ())
            if any(t.state is RequestState.QUEUED and _HEIGHT[t.band] >= height for t in waiting):
                ends.append(since + self.min_residency)
        return min(ends, default=None)

    def held(self, ticket: Ticket, evict: Collection[str]) -> bool:
        """Whether ``minResidency`` keeps a model of ``evict`` from ``ticket`` now; if so,
        a ``Recheck`` is decided for when it may go (once for each time)."""
        until = self.held_until(ticket, evict)
        if until is None:
            return False
        now = self.world.now()
        self._rechecks = {at for at in self._rechecks if at > now}
        if until not in self._rechecks:
            self._rechecks.add(until)
            self._outbox.append(Recheck(until))
        return True

    def _collides(self, target: str, evict: frozenset[str]) -> bool:
        for swap in self.loads():
            if swap.target == target:
                continue  # the load of it, which requests join
            if target in swap.evict or swap.target in evict or not evict.isdisjoint(swap.evict):
                return True
        return False

    def dispatch(self, ticket: Ticket) -> bool:
        """Serve ``ticket`` now, or start the load it needs; False if a model it would
        evict is busy or within its residency (or another load collides) and it has to
        wait."""
        plan = self.plan(ticket.model)
        if plan.immediate:
            self.grant(ticket)
        elif plan.blocked or self.held(ticket, plan.evict):
            return False
        else:
            swap = Swap(ticket.model, plan.evict)
            self.swaps[ticket.model] = swap
            self._outbox.append(StartSwap(swap))
            self.join(ticket, swap)
        return True

    def join(self, ticket: Ticket, swap: Swap) -> None:
        self.mark_dispatched(ticket)
        if ticket.joined_load_at is None:
            ticket.joined_load_at = self.world.now()
        ticket.state = RequestState.LOADING
        swap.waiters.append(ticket)
        self._outbox.append(JoinSwap(ticket, swap))

    def joined(self, ticket: Ticket) -> bool:
        """Whether ``ticket`` waits for its model's load (a waiter of the swap)."""
        swap = self.swaps.get(ticket.model)
        return swap is not None and ticket in swap.waiters

    def leave_swap(self, ticket: Ticket) -> bool:
        """Take a loading ticket out of its swap; cancel the swap if nobody is left.

        Returns whether the swap was cancelled (this ticket was its last waiter).
        """
        swap = self.swaps[ticket.model]
        swap.waiters.remove(ticket)
        if swap.waiters:
            return False
        del self.swaps[ticket.model]
        reason = f"every request waiting for {swap.target!r} has left"
        self._outbox.append(CancelSwap(swap, reason))
        return True

    def finish_swap(self, swap: Swap, error: RequestError | None) -> bool:
        """Forget a finished swap and grant its waiters (or fail them with ``error``);
        False if it had already been cancelled or abandoned, or is retried, and nothing
        else was done.

        A first load that ran out of memory (``ModelStartFailed.out_of_memory``) is tried
        again, once, by a new swap with the same waiters that evicts every other idle
        model: running, serving nothing, in no other load, not ``persistent``. With none
        to evict, the retry could only fail the same way: its waiters fail at once.
        """
        if self.swaps.get(swap.target) is not swap:
            return False
        oom = error.out_of_memory if isinstance(error, ModelStartFailed) else None
        if oom is not None and swap.retry is None and (evict := self._idle_others(swap.target)):
            retry = Swap(swap.target, evict, swap.waiters, retry=f"out of memory: {oom}")
            self.swaps[swap.target] = retry
            for ticket in retry.waiters:
                ticket.metadata["retried"] = retry.retry
            self._outbox.append(StartSwap(retry))
            return False
        del self.swaps[swap.target]
        for ticket in swap.waiters:
            if error is None:
                self.grant(ticket)
            else:
                self.fail(ticket, error)
        return True

    def _idle_others(self, target: str) -> frozenset[str]:
        """The running models a retry after an out-of-memory failure evicts."""
        involved = {m for s in self.loads() for m in (s.target, *s.evict)}
        return frozenset(
            model
            for model in self.world.running_models()
            if model != target
            and model not in involved
            and model not in self.swapper.persistent
            and not self.busy(model)
        )

    def abandon_swap(self, model: str, error: RequestError, reason: str) -> None:
        """Cancel the swap to ``model``, if any, and fail its waiters (unload, shutdown)."""
        swap = self.swaps.pop(model, None)
        if swap is None:
            return
        self._outbox.append(CancelSwap(swap, reason))
        for ticket in swap.waiters:
            self.fail(ticket, error)

    def close(self, error: RequestError) -> None:
        """Shutting down: refuse new requests with ``error``, abandon every swap."""
        self.closed = error
        for model in list(self.swaps):
            self.abandon_swap(model, error, "shutting down")

    # ------------------------------------------------- what both schedulers do

    def cancel(self, queue: Queue, ticket: Ticket) -> bool:
        """The ticket's client left before its grant: take it out of ``queue`` or out of
        its swap, and free its reservation. True if that cancelled the swap."""
        cancelled = False
        if not queue.remove(ticket) and self.joined(ticket):
            cancelled = self.leave_swap(ticket)
        self.release(ticket)
        return cancelled

    def fail_queued(
        self, queue: Queue, models: Collection[str] | None, error: RequestError
    ) -> None:
        """Fail the queued tickets for ``models`` (all of them for ``None``), oldest first."""
        doomed = [t for t in queue if models is None or t.model in models]
        for ticket in sorted(doomed, key=lambda t: t.seq):
            queue.remove(ticket)
            self.fail(ticket, error)

    def unload(self, queue: Queue, models: Collection[str], reason: str) -> None:
        """Fail every request waiting for ``models`` (queued, or loading) with 503."""
        for model in models:
            self.abandon_swap(model, ModelUnloaded(model, reason), reason)
            self.fail_queued(queue, {model}, ModelUnloaded(model, reason))

    def surrender(self, queue: Queue, held: Iterable[Ticket] = ()) -> Handover:
        """Give up everything: the queued tickets of ``queue`` (and the undispatched
        ``held`` ones a scheduler keeps aside), oldest first, their reservations freed;
        the dispatched ones, still admitted; and the loads in progress."""
        waiting = sorted([*queue, *held], key=lambda t: t.seq)
        for ticket in waiting:
            queue.remove(ticket)
            self.release(ticket)
            ticket.state = RequestState.QUEUED
        dispatched = sorted(
            (ticket for tickets in self.admitted.values() for ticket in tickets),
            key=lambda t: t.seq,
        )
        swaps = tuple(self.swaps.values())
        self.admitted, self.swaps = {}, {}
        return Handover(tuple(waiting), tuple(dispatched), swaps)

    def take_over(self, handover: Handover) -> None:
        """Account for another scheduler's dispatched tickets and loads as this one's own
        (``adopt``): they keep their reservations, even beyond a lowered limit."""
        for ticket in handover.dispatched:
            self.admitted.setdefault(ticket.model, set()).add(ticket)
        for swap in handover.swaps:
            self.swaps[swap.target] = swap

    def shut_down(self, queue: Queue, error: RequestError) -> None:
        """Refuse new requests and fail every waiting one with ``error``."""
        self.close(error)
        self.fail_queued(queue, None, error)

    # ------------------------------------------------------------ statistics

    def band_statistics(self, queued: Iterable[Ticket]) -> dict[str, BandStatistics]:
        now = self.world.now()
        depth: collections.Counter[str] = collections.Counter()
        oldest: dict[str, float] = {}
        for ticket in queued:
            band = ticket.band
            depth[band] += 1
            oldest[band] = max(oldest.get(band, 0.0), now - ticket.arrival)
        return {
            band: BandStatistics(
                depth[band], oldest.get(band, 0.0), self.dispatched[band], self.preempted[band]
            )
            for band in BANDS
        }

    def loading_count(self) -> int:
        return sum(len(swap.waiters) for swap in self.swaps.values())
