"""The lifecycle of a model process, as an enum with its transition table."""

from __future__ import annotations

import enum

__all__ = ["ModelState", "check_transition"]


class ModelState(str, enum.Enum):
    """Where a model's server is in its life.

    ``stopped`` → ``starting`` → ``ready`` → ``stopping`` → ``stopped``; a process that
    exits by itself goes straight to ``stopped`` from ``starting`` or ``ready``.
    """

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


_ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.STOPPED: frozenset({ModelState.STARTING}),
    ModelState.STARTING: frozenset({ModelState.READY, ModelState.STOPPING, ModelState.STOPPED}),
    ModelState.READY: frozenset({ModelState.STOPPING, ModelState.STOPPED}),
    ModelState.STOPPING: frozenset({ModelState.STOPPED}),
}

_WHY_NOT: dict[ModelState, str] = {
    ModelState.STOPPED: "a stopped model can only start",
    ModelState.STARTING: "a starting model becomes ready, or stops",
    ModelState.READY: "a ready model can only stop",
    ModelState.STOPPING: "a stopping model can only finish stopping",
}


def check_transition(model: str, old: ModelState, new: ModelState) -> None:
    """Raise ``RuntimeError`` if ``old → new`` is not in the transition table."""
    if new not in _ALLOWED[old]:
        raise RuntimeError(
            f"model {model!r}: illegal transition {old.value} → {new.value}: {_WHY_NOT[old]}"
        )
