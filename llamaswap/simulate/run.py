"""Running a workload through the real router and scheduler on Trio's mock clock.

Nothing here models the scheduler: the :class:`~llamaswap.router.Router` of the config,
with its supervisors and the configured scheduler, serves the workload's requests. Only
the model servers are simulated (a process that is ready ``load`` seconds after it starts,
works on ``parallel`` requests at once and queues the rest, as llama-server does, and
stops when told; where the config declares a model's ``memory``, it holds that much while
it runs, and fails to start where it does not fit: ``memory.py``), and time is Trio's
``MockClock`` with ``autojump_threshold=0``: when every task waits, the clock jumps to the
next deadline. An hour of traffic takes seconds, and the same workload gives the same
figures every time.

Preemption (``serial`` with ``preempt``, for a model whose ``preemptible`` is on): a
simulated request is preemptible as the forwarder makes a real one, and is served as the
forwarder serves it. Its server works in a ``lease.preemption()`` scope; when a
preemption cancels it, the request keeps what was generated (the time it was served, at
its model's ``tokensPerSecond``), gives its slot back (``Router.resume``) and, granted
again, goes on with the rest of its job, first reading its prompt and its answer so far
again at its model's ``promptTokensPerSecond``: what a real server does with the prompt
and the partial answer the forwarder resends. A request preempted again before that
reading is done has gained nothing, and reads it all again next time.
"""

from __future__ import annotations

import collections
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import final

import attrs
import trio
import trio.testing

from llamaswap.config import Config
from llamaswap.errors import RequestError
from llamaswap.resources import Resources
from llamaswap.router import Router, RouterEvent
from llamaswap.router.events import DecisionApplied
from llamaswap.schedulers import Grant, StartSwap, Ticket
from llamaswap.schedulers.settings import preemptible

from .memory import DeviceMemory, MemoryFigures, budgets_label, needs
from .workload import Job, ModelTimes

__all__ = ["Outcome", "PreemptionFigures", "Run", "simulate"]

_URL = "http://{}.simulated"


@attrs.frozen
class Outcome:
    """What became of one job: when its server started on it and when it finished
    (seconds from the start), or why it was refused or failed."""

    job: Job
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    #: How often it was preempted, and the tokens its server read again to resume it.
    preemptions: int = 0
    recomputed_tokens: float = 0.0

    @property
    def wait(self) -> float | None:
        """From arrival to the first token: waiting in llamaswap, a load, and waiting in
        the server's own queue."""
        return None if self.started is None else self.started - self.job.at


@attrs.frozen
class PreemptionFigures:
    """What preemption cost in a run (``Run.preemption``).

    ``generated_tokens``: the answer tokens the servers generated, every served job's
    time at its model's ``tokensPerSecond``; a preemption changes nothing in it (the
    answer so far is kept, and sent again as a prefill, not generated again).
    ``recomputed_tokens``: the tokens servers read again to resume preempted requests,
    the prompt and the answer so far at each resume: the work a preemption throws away
    (the server's cache of them) and does again. ``recompute_seconds``: the time that took.
    """

    preemptions: int
    generated_tokens: int
    recomputed_tokens: int
    recompute_seconds: float

    @property
    def recomputed_fraction(self) -> float:
        """Recomputed tokens as a fraction of the generated ones (0 when none were)."""
        return self.recomputed_tokens / self.generated_tokens if self.generated_tokens else 0.0


@attrs.frozen
class Run:
    """One policy's run of a workload."""

    outcomes: tuple[Outcome, ...]
    loads: int
    #: The serial scheduler's counts (None under fifo).
    aging_changed_picks: int | None
    affinity_changed_picks: int | None
    #: What the simulated devices saw; None when no model declares ``memory``.
    memory: MemoryFigures | None = None
    #: What preemption cost; None when the scheduler does not preempt.
    preemption: PreemptionFigures | None = None


