"""Model processes die with llamaswap, however llamaswap dies.

Linux's parent-death signal (``PR_SET_PDEATHSIG``) does not work here: Trio forks from a
worker thread and the signal fires when that *thread* exits, which Trio does after about
ten idle seconds, killing a healthy model. Instead, a tiny guard process (``_guard.py``)
reads a pipe whose only write end llamaswap holds. Each model child writes ``+PID`` into
the pipe from ``preexec_fn``, after ``fork`` and before ``exec``, so there is no moment at
which a model runs unregistered; the write end is close-on-exec, so the model itself never
holds it. When llamaswap exits, even by ``kill -9``, the kernel closes the pipe and the
guard SIGKILLs every process group still registered.

**The guard can die too** (the OOM killer, an operator, a cleanup script), and then the
lifeline heals itself:

* llamaswap keeps the set of live groups itself: a spawn adds one, ``forget`` removes it
  (from the guard too: when a group's leader is reaped, and when a child that registered
  could not run its program).
* A watch task, owned by ``open_lifeline``, waits for the guard to exit. If it exits while
  llamaswap runs, the task logs a warning and *replaces* it: a new pipe, the live groups
  written into it, a new guard started on it. The new guard thus kills the groups
  registered before its start too.
* Spawns and replacements exclude each other (one ``trio.Lock``). A spawn either finishes
  before a replacement begins (its group is in the set the new guard is sent) or starts
  after it (the child inherits the new pipe). Without the lock, a child could register
  into the old pipe after the set was copied for the new guard.
* The live groups are written into the new pipe *before* the new guard starts (when they
  fit in an empty pipe, ``PIPE_BUF`` bytes, i.e. hundreds of groups; more are written just
  after), so the guard knows them from its first instant. The one window left is while no
  guard exists at all, between the old one's death and the new one's fork: nobody can
  kill a model then, and ``kill -9`` of llamaswap in those milliseconds leaves orphans.

A spawn can also be the first to find the guard dead. The child blocks SIGPIPE around its
registration write, so a pipe with no reader makes the write fail with ``EPIPE`` instead of
killing the child with SIGPIPE (status -13, which used to read as a failure of the model's
``cmd``). An exception in ``preexec_fn`` makes the child exit before ``exec`` and
``subprocess`` raise ``SubprocessError`` in llamaswap: the command never ran, so the spawn
replaces the guard and tries once more. If that fails too, it raises ``LifelineError``:
llamaswap's own failure, never reported as the model's.

Rejected: registering from the parent after the spawn (a model would run unregistered until
then); the child ``os._exit``-ing with a special status (indistinguishable from a model
exiting with that status, and only seen after the fact); a generation counter instead of
the lock (a spawn that raced a replacement would have to re-send its registration, and a
failed one would need the replacement to be awaited: the lock says the same in one line).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from functools import partial
from typing import final

import trio

from ..errors import LifelineError

__all__ = ["Lifeline", "open_lifeline"]

logger = logging.getLogger("llamaswap.process")

_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.py")
#: The guard's command line; a module constant, so that a test can make a restart fail.
GUARD_ARGV: tuple[str, ...] = (sys.executable, "-I", "-S", _GUARD)
#: Seconds between attempts to replace a guard when starting a new one failed.
GUARD_RETRY_SECONDS = 1.0

#: Opens a process with the given ``preexec_fn`` (``trio.lowlevel.open_process``).
Start = Callable[[Callable[[], None]], Awaitable[trio.Process]]


@final
class Lifeline:
    """The write end of the guard's pipe, and the process groups registered through it."""

    def __init__(self, guard: trio.Process, write_fd: int) -> None:
        self._guard = guard
        self._fd = write_fd
        self._groups: set[int] = set()
        self._lock = trio.Lock()  # spawns and guard replacements exclude each other

    async def spawn(self, start: Start) -> trio.Process:
        """Open a process with ``start(preexec_fn)``, registered with the guard.

        The process must lead a new session (``start_new_session=True``): its group is its PID.

        Raises:
            LifelineError: the child could not register, even with a new guard; it never ran.
            OSError: from ``start`` (the program could not be executed).

        *Cancellation*: only while waiting for the lock (another spawn, or a guard being
        replaced); once the process is being opened, the spawn runs to its end.
        """
        async with self._lock:
            if self._fd < 0:
                raise LifelineError("it is closed: llamaswap is stopping")
            try:
                process = await self._start(start)
            except subprocess.SubprocessError:
                # Only our preexec_fn fails this way: the guard no longer reads the pipe.
                await self._replace(self._guard, "no longer reads its pipe")
                try:
                    process = await self._start(start)
                except subprocess.SubprocessError as exc:
                    raise LifelineError(
                        "a new process could not register with a new guard either"
                    ) from exc
            self._groups.add(process.pid)
            return process

    async def _start(self, start: Start) -> trio.Process:
        """``start`` with ``_register_self`` as its ``preexec_fn``; a child that registered
        but could not run its program is forgotten at once.

        The child registers before ``exec``: when ``exec`` fails (no such program, no
        permission), ``subprocess`` reaps it and raises ``OSError`` without its PID, and the
        guard would keep that number for good, one per failed start, and at llamaswap's
        death SIGKILL whatever process group had come to hold it by then. So the child also
        writes its PID into a pipe of this spawn's, read when ``start`` fails.
        """
        read_fd, write_fd = os.pipe()  # close-on-exec, as the guard's pipe: only until exec
        try:
            try:
                return await start(partial(self._register_self, write_fd))
            except OSError:
                os.close(write_fd)  # the child's copy is closed too (it has exited): EOF
                write_fd = -1
                if pid := os.read(read_fd, 32):  # empty: no child registered (fork failed)
                    self.forget(int(pid))
                raise
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def forget(self, pgid: int) -> None:
        """The group's leader has been reaped: the guard must not kill that number later."""
        self._groups.discard(pgid)
        with contextlib.suppress(OSError):  # the guard is gone; its successor gets the set
            os.write(self._fd, b"-%d\n" % pgid)

    def _register_self(self, report: int) -> None:
        """``preexec_fn`` for a model child: register its own process group, then write its
        PID into ``report`` (read if the child cannot run its program: see ``_start``).

        Runs in the forked child before ``exec``; the child leads a new session, so its
        process group ID is its PID. ``subprocess`` has reset SIGPIPE to its default, which
        would kill the child if the guard is gone; blocked, the write raises instead, and
        the pending SIGPIPE dies with the child. On success the mask is restored (``exec``
        keeps it).
        """
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        os.write(self._fd, b"+%d\n" % os.getpid())
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.write(report, b"%d" % os.getpid())

    async def _replace(self, dead: trio.Process, why: str) -> None:
        """Replace the guard ``dead`` with a new one, unless that is done already.

        Call with the lock held. Raises ``LifelineError`` if no new guard could be started
        (``dead`` then stays current, and the next attempt replaces it).

        *Cancellation*: shielded, so the pipe, the guard and the set never disagree.
        """
        if self._guard is not dead:
            return
        with trio.CancelScope(shield=True):
            # A guard that still lived would take its pipe's closing for llamaswap's death
            # and kill every model: it must be dead before that pipe closes.
            dead.kill()
            groups = frozenset(self._groups)
            guard, write_fd = await _start_guard(groups)
            old_fd, self._fd, self._guard = self._fd, write_fd, guard
            # Groups reaped while the guard started: their numbers may be reused.
            with contextlib.suppress(OSError):  # the new guard is gone already: the watch sees it
                _write_all(write_fd, _lines(b"-", groups - self._groups))
            status = await dead.wait()
            os.close(old_fd)
        logger.warning(
            "lifeline guard (pid %d) %s (status %d); started a new guard (pid %d) and "
            "re-registered %d model process group(s)",
            dead.pid,
            why,
            status,
            guard.pid,
            len(self._groups),
        )

    async def _watch(self) -> None:
        """Replace the guard whenever it exits, until cancelled by ``open_lifeline``."""
        while True:
            guard = self._guard
            await guard.wait()
            try:
                async with self._lock:
                    await self._replace(guard, "exited while llamaswap runs")
            except LifelineError as exc:
                logger.error("%s; trying again in %gs", exc, GUARD_RETRY_SECONDS)
                await trio.sleep(GUARD_RETRY_SECONDS)

    async def _close(self) -> None:
        """Close the pipe (the guard kills what is still registered) and reap the guard."""
        # -1, not a stale number that the next open file may reuse: a late ``forget`` fails.
        fd, self._fd = self._fd, -1
        os.close(fd)
        with trio.CancelScope(shield=True):
            await self._guard.wait()


