"""``Throttle``, the log filter for a line that repeats, on an injected clock."""

from __future__ import annotations

import logging

from llamaswap.observability.throttle import Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(message: str = "accept returned %s", *args: object) -> logging.LogRecord:
    try:
        raise OSError(24, "Too many open files")
    except OSError as exc:
        error = exc
    return logging.LogRecord(
        "trio.serve_listeners",
        logging.ERROR,
        __file__,
        1,
        message,
        args or ("EMFILE",),
        (type(error), error, error.__traceback__),
    )


def test_one_record_passes_per_interval_without_its_traceback() -> None:
    clock = Clock()
    throttle = Throttle(10.0, clock=clock)
    passed: list[tuple[float, str]] = []
    for step in range(250):  # every 0.125 s for 31.25 s
        clock.now = step * 0.125
        item = record()
        if throttle.filter(item):
            assert item.exc_info is None
            assert item.exc_text is None
            passed.append((clock.now, item.getMessage()))
    assert passed == [
        (0.0, "accept returned EMFILE (logged at most once every 10 s)"),
        (10.0, "accept returned EMFILE (79 more since the last; logged at most once every 10 s)"),
        (20.0, "accept returned EMFILE (79 more since the last; logged at most once every 10 s)"),
        (30.0, "accept returned EMFILE (79 more since the last; logged at most once every 10 s)"),
    ]


def test_after_a_quiet_interval_the_next_record_passes_at_once() -> None:
    clock = Clock()
    throttle = Throttle(10.0, clock=clock)
    assert throttle.filter(record())
    clock.now = 0.5
    assert not throttle.filter(record())
    clock.now = 60.0
    item = record()
    assert throttle.filter(item)
    assert item.getMessage().endswith("(1 more since the last; logged at most once every 10 s)")
    clock.now = 75.0
    item = record()
    assert throttle.filter(item)
    assert item.getMessage().endswith("(logged at most once every 10 s)")


def test_outside_a_trio_run_every_record_passes_as_it_is() -> None:
    throttle = Throttle(10.0)  # trio.current_time(), which raises outside a run
    for _ in range(3):
        item = record()
        assert throttle.filter(item)
        assert item.exc_info is not None
        assert item.getMessage() == "accept returned EMFILE"
