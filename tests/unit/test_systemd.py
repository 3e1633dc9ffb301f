"""The sd_notify messages, read from a real datagram socket pair (no systemd needed)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from llamaswap._systemd import Notifier, message


def fields(datagram: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in datagram.decode().split("\n"))


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_a_message_is_key_value_lines_and_a_newline_cannot_add_a_field() -> None:
    assert message(READY=1, STATUS="serving") == b"READY=1\nSTATUS=serving"
    assert fields(message(STATUS="a\nWATCHDOG=trigger")) == {"STATUS": "a WATCHDOG=trigger"}


def test_ready_reloading_stopping_reach_the_socket(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    notifier.ready()
    assert fields(sock.recv(4096)) == {"READY": "1", "STATUS": "serving"}
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    reloading = fields(sock.recv(4096))
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert reloading["RELOADING"] == "1"
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after
    notifier.status("serving; models ready: alpha")
    notifier.status("serving; models ready: alpha")  # the same again: not sent
    assert fields(sock.recv(4096)) == {"STATUS": "serving; models ready: alpha"}
    notifier.stopping()
    assert fields(sock.recv(4096)) == {"STOPPING": "1", "STATUS": "shutting down"}
    notifier.status("serving; models ready: none")  # the shutdown's status stays
    notifier.ready()  # a reload the shutdown cancelled says nothing after STOPPING=1
    notifier.send(WATCHDOG=1)  # a last datagram to show that neither above was sent
    assert fields(sock.recv(4096)) == {"WATCHDOG": "1"}
    notifier.close()


def test_an_abstract_socket_name_starts_with_an_at_sign() -> None:
    name = f"llamaswap-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        notifier.ready()
        assert fields(sock.recv(4096))["READY"] == "1"
    finally:
        notifier.close()
        sock.close()


def test_without_notify_socket_nothing_is_enabled() -> None:
    notifier = Notifier.from_env({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    notifier.ready()  # a no-op, no socket opened


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "2000000"}, 1.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 1.0),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_is_half_the_period_and_only_for_our_pid(
    env: dict[str, str], interval: float | None
) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "/nonexistent", **env})
    assert notifier.watchdog_interval == interval


def test_a_failed_send_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "nobody")})
    with caplog.at_level(logging.WARNING, logger="llamaswap"):
        notifier.ready()
        notifier.stopping()
    notifier.close()
    assert [r.message for r in caplog.records if "notify systemd" in r.message] == [
        f"could not notify systemd at {tmp_path / 'nobody'}: [Errno 2] No such file or directory"
    ]


async def test_the_watchdog_pings_every_half_period_until_cancelled(
    listener: tuple[socket.socket, str], autojump_clock: trio.testing.MockClock
) -> None:
    sock, path = listener
    sock.setblocking(False)
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000"})
    async with trio.open_nursery() as nursery:
        await nursery.start(notifier.watchdog)
        await trio.sleep(12)  # pings at 0, 5 and 10 s
        nursery.cancel_scope.cancel()
    notifier.close()
    pings = []
    while True:
        try:
            pings.append(fields(sock.recv(4096)))
        except BlockingIOError:
            break
    assert pings == [{"WATCHDOG": "1"}] * 3