async def _start_guard(groups: Collection[int]) -> tuple[trio.Process, int]:
    """A new guard on a new pipe, told about ``groups``; returns it and the pipe's write end.

    Raises:
        LifelineError: the guard could not be started.
    """
    registrations = _lines(b"+", groups)
    # An empty pipe takes PIPE_BUF bytes without blocking: written before the guard starts,
    # they are known to it from its first instant. More must wait for the reader.
    early = len(registrations) <= select.PIPE_BUF
    read_fd, write_fd = os.pipe()
    try:
        if early:
            _write_all(write_fd, registrations)
        guard = await trio.lowlevel.open_process(
            list(GUARD_ARGV), stdin=read_fd, start_new_session=True
        )
    except BaseException as exc:
        os.close(write_fd)
        if isinstance(exc, OSError):
            raise LifelineError(f"cannot start a guard: {exc}") from exc
        raise
    finally:
        os.close(read_fd)
    if not early:
        with contextlib.suppress(OSError):  # it died at once: the watch task replaces it
            _write_all(write_fd, registrations)
    return guard, write_fd


def _lines(sign: bytes, groups: Collection[int]) -> bytes:
    return b"".join(b"%s%d\n" % (sign, group) for group in sorted(groups))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@asynccontextmanager
async def open_lifeline() -> AsyncIterator[Lifeline]:
    """Start the guard and the task that replaces it if it dies; on exit, close the pipe
    and wait for the guard.

    Raises:
        LifelineError: the guard could not be started.

    *Cancellation*: leaving the block always stops the watch task, closes the pipe and
    reaps the guard (shielded; the guard exits as soon as it reads end of file).
    """
    guard, write_fd = await _start_guard(())
    logger.debug("lifeline guard started, pid %d", guard.pid)
    lifeline = Lifeline(guard, write_fd)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lifeline._watch, name="lifeline guard watch")
            yield lifeline
            # Before the pipe closes: its guard's exit then is the point, not a death.
            nursery.cancel_scope.cancel(reason="lifeline closing")
    finally:
        await lifeline._close()
