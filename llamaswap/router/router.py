"""The router: owns the model supervisors and the swap tasks, and is the scheduler's Effects.

``Router.run`` owns two nurseries: the supervisors' (one task each) and, inside it, the
swap nursery, where each load the scheduler starts runs as one task with its own cancel
scope. Requests never touch processes: ``acquire()`` hands a ticket to the scheduler,
parks on the ticket's ``Waiter`` until the scheduler grants it (the model is ready) or
fails it, and reports completion in ``finally``.

**Invariant: every grant is matched by exactly one ``on_serve_done``**, in the ``finally``
of ``acquire()``; every ticket that is never granted leaves through ``on_cancel`` (its
waiter was abandoned) or through ``Effects.fail``. Cancelling a swap's scope reaches the
supervisor's ``ensure_ready``, which aborts a start nobody else waits for.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Set
from contextlib import asynccontextmanager
from functools import partial
from typing import final

import trio

from llamaswap.config.model import Config
from llamaswap.errors import ModelUnloaded, RequestError, ShuttingDown
from llamaswap.process import ModelState, ModelSupervisor, Probe, Spawner, StateListener
from llamaswap.schedulers import Scheduler, Swap, Ticket, TicketState, Waiter, make_scheduler

from .swappers import make_swapper

__all__ = ["Router"]

logger = logging.getLogger("llamaswap.router")


@final
class Router:
    """Runs the models of ``config``; see the module docstring.

    Args:
        config: the validated configuration.
        spawner: starts model processes.
        probe: readiness check.
        listeners: also told of every model state change (metrics, events); more can
            be added with ``add_listener`` before ``run``.
    """

    def __init__(
        self,
        config: Config,
        *,
        spawner: Spawner,
        probe: Probe,
        listeners: Collection[StateListener] = (),
    ) -> None:
        self.config = config
        self._listeners = list(listeners)
        self.supervisors = {
            model_id: ModelSupervisor(
                model_id,
                model,
                spawner=spawner,
                probe=probe,
                health_check_timeout=config.health_check_timeout,
                listener=self._on_model_state,
            )
            for model_id, model in config.models.items()
        }
        self.scheduler: Scheduler = make_scheduler(config, self, make_swapper(config))
        self._seq = itertools.count()
        self._swap_scopes: dict[Swap, trio.CancelScope] = {}
        self._swap_nursery: trio.Nursery | None = None
        self._serving = 0
        self._drained = trio.Event()
        self._drained.set()

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every model until cancelled; cancelling stops them all."""
        async with trio.open_nursery() as nursery:
            for supervisor in self.supervisors.values():
                await nursery.start(supervisor.run)
            # Cleared only once the swaps are over: while they unwind, the scheduler may
            # still start one (it is cancelled at once, and reports back like any other).
            try:
                async with trio.open_nursery() as swaps:
                    self._swap_nursery = swaps
                    task_status.started()
                    await trio.sleep_forever()
            finally:
                self._swap_nursery = None

    # --------------------------------------------------------------- requests

    def ticket(self, model: str, *, priority: int = 0, needs_slot: bool = True) -> Ticket:
        """A new request for ``model`` (an ID), to pass to ``acquire``."""
        return Ticket(
            model,
            priority=priority,
            seq=next(self._seq),
            arrival=trio.current_time(),
            needs_slot=needs_slot,
            effective_priority=priority,
        )

    @asynccontextmanager
    async def acquire(
        self,
        ticket: Ticket,
        *,
        while_waiting: Callable[[Ticket], Awaitable[None]] | None = None,
    ) -> AsyncIterator[Ticket]:
        """Wait until the ticket's model may serve it; hold it while the block runs.

        ``while_waiting(ticket)``, if given, runs while the request waits (it is cancelled
        when the wait ends); it does not run for a request granted at once.

        Raises:
            ConcurrencyLimit: at once, before waiting, when the model is full.
            ModelStartFailed, ModelUnloaded, ShuttingDown: the wait ended without a grant.

        *Cancellation*: cancelled while waiting, the request leaves the queue at once (and a
        load it alone waited for is cancelled); once granted, leaving the block releases it.
        """
        ticket.waiter = Waiter(partial(self.scheduler.on_cancel, ticket))
        self.scheduler.on_request(ticket)
        try:
            if ticket.waiter.woken:
                await ticket.waiter.wait()
            else:
                logger.debug(
                    "request #%d for %r: %s", ticket.seq, ticket.model, ticket.state.value
                )
                await self._wait(ticket, while_waiting)
            yield ticket
        finally:
            # Granted means ours to release, even if a cancellation arrived between the
            # grant and this block (e.g. while ``while_waiting`` was being cancelled).
            if ticket.state is TicketState.SERVING:
                self.supervisors[ticket.model].end_request()
                self.scheduler.on_serve_done(ticket)
                self._serving -= 1
                if not self._serving:
                    self._drained.set()

    async def _wait(
        self, ticket: Ticket, while_waiting: Callable[[Ticket], Awaitable[None]] | None
    ) -> None:
        assert ticket.waiter is not None
        if while_waiting is None:
            await ticket.waiter.wait()
            return
        failure: RequestError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(while_waiting, ticket)
            try:
                await ticket.waiter.wait()
            except RequestError as exc:
                failure = exc
            nursery.cancel_scope.cancel(reason="the wait is over")
        if failure is not None:
            raise failure

    async def load(self, model: str, *, priority: int = 0) -> None:
        """Make ``model`` ready, queued like a request (``POST /api/models/load``)."""
        async with self.acquire(self.ticket(model, priority=priority)):
            pass

    async def unload(self, models: Collection[str] | None = None) -> None:
        """Stop ``models`` (all by default); requests waiting for them fail with 503.

        *Cancellation*: the stops go on without the cancelled caller.
        """
        targets = list(self.supervisors if models is None else models)
        self.scheduler.on_unload(targets)
        # Now, not when the stop tasks first run: a request arriving in between would be
        # granted a model about to be killed under it.
        for model in targets:
            self.supervisors[model].request_stop("unload requested")
        async with trio.open_nursery() as nursery:
            for model in targets:
                nursery.start_soon(self.supervisors[model].stop, "unload requested")

    async def shutdown(self, grace: float) -> None:
        """Fail waiting requests (503), let served ones finish for ``grace`` s, stop all."""
        self.scheduler.on_shutdown(ShuttingDown())
        with trio.move_on_after(grace):
            await self._drained.wait()
        async with trio.open_nursery() as nursery:
            for supervisor in self.supervisors.values():
                nursery.start_soon(supervisor.stop, "shutting down")

    # ---------------------------------------------------------------- Effects

    def now(self) -> float:
        return trio.current_time()

    def model_state(self, model: str) -> ModelState:
        return self.supervisors[model].state

    def running_models(self) -> Set[str]:
        return {m for m, s in self.supervisors.items() if s.state is not ModelState.STOPPED}

    def start_swap(self, swap: Swap) -> None:
        if self._swap_nursery is None:
            raise RuntimeError("router is not running")
        scope = trio.CancelScope()
        self._swap_scopes[swap] = scope
        evicting = f", evicting {sorted(swap.evict)}" if swap.evict else ""
        logger.info("loading model %r%s", swap.target, evicting)
        self._swap_nursery.start_soon(self._swap, swap, scope, name=f"swap to {swap.target}")

    def cancel_swap(self, swap: Swap, reason: str) -> None:
        logger.info("cancelling the load of %r: %s", swap.target, reason)
        self._swap_scopes[swap].cancel(reason=reason)

    def grant(self, ticket: Ticket) -> None:
        assert ticket.waiter is not None
        self.supervisors[ticket.model].begin_request()
        if not self._serving:
            self._drained = trio.Event()
        self._serving += 1
        ticket.waiter.wake()

    def fail(self, ticket: Ticket, error: RequestError) -> None:
        assert ticket.waiter is not None
        ticket.waiter.wake(error)

    # ---------------------------------------------------------------- private

    async def _swap(self, swap: Swap, scope: trio.CancelScope) -> None:
        # Ready is the one way to succeed: however else this ends (its scope or an outer
        # one cancelled, an unexpected error), the waiters must not be granted.
        error: RequestError | None = ModelUnloaded(swap.target, "load cancelled")
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for model in swap.evict:
                        reason = f"evicted for {swap.target!r}"
                        nursery.start_soon(self.supervisors[model].stop, reason)
                await self.supervisors[swap.target].ensure_ready()
                error = None
        except RequestError as exc:
            error = exc
        finally:
            del self._swap_scopes[swap]
            self.scheduler.on_swap_done(swap, error)

    def _on_model_state(self, model: str, state: ModelState) -> None:
        self.scheduler.on_model_state(model, state)
        for listener in self._listeners:
            listener(model, state)
