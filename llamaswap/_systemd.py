"""Telling systemd how llamaswap is doing: the sd_notify protocol, without a dependency.

A ``Type=notify`` service is started by systemd with ``$NOTIFY_SOCKET`` naming an AF_UNIX
datagram socket (a name starting with ``@`` is in the abstract namespace). Each message
is one datagram of ``KEY=value`` lines (sd_notify(3)): ``READY=1`` once every listener
listens, ``RELOADING=1`` (with ``MONOTONIC_USEC``, which ``Type=notify-reload`` requires)
then ``READY=1`` around a SIGHUP reload, ``STOPPING=1`` when the shutdown starts, and
``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` from a task of the serving nursery, so an
event loop that hangs stops pinging and systemd restarts the service.

Without ``$NOTIFY_SOCKET`` every call is a no-op. Sending never blocks the event loop
(the socket is non-blocking) and never raises: the first failure is logged, later ones
are not.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

import trio

__all__ = ["Notifier", "message"]

logger = logging.getLogger("llamaswap")


def message(**fields: str | int) -> bytes:
    """One datagram of ``KEY=value`` lines; a newline inside a value would start a new
    (bogus) field, so it becomes a space."""
    lines = (f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
    return "\n".join(lines).encode()


def _address(name: str) -> str | bytes:
    """The socket address of ``$NOTIFY_SOCKET``: ``@name`` is the abstract ``\\0name``."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()
    return name


def _watchdog_interval(environ: Mapping[str, str]) -> float | None:
    """Seconds between pings: half ``$WATCHDOG_USEC``, when the watchdog is ours.

    ``$WATCHDOG_PID``, when set, names the process systemd expects the pings from; a
    child that inherited the environment must not ping for its parent.
    """
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
        pid = int(environ.get("WATCHDOG_PID") or os.getpid())
    except ValueError:
        return None
    if usec <= 0 or pid != os.getpid():
        return None
    return usec / 2 / 1_000_000


class Notifier:
    """The notify socket, if systemd gave one; see the module docstring."""

    def __init__(self, path: str | None, watchdog_interval: float | None = None) -> None:
        self._address = _address(path) if path else None
        self._socket: socket.socket | None = None
        self._failed = False
        self._stopping = False
        self._status = ""
        self.watchdog_interval = watchdog_interval if self._address is not None else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET") or None, _watchdog_interval(env))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, **fields: str | int) -> None:
        """Send one message; a failure is logged once and otherwise ignored."""
        if self._address is None:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                )
                self._socket.setblocking(False)
            self._socket.sendto(message(**fields), self._address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                logger.warning("could not notify systemd at %s: %s", self._address, exc)

    def ready(self, status: str = "serving") -> None:
        """``READY=1``, unless the shutdown has begun (a SIGHUP reload that the shutdown
        cancels ends by calling this: systemd must not read the service ready again)."""
        if not self._stopping:
            self._status = status
            self.send(READY=1, STATUS=status)

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send(RELOADING=1, MONOTONIC_USEC=usec, STATUS="reloading the configuration")

    def status(self, status: str) -> None:
        """A new ``STATUS=`` line (``systemctl status`` shows it) when it differs from the
        last one, unless the shutdown has begun: "shutting down" stays while models stop."""
        if not self._stopping and status != self._status:
            self._status = status
            self.send(STATUS=status)

    def stopping(self) -> None:
        self._stopping = True
        self.send(STOPPING=1, STATUS="shutting down")

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def watchdog(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Ping every half watchdog period until cancelled (with the serving nursery).

        It runs on the event loop on purpose: a loop that hangs stops pinging.
        """
        task_status.started()
        if self.watchdog_interval is None:
            return
        while True:
            self.send(WATCHDOG=1)
            await trio.sleep(self.watchdog_interval)
