"""The bookkeeping every scheduler shares: admissions, in-flight requests, active swaps.

A scheduler owns a ``Ledger`` and decides *when*; the ledger keeps the counts right and
performs the grant/fail/swap effects. ``fifo`` and ``serial`` differ only in their
queues and in when they dispatch, so the accounting below is written once.

**Invariants** (checked by the tests of both schedulers):

* ``admitted[m]`` = requests for ``m`` queued + loading + serving; a request beyond
  ``concurrencyLimit`` is refused before anything is sent (429).
* ``in_flight[m]`` = granted requests of ``m`` not yet done; a model with
  ``in_flight > 0`` is never evicted.
* One active swap per target model; every ticket in ``LOADING`` is a waiter of the swap
  for its model, and a swap with no waiters left is cancelled at once.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import final

import attrs

from llamaswap.config.model import DEFAULT_CONCURRENCY_LIMIT
from llamaswap.errors import ConcurrencyLimit, RequestError
from llamaswap.process.state import ModelState

from .base import BandStatistics, Effects, Swap, Swapper, Ticket, TicketState
from .priority import BANDS, band_of

__all__ = ["Ledger", "Plan"]


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
    def __init__(self, effects: Effects, swapper: Swapper, limits: Mapping[str, int]) -> None:
        self.effects = effects
        self.swapper = swapper
        self.limits = limits
        self.admitted: collections.Counter[str] = collections.Counter()
        self.in_flight: collections.Counter[str] = collections.Counter()
        self.swaps: dict[str, Swap] = {}
        self.dispatched: collections.Counter[str] = collections.Counter()
        self.closed: RequestError | None = None

    # ------------------------------------------------------------ admission

    def admit(self, ticket: Ticket) -> None:
        """Count ``ticket`` in, or raise (429, or the shutdown error) before any byte."""
        if self.closed is not None:
            raise self.closed
        limit = self.limits.get(ticket.model, DEFAULT_CONCURRENCY_LIMIT)
        if self.admitted[ticket.model] >= limit:
            raise ConcurrencyLimit(ticket.model, limit)
        self.admitted[ticket.model] += 1

    def release(self, ticket: Ticket) -> None:
        """The ticket is finished, failed or abandoned: its reservation frees."""
        self.admitted[ticket.model] -= 1
        if not self.admitted[ticket.model]:
            del self.admitted[ticket.model]
        ticket.state = TicketState.DONE

    # ------------------------------------------------------------- outcomes

    def mark_dispatched(self, ticket: Ticket) -> None:
        if ticket.dispatched_at is None:
            ticket.dispatched_at = self.effects.now()
            self.dispatched[band_of(ticket.effective_priority)] += 1

    def grant(self, ticket: Ticket) -> None:
        self.mark_dispatched(ticket)
        ticket.state = TicketState.SERVING
        self.in_flight[ticket.model] += 1
        self.effects.grant(ticket)

    def fail(self, ticket: Ticket, error: RequestError) -> None:
        self.release(ticket)
        self.effects.fail(ticket, error)

    def serve_done(self, ticket: Ticket) -> None:
        """A granted ticket finished: it no longer keeps its model busy."""
        self.in_flight[ticket.model] -= 1
        if not self.in_flight[ticket.model]:
            del self.in_flight[ticket.model]
        self.release(ticket)

    # ----------------------------------------------------------------- swaps

    def running(self) -> set[str]:
        """Models whose process is not stopped, plus the targets of swaps in progress."""
        running = set(self.effects.running_models())
        running.update(self.swaps)
        return running

    def evictions(self, target: str, running: set[str] | None = None) -> frozenset[str]:
        """What the swapper would stop for ``target`` to run now."""
        others = (self.running() if running is None else running) - {target}
        return self.swapper.eviction_for(target, others)

    def plan(self, target: str) -> Plan:
        evict = self.evictions(target)
        return Plan(
            ready=self.effects.model_state(target) is ModelState.READY,
            evict=evict,
            collides=self._collides(target, evict),
            busy=any(self.in_flight[model] for model in evict),
        )

    def _collides(self, target: str, evict: frozenset[str]) -> bool:
        for swap in self.swaps.values():
            if swap.target == target:
                continue
            if target in swap.evict or swap.target in evict or not evict.isdisjoint(swap.evict):
                return True
        return False

    def dispatch(self, ticket: Ticket) -> bool:
        """Serve ``ticket`` now, or start the load it needs; False if a model it would
        evict is busy (or another load collides) and it has to wait."""
        plan = self.plan(ticket.model)
        if plan.immediate:
            self.grant(ticket)
        elif plan.blocked:
            return False
        else:
            self.start_swap(ticket, plan.evict)
        return True

    def start_swap(self, ticket: Ticket, evict: frozenset[str]) -> Swap:
        swap = Swap(ticket.model, evict)
        self.swaps[ticket.model] = swap
        self.join(ticket, swap)
        self.effects.start_swap(swap)
        return swap

    def join(self, ticket: Ticket, swap: Swap) -> None:
        self.mark_dispatched(ticket)
        ticket.state = TicketState.LOADING
        swap.waiters.append(ticket)

    def leave_swap(self, ticket: Ticket) -> Swap | None:
        """Take a loading ticket out of its swap; cancel the swap if nobody is left.

        Returns the cancelled swap, if this ticket was its last waiter.
        """
        swap = self.swaps[ticket.model]
        swap.waiters.remove(ticket)
        if swap.waiters:
            return None
        del self.swaps[ticket.model]
        self.effects.cancel_swap(swap, f"every request waiting for {swap.target!r} has left")
        return swap

    def finish_swap(self, swap: Swap, error: RequestError | None) -> bool:
        """Forget a finished swap and grant its waiters (or fail them with ``error``);
        False if it had already been cancelled or abandoned, and nothing was done."""
        if self.swaps.get(swap.target) is not swap:
            return False
        del self.swaps[swap.target]
        for ticket in swap.waiters:
            if error is None:
                self.grant(ticket)
            else:
                self.fail(ticket, error)
        return True

    def close(self, error: RequestError) -> None:
        """Shutting down: refuse new requests with ``error``, abandon every swap."""
        self.closed = error
        for swap in list(self.swaps.values()):
            self.abandon_swap(swap, error, "shutting down")

    def abandon_swap(self, swap: Swap, error: RequestError, reason: str) -> None:
        """Cancel ``swap`` and fail its waiters with ``error`` (unload, shutdown)."""
        del self.swaps[swap.target]
        self.effects.cancel_swap(swap, reason)
        for ticket in swap.waiters:
            self.fail(ticket, error)

    # ------------------------------------------------------------ statistics

    def band_statistics(self, queued: Iterable[Ticket]) -> dict[str, BandStatistics]:
        now = self.effects.now()
        depth: collections.Counter[str] = collections.Counter()
        oldest: dict[str, float] = {}
        for ticket in queued:
            band = band_of(ticket.effective_priority)
            depth[band] += 1
            oldest[band] = max(oldest.get(band, 0.0), now - ticket.arrival)
        return {
            band: BandStatistics(depth[band], oldest.get(band, 0.0), self.dispatched[band])
            for band in BANDS
        }

    def loading_count(self) -> int:
        return sum(len(swap.waiters) for swap in self.swaps.values())
