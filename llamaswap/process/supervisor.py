"""One supervisor per model: start, health-check, stop, TTL and crash detection.

Ownership: ``ModelSupervisor.run`` owns a nursery for as long as llamaswap serves. Each
start of the model's server is one *run*: a task in that nursery that spawns the process,
captures its output, polls readiness (and probes at once when the server prints), waits
for the exit, and in its ``finally`` always stops and reaps the process (shielded, bounded
by ``unloadTimeout`` then SIGKILL). Stopping a model is cancelling its run's cancel scope,
with the reason.

Callers never touch the process. ``ensure_ready()`` starts the model or joins the start
in progress (and waits out a stop in progress first), so it never acts on a stale state;
``stop()`` stops it. A start that every caller of ``ensure_ready()`` has abandoned is
aborted at once and its process killed: that is how a load nobody waits for any more ends.

**A model whose start failed is shown as failed until its next start begins**:
``statistics().failure`` says why (the error its requests got, its exit status, its last
lines of output) from the moment that run is over (stopped) to the next ``ensure_ready``
that starts it again; a start that was stopped (an unload, an eviction, abandoned) is no
failure. A crash after ready is not one either: the model is stopped, and the next
request starts it again (``crashes`` counts them).
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable
from typing import Any, final

import attrs
import trio

from llamaswap.keypaths import format_path

from ..config.model import ModelConfig
from ..errors import LifelineError, ModelStartFailed, ModelUnloaded, RequestError, output_tail
from .health import Probe
from .logring import LogRing
from .spawn import OUTPUT_DRAIN_SECONDS, ProcessHandle, Spawner
from .state import ModelState, check_transition

__all__ = ["ModelStatistics", "ModelSupervisor", "StartFailure", "StateListener"]

logger = logging.getLogger("llamaswap.process")
#: Where model output is copied at debug level (it is in each model's own ring already).
output_logger = logging.getLogger("llamaswap.process.output")

#: Seconds between readiness probes: readiness is seen well within 100 ms of turning healthy.
HEALTH_POLL_INTERVAL = 0.02
#: A starting server that prints a line is probed again at once (servers say when they are
#: ready: llama-server prints "model loaded" the moment its /health turns 200), but no sooner
#: than this many seconds after the last probe ended: a server printing its load log line
#: by line then costs a probe per 2 ms at most, not one per line.
OUTPUT_PROBE_GAP = 0.002
#: Lines of output quoted in a start failure.
LOG_TAIL_LINES = 5
#: Seconds a request whose connection to the server broke waits to see if it died.
EXIT_GRACE = 0.5

StateListener = Callable[[str, ModelState], None]


@attrs.frozen
class StartFailure:
    """Why a model's last start failed: its ``ModelStartFailed``, as a value."""

    #: What went wrong: ``exited with status 1 while starting``, ``not ready after
    #: healthCheckTimeout (120s)``, ``cannot run 'llama-server': ...``
    reason: str
    #: The whole error its requests got: the reason, the output quoted, what to check.
    message: str
    #: Its status, when it exited by itself while starting; None when it never ran, or
    #: was stopped for missing ``healthCheckTimeout``.
    exit_code: int | None
    #: Its last lines of output in that start (``LOG_TAIL_LINES`` at most), oldest first.
    output: tuple[str, ...]

    @classmethod
    def of(cls, error: ModelStartFailed) -> StartFailure:
        return cls(error.reason, str(error), error.exit_code, error.log_tail)


@attrs.frozen
class ModelStatistics:
    model: str
    state: ModelState
    pid: int | None
    in_flight: int
    starts: int
    start_failures: int
    crashes: int
    last_exit_code: int | None
    ready_since: float | None
    #: When the model unloads for idleness: ``inf`` unless it is ready, has a ``ttl`` and
    #: no request wants it (waiting or in flight).
    idle_deadline: float
    #: The ``proxy`` of the server running, or of the last one that ran (a reload may
    #: have given the next start another); None before the first start.
    address: str | None = None
    #: When its load began, while it is ``starting``; None otherwise.
    starting_since: float | None = None
    #: Why its last start failed, while it is stopped after that start; None otherwise.
    failure: StartFailure | None = None

    @property
    def shown_state(self) -> str:
        """Its state as routes and the dashboard show it: ``state``, but ``failed`` while
        it is stopped after a failed start."""
        return "failed" if self.failure is not None else self.state.value

    def failure_json(self) -> dict[str, Any] | None:
        """``failure`` as routes and events show it: null, or its fields by name."""
        failure = self.failure
        if failure is None:
            return None
        return {
            "reason": failure.reason,
            "message": failure.message,
            "exit_code": failure.exit_code,
            "output": list(failure.output),
        }

    def ttl_left(self, now: float) -> float | None:
        """Seconds until the model is unloaded for idleness (0 when overdue), or None
        while that countdown does not run: not ready, no ``ttl``, or requests want it."""
        if self.state is ModelState.READY and self.idle_deadline != math.inf:
            return max(0.0, self.idle_deadline - now)
        return None


