"""The Trio half of the wait queue: parking, waking, abandoning."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llamaswap.errors import ModelUnloaded
from llamaswap.schedulers.waitqueue import PriorityWaitQueue, Waiter


async def test_wake_before_wait_returns_at_once() -> None:
    waiter = Waiter(lambda: pytest.fail("not abandoned"))
    waiter.wake()
    await waiter.wait()
    assert waiter.woken


async def test_wake_after_parking_resumes_the_task(nursery: trio.Nursery) -> None:
    waiter = Waiter(lambda: pytest.fail("not abandoned"))
    resumed = trio.Event()

    async def park() -> None:
        await waiter.wait()
        resumed.set()

    nursery.start_soon(park)
    await trio.testing.wait_all_tasks_blocked()
    assert not resumed.is_set()
    waiter.wake()
    await resumed.wait()


async def test_wake_with_an_error_raises_it() -> None:
    waiter = Waiter(lambda: pytest.fail("not abandoned"))
    waiter.wake(ModelUnloaded("m"))
    with pytest.raises(ModelUnloaded):
        await waiter.wait()
    with pytest.raises(RuntimeError, match="woken twice"):
        waiter.wake()


async def test_cancelled_waiter_calls_on_abandon_synchronously() -> None:
    calls: list[bool] = []
    waiter = Waiter(lambda: calls.append(waiter.woken))
    with trio.CancelScope() as scope:
        scope.deadline = trio.current_time()  # cancels at the first checkpoint
        await waiter.wait()
    assert scope.cancelled_caught
    assert calls == [False]


async def test_a_woken_waiter_is_not_abandoned_by_a_late_cancel() -> None:
    waiter = Waiter(lambda: pytest.fail("woken waiters are never abandoned"))
    waiter.wake()
    with trio.CancelScope() as scope:
        scope.cancel()
        await waiter.wait()  # returns: what was granted is the caller's to release
    assert not scope.cancelled_caught


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
