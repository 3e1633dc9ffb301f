"""``fifo``: llama-swap's scheduler, with the priority header added (SPEC §7.4).

The decision for a request, in order:

1. a swap to its model is in progress → join it (one load serves every caller);
2. it would collide with a swap in progress, evict a model that is serving, or one that
   ``minResidency`` keeps (loaded moments ago, with requests waiting) → queue;
3. its model is ready and nothing must be evicted → serve now (many in parallel, up to
   ``concurrencyLimit``);
4. otherwise → start a swap (in parallel with swaps it does not collide with).

The queue is ordered by effective priority = ``settings.fifo.priority[model]`` + the
header's priority, arrival order among equals, and is walked in that order whenever a
swap ends, a model drains or stops, or a residency ends (``on_recheck``). Walking it
re-runs the decision for each request, so requests for the same model collate:
``A B A B`` is served ``A A B B``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import final

from llamaswap.config.model import DEFAULT_CONCURRENCY_LIMIT, Config
from llamaswap.errors import RequestError
from llamaswap.process.state import ModelState

from .base import Decision, Handover, SchedulerStatistics, Swap, Swapper, Ticket, World
from .ledger import Ledger
from .settings import fifo_priorities, limits
from .waitqueue import PriorityWaitQueue

__all__ = ["FifoScheduler"]


@final
class FifoScheduler:
    """See the module docstring.

    Args:
        world: what the scheduler may ask (the router).
        swapper: the eviction policy.
        limits: ``concurrencyLimit`` per model ID.
        priorities: ``settings.fifo.priority``, by model ID.
        min_residency: ``minResidency``, seconds; 0 turns the rule off.
    """

    name = "fifo"

    def __init__(
        self,
        world: World,
        swapper: Swapper,
        *,
        limits: Mapping[str, int],
        priorities: Mapping[str, int] | None = None,
        min_residency: float = 0.0,
    ) -> None:
        self._ledger = Ledger(
            world,
            swapper,
            limits,
            default_limit=DEFAULT_CONCURRENCY_LIMIT,
            min_residency=min_residency,
        )
        self._priorities = dict(priorities or {})
        self._queue: PriorityWaitQueue[Ticket] = PriorityWaitQueue()

    # ----------------------------------------------------------------- events

    def on_request(self, ticket: Ticket) -> list[Decision]:
        self._ledger.admit(ticket)
        self._prioritise(ticket)
        if not self._dispatch(ticket):
            self._queue.push(ticket, (-ticket.effective_priority, ticket.seq))
        return self._ledger.take()

    def admitted(self, model: str) -> int:
        return len(self._ledger.admitted.get(model, ()))

    def adopt(self, handover: Handover) -> list[Decision]:
        self._ledger.take_over(handover)
        for ticket in handover.waiting:
            try:
                self._ledger.admit(ticket)
            except RequestError as exc:  # over a lowered concurrencyLimit, say
                self._ledger.fail(ticket, exc)
                continue
            self._enqueue(ticket)
        self._drain()
        return self._ledger.take()

    def on_cancel(self, ticket: Ticket) -> list[Decision]:
        if self._ledger.cancel(self._queue, ticket):
            self._drain()  # its load was cancelled: what it would have evicted is free
        return self._ledger.take()

    def on_finish(self, ticket: Ticket) -> list[Decision]:
        self._ledger.release(ticket)
        if not self._ledger.busy(ticket.model):
            self._drain()
        return self._ledger.take()

    def on_preempted(self, ticket: Ticket) -> list[Decision]:
        # fifo preempts nothing: a serial scheduler did, before a reload switched to fifo.
        self._ledger.requeue(ticket)
        self._enqueue(ticket)
        self._drain()
        return self._ledger.take()

    def on_swap_done(self, swap: Swap, error: RequestError | None) -> list[Decision]:
        if self._ledger.finish_swap(swap, error) and error is not None:
            self._ledger.fail_queued(self._queue, {swap.target}, error)
        self._drain()  # also after a load cancelled, which held requests back
        return self._ledger.take()

    def on_model_state(self, model: str, state: ModelState) -> list[Decision]:
        if state is ModelState.STOPPED:
            self._drain()
        return self._ledger.take()

    def on_recheck(self) -> list[Decision]:
        self._drain()
        return self._ledger.take()

    def on_unload(self, models: Collection[str], reason: str = "unloaded") -> list[Decision]:
        self._ledger.unload(self._queue, models, reason)
        self._drain()
        return self._ledger.take()

    def on_reconfigure(self, config: Config, swapper: Swapper) -> list[Decision]:
        self._ledger.configure(swapper, limits(config), config.min_residency)
        self._priorities = fifo_priorities(config)
        queued = self._queue.ordered()
        self._queue = PriorityWaitQueue()
        for ticket in queued:
            self._enqueue(ticket)
        self._drain()
        return self._ledger.take()

    def surrender(self) -> Handover:
        return self._ledger.surrender(self._queue)

    def on_shutdown(self, error: RequestError) -> list[Decision]:
        self._ledger.shut_down(self._queue, error)
        return self._ledger.take()

    # ------------------------------------------------------------------ views

    def queued(self) -> list[Ticket]:
        """In queue order, but each model's requests together, where its first one is: a
        drain serves them together, the later ones joining the first one's load."""
        by_model: dict[str, list[Ticket]] = {}
        for ticket in self._queue.ordered():
            by_model.setdefault(ticket.model, []).append(ticket)
        return [ticket for tickets in by_model.values() for ticket in tickets]

    def scores(self, tickets: list[Ticket]) -> list[float | None]:
        return [None] * len(tickets)

    def statistics(self) -> SchedulerStatistics:
        ledger = self._ledger
        return SchedulerStatistics(
            name=self.name,
            waiting=len(self._queue),
            loading=ledger.loading_count(),
            swaps=tuple(sorted(ledger.swaps)),
            bands=ledger.band_statistics(self._queue),
        )

    # ---------------------------------------------------------------- private

    def _prioritise(self, ticket: Ticket) -> None:
        model_priority = self._priorities.get(ticket.model, 0)
        ticket.effective_priority = model_priority + ticket.priority
        ticket.metadata["fifo_priority"] = model_priority

    def _enqueue(self, ticket: Ticket) -> None:
        """Queue ``ticket`` by its effective priority (the model's, from now on)."""
        self._prioritise(ticket)
        self._queue.push(ticket, (-ticket.effective_priority, ticket.seq))

    def _dispatch(self, ticket: Ticket) -> bool:
        """Serve, join or start a load for ``ticket``; False if it must wait."""
        swap = self._ledger.swaps.get(ticket.model)
        if swap is not None:
            self._ledger.join(ticket, swap)
            return True
        return self._ledger.dispatch(ticket)

    def _drain(self) -> None:
        # A dispatch only adds load (a grant, a load started), so a model found blocked
        # stays blocked for the rest of the pass: its other requests need no new plan.
        blocked: set[str] = set()
        for ticket in self._queue.ordered():
            if ticket.model in blocked:
                continue
            if self._dispatch(ticket):
                self._queue.remove(ticket)
            else:
                blocked.add(ticket.model)
