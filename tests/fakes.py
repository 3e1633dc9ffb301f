"""Fakes implementing llamaswap's Protocols, for tests on Trio's mock clock."""

from __future__ import annotations

import collections
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Generic, TypeVar, final
from urllib.parse import urlsplit

import attrs
import trio

from llamaswap.errors import RequestError
from llamaswap.process import ModelState
from llamaswap.router.events import DecisionApplied, ModelStateChanged, Observer, RouterEvent
from llamaswap.schedulers.base import (
    CancelSwap,
    Decision,
    Fail,
    Grant,
    Handover,
    Preempt,
    Recheck,
    Scheduler,
    SchedulerStatistics,
    StartSwap,
    Swap,
    Ticket,
)


@attrs.define(eq=False)
class Script:
    """How a fake process behaves, in seconds after it was spawned."""

    healthy_after: float | None = 0.0
    exit_after: float | None = None
    exit_code: int = 1
    ignores_sigterm: bool = False
    output: Sequence[str] = ()


@final
@attrs.define(eq=False)
class FakeProcess:
    pid: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    script: Script
    spawned_at: float
    signals: list[tuple[float, int]] = attrs.field(factory=list)
    _code: int | None = None
    _exited: trio.Event = attrs.field(factory=trio.Event)

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._code is not None
        return self._code

    def signal_group(self, sig: int) -> None:
        self.signals.append((trio.current_time(), sig))
        if sig == signal.SIGKILL:
            self.exit(-signal.SIGKILL)
        elif sig == signal.SIGTERM and not self.script.ignores_sigterm:
            self.exit(0)

    def exit(self, code: int) -> None:
        if self._code is None:
            self._code = code
            self._exited.set()

    def healthy(self) -> bool:
        after = self.script.healthy_after
        return (
            self._code is None
            and after is not None
            and trio.current_time() >= self.spawned_at + after
        )

    async def pump_output(self, sink: Callable[[str], None]) -> None:
        for line in self.script.output:
            sink(line)
        await self._exited.wait()


