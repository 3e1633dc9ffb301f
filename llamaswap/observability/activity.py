"""The activity log (SPEC §9.2): one record per proxied request, newest first, bounded."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping
from typing import Any, final

import attrs

__all__ = ["ActivityLog", "ActivityRecord"]


@attrs.frozen
class ActivityRecord:
    """What happened to one request.

    ``priority``/``band``/``score``/``queue_wait_ms`` describe its time with the scheduler
    (``score`` is ``None`` unless ``serial`` picked it); token counts come from the
    response's ``usage`` when it reports one; ``metadata`` is whatever the handlers on the
    request's path added.
    """

    id: int
    time: str
    model: str
    method: str
    path: str
    status: int
    duration_ms: float
    queue_wait_ms: float | None
    scheduler: str | None
    priority: int
    band: str
    score: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None
    metadata: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        document = attrs.asdict(self, recurse=False)
        document["metadata"] = dict(self.metadata)
        return document


@final
class ActivityLog:
    """The last ``capacity`` records, in memory."""

    def __init__(self, capacity: int = 1000) -> None:
        self._records: collections.deque[ActivityRecord] = collections.deque(maxlen=capacity)
        self._ids = itertools.count(1)
        self._listeners: list[Callable[[ActivityRecord], None]] = []

    def next_id(self) -> int:
        return next(self._ids)

    def add_listener(self, listener: Callable[[ActivityRecord], None]) -> None:
        """``listener`` is told of each record as it is added (events); must not raise."""
        self._listeners.append(listener)

    def add(self, record: ActivityRecord) -> None:
        self._records.append(record)
        for listener in self._listeners:
            listener(record)

    def recent(self, limit: int = 100, model: str | None = None) -> list[ActivityRecord]:
        """Up to ``limit`` records, newest first, optionally only those of ``model``."""
        found: list[ActivityRecord] = []
        for record in reversed(self._records):
            if len(found) >= limit:
                break
            if model is None or record.model == model:
                found.append(record)
        return found
