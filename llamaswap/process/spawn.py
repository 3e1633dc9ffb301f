"""Starting processes: the seam between the supervisor and the operating system.

The supervisor only sees the ``Spawner`` and ``ProcessHandle`` protocols, so its state
machine runs on Trio's mock clock against a fake, and here against real processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, final

import trio

from .lifeline import Lifeline

__all__ = [
    "OUTPUT_DRAIN_SECONDS",
    "ProcessHandle",
    "Spawner",
    "SubprocessHandle",
    "SubprocessSpawner",
]

MAX_LINE_BYTES = 16 * 1024
#: Seconds a process's output is still read after it has exited (a child that left its
#: process group may hold it open).
OUTPUT_DRAIN_SECONDS = 1.0


class ProcessHandle(Protocol):
    """A started process that leads its own process group."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal)."""

    async def wait(self) -> int:
        """Wait for the exit and reap; safe to call from several tasks."""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the whole process group; a group already gone is not an error."""

    async def pump_output(self, sink: Callable[[str], None]) -> None:
        """Call ``sink`` with each line of stdout and stderr until both close."""


class Spawner(Protocol):
    async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> ProcessHandle:
        """Start ``argv`` without a shell, in a new process group, with exactly ``env``.

        Raises:
            OSError: the program could not be executed (not found, not executable).
            ValueError: an argument or variable the OS cannot take (a NUL character).
            LifelineError: llamaswap could not register the process with its lifeline
                guard (llamaswap's own failure; the program never ran).
        """

    async def run(
        self, argv: Sequence[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> int:
        """Run ``argv`` until it exits (used for ``cmdStop``), its output into ``sink``;
        what it leaves in its process group is killed.

        Raises:
            the errors of ``spawn``.
        """


@final
class SubprocessHandle:
    def __init__(self, process: trio.Process, lifeline: Lifeline | None) -> None:
        self._process = process
        self._lifeline = lifeline
        self._reaped = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        code = await self._process.wait()
        if not self._reaped:
            self._reaped = True
            # Whatever the leader left behind in its group dies with it.
            self.signal_group(signal.SIGKILL)
            if self._lifeline is not None:
                self._lifeline.forget(self.pid)
        return code

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def pump_output(self, sink: Callable[[str], None]) -> None:
        stream = self._process.stdout
        assert stream is not None
        await _pump_lines(stream, sink)


#: What ends a line of output: a line feed, or a carriage return alone (a progress bar
#: redrawn in place: each state is a line, and none waits for the bar's end).
_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _pump_lines(stream: trio.abc.ReceiveStream, sink: Callable[[str], None]) -> None:
    pending = b""
    while chunk := await stream.receive_some():
        data, start = pending + chunk, 0
        for end in _LINE_END.finditer(data):
            if end.group() == b"\r" and end.end() == len(data):
                break  # perhaps the first half of a \r\n
            line = data[start : end.start()]
            if line or end.group() != b"\r":  # a redraw after a line break is no line
                sink(_decode(line))
            start = end.end()
        pending = data[start:]
        while len(pending) > MAX_LINE_BYTES:
            cut = _cut(pending, MAX_LINE_BYTES)
            sink(_decode(pending[:cut]))
            pending = pending[cut:]
    if pending := pending.rstrip(b"\r"):
        sink(_decode(pending))


def _cut(data: bytes, limit: int) -> int:
    """Where to cut ``data``, at most ``limit`` bytes in, not inside a UTF-8 character
    (a continuation byte is not a character's first)."""
    cut = limit
    while cut > limit - 3 and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


def _decode(line: bytes) -> str:
    return line.decode("utf-8", errors="replace")


@final
class SubprocessSpawner:
    """Starts real processes, each registered with the lifeline guard when one is given."""

    def __init__(self, lifeline: Lifeline | None = None) -> None:
        self._lifeline = lifeline

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> SubprocessHandle:
        async def start(preexec_fn: Callable[[], None] | None) -> trio.Process:
            return await trio.lowlevel.open_process(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
                preexec_fn=preexec_fn,
            )

        if self._lifeline is None:
            process = await start(None)
        else:
            process = await self._lifeline.spawn(start)
        return SubprocessHandle(process, self._lifeline)

    async def run(
        self, argv: Sequence[str], env: Mapping[str, str], sink: Callable[[str], None]
    ) -> int:
        handle = await self.spawn(argv, env)
        try:
            async with trio.open_nursery() as nursery:
                output_closed = trio.Event()

                async def pump() -> None:
                    try:
                        await handle.pump_output(sink)
                    finally:
                        output_closed.set()

                nursery.start_soon(pump)
                # Done when it exits: what it left in its group is killed then (a helper
                # sent to the background would hold its output open for good).
                code = await handle.wait()
                with trio.move_on_after(OUTPUT_DRAIN_SECONDS):
                    await output_closed.wait()
                nursery.cancel_scope.cancel()
            return code
        finally:
            if handle.returncode is None:
                handle.signal_group(signal.SIGKILL)
                with trio.CancelScope(shield=True):
                    await handle.wait()