@final
class _Process:
    """A simulated model server: ready ``load`` seconds after it starts; or, given the
    line an ``out_of_memory`` start prints, one that prints it and exits with status 1."""

    def __init__(
        self,
        pid: int,
        model: str,
        ready_at: float,
        *,
        exited: Callable[[], None] = lambda: None,
        out_of_memory: str | None = None,
    ) -> None:
        self.pid = pid
        self.model = model
        self.ready_at = ready_at if out_of_memory is None else float("inf")
        self.returncode: int | None = None
        self._exited = trio.Event()
        self._on_exit = exited
        self._out_of_memory = out_of_memory

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()
            self._on_exit()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def signal_group(self, sig: int) -> None:
        self._exit(0 if sig == signal.SIGTERM else -sig)

    async def pump_output(self, sink: Callable[[str], None]) -> None:
        if self._out_of_memory is not None:
            # The line before the exit, as a real server's reaches its log before the
            # supervisor sees it gone: the router reads the failure as out of memory.
            sink(self._out_of_memory)
            self._exit(1)
        await self._exited.wait()


@final
class _ServerQueue:
    """A model server's own queue: it works on ``parallel`` requests at once, taken in
    the order llamaswap granted them (as they would reach it), not in the order Trio
    happens to wake their tasks."""

    def __init__(self, parallel: int) -> None:
        self._parallel = parallel
        self._granted: collections.deque[Ticket] = collections.deque()
        self._running = 0
        self._changed = trio.Event()

    def granted(self, ticket: Ticket) -> None:
        self._granted.append(ticket)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @contextlib.asynccontextmanager
    async def turn(self, ticket: Ticket) -> AsyncIterator[None]:
        """Wait until the server starts on ``ticket``; hold its place while the block runs."""
        try:
            while self._running >= self._parallel or self._granted[0] is not ticket:
                await self._changed.wait()
        except BaseException:
            self._granted.remove(ticket)
            self._notify()
            raise
        self._granted.popleft()
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._notify()


