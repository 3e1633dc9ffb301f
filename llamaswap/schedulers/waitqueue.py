"""The priority wait queue: the order in which waiting requests are considered.

``PriorityWaitQueue`` orders waiting items by a sort key. It is pure (no Trio), so the
schedulers that hold one are tested as synchronous state machines. Push, peek and remove
are O(log n) (removal is lazy: the entry is marked and skipped when it surfaces). Where the
request's *task* waits — parked Trio-natively until the scheduler's decision is applied —
is the router's ``Lease`` (``router/lease.py``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from typing import Any, Generic, TypeVar, final

__all__ = ["PriorityWaitQueue"]

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
