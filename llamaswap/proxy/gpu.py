"""``GET /api/resources``, and each model's memory in ``/running`` and ``/v1/models``.

Everything comes from the router's ``Resources`` (``llamaswap/resources/book.py``): the
devices as last sampled, their budgets, each model's need (declared or learned) and what
its processes hold. Without a GPU probe, ``probe`` is null and ``absent`` says why; the
devices are then only those declared (and ``cpu`` where a model names it).
"""

from __future__ import annotations

from typing import Any

from quart import Response
from quart_trio import QuartTrio

from llamaswap.process import ModelState
from llamaswap.resources import DeviceView, Resources
from llamaswap.router import Router

from .operations import json_response

__all__ = ["memory_entry", "register", "resources_document"]


def memory_entry(resources: Resources, model: str) -> dict[str, Any]:
    """A model's memory: its need by device and where the figure comes from (null when
    unknown), and what its processes hold now."""
    memory = resources.memory(model)
    need = memory.need
    return {
        "memory": None if need is None else dict(need.sizes),
        "memory_source": None if need is None else need.source,
        "memory_held": dict(memory.held),
    }


def _device(view: DeviceView) -> dict[str, Any]:
    return {
        "name": view.name,
        "label": view.label,
        "total": view.total,
        "used": view.used,
        "budget": view.budget,
        "headroom": view.headroom,
        "utilization": view.utilization,
        "temperature": view.temperature,
        "power": view.power,
        "source": view.source,
        "models": dict(view.holders),
    }


def resources_document(router: Router) -> dict[str, Any]:
    """The ``/api/resources`` document."""
    resources = router.resources
    probe = resources.probe
    models = {}
    for model in router.shown_models():
        models[model] = {
            "state": router.statistics(model).shown_state,
            **memory_entry(resources, model),
            "load_seconds": resources.load_seconds(model),
            "serve_seconds": resources.serve_seconds(model),
        }
    waiting: dict[str, int] = {}
    for info in router.requests():
        if (
            info.state in ("queued", "loading")
            and router.model_state(info.model) is not ModelState.READY
        ):
            waiting[info.model] = waiting.get(info.model, 0) + 1
    return {
        "probe": None if probe is None else probe.name,
        "absent": resources.absent or None,
        "devices": [_device(view) for view in resources.devices()],
        "models": models,
        "waiting": [
            {"model": model, "requests": count, "memory": models.get(model, {}).get("memory")}
            for model, count in waiting.items()
        ],
    }


def register(quart: QuartTrio, router: Router) -> None:
    """Add ``GET /api/resources``."""

    @quart.get("/api/resources")
    async def resources() -> Response:
        return json_response(resources_document(router))