@attrs.define(eq=False)
class _Run:
    """One start of the model's server, from spawn to reap."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    settled: trio.Event = attrs.field(factory=trio.Event)  # ready, or failed
    stopped: trio.Event = attrs.field(factory=trio.Event)  # reaped
    output_closed: trio.Event = attrs.field(factory=trio.Event)
    printed: trio.Event = attrs.field(factory=trio.Event)  # output since the last probe began
    error: RequestError | None = None
    waiters: int = 0
    exited: trio.Event = attrs.field(factory=trio.Event)  # by itself, once ready
    pid: int | None = None
    stop_reason: str | None = None
    polite: trio.CancelScope | None = None  # the polite stop in progress: hurry() ends it
    log_start: int = 0  # the model log's position when this run began
    draining: bool = False  # stopping once the requests in flight are done
    restart: bool = False  # stopped for a new definition: ensure_ready starts it again


@final
class ModelSupervisor:
    """Owns one model's server process.

    Args:
        model_id: the model's ID in the configuration.
        config: its ``[models.ID]`` section.
        spawner: starts processes (a fake in tests).
        probe: the readiness check.
        health_check_timeout: seconds a start may take before it fails.
        listener: called synchronously on every state change; must not block.
        spawned: called once the server's process runs (while it starts: its PID is in
            ``statistics()``); must not block.
        in_flight: the number of requests being served by this model (the router's
            count); call ``requests_changed`` whenever it changes.
        wanted: the number of requests for this model, waiting or being served (at least
            ``in_flight``): the TTL does not run while there are any. Call
            ``requests_changed`` whenever it changes too.
        poll_interval: seconds between readiness probes (a starting server that prints
            is probed at once too, ``OUTPUT_PROBE_GAP`` after the last probe at the soonest).
    """

    def __init__(
        self,
        model_id: str,
        config: ModelConfig,
        *,
        spawner: Spawner,
        probe: Probe,
        health_check_timeout: float,
        listener: StateListener | None = None,
        spawned: Callable[[], None] = lambda: None,
        in_flight: Callable[[], int] = lambda: 0,
        wanted: Callable[[], int] | None = None,
        poll_interval: float = HEALTH_POLL_INTERVAL,
    ) -> None:
        self.model_id = model_id
        self.config = config
        self.log = LogRing()
        self._spawner = spawner
        self._probe = probe
        self._health_check_timeout = health_check_timeout
        self._listener = listener
        self._spawned = spawned
        self._poll_interval = poll_interval
        self._env = {**os.environ, **config.env}
        self._state = ModelState.STOPPED
        self._run: _Run | None = None
        self._nursery: trio.Nursery | None = None
        self._in_flight = in_flight
        self._wanted = in_flight if wanted is None else wanted
        self._idle_deadline = math.inf
        self._idle_scope = trio.CancelScope()
        self._hurried = False
        self._starts = 0
        self._start_failures = 0
        self._crashes = 0
        self._last_exit_code: int | None = None
        self._ready_since: float | None = None
        self._starting_since: float | None = None
        self._address: str | None = None
        self._failure: StartFailure | None = None  # only while STOPPED

    # ---------------------------------------------------------------- service

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise until cancelled; cancelling stops the process (polite, then SIGKILL)."""
        # Cleared only once every run is over: a run unwinding from a cancellation may
        # still start its output reader (a spawn cannot be interrupted mid-way).
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._expire_idle)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    @property
    def state(self) -> ModelState:
        return self._state

    def statistics(self) -> ModelStatistics:
        return ModelStatistics(
            model=self.model_id,
            state=self._state,
            pid=None if self._run is None else self._run.pid,
            in_flight=self._in_flight(),
            starts=self._starts,
            start_failures=self._start_failures,
            crashes=self._crashes,
            last_exit_code=self._last_exit_code,
            ready_since=self._ready_since,
            idle_deadline=self._idle_deadline,
            address=self._address,
            starting_since=self._starting_since,
            failure=self._failure,
        )

    # ------------------------------------------------------------ public API

    async def ensure_ready(self) -> None:
        """Return once the server is ready, starting it (or waiting out a stop) first.

        Raises:
            ModelStartFailed: the process exited, could not run, or missed the health deadline.
            ModelUnloaded: the start was stopped (unload, eviction, shutdown) before ready.

        *Cancellation*: a cancelled caller leaves the start; when no caller is left the
        start is aborted and the process killed.
        """
        while True:
            run = self._run
            if run is None:
                run = self._launch()
            elif self._state is ModelState.STOPPING:
                await run.stopped.wait()
                continue
            elif self._state is ModelState.READY:
                return
            run.waiters += 1
            try:
                await run.settled.wait()
            finally:
                run.waiters -= 1
                if run.waiters == 0 and not run.settled.is_set():
                    self._request_stop(run, "start abandoned: nobody waits for it any more")
            if run.error is not None:
                if run.restart:
                    continue  # stopped for a new definition: start that one
                raise run.error
            return

    async def stop(self, reason: str) -> None:
        """Stop the server (aborting a start) and return once the process is reaped.

        *Cancellation*: the stop goes on without the cancelled caller.
        """
        run = self._run
        if run is None:
            return
        self._request_stop(run, reason)
        await run.stopped.wait()

    def request_stop(self, reason: str) -> None:
        """Begin stopping at once (the state is STOPPING on return); ``stop`` waits."""
        if self._run is not None:
            self._request_stop(self._run, reason)

    def requests_changed(self) -> None:
        """The requests for the model changed: a model retiring once drained stops when
        the last one it serves ends; while requests for it wait or are served, it is never
        unloaded for idleness; when the last one ends, the TTL clock restarts from now."""
        run = self._run
        if run is not None and run.draining and not self._in_flight():
            run.scope.cancel(reason=f"model {self.model_id!r}: {run.stop_reason}")
        elif self._wanted():
            self._set_idle_deadline(math.inf)
        else:
            self._arm_ttl()

    def update(self, config: ModelConfig, *, health_check_timeout: float) -> None:
        """Take a new definition for the next start; ``ttl``, ``unloadTimeout`` and
        ``cmdStop`` apply at once (the TTL clock restarts from now)."""
        self.config = config
        self._env = {**os.environ, **config.env}
        self._health_check_timeout = health_check_timeout
        if self._state is ModelState.READY:
            self.requests_changed()

    def hurry(self) -> None:
        """Stop without waiting for the server (a second Ctrl-C): the polite stop in
        progress, and any later one, gives way to SIGKILL at once, not after
        ``unloadTimeout``."""
        self._hurried = True
        if self._run is not None and self._run.polite is not None:
            self._run.polite.cancel()

    def retire(self, reason: str, *, restart: bool) -> None:
        """Stop the running server once its requests in flight are done (at once if
        none are); it is STOPPING from now on, so no new request is sent to it. With
        ``restart``, a start in progress and its waiters go on with the new definition.
        """
        run = self._run
        if run is None or run.scope.cancel_called:
            return
        run.restart = restart
        if not self._in_flight():
            self._request_stop(run, reason)
            return
        run.draining = True
        if self._state is not ModelState.STOPPING:
            run.stop_reason = reason
            self._set_state(ModelState.STOPPING)
            logger.info("model %r: stopping once its requests finish (%s)", self.model_id, reason)

    # --------------------------------------------------------------- the run

    def _launch(self) -> _Run:
        if self._nursery is None:
            raise RuntimeError(f"model {self.model_id!r}: supervisor is not running")
        run = _Run(log_start=self.log.appended)
        self._run = run
        self._address = self.config.proxy
        self._failure = None
        self._starts += 1
        self._set_state(ModelState.STARTING)
        self._nursery.start_soon(self._lifetime, run, name=f"model {self.model_id}")
        return run

    def _request_stop(self, run: _Run, reason: str) -> None:
        if run is not self._run or run.scope.cancel_called:
            return
        if self._state is not ModelState.STOPPING:
            run.stop_reason = reason
            self._set_state(ModelState.STOPPING)
            logger.info("model %r: stopping (%s)", self.model_id, reason)
        run.scope.cancel(reason=f"model {self.model_id!r}: {run.stop_reason}")

    async def _lifetime(self, run: _Run) -> None:
        process: ProcessHandle | None = None
        try:
            with run.scope:
                process = await self._spawn(run)
                if process is not None:
                    # Output is read until end of file, beyond this scope: the lines a
                    # server prints while it stops belong in its log too.
                    assert self._nursery is not None
                    self._nursery.start_soon(self._capture_output, run, process)
                    await self._supervise(run, process)
        finally:
            with trio.CancelScope(shield=True):
                if process is not None:
                    await self._terminate(run, process)
                    await self._drain_output(run)
            self._finish(run)

    async def _spawn(self, run: _Run) -> ProcessHandle | None:
        url = self.config.health_url
        if url is not None and await self._probe(url):
            # Someone else's server (another llamaswap with the same startPort, a leftover
            # process) would pass for ours, and answer our requests: refuse to start.
            reason = f"{url} answers before the model was started: another process holds its port"
            proxy = format_path(("models", self.model_id, "proxy"))
            hint = f"stop that process, or change startPort or {proxy}"
            self._fail(run, ModelStartFailed(self.model_id, reason, hint=hint))
            return None
        try:
            process = await self._spawner.spawn(self.config.cmd, self._env)
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte, which exec cannot take
            reason = f"cannot run {self.config.cmd[0]!r}: {getattr(exc, 'strerror', None) or exc}"
            self._fail(run, ModelStartFailed(self.model_id, reason))
            return None
        except LifelineError as exc:
            # Our own machinery failed before the command ran: not a problem with cmd.
            hint = "the command never ran: this is llamaswap's own failure; see its log"
            self._fail(run, ModelStartFailed(self.model_id, str(exc), hint=hint))
            return None
        run.pid = process.pid
        logger.info("model %r: started pid %d", self.model_id, process.pid)
        self._spawned()
        return process

    async def _supervise(self, run: _Run, process: ProcessHandle) -> None:
        """Wait for readiness, then for the process to exit by itself (a crash)."""
        failure = await self._await_ready(run, process)
        if failure is not None:
            self._fail(run, failure)
            return
        self._ready_since = trio.current_time()
        logger.info("model %r: ready", self.model_id)
        self._set_state(ModelState.READY)  # its TTL armed
        run.settled.set()
        code = await process.wait()
        self._crashes += 1
        self._exited(run)
        await self._drain_output(run)
        logger.warning(
            "model %r: exited unexpectedly with status %d (last output: %s)",
            self.model_id,
            code,
            output_tail(self.log.tail(LOG_TAIL_LINES, since=run.log_start)),
        )

    async def notice_exit(self) -> None:
        """A request's connection to the ready server broke: give its process up to
        ``EXIT_GRACE`` seconds to show it has died. If it has, the model counts as stopping
        before that request is released, so that the next request starts it again rather
        than being sent to a dead port (the connection may break a moment before the
        process is gone)."""
        run = self._run
        if run is not None and self._state is ModelState.READY:
            with trio.move_on_after(EXIT_GRACE):
                await run.exited.wait()

    def _exited(self, run: _Run) -> None:
        """The server's process has exited by itself: a ready model is stopping."""
        run.exited.set()
        if self._state is ModelState.READY:
            run.stop_reason = "exited unexpectedly"
            self._set_state(ModelState.STOPPING)

    def _fail(self, run: _Run, failure: ModelStartFailed) -> None:
        self._start_failures += 1
        logger.warning("%s", failure)
        run.error = failure

    def _finish(self, run: _Run) -> None:
        if run.error is None and not run.settled.is_set():
            run.error = ModelUnloaded(self.model_id, run.stop_reason or "stopped")
        self._run = None
        self._ready_since = None
        error = run.error
        self._failure = StartFailure.of(error) if isinstance(error, ModelStartFailed) else None
        self._set_state(ModelState.STOPPED)
        run.settled.set()
        run.stopped.set()

    def _sink(self, prefix: str) -> Callable[[str], None]:
        """Where a line of output goes: the model's log, and llamaswap's at debug level."""

        def sink(line: str) -> None:
            self.log.append(trio.current_time(), prefix + line)
            output_logger.debug("[%s] %s%s", self.model_id, prefix, line)

        return sink

    async def _capture_output(self, run: _Run, process: ProcessHandle) -> None:
        sink = self._sink("")

        def line(text: str) -> None:
            sink(text)
            run.printed.set()  # a starting server is probed again (_await_ready)

        try:
            await process.pump_output(line)
        finally:
            run.output_closed.set()

    async def _drain_output(self, run: _Run) -> None:
        """Give a dead process's last lines a moment to arrive (for the error message)."""
        with trio.move_on_after(OUTPUT_DRAIN_SECONDS):
            await run.output_closed.wait()

    async def _await_ready(self, run: _Run, process: ProcessHandle) -> ModelStartFailed | None:
        """Poll the check endpoint, and probe it again whenever the server prints; the
        failure if the process exits or the deadline passes."""
        url = self.config.health_url
        if url is None:
            return None
        ready = False
        async with trio.open_nursery() as nursery:

            async def watch_exit() -> None:
                await process.wait()
                nursery.cancel_scope.cancel(reason="process exited while starting")

            nursery.start_soon(watch_exit)
            with trio.move_on_after(self._health_check_timeout):
                while True:
                    run.printed = trio.Event()  # what is printed from now on is news
                    if await self._probe(url):
                        break
                    # The next probe: at the next poll, or once the server prints (what
                    # it printed during this probe counts), but not within the gap.
                    ended = trio.current_time()
                    with trio.move_on_at(ended + self._poll_interval):
                        await run.printed.wait()
                        await trio.sleep_until(ended + OUTPUT_PROBE_GAP)
                ready = True
            nursery.cancel_scope.cancel(reason="readiness decided")
        if ready:
            return None
        if process.returncode is not None:
            await self._drain_output(run)
            return ModelStartFailed(
                self.model_id,
                f"exited with status {process.returncode} while starting",
                log_tail=self.log.tail(LOG_TAIL_LINES, since=run.log_start),
                exit_code=process.returncode,
            )
        return ModelStartFailed(
            self.model_id,
            f"not ready after healthCheckTimeout ({self._health_check_timeout:g}s)",
            log_tail=self.log.tail(LOG_TAIL_LINES, since=run.log_start),
        )

    async def _terminate(self, run: _Run, process: ProcessHandle) -> None:
        """Polite stop, SIGKILL after ``unloadTimeout``, always reap. Runs shielded."""
        if process.returncode is None:
            if self._state is not ModelState.STOPPING:
                run.stop_reason = run.stop_reason or "failed to start"
                self._set_state(ModelState.STOPPING)
            patience = 0.0 if self._hurried else self.config.unload_timeout
            with trio.move_on_after(patience) as run.polite:
                await self._polite_stop(process)
                await process.wait()
            if process.returncode is None:
                if self._hurried:
                    logger.warning("model %r: stopping at once; sending SIGKILL", self.model_id)
                else:
                    logger.warning(
                        "model %r: still running %gs after the stop request (unloadTimeout); "
                        "sending SIGKILL",
                        self.model_id,
                        self.config.unload_timeout,
                    )
                process.signal_group(signal.SIGKILL)
        self._last_exit_code = await process.wait()
        logger.info("model %r: stopped, exit status %d", self.model_id, self._last_exit_code)

    async def _polite_stop(self, process: ProcessHandle) -> None:
        """``cmdStop``, or SIGTERM to the group (also when ``cmdStop`` cannot be run, or
        fails)."""
        if self.config.cmd_stop is not None:
            argv = [part.replace("${PID}", str(process.pid)) for part in self.config.cmd_stop]
            try:
                code = await self._spawner.run(argv, self._env, self._sink("cmdStop: "))
            except (OSError, ValueError, LifelineError) as exc:
                failure = (
                    f"cannot run cmdStop {argv[0]!r} ({getattr(exc, 'strerror', None) or exc})"
                )
            else:
                if code == 0:
                    return
                failure = f"cmdStop {argv[0]!r} exited with status {code}"
            logger.warning("model %r: %s; sending SIGTERM instead", self.model_id, failure)
        process.signal_group(signal.SIGTERM)

    # ------------------------------------------------------------------- TTL

    def _arm_ttl(self) -> None:
        if self._state is ModelState.READY and not self._wanted() and self.config.ttl > 0:
            self._set_idle_deadline(trio.current_time() + self.config.ttl)

    def _set_idle_deadline(self, deadline: float) -> None:
        if deadline != self._idle_deadline:  # unchanged for every request without a ttl
            self._idle_deadline = deadline
            self._idle_scope.deadline = deadline

    async def _expire_idle(self) -> None:
        """Unload the model ``ttl`` seconds after its last request (or after ready)."""
        while True:
            self._idle_scope = trio.CancelScope(deadline=self._idle_deadline)
            with self._idle_scope:
                await trio.sleep_forever()
            if (
                self._run is not None
                and self._state is ModelState.READY
                and not self._wanted()
                and trio.current_time() >= self._idle_deadline
            ):
                self._request_stop(self._run, f"idle for ttl={self.config.ttl:g}s")

    # ----------------------------------------------------------------- state

    def _set_state(self, new: ModelState) -> None:
        check_transition(self.model_id, self._state, new)
        self._state = new
        self._starting_since = trio.current_time() if new is ModelState.STARTING else None
        # Before the listener: whoever it tells reads statistics() that match the state.
        if new is ModelState.READY:
            self._arm_ttl()
        else:
            self._set_idle_deadline(math.inf)
        if self._listener is not None:
            self._listener(self.model_id, new)
