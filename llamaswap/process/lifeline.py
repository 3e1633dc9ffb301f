"""Model processes die with llamaswap, however llamaswap dies.

Linux's parent-death signal (``PR_SET_PDEATHSIG``) does not work here: Trio forks from a
worker thread and the signal fires when that *thread* exits, which Trio does after about
ten idle seconds, killing a healthy model. Instead, a tiny guard process (``_guard.py``)
reads a pipe whose only write end llamaswap holds. Each model child writes ``+PID`` into
the pipe from ``preexec_fn``, after ``fork`` and before ``exec``, so there is no moment at
which a model runs unregistered; the write end is close-on-exec, so the model itself never
holds it. When llamaswap exits, even by ``kill -9``, the kernel closes the pipe and the
guard SIGKILLs every process group still registered.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import final

import trio

__all__ = ["Lifeline", "open_lifeline"]

_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.py")


@final
class Lifeline:
    """The write end of the guard's pipe."""

    def __init__(self, write_fd: int) -> None:
        self._fd = write_fd

    def register_self(self) -> None:
        """``preexec_fn`` for a model child: register its own process group.

        Runs in the forked child before ``exec``; the child leads a new session, so its
        process group ID is its PID.
        """
        os.write(self._fd, b"+%d\n" % os.getpid())

    def forget(self, pgid: int) -> None:
        """The group's leader has been reaped: the guard must not kill that number later."""
        with contextlib.suppress(OSError):  # the guard is gone; nothing left to tell
            os.write(self._fd, b"-%d\n" % pgid)


@asynccontextmanager
async def open_lifeline() -> AsyncIterator[Lifeline]:
    """Start the guard process; on exit, close the pipe and wait for the guard.

    *Cancellation*: leaving the block always closes the pipe and reaps the guard
    (shielded; the guard exits as soon as it reads end of file).
    """
    read_fd, write_fd = os.pipe()
    try:
        guard = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", _GUARD], stdin=read_fd, start_new_session=True
        )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    try:
        yield Lifeline(write_fd)
    finally:
        os.close(write_fd)
        with trio.CancelScope(shield=True):
            await guard.wait()
