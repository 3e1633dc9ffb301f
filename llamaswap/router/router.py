"""The router: owns the model supervisors, the swap tasks and the leases, and applies the
scheduler's decisions.

``Router.run`` owns two nurseries: the supervisors' (one task each, in a cancel scope of
its own) and, inside it, the swap nursery, where each load the scheduler starts runs as
one task with its own cancel scope. Requests never touch processes: ``acquire()`` admits
a lease, hands its ticket to the scheduler, parks until the router applies a ``Grant`` or
``Fail`` for it, and releases it in ``finally``.

Every scheduler event goes through ``_decide``: it first tells the scheduler about every
request abandoned since the last event (see ``lease.py``), then runs the event, then
applies the decisions it returned, in order. **A scheduler exception fails the requests
its event concerned (500, logged with its traceback), never the server.** **Every grant
is released exactly once**, in the ``finally`` of ``acquire()``, and only then is the
scheduler told (``on_finish``). Cancelling a swap's scope reaches the supervisor's
``ensure_ready``, which aborts a start nobody else waits for.

**A model a reload removed is forgotten once nothing needs it**: stopped, no request in
flight, no load naming it. Its supervisor's task ends (its scope is cancelled), it leaves
``supervisors``, and the forget listeners (metrics) drop what they keep for it. Until
then it stays, so a straggler's bookkeeping always finds it.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Set
from contextlib import asynccontextmanager
from functools import partial
from typing import final

import trio

from llamaswap.config.model import Config, ModelConfig
from llamaswap.errors import (
    BadRequest,
    InternalError,
    ModelStartFailed,
    ModelUnloaded,
    RequestError,
    ShuttingDown,
    only_cause,
)
from llamaswap.process import (
    LogLine,
    LogRing,
    ModelState,
    ModelStatistics,
    ModelSupervisor,
    NoSlots,
    Probe,
    Slots,
    Spawner,
)
from llamaswap.resources import Resources, out_of_memory
from llamaswap.schedulers import (
    CancelSwap,
    Decision,
    Fail,
    Grant,
    Preempt,
    Recheck,
    RequestState,
    Scheduler,
    SchedulerCounts,
    StartSwap,
    Swap,
    Swapper,
    Ticket,
    make_scheduler,
    needs_slot,
)

from .events import (
    EVENT_KINDS,
    DecisionApplied,
    ModelForgotten,
    ModelOutput,
    ModelSpawned,
    ModelStateChanged,
    Observer,
    ProfileChanged,
    RequestChange,
    RequestChanged,
    RouterEvent,
)
from .lease import Lease, Leases, RequestInfo
from .names import Names
from .prefetcher import Prefetcher
from .reload import ConfigChanges, diff_config
from .swappers import make_swapper

__all__ = ["Router"]

logger = logging.getLogger("llamaswap.router")

#: Seconds a request cancelled at the end of the shutdown grace has to tell its client.
CANCEL_GRACE = 2.0
#: The route of a load asked for by name (``POST /api/models/load/{model}``).
LOAD_ROUTE = "POST /api/models/load/"
#: Why a reload's removed model stops, and its requests fail.
REMOVED = "removed from the configuration"


@final
class Router:
    """Runs the models of ``config``; see the module docstring.

    Args:
        config: the validated configuration.
        spawner: starts model processes.
        probe: readiness check.
        observers: told of everything the router does (``events.py``); more can be
            added with ``observe`` before ``run``.
        resources: what is known of memory and time (``Resources``), which the router
            teaches (loads, serving times) and the fit rule reads; by default one with
            no GPU probe (declared figures only).
        slots: keeps models' KV caches across a swap (``process/slots.py``): saved
            before an eviction stops a ready model, restored after a load; by default
            nothing is kept.
    """

    def __init__(
        self,
        config: Config,
        *,
        spawner: Spawner,
        probe: Probe,
        observers: Collection[Observer] = (),
        resources: Resources | None = None,
        slots: Slots | None = None,
    ) -> None:
        self.config = config
        self._slots: Slots = slots if slots is not None else NoSlots()
        self.resources = resources if resources is not None else Resources(config)
        #: The fit rule's view: figures, budgets, and each model's waiting requests.
        self._placement = self.resources.placement(self.waiting)
        #: Names as requests use them: the active profile's pins (none at start) and the
        #: selectors, which read the models' states and requests from here.
        self.names = Names(config, self)
        self._spawner = spawner
        self._probe = probe
        #: Who is told of each kind of event (``observe``).
        self._observers: dict[type[RouterEvent], list[Observer]] = {}
        for observer in observers:
            self.observe(observer)
        self._leases = Leases()
        #: Every configured model, and a removed one until it is forgotten (``_forget``).
        self._supervisors = {
            model_id: self._supervisor(model_id, model)
            for model_id, model in config.models.items()
        }
        #: Each supervisor's task's cancel scope, by model: cancelled when it is forgotten.
        self._supervisor_scopes: dict[str, trio.CancelScope] = {}
        #: ``run``'s context, which every supervisor's task is started in (``_start``).
        self._context = contextvars.copy_context()
        #: The one scheduler: a reload that switches hands it everything (``Handover``).
        #: The eviction policy the scheduler applies (how many models fit together: the
        #: ``max_lora`` of ``/gateway/metrics``).
        self.swapper: Swapper = make_swapper(config, self._placement)
        self.scheduler: Scheduler = make_scheduler(config, self, self.swapper)
        #: The final counts of every scheduler a reload switched out (metrics add the
        #: current one's, so the counters never go back).
        self.retired_counts = SchedulerCounts()
        self._seq = itertools.count()
        self._swap_scopes: dict[Swap, trio.CancelScope] = {}
        self._supervisor_nursery: trio.Nursery | None = None
        self._swap_nursery: trio.Nursery | None = None
        #: Tickets granted after their request had gone (a scheduler bug): to be finished.
        self._orphans: list[Ticket] = []
        #: The line that showed a model's start running out of memory, by model, until
        #: its load ends (``_on_output``).
        self._out_of_memory: dict[str, str] = {}
        #: Reads the weights of the model the queue will load next (``prefetcher.py``).
        self.prefetcher = Prefetcher(self._next_load, self.definition)
        #: ``shutdown`` has begun: what is still running is cancelled at its end.
        self.shutting_down = False

    def _supervisor(self, model_id: str, model: ModelConfig) -> ModelSupervisor:
        supervisor = ModelSupervisor(
            model_id,
            model,
            spawner=self._spawner,
            probe=self._probe,
            health_check_timeout=self.config.health_check_timeout,
            listener=self._on_model_state,
            spawned=partial(self._tell_spawned, model_id),
            in_flight=partial(self._leases.in_flight, model_id),
            wanted=partial(self.wanted, model_id),
        )
        supervisor.log.subscribe(partial(self._on_output, model_id))
        return supervisor

    def observe(self, observer: Observer, *kinds: type[RouterEvent]) -> None:
        """``observer`` is told of what the router does from now on (``events.py``): the
        events of ``kinds``, every kind if none is named. It must not block or raise.
        (Each event goes only to those who want its kind, and one nobody wants is not
        made: a request's events are on its path.)"""
        for kind in kinds or EVENT_KINDS:
            self._observers.setdefault(kind, []).append(observer)

    def _emit(self, event: RouterEvent) -> None:
        for observer in self._observers.get(type(event), ()):
            observer(event)

    # --------------------------------------------------------------- queries

    def statistics(self, model: str) -> ModelStatistics:
        """A snapshot of ``model``'s process (a configured model, or a removed one not yet
        forgotten). Raises KeyError for any other name."""
        return self._supervisors[model].statistics()

    def definition(self, model: str) -> ModelConfig:
        """The definition ``model``'s server runs with (a removed model keeps its last)."""
        return self._supervisors[model].config

    def wanted(self, model: str) -> int:
        """The requests for ``model`` admitted and not released: waiting or in flight (the
        scheduler's one count, ``Scheduler.admitted``)."""
        return self.scheduler.admitted(model)

    def pids(self) -> dict[str, int]:
        """The PID of each running model's server (what the GPU sampler reads)."""
        return {
            model: pid
            for model, supervisor in self._supervisors.items()
            if (pid := supervisor.statistics().pid) is not None
        }

    def _next_load(self) -> str | None:
        """The model of the first waiting request, in the scheduler's order, that is
        stopped (or stopping): the load the queue will ask for next."""
        for ticket in self.scheduler.queued():
            if self._supervisors[ticket.model].state in (ModelState.STOPPED, ModelState.STOPPING):
                return ticket.model
        return None

    def waiting(self, model: str) -> int:
        """The requests for ``model`` admitted and not yet served."""
        return self.scheduler.admitted(model) - self._leases.in_flight(model)

    def known_models(self) -> list[str]:
        """Every configured model, and a removed one until it is forgotten."""
        return list(self._supervisors)

    def log_rings(self) -> dict[str, LogRing]:
        """Each known model's output ring."""
        return {model: supervisor.log for model, supervisor in self._supervisors.items()}

    async def notice_exit(self, model: str) -> None:
        """A connection to ``model``'s server broke: give its process a moment to show it
        has died (``ModelSupervisor.notice_exit``), so that no request is sent to it."""
        supervisor = self._supervisors.get(model)
        if supervisor is not None:
            await supervisor.notice_exit()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise every model until cancelled; cancelling stops them all."""
        self._context = contextvars.copy_context()
        try:
            async with trio.open_nursery() as nursery:
                self._supervisor_nursery = nursery
                for model_id, supervisor in self._supervisors.items():
                    await self._start(model_id, supervisor)
                nursery.start_soon(self.prefetcher.run, name="prefetcher")
                # Cleared only once the swaps are over: while they unwind, the scheduler
                # may still start one (it is cancelled at once, and reports back).
                try:
                    async with trio.open_nursery() as swaps:
                        self._swap_nursery = swaps
                        task_status.started()
                        await trio.sleep_forever()
                finally:
                    self._swap_nursery = None
        finally:
            self._supervisor_nursery = None

    async def _start(self, model_id: str, supervisor: ModelSupervisor) -> None:
        """Run ``supervisor`` in the supervisors' nursery, in a cancel scope of its own
        (``_forget_if_unneeded`` cancels it); return once it runs.

        Its task is started in ``run``'s context, not the caller's: a task keeps a copy of
        the context it was started from, and a reload's is its HTTP request's (Quart's
        request context, and through it the whole request).

        *Cancellation*: shielded. The task runs from the moment it is started, so the
        caller must go on to record it; the wait is one pass of the scheduler (``run``
        reaches ``started()`` without blocking).
        """
        if self._supervisor_nursery is None:
            raise RuntimeError("router is not running")
        scope = trio.CancelScope()
        self._supervisor_scopes[model_id] = scope
        started = _Started()
        start = partial(self._supervisor_nursery.start_soon, name=f"supervisor of {model_id}")
        self._context.run(start, self._supervise, supervisor, scope, started)
        with trio.CancelScope(shield=True):
            await started.event.wait()

    @staticmethod
    async def _supervise(
        supervisor: ModelSupervisor, scope: trio.CancelScope, started: _Started
    ) -> None:
        with scope:
            await supervisor.run(task_status=started)

    # --------------------------------------------------------------- requests

    def lease(
        self,
        model: str,
        *,
        priority: int = 0,
        client: str | None = None,
        route: str = "",
        preemptible: bool = False,
    ) -> Lease:
        """A new request for ``model`` (an ID), to pass to ``acquire``. ``route``
        (``"POST /v1/chat/completions"``) says whether it takes the model's slot
        (``needs_slot``); it and ``client`` are shown (``RequestInfo``). ``preemptible``:
        its task can checkpoint it and go on later (``resume``)."""
        ticket = Ticket(
            model,
            priority=priority,
            seq=next(self._seq),
            arrival=trio.current_time(),
            needs_slot=needs_slot(route) if route else True,
            effective_priority=priority,
            preemptible=preemptible,
        )
        return Lease(ticket, client=client, route=route)

    def requests(self) -> list[RequestInfo]:
        """Every admitted request not yet released, oldest first."""
        return [lease.info() for lease in self._leases]

    def lease_by_id(self, request_id: int) -> Lease | None:
        """The admitted, unreleased request whose ``RequestInfo.id`` is ``request_id``."""
        return next((lease for lease in self._leases if lease.id == request_id), None)

    def queue_order(self) -> list[int]:
        """The IDs of the requests not yet dispatched, in the order they will be served."""
        return [ticket.seq for ticket in self.scheduler.queued()]

    def dispatched(self) -> list[Ticket]:
        """The tickets of the requests loading or being served, oldest first (the
        scheduler's records, as ``Scheduler.queued()`` gives the waiting ones: to read,
        for the estimates, which need ``granted_at``)."""
        states = (RequestState.LOADING, RequestState.SERVING)
        return [lease.ticket for lease in self._leases if lease.state in states]

    def position(self, lease: Lease) -> tuple[int | None, int]:
        """The request's 1-based place in the queue (``None`` once dispatched), and how
        many wait."""
        order = self.queue_order()
        return (order.index(lease.id) + 1 if lease.id in order else None), len(order)

    @asynccontextmanager
    async def acquire(
        self,
        lease: Lease,
        *,
        while_waiting: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> AsyncIterator[Lease]:
        """Wait until the lease's model may serve it; hold it while the block runs.

        ``while_waiting(lease)``, if given, runs while the request waits (it is cancelled
        when the wait ends); it does not run for a request granted at once. A
        RequestError it raises ends the wait and is raised as it is.

        Raises:
            ConcurrencyLimit: at once, before waiting, when the model is full.
            ModelStartFailed, ModelUnloaded, ShuttingDown: the wait ended without a grant.
            InternalError: the scheduler failed on this request (logged).
            the ``Lease.cancel`` error: the request was cancelled, wherever it was.

        *Cancellation*: cancelled while waiting, the request leaves the queue (and a load
        it alone waited for is cancelled) before the scheduler decides anything else; once
        granted, leaving the block releases it.
        """
        with lease.scope:
            self._admit(lease)
            try:
                if lease.woken:
                    await lease.wait()
                else:
                    ticket = lease.ticket
                    logger.debug(
                        "request #%d for %r: %s", ticket.seq, ticket.model, ticket.state.value
                    )
                    await self._wait(lease, while_waiting)
                yield lease
            finally:
                self._end(lease)
        if lease.scope.cancelled_caught and lease.cancel_error is not None:
            raise lease.cancel_error

    def _admit(self, lease: Lease) -> None:
        self._catch_up()
        model = lease.ticket.model
        if model not in self.config.models:
            # Named before a reload removed it: it must not start again (nor, once
            # forgotten, come back without a supervisor).
            raise ModelUnloaded(model, REMOVED)
        lease.scheduler = self.scheduler.name
        self._leases.add(lease)
        try:
            decisions = self.scheduler.on_request(lease.ticket)
        except RequestError:
            self._leases.release(lease)
            raise
        except Exception as exc:
            self._leases.release(lease)
            logger.exception("scheduler %r failed on request #%d", self.scheduler.name, lease.id)
            raise InternalError("the scheduler failed on this request") from exc
        self._tell("queued", lease)  # before its decisions: a grant comes after admission
        self._requests_changed(model)  # wanted now: its TTL waits
        self._apply(decisions)
        if not decisions:  # queued, deciding nothing: the next load may be its model's
            self.prefetcher.poke()

    def _end(self, lease: Lease) -> None:
        """The request's task is leaving ``acquire``: release what it holds."""
        if lease.state is RequestState.SERVING:
            ticket = lease.ticket
            model = ticket.model
            if ticket.needs_slot and ticket.granted_at is not None and _serves(lease.route):
                self.resources.served(model, trio.current_time() - ticket.granted_at)
            self._leases.release(lease)
            self._tell("done", lease)
            self._decide("a finished request", partial(self.scheduler.on_finish, lease.ticket))
            self._requests_changed(model)  # counted out by the scheduler now
            self._forget_if_unneeded(model)  # a removed model's last straggler
        elif lease.state is RequestState.FAILED:
            self._leases.release(lease)
            self._tell("failed", lease)
            self._requests_changed(lease.ticket.model)
        else:  # abandoned while parked: the scheduler is told now, if nobody did yet
            self._catch_up()

    async def _wait(
        self, lease: Lease, while_waiting: Callable[[Lease], Awaitable[None]] | None
    ) -> None:
        if while_waiting is None:
            await lease.wait()
            return
        failure: RequestError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(while_waiting, lease)
                try:
                    await lease.wait()
                except RequestError as exc:
                    failure = exc
                nursery.cancel_scope.cancel(reason="the wait is over")
        except BaseException as exc:  # the nursery's ExceptionGroup
            # ``while_waiting`` failing the request (a body read ahead that is over
            # maxBodyBytes) fails it as the wait would, with a RequestError of its own:
            # its callers catch that, not a group. Anything else, Cancelled included,
            # leaves as the nursery made it.
            error = only_cause(exc)
            if isinstance(error, RequestError):
                raise error from None
            raise
        if failure is not None:
            raise failure

    async def resume(
        self,
        lease: Lease,
        *,
        while_waiting: Callable[[Lease], Awaitable[None]] | None = None,
    ) -> None:
        """Inside ``acquire``: the request's generation was checkpointed (``preempt``).
        Give its slot back, and wait, queued again, until it is granted anew.

        Raises as ``acquire`` does when its wait ends without a grant (an unload, the
        shutdown, its cancel); the block then ends, and ``acquire`` releases it.

        *Cancellation*: as ``acquire``'s wait: cancelled while parked, the request leaves
        the queue.
        """
        self._leases.pause(lease)
        self._decide(
            f"preempted request #{lease.id}",
            partial(self.scheduler.on_preempted, lease.ticket),
            concerned=[lease.ticket],
            # Told as the scheduler has it back, and before it may be granted again.
            tell=partial(self._tell, "paused", lease),
        )
        self._requests_changed(lease.ticket.model)
        await self._wait(lease, while_waiting)

    async def load(self, model: str, *, priority: int = 0) -> None:
        """Make ``model`` ready, queued like a request (``POST /api/models/load``)."""
        async with self.acquire(self.lease(model, priority=priority, route=LOAD_ROUTE + model)):
            pass

    async def unload(self, models: Collection[str] | None = None) -> list[str]:
        """Stop ``models`` (by default every model running or loading); requests waiting
        for them fail with 503, and those waiting for other models stay queued (SPEC §7.7);
        those they serve are cancelled with the same error. Returns the models stopped.

        *Cancellation*: the stops go on without the cancelled caller.
        """
        if models is None:
            running = self.running_models() | {swap.target for swap in self._swap_scopes}
            models = [model for model in self._supervisors if model in running]
        targets = list(models)
        self._decide("unload", partial(self.scheduler.on_unload, targets))
        # The requests they serve end now, saying why (not as a model server broken off).
        for lease in self._leases:
            model = lease.ticket.model
            if lease.state is RequestState.SERVING and model in targets:
                lease.cancel(ModelUnloaded(model, "unload requested", served=True))
        # A model forgotten since it was named is stopped already.
        supervisors = [self._supervisors[m] for m in targets if m in self._supervisors]
        # Now, not when the stop tasks first run: a request arriving in between would be
        # granted a model about to be killed under it.
        for supervisor in supervisors:
            supervisor.request_stop("unload requested")
        async with trio.open_nursery() as nursery:
            for supervisor in supervisors:
                nursery.start_soon(supervisor.stop, "unload requested")
        return targets

    async def reconfigure(self, config: Config) -> ConfigChanges:
        """Apply a new, validated configuration, model by model (SPEC §3.7).

        Unchanged models keep their process and their queue; a changed one finishes its
        requests in flight, then stops, and starts with its new definition on the next
        request (its queued requests stay queued); a removed one fails its queued
        requests with 503 and stops once its requests in flight are done, and is then
        forgotten (``_forget_if_unneeded``); a new one is servable at once. Names, keys,
        filters, TTLs, groups and scheduler settings apply at once; a change of scheduler
        hands every request over to the new one (``Scheduler.surrender``, ``adopt``).
        The active profile stays active, with its new pins, if the new configuration has
        it; otherwise none is (``ProfileChanged``).
        """
        changes = diff_config(self.config, config)
        # The new models' supervisors run before any name reaches them; from the swap of
        # config and names on, nothing awaits: no request sees a half-applied reload.
        # A removed model re-added before it was forgotten keeps its supervisor.
        for model_id in changes.added:
            if model_id not in self._supervisors:
                supervisor = self._supervisor(model_id, config.models[model_id])
                await self._start(model_id, supervisor)
                self._supervisors[model_id] = supervisor
        self.config = config
        # The active profile stays active while the configuration still has it.
        active = self.names.profile
        self.names = Names(config, self, active if active in config.profiles else None)
        if self.names.profile != active:
            logger.info("profile %r is no longer in the configuration: none is active", active)
            self._emit(ProfileChanged(None))
        self.resources.configure(config)
        for model_id, model in config.models.items():
            supervisor = self._supervisors[model_id]
            supervisor.update(model, health_check_timeout=config.health_check_timeout)
            if model_id in changes.restarted or model_id in changes.added:
                supervisor.retire("its configuration changed", restart=True)  # if running
        if changes.removed:
            self._decide("reload", partial(self.scheduler.on_unload, changes.removed, REMOVED))
        for model_id in changes.removed:
            self._supervisors[model_id].retire(REMOVED, restart=False)
            self._forget_if_unneeded(model_id)  # stopped already, nothing in flight
        self.swapper = swapper = make_swapper(config, self._placement)
        if config.routing.scheduler.use == self.scheduler.name:
            self._decide("reload", partial(self.scheduler.on_reconfigure, config, swapper))
        else:
            self._switch_scheduler(make_scheduler(config, self, swapper))
        return changes

    def _switch_scheduler(self, new: Scheduler) -> None:
        """Hand everything to ``new`` at once (``Handover``): what the old scheduler
        dispatched becomes its running work, its loads its own, and it picks among the
        waiting requests by its own order. **One scheduler at a time**: the old one keeps
        nothing, so the new one's slot is never shared with the old one's requests."""
        self._catch_up()
        old, self.scheduler = self.scheduler, new
        logger.info("scheduler %r replaces %r", new.name, old.name)
        handover = old.surrender()
        self.retired_counts += SchedulerCounts.of(old.statistics())  # final: see surrender
        waiting = set(handover.waiting)
        for lease in self._leases:
            if lease.ticket in waiting:
                lease.scheduler = new.name  # the scheduler it will be dispatched by
        self._run_event("reload", partial(new.adopt, handover), handover.waiting)

    def set_profile(self, profile: str | None) -> None:
        """Make ``profile`` (one of ``config.profiles``) the active profile, or none:
        requests resolved from now on see its pins. Raises BadRequest for another name."""
        if profile is not None and profile not in self.config.profiles:
            known = ", ".join(map(repr, self.config.profiles)) or "none"
            message = f"no profile {profile!r} in the configuration (profiles: {known})"
            raise BadRequest(message, param="profile")
        if profile != self.names.profile:
            logger.info("profile %r is active", profile)
            self.names = Names(self.config, self, profile)
            self._emit(ProfileChanged(profile))

    def hurry(self) -> None:
        """Every model's stop, in progress or to come, kills its server at once."""
        for supervisor in self._supervisors.values():
            supervisor.hurry()

    async def shutdown(self, grace: float) -> None:
        """Fail waiting requests (503), let served ones finish for ``grace`` s, stop all.

        A request still running when the grace ends is cancelled with a clear
        ``ShuttingDown`` error (a JSON 503, or an error event on a stream) before its
        model is stopped, rather than cut off by the model's exit.
        """
        self.shutting_down = True
        self._decide("shutdown", partial(self.scheduler.on_shutdown, ShuttingDown()))
        with trio.move_on_after(grace):
            await self._leases.drained()
        late = ShuttingDown(f"the request was still running after unloadTimeout ({grace:g}s)")
        for lease in self._leases:
            if lease.state is not RequestState.FAILED:  # failed: its error is on its way
                lease.cancel(late)
        with trio.move_on_after(CANCEL_GRACE):
            await self._leases.drained()
        async with trio.open_nursery() as nursery:
            for supervisor in self._supervisors.values():
                nursery.start_soon(supervisor.stop, "shutting down")

    # ------------------------------------------------------------------ World

    def now(self) -> float:
        return trio.current_time()

    def model_state(self, model: str) -> ModelState:
        return self._supervisors[model].state

    def shown_models(self) -> list[str]:
        """The models to show: every configured one, and a removed one until it stops."""
        return [
            model
            for model, supervisor in self._supervisors.items()
            if model in self.config.models or supervisor.state is not ModelState.STOPPED
        ]

    def ready_since(self, model: str) -> float | None:
        return self._supervisors[model].statistics().ready_since

    def running_models(self) -> Set[str]:
        return {m for m, s in self._supervisors.items() if s.state is not ModelState.STOPPED}

    def in_flight(self, model: str) -> int:
        return self._leases.in_flight(model)

    # ------------------------------------------------------------- decisions

    def _decide(
        self,
        what: str,
        event: Callable[[], list[Decision]],
        *,
        concerned: Iterable[Ticket] = (),
        tell: Callable[[], None] | None = None,
    ) -> None:
        """Run one scheduler event (``partial(scheduler.on_..., ...)``) and apply its
        decisions; before it, the scheduler hears every cancel it has not heard yet.
        ``tell``, if given, tells the observers of the event between the two."""
        self._catch_up()
        self._run_event(what, event, concerned, tell)
        self._catch_up()

    def _catch_up(self) -> None:
        """Tell the scheduler of abandoned requests (and of grants that found no request)."""
        abandoned = self._leases.abandoned
        while abandoned or self._orphans:
            if abandoned:
                lease = abandoned.popleft()
                if lease.state is RequestState.ABANDONED:
                    self._tell("cancelled", lease)
                    on_cancel = partial(self.scheduler.on_cancel, lease.ticket)
                    self._run_event(f"cancelled request #{lease.id}", on_cancel, ())
                    self._leases.release(lease)
                    self._requests_changed(lease.ticket.model)
            else:
                ticket = self._orphans.pop()
                on_finish = partial(self.scheduler.on_finish, ticket)
                self._run_event(f"orphaned request #{ticket.seq}", on_finish, ())

    def _run_event(
        self,
        what: str,
        event: Callable[[], list[Decision]],
        concerned: Iterable[Ticket],
        tell: Callable[[], None] | None = None,
    ) -> None:
        try:
            decisions = event()
        except Exception:
            logger.exception("scheduler %r failed on %s", self.scheduler.name, what)
            error = InternalError(f"the scheduler failed on {what}")
            decisions = [Fail(t, error) for t in concerned if self._leases.waiting(t)]
        if tell is not None:
            tell()
        self._apply(decisions)

    def _apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if isinstance(decision, Grant):
                ticket = decision.ticket
                if self._leases.grant(ticket):
                    self._requests_changed(ticket.model)
                else:
                    logger.error("request #%d was granted after it left; releasing", ticket.seq)
                    self._orphans.append(ticket)
            elif isinstance(decision, Fail):
                if not self._leases.fail(decision.ticket, decision.error):
                    logger.error("request #%d was failed after it left", decision.ticket.seq)
            elif isinstance(decision, StartSwap):
                self._start_swap(decision.swap)
            elif isinstance(decision, CancelSwap):
                logger.info("cancelling the load of %r: %s", decision.swap.target, decision.reason)
                self._swap_scopes[decision.swap].cancel(reason=decision.reason)
            elif isinstance(decision, Recheck) and self._swap_nursery is not None:
                self._swap_nursery.start_soon(self._recheck, decision.at)
            elif isinstance(decision, Preempt) and self._leases.preempt(decision.ticket):
                logger.info(
                    "preempting request #%d for %r", decision.ticket.seq, decision.ticket.model
                )
            if DecisionApplied in self._observers:
                self._emit(DecisionApplied(decision))
        if decisions:
            self.prefetcher.poke()

    def _tell(self, change: RequestChange, lease: Lease) -> None:
        if RequestChanged in self._observers:
            self._emit(RequestChanged(change, lease))

    def _start_swap(self, swap: Swap) -> None:
        if self._swap_nursery is None:
            raise RuntimeError("router is not running")
        scope = trio.CancelScope()
        self._swap_scopes[swap] = scope
        evicting = f", evicting {sorted(swap.evict)}" if swap.evict else ""
        need = self.resources.need(swap.target)
        needs = f" (needs {need.describe()})" if need is not None else ""
        if swap.retry is not None:
            logger.warning(
                "retrying the load of %r%s%s: %s", swap.target, needs, evicting, swap.retry
            )
        else:
            logger.info("loading model %r%s%s", swap.target, needs, evicting)
        self._swap_nursery.start_soon(self._swap, swap, scope, name=f"swap to {swap.target}")

    # ---------------------------------------------------------------- private

    async def _swap(self, swap: Swap, scope: trio.CancelScope) -> None:
        # Ready is the one way to succeed: however else this ends (its scope or an outer
        # one cancelled, an unexpected error), the waiters must not be granted.
        error: RequestError | None = ModelUnloaded(swap.target, "load cancelled")
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for model in swap.evict:
                        nursery.start_soon(self._evict, model, swap.target)
                target = self._supervisors[swap.target]
                loads = target.state is not ModelState.READY  # one running keeps its cache
                await target.ensure_ready()
                if loads:
                    await self._slots.restore(swap.target, target.config)  # never raises
                error = None
        except RequestError as exc:
            error = exc
            oom = self._out_of_memory.get(swap.target)
            if isinstance(exc, ModelStartFailed) and oom is not None:
                exc.out_of_memory = oom
        finally:
            self._out_of_memory.pop(swap.target, None)
            del self._swap_scopes[swap]
            what, waiters = f"the load of {swap.target!r}", list(swap.waiters)
            done = partial(self.scheduler.on_swap_done, swap, error)
            self._decide(what, done, concerned=waiters)
            for model in (swap.target, *swap.evict):
                self._forget_if_unneeded(model)

    async def _evict(self, model: str, target: str) -> None:
        """Stop ``model`` for the load of ``target``; a ready one's slots are saved first
        (``process/slots.py``: bounded, never raises). Meanwhile it is granted nothing: a
        request for it waits, as the load evicting it collides with its own."""
        supervisor = self._supervisors[model]
        if supervisor.state is ModelState.READY:
            await self._slots.save(model, supervisor.config, self.config, loading=target)
        await supervisor.stop(f"evicted for {target!r}")

    async def _recheck(self, at: float) -> None:
        """At ``at`` a model's residency ends: the scheduler looks again at what it held
        back (the router's run cancels this with the swaps)."""
        await trio.sleep_until(at)
        self._decide("the end of a residency", self.scheduler.on_recheck)

    def _tell_spawned(self, model: str) -> None:
        self._emit(ModelSpawned(model))

    def _on_output(self, model: str, line: LogLine) -> None:
        supervisor = self._supervisors.get(model)
        if (
            supervisor is not None
            and supervisor.state is ModelState.STARTING
            and model not in self._out_of_memory
            and out_of_memory(line.text)
        ):
            self._out_of_memory[model] = line.text
        if ModelOutput in self._observers:
            self._emit(ModelOutput(model, line))

    def _on_model_state(self, model: str, state: ModelState) -> None:
        now = trio.current_time()
        if state is ModelState.STARTING:
            self.resources.loading(model, now)
        elif state is ModelState.READY:
            self.resources.ready(model, now)
        elif state is ModelState.STOPPED:
            self.resources.stopped(model)
        self.prefetcher.poke()
        on_model_state = partial(self.scheduler.on_model_state, model, state)
        self._decide(f"model {model!r} {state.value}", on_model_state)
        self._emit(ModelStateChanged(model, state))
        if state is ModelState.STOPPED:
            self._forget_if_unneeded(model)

    def _requests_changed(self, model: str) -> None:
        """The requests for ``model`` changed (one came, was granted, or left): its TTL
        waits, or may run; a model retiring stops once drained."""
        supervisor = self._supervisors.get(model)  # none if a reload removed it
        if supervisor is not None:
            supervisor.requests_changed()

    def _forget_if_unneeded(self, model: str) -> None:
        """Forget ``model`` if a reload removed it and nothing needs it any more: it is
        stopped, no request is in flight for it, and no load names it (as its target or
        to evict). Its supervisor's task ends, and the forget listeners are told.

        Called wherever one of those can become true: its stop, its last request's end,
        the end of a load, the reload that removed it. Nothing can make it needed again:
        a request for a model the configuration lacks is refused at admission.
        """
        supervisor = self._supervisors.get(model)
        if (
            supervisor is None
            or model in self.config.models
            or supervisor.state is not ModelState.STOPPED
            or self._leases.in_flight(model)
            or any(model == s.target or model in s.evict for s in self._swap_scopes)
        ):
            return
        del self._supervisors[model]
        self._supervisor_scopes.pop(model).cancel(reason=f"model {model!r}: {REMOVED}")
        self._slots.forget(model, supervisor.config)  # its saved KV cache: of no more use
        logger.debug("model %r forgotten: removed, stopped, no request left", model)
        self._emit(ModelForgotten(model))


def _serves(route: str) -> bool:
    """Whether a request to ``route`` is served by its model (its time is a serve time):
    not a load asked for by name (``Router.load``, ``POST /api/models/load``)."""
    return not route.startswith(LOAD_ROUTE)


@final
class _Started:
    """The ``task_status`` of a task started with ``start_soon``: ``event`` is set when it
    calls ``started()``."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def started(self, value: None = None) -> None:
        self.event.set()
