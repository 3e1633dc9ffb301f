from __future__ import annotations

import pytest

from llamaswap.process.logring import LogRing
from llamaswap.process.state import ModelState, check_transition


def test_lifecycle_transitions_are_allowed() -> None:
    S = ModelState
    for old, new in [
        (S.STOPPED, S.STARTING),
        (S.STARTING, S.READY),
        (S.STARTING, S.STOPPED),
        (S.READY, S.STOPPING),
        (S.READY, S.STOPPED),
        (S.STOPPING, S.STOPPED),
    ]:
        check_transition("m", old, new)


def test_illegal_transition_explains_itself() -> None:
    with pytest.raises(RuntimeError, match=r"model 'm': illegal transition stopped → ready"):
        check_transition("m", ModelState.STOPPED, ModelState.READY)
    with pytest.raises(RuntimeError, match="a stopping model can only finish stopping"):
        check_transition("m", ModelState.STOPPING, ModelState.STARTING)


def test_log_ring_is_bounded_and_notifies() -> None:
    ring = LogRing(capacity=3)
    seen: list[str] = []
    unsubscribe = ring.subscribe(lambda line: seen.append(line.text))
    for i in range(5):
        ring.append(float(i), f"line {i}")
    assert [line.text for line in ring.lines()] == ["line 2", "line 3", "line 4"]
    assert ring.tail(2) == ["line 3", "line 4"]
    assert ring.tail(10) == ["line 2", "line 3", "line 4"]
    unsubscribe()
    ring.append(5.0, "line 5")
    assert seen == [f"line {i}" for i in range(5)]