@final
class FakeSpawner:
    """Spawns ``FakeProcess``es following ``script``; runs their timers in ``nursery``."""

    def __init__(self, nursery: trio.Nursery, script: Script | None = None) -> None:
        self.script = script or Script()
        self.processes: list[FakeProcess] = []
        self.commands: list[tuple[str, ...]] = []
        self.fail_with: OSError | ValueError | None = None
        self._nursery = nursery

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> FakeProcess:
        await trio.lowlevel.checkpoint()
        if self.fail_with is not None:
            raise self.fail_with
        process = FakeProcess(
            pid=1000 + len(self.processes),
            argv=tuple(argv),
            env=env,
            script=self.script,
            spawned_at=trio.current_time(),
        )
        self.processes.append(process)
        if self.script.exit_after is not None:
            self._nursery.start_soon(self._exit_later, process, self.script.exit_after)
        return process

    async def _exit_later(self, process: FakeProcess, delay: float) -> None:
        await trio.sleep(delay)
        process.exit(self.script.exit_code)

    async def run(
        self, argv: Sequence[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> int:
        """``cmdStop``: records the command, and terminates the process whose PID it names."""
        await trio.lowlevel.checkpoint()
        self.commands.append(tuple(argv))
        for process in self.processes:
            if str(process.pid) in argv:
                process.exit(0)
                sink(f"stopped {process.pid}")
        return 0

    @property
    def last(self) -> FakeProcess:
        return self.processes[-1]


@final
class FakeProbe:
    """Healthy when the newest process of ``spawner`` serving the URL's port (its argv
    names the port) says so."""

    def __init__(self, spawner: FakeSpawner) -> None:
        self._spawner = spawner
        self.urls: list[str] = []

    async def __call__(self, url: str) -> bool:
        await trio.lowlevel.checkpoint()
        self.urls.append(url)
        port = urlsplit(url).port
        ours = [p for p in self._spawner.processes if str(port) in p.argv]
        return bool(ours) and ours[-1].healthy()


@final
class StateRecorder:
    """A supervisor listener that records transitions and lets a test wait for one."""

    def __init__(self) -> None:
        self.history: list[tuple[str, ModelState]] = []
        self._changed = trio.Event()

    def __call__(self, model: str, state: ModelState) -> None:
        self.history.append((model, state))
        self._changed.set()
        self._changed = trio.Event()

    def observe(self, event: RouterEvent) -> None:
        """The router's observer: its models' transitions."""
        if isinstance(event, ModelStateChanged):
            self(event.model, event.state)

    def states(self, model: str | None = None) -> list[ModelState]:
        return [s for m, s in self.history if model is None or m == model]

    async def wait_for(self, state: ModelState, model: str | None = None) -> None:
        """Wait until ``model`` (or any model) enters ``state`` after this call."""
        seen = len(self.history)
        while True:
            await self._changed.wait()
            if any(s is state and (model is None or m == model) for m, s in self.history[seen:]):
                return
            seen = len(self.history)


def decisions_into(found: list[Decision]) -> Observer:
    """A router observer that appends each decision applied to ``found``."""

    def observe(event: RouterEvent) -> None:
        if isinstance(event, DecisionApplied):
            found.append(event.decision)

    return observe


@final
@attrs.define
class FakeLoads:
    """What the selectors read (``router/selectors.py``'s ``Loads``), as the test sets it:
    a model not in ``states`` is stopped, one not in ``wanted`` has no request."""

    states: dict[str, ModelState] = attrs.field(factory=dict)
    wanted_by: dict[str, int] = attrs.field(factory=dict)

    def model_state(self, model: str) -> ModelState:
        return self.states.get(model, ModelState.STOPPED)

    def wanted(self, model: str) -> int:
        return self.wanted_by.get(model, 0)


@final
class FakeWorld:
    """The world as a scheduler sees it, with the decisions applied to it by hand.

    The test plays the router's part: ``apply`` records each decision (and counts a grant
    in flight), ``complete`` plays a swap's task to its end.
    """

    def __init__(self) -> None:
        self.time = 0.0
        self.states: dict[str, ModelState] = {}
        #: When each model became ready, as the test says (``World.ready_since``).
        self.ready: dict[str, float] = {}
        self.serving: collections.Counter[str] = collections.Counter()
        self.decisions: list[Decision] = []
        self.granted: list[Ticket] = []
        self.failed: list[tuple[Ticket, RequestError]] = []
        self.swaps: list[Swap] = []  # every swap started
        self.done: list[Swap] = []  # those ``complete`` ended
        self.cancelled: list[tuple[Swap, str]] = []
        self.rechecks: list[float] = []  # the time of every Recheck decided
        self.preempted: list[Ticket] = []  # every Preempt decided, in order

    def now(self) -> float:
        return self.time

    def model_state(self, model: str) -> ModelState:
        return self.states.get(model, ModelState.STOPPED)

    def ready_since(self, model: str) -> float | None:
        return self.ready.get(model) if self.model_state(model) is ModelState.READY else None

    def running_models(self) -> set[str]:
        return {m for m, s in self.states.items() if s is not ModelState.STOPPED}

    def in_flight(self, model: str) -> int:
        return self.serving[model]

    def apply(self, decisions: list[Decision]) -> list[Decision]:
        for decision in decisions:
            self.decisions.append(decision)
            if isinstance(decision, Grant):
                self.granted.append(decision.ticket)
                self.serving[decision.ticket.model] += 1
            elif isinstance(decision, Fail):
                self.failed.append((decision.ticket, decision.error))
            elif isinstance(decision, StartSwap):
                self.swaps.append(decision.swap)
            elif isinstance(decision, CancelSwap):
                self.cancelled.append((decision.swap, decision.reason))
            elif isinstance(decision, Recheck):
                self.rechecks.append(decision.at)
            elif isinstance(decision, Preempt):
                self.preempted.append(decision.ticket)
        return decisions

    def complete(
        self, scheduler: Driven[Any], swap: Swap, error: RequestError | None = None
    ) -> None:
        """Play the swap's task to its end: evictions stopped, target ready (or not)."""
        for model in swap.evict:
            self.states[model] = ModelState.STOPPED
        self.states[swap.target] = ModelState.STOPPED if error else ModelState.READY
        self.ready[swap.target] = self.time
        self.done.append(swap)
        scheduler.on_swap_done(swap, error)

    def last_swap(self) -> Swap:
        return self.swaps[-1]

    def granted_models(self) -> list[str]:
        return [t.model for t in self.granted]


S = TypeVar("S", bound=Scheduler)


@final
class Driven(Generic[S]):
    """A scheduler driven as the router drives it: every event's decisions are applied to
    ``world``, and a finished request is counted out before ``on_finish``."""

    def __init__(self, scheduler: S, world: FakeWorld) -> None:
        self.scheduler = scheduler
        self.world = world

    def on_request(self, ticket: Ticket) -> list[Decision]:
        return self.world.apply(self.scheduler.on_request(ticket))

    def adopt(self, handover: Handover) -> list[Decision]:
        return self.world.apply(self.scheduler.adopt(handover))

    def on_cancel(self, ticket: Ticket) -> list[Decision]:
        return self.world.apply(self.scheduler.on_cancel(ticket))

    def on_finish(self, ticket: Ticket) -> list[Decision]:
        self.world.serving[ticket.model] -= 1
        return self.world.apply(self.scheduler.on_finish(ticket))

    def on_preempted(self, ticket: Ticket) -> list[Decision]:
        """The checkpointed request came back: counted out first, as a finished one."""
        self.world.serving[ticket.model] -= 1
        return self.world.apply(self.scheduler.on_preempted(ticket))

    def on_swap_done(self, swap: Swap, error: RequestError | None) -> list[Decision]:
        return self.world.apply(self.scheduler.on_swap_done(swap, error))

    def on_model_state(self, model: str, state: ModelState) -> list[Decision]:
        return self.world.apply(self.scheduler.on_model_state(model, state))

    def on_recheck(self) -> list[Decision]:
        return self.world.apply(self.scheduler.on_recheck())

    def on_unload(self, models: Collection[str]) -> list[Decision]:
        return self.world.apply(self.scheduler.on_unload(models))

    def on_shutdown(self, error: RequestError) -> list[Decision]:
        return self.world.apply(self.scheduler.on_shutdown(error))

    def position(self, ticket: Ticket) -> int | None:
        """1-based place in ``queued()``; ``None`` once dispatched."""
        queued = self.scheduler.queued()
        return queued.index(ticket) + 1 if ticket in queued else None

    def statistics(self) -> SchedulerStatistics:
        return self.scheduler.statistics()


def ticket(model: str, seq: int, *, priority: int = 0, arrival: float | None = None) -> Ticket:
    return Ticket(
        model, priority=priority, seq=seq, arrival=float(seq) if arrival is None else arrival
    )
