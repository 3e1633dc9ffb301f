"""What a scheduler takes from the configuration: limits and priorities by model ID."""

from __future__ import annotations

from llamaswap.config.model import DEFAULT_CONCURRENCY_LIMIT, Config

__all__ = ["concurrency", "fifo_priorities", "limits", "model_slots", "preemptible"]


def limits(config: Config) -> dict[str, int]:
    """``concurrencyLimit`` per model ID, for the models that set it."""
    return {
        model_id: model.concurrency_limit
        for model_id, model in config.models.items()
        if model.concurrency_limit is not None
    }


def model_slots(config: Config) -> dict[str, int]:
    """``slots`` per model ID, for the models that set it (``serial`` only)."""
    return {
        model_id: model.slots
        for model_id, model in config.models.items()
        if model.slots is not None
    }


def concurrency(config: Config, model_id: str) -> int:
    """How many requests for ``model_id`` may be served at once: its ``slots`` under
    ``serial``, its ``concurrencyLimit`` under ``fifo`` (each with its default)."""
    model = config.models.get(model_id)
    if config.routing.scheduler.use == "serial":
        serial = config.routing.scheduler.settings.serial
        return serial.slots if model is None or model.slots is None else model.slots
    if model is None or model.concurrency_limit is None:
        return DEFAULT_CONCURRENCY_LIMIT
    return model.concurrency_limit


def fifo_priorities(config: Config) -> dict[str, int]:
    """``settings.fifo.priority`` by model ID (names given as aliases resolved)."""
    priorities: dict[str, int] = {}
    for name, value in config.routing.scheduler.settings.fifo.priority.items():
        model_id = config.resolve(name)
        if model_id is not None:
            priorities[model_id] = value
    return priorities


def preemptible(config: Config, model_id: str) -> bool:
    """Whether requests for ``model_id`` may be preempted at all: under ``serial`` with
    ``preempt``, for a model whose ``preemptible`` is on (a request may still opt out, or
    be a generation that cannot be resumed)."""
    scheduler = config.routing.scheduler
    return (
        scheduler.use == "serial"
        and scheduler.settings.serial.preempt
        and config.models[model_id].preemptible
    )
