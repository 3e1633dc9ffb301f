"""Ollama's model routes, answered by llamaswap: ``GET /api/tags``, ``GET /api/ps`` and
``POST /api/show``.

Clients that speak Ollama's API find their models here before they chat (an editor's
model picker reads ``/api/tags``, then ``/api/show`` for a model's context length and
capabilities). llamaswap answers from its config and its models' state, and says only
what it knows: a figure it does not have is an empty string or 0, never a guess. It does
not read the model files, so a model's family, parameter count and quantization are
empty, and ``general.architecture`` is ``"llamaswap"``, under which ``model_info`` carries
the context length where the model's server or its config told it.

The listing is ``/v1/models``' (``listed_names``): the same names in the same order.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from llamaswap.config import Capabilities, ModelConfig
from llamaswap.errors import BadRequest, ModelNotFound
from llamaswap.router import Router
from llamaswap.router.names import Local

from .extract import Payload
from .gpu import memory_entry
from .operations import iso_time, json_response, listed_names, to_wall_clock

__all__ = ["capabilities", "details", "digest", "register"]

#: ``model_info``'s architecture: llamaswap does not read the model's file.
ARCHITECTURE = "llamaswap"
#: ``expires_at`` of a model that no idle timer unloads (a ttl of 0): what Ollama sends
#: for a model kept loaded (``keep_alive`` -1), a time far ahead.
NEVER = "2318-08-13T00:00:00Z"


def digest(*parts: str) -> str:
    """A stable 64-hex-digit name for what ``parts`` describe (Ollama's is its file's)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def details(model: ModelConfig | None) -> dict[str, Any]:
    """``details``: the file's format where the command names a ``.gguf``, else nothing."""
    gguf = model is not None and any(word.lower().endswith(".gguf") for word in model.cmd)
    return {
        "parent_model": "",
        "format": "gguf" if gguf else "",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def capabilities(known: Capabilities) -> list[str]:
    """Ollama's capability words for what the config's ``capabilities`` say: every model
    completes text unless it is a reranker; ``tools`` and ``vision`` where declared."""
    found = [] if known.reranker else ["completion"]
    if known.tools:
        found.append("tools")
    if "image" in known.in_:
        found.append("vision")
    return found


def register(
    quart: QuartTrio, router: Router, context_length: Callable[[str], int | None]
) -> None:
    """Add ``/api/tags``, ``/api/ps`` and ``/api/show``; ``context_length``: a model's, in
    tokens, where known (``ServerProps.context_length``)."""
    loaded_at = iso_time(time.time())  # when the config was first read: modified_at

    def size(model_id: str) -> int:
        need = memory_entry(router.resources, model_id)["memory"]
        return sum(need.values()) if need else 0

    def model_of(name: str) -> str | None:
        """The local model ``name`` reaches; None for a selector or a peer's."""
        if router.names.selector(name) is not None:
            return None
        target = router.names.resolve(name)
        return target.model_id if isinstance(target, Local) else None

    def entry(name: str) -> dict[str, Any]:
        model_id = model_of(name)
        model = None if model_id is None else router.config.models[model_id]
        return {
            "name": name,
            "model": name,
            "modified_at": loaded_at,
            "size": 0 if model_id is None else size(model_id),
            "digest": digest(name, *(model.cmd if model is not None else ())),
            "details": details(model),
        }

    @quart.get("/api/tags")
    async def tags() -> Response:
        return json_response({"models": [entry(name) for name in listed_names(router)]})

    @quart.get("/api/ps")
    async def ps() -> Response:
        now, wall_now = trio.current_time(), time.time()
        running = []
        for model_id in router.known_models():
            stats = router.statistics(model_id)
            if stats.shown_state != "ready":
                continue
            left = stats.ttl_left(now)
            ttl = router.definition(model_id).idle_ttl
            if ttl is None:
                expires = NEVER
            else:  # unloaded when idle that long from now (or from when it last ended)
                seconds = left if left is not None else ttl
                expires = iso_time(to_wall_clock(now + seconds, now=now, wall_now=wall_now))
            found = entry(model_id)
            running.append(found | {"expires_at": expires, "size_vram": found["size"]})
        return json_response({"models": running})

    @quart.post("/api/show")
    async def show() -> Response:
        body = Payload(await request.get_data(True, False, False), "application/json").json()
        name = body.get("model") or body.get("name")  # older clients send "name"
        if not isinstance(name, str):
            raise BadRequest("the request names no model: set the 'model' field", param="model")
        target = router.names.resolve(name)  # ModelNotFound for a name nothing answers
        if not isinstance(target, Local):
            raise ModelNotFound(name, peer=target.peer_id)
        model = router.config.models[target.model_id]
        info: dict[str, Any] = {"general.architecture": ARCHITECTURE}
        if (length := context_length(target.model_id)) is not None:
            info[f"{ARCHITECTURE}.context_length"] = length
        return json_response(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": details(model),
                "model_info": info,
                "capabilities": capabilities(model.capabilities),
                "modified_at": loaded_at,
            }
        )
