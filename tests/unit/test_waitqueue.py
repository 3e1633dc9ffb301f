"""The priority wait queue: order, removal, compaction (pure)."""

from __future__ import annotations

import pytest

from llamaswap.schedulers.waitqueue import PriorityWaitQueue


def test_priority_wait_queue_orders_and_removes() -> None:
    queue: PriorityWaitQueue[str] = PriorityWaitQueue()
    for item, key in [("c", 3), ("a", 1), ("b", 2), ("a2", 1)]:
        queue.push(item, key)
    assert len(queue) == 4
    assert queue.peek() == "a"
    assert queue.remove("a")
    assert not queue.remove("a")
    assert "a" not in queue
    assert queue.ordered() == ["a2", "b", "c"]  # ties: insertion order
    assert queue.peek() == "a2"
    assert queue.remove("a2")
    assert queue.peek() == "b"
    assert sorted(queue) == ["b", "c"]
    with pytest.raises(ValueError, match="already queued"):
        queue.push("b", 0)


def test_priority_wait_queue_compacts_after_many_removals() -> None:
    queue: PriorityWaitQueue[int] = PriorityWaitQueue()
    for i in range(1000):
        queue.push(i, -i)
    for i in range(999):
        queue.remove(i)
    assert len(queue) == 1
    assert len(queue._heap) < 200
    assert queue.peek() == 999
    assert queue.remove(999)
    assert queue.peek() is None
