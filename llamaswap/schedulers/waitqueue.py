"""The priority wait queue: where a request waits for its turn.

Two halves, one per concern:

* ``PriorityWaitQueue`` orders waiting items by a sort key. It is pure (no Trio), so the
  schedulers that hold one are tested as synchronous state machines. Push, pop, peek and
  remove are O(log n) (removal is lazy: the entry is marked and skipped when it surfaces).
* ``Waiter`` parks one task until the scheduler wakes it, Trio-natively (like
  ``trio.ParkingLot``, with ``wait_task_rescheduled``). Waking is synchronous. A parked
  task that is cancelled calls its ``on_abandon`` hook *synchronously, from the abort
  callback*: the scheduler removes it from its queue at that very moment, so no later
  decision can pick a request whose client has gone.

**Invariant: a scheduler never wakes an abandoned waiter, and a woken waiter is never
abandoned.** ``on_abandon`` runs inside Trio's cancellation delivery, so it (and every
scheduler effect it causes) must be synchronous and must not deliver a cancellation to
another waiter: effects only reschedule parked tasks, start tasks, and cancel swap tasks.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar, final

import outcome
import trio

__all__ = ["PriorityWaitQueue", "Waiter"]

T = TypeVar("T", bound=Hashable)

_REMOVED: Any = object()


@final
class PriorityWaitQueue(Generic[T]):
    """Items ordered by ascending key, ties broken by insertion order."""

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []  # [key, insertion, item]
        self._entries: dict[T, list[Any]] = {}
        self._insertions = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, item: object) -> bool:
        return item in self._entries

    def push(self, item: T, key: Any) -> None:
        if item in self._entries:
            raise ValueError(f"{item!r} is already queued")
        entry = [key, next(self._insertions), item]
        self._entries[item] = entry
        heapq.heappush(self._heap, entry)

    def remove(self, item: T) -> bool:
        """Take ``item`` out of the queue; False if it was not queued."""
        entry = self._entries.pop(item, None)
        if entry is None:
            return False
        entry[2] = _REMOVED
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._entries):
            self._heap = [e for e in self._heap if e[2] is not _REMOVED]
            heapq.heapify(self._heap)
        return True

    def _surface(self) -> list[Any] | None:
        heap = self._heap
        while heap and heap[0][2] is _REMOVED:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def peek(self) -> T | None:
        """The first item, or ``None`` when empty."""
        entry = self._surface()
        return None if entry is None else entry[2]

    def ordered(self) -> list[T]:
        """Every item, first first. O(n log n): for drains and positions, not picks."""
        return [e[2] for e in sorted(self._entries.values())]

    def __iter__(self) -> Iterator[T]:
        """Every item in no particular order."""
        return iter(list(self._entries))


@final
class Waiter:
    """One task parked until it is granted (``wake()``) or failed (``wake(error)``).

    Args:
        on_abandon: called synchronously if the parked task is cancelled before a wake.
    """

    def __init__(self, on_abandon: Callable[[], None]) -> None:
        self._on_abandon = on_abandon
        self._task: trio.lowlevel.Task | None = None
        self._outcome: outcome.Outcome[None] | None = None

    @property
    def woken(self) -> bool:
        return self._outcome is not None

    def wake(self, error: BaseException | None = None) -> None:
        """Let the waiting task go on, or raise ``error`` in it. Synchronous; once only."""
        if self._outcome is not None:
            raise RuntimeError("waiter woken twice")
        self._outcome = outcome.Value(None) if error is None else outcome.Error(error)
        if self._task is not None:
            task, self._task = self._task, None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        """Park until woken; raises the error given to ``wake``.

        *Cancellation*: cancelled while parked, the waiter calls ``on_abandon`` at once and
        raises ``Cancelled``. Once woken it is no longer cancellable here: the caller owns
        whatever was granted and must release it in a ``finally``.
        """
        if self._outcome is None:
            self._task = trio.lowlevel.current_task()

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                self._task = None
                self._on_abandon()
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        assert self._outcome is not None
        self._outcome.unwrap()