@final
class _Servers:
    """Spawner and probe of the simulated servers (``cmd`` names the model)."""

    def __init__(
        self, servers: Mapping[str, ModelTimes], memory: DeviceMemory | None = None
    ) -> None:
        self._servers = servers
        self._latest: dict[str, _Process] = {}
        self.queues = {model: _ServerQueue(s.parallel) for model, s in servers.items()}
        self.memory = memory
        self.spawned = 0
        self.evictions = 0

    def server(self, model: str) -> ModelTimes:
        """How ``model``'s server behaves."""
        return self._servers[model]

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> _Process:
        await trio.lowlevel.checkpoint()
        model = argv[-1]
        self.spawned += 1
        ready_at = trio.current_time() + self._servers[model].load
        memory = self.memory
        if memory is None:
            process = _Process(self.spawned, model, ready_at)
        else:
            line = memory.take(model)
            process = _Process(
                self.spawned,
                model,
                ready_at,
                exited=(lambda: memory.release(model)) if line is None else (lambda: None),
                out_of_memory=line,
            )
        self._latest[model] = process
        return process

    async def run(
        self, argv: Sequence[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> int:
        await trio.lowlevel.checkpoint()  # no cmdStop in a simulation
        return 0

    def on_event(self, event: RouterEvent) -> None:
        """A grant starts its request's turn at its server; a load's evictions are counted
        (a ``Router.observe`` observer)."""
        if isinstance(event, DecisionApplied) and isinstance(event.decision, Grant):
            self.queues[event.decision.ticket.model].granted(event.decision.ticket)
        elif isinstance(event, DecisionApplied) and isinstance(event.decision, StartSwap):
            self.evictions += len(event.decision.swap.evict)

    async def probe(self, url: str) -> bool:
        await trio.lowlevel.checkpoint()
        model = url.removeprefix("http://").split(".simulated", 1)[0]
        process = self._latest.get(model)
        return (
            process is not None
            and process.returncode is None
            and trio.current_time() >= process.ready_at
        )


def simulated(config: Config) -> Config:
    """``config`` with every model's server replaced by a simulated one."""
    models = {
        model_id: attrs.evolve(
            model,
            cmd=("simulated", model_id),
            cmd_stop=None,
            proxy=_URL.format(model_id),
            check_endpoint="/health",
        )
        for model_id, model in config.models.items()
    }
    return attrs.evolve(config, models=models, peers={})


def simulate(
    config: Config,
    jobs: Sequence[Job],
    servers: Mapping[str, ModelTimes],
    *,
    ignore_priority: bool = False,
) -> Run:
    """Serve ``jobs`` under ``config``'s scheduler, in simulated time.

    Args:
        ignore_priority: send every job with priority 0 (its band is still reported).
    """
    return trio.run(
        _simulate,
        config,
        jobs,
        servers,
        ignore_priority,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )


async def _simulate(
    config: Config, jobs: Sequence[Job], times: Mapping[str, ModelTimes], ignore_priority: bool
) -> Run:
    config = simulated(config)
    # The router's own Resources (the one it would build): its budgets are the devices'.
    resources = Resources(config)
    declared = needs(config)
    memory = DeviceMemory(declared, resources.budget) if declared else None
    servers = _Servers(times, memory)
    router = Router(config, spawner=servers, probe=servers.probe, resources=resources)
    router.observe(servers.on_event, DecisionApplied)
    outcomes: list[Outcome] = [Outcome(job) for job in jobs]
    start = trio.current_time()

    recompute_seconds = 0.0

    async def client(job: Job) -> None:
        nonlocal recompute_seconds
        server = servers.server(job.model)
        lease = router.lease(
            job.model,
            priority=0 if ignore_priority else job.priority,
            preemptible=preemptible(config, job.model),
        )
        queue = servers.queues[job.model]
        started: float | None = None
        remaining = job.duration  # of its generation
        reading = 0.0  # before it: the prompt and answer so far, read again to resume
        preemptions = 0
        recomputed = 0.0
        try:
            async with router.acquire(lease):
                while True:
                    began: float | None = None
                    # As the forwarder's upstream request: in the scope from being sent.
                    with lease.preemption() as preemption:
                        async with queue.turn(lease.ticket):
                            began = trio.current_time()
                            if started is None:
                                started = began - start
                            await trio.sleep(reading + remaining)
                    if not preemption.cancelled_caught:
                        break
                    if began is not None:
                        served = trio.current_time() - began
                        recompute_seconds += min(served, reading)
                        remaining -= max(served - reading, 0.0)
                    preemptions += 1
                    answered = (job.duration - remaining) * server.tokens_per_second
                    tokens = job.prompt_tokens + answered
                    reading = tokens / server.prompt_tokens_per_second
                    await router.resume(lease)
                    recomputed += tokens
                recompute_seconds += reading
        except RequestError as exc:
            outcomes[job.index] = Outcome(job, error=type(exc).__name__, preemptions=preemptions)
            return
        finished = trio.current_time() - start
        outcomes[job.index] = Outcome(job, started, finished, None, preemptions, recomputed)

    async with trio.open_nursery() as nursery:
        await nursery.start(router.run)
        async with trio.open_nursery() as clients:
            for job in jobs:
                await trio.sleep_until(start + job.at)
                clients.start_soon(client, job)
        statistics = router.scheduler.statistics()
        nursery.cancel_scope.cancel()
    is_serial = statistics.name == "serial"
    return Run(
        tuple(outcomes),
        loads=servers.spawned,
        aging_changed_picks=statistics.aging_changed_picks if is_serial else None,
        affinity_changed_picks=statistics.affinity_changed_picks if is_serial else None,
        memory=None
        if memory is None
        else MemoryFigures(
            budgets_label(config),
            dict(memory.peaks),
            servers.evictions,
            tuple(memory.out_of_memory),
        ),
        preemption=PreemptionFigures(
            preemptions=sum(o.preemptions for o in outcomes),
            generated_tokens=round(
                sum(
                    o.job.duration * servers.server(o.job.model).tokens_per_second
                    for o in outcomes
                    if o.finished is not None
                )
            ),
            recomputed_tokens=round(sum(o.recomputed_tokens for o in outcomes)),
            recompute_seconds=recompute_seconds,
        )
        if config.routing.scheduler.use == "serial"
        and config.routing.scheduler.settings.serial.preempt
        else None,
    )
