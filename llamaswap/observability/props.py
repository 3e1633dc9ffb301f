"""What a model's server says of itself at ``GET /props``: the context length that
``/v1/models`` shows as ``context_length``.

llama-server answers ``GET /props`` with ``default_generation_settings.n_ctx`` (a
top-level ``n_ctx`` in some builds): the context one request may fill, its slot's share
of ``--ctx-size``. ``ServerProps.run`` reads it once after each load, off the request
path (a client listing the models never waits for a model server), and keeps it while
the model's process definition (``cmd``, ``env``, ``proxy``, ``checkEndpoint``) stays
the same, after an unload too: the same command starts a server with the same context.
**A model's ``capabilities.context``, when set, is what is shown, and its server is not
asked.** A server that gives no such figure (vLLM has no ``/props``; an error, a slow
answer) leaves it unknown (null), or as an earlier load of the same definition found it.

*Cancellation*: ``run`` ends with ``serve()``'s nursery; a read cut short keeps nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol, final

import trio

from llamaswap.config.model import ModelConfig
from llamaswap.http.client import UpstreamFailed, UpstreamPool
from llamaswap.process import ModelState, ModelStatistics
from llamaswap.router.events import ModelForgotten, ModelStateChanged, RouterEvent
from llamaswap.router.reload import process_definition

__all__ = ["PROPS_TIMEOUT", "ServerProps", "context_length"]

logger = logging.getLogger("llamaswap.observability")

#: Seconds a server has to answer ``GET /props`` after a load.
PROPS_TIMEOUT = 5.0
#: Bytes of a ``GET /props`` answer read at most (llama-server's, with its chat template,
#: is tens of KiB); a larger one says nothing.
PROPS_LIMIT = 1024 * 1024


class Source(Protocol):
    """Where the models' state and definitions are read (the router)."""

    def statistics(self, model: str) -> ModelStatistics: ...

    def definition(self, model: str) -> ModelConfig: ...


def context_length(props: object) -> int | None:
    """The ``n_ctx`` of a decoded ``GET /props`` answer, where it gives one above 0
    (llama-server's router answers 0 for itself)."""
    if not isinstance(props, dict):
        return None
    for place in (props.get("default_generation_settings"), props):
        n_ctx = place.get("n_ctx") if isinstance(place, dict) else None
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
            return n_ctx
    return None


@final
class ServerProps:
    """Each model's context length: its ``capabilities.context``, or what its server said
    after its last load (see the module docstring). Follow the router with ``on_event``; read
    with ``run``."""

    def __init__(self, source: Source, pool: UpstreamPool) -> None:
        self._source = source
        self._pool = pool
        #: By model: the process definition its server ran, and the figure it gave.
        self._found: dict[str, tuple[tuple[Any, ...], int]] = {}
        #: The models ready since ``run`` last looked; ``_wake`` is set when one is added.
        self._loaded: set[str] = set()
        self._wake = trio.Event()

    def on_event(self, event: RouterEvent) -> None:
        """A ``Router.observe`` observer of ``ModelStateChanged`` and ``ModelForgotten``."""
        if isinstance(event, ModelStateChanged) and event.state is ModelState.READY:
            self._loaded.add(event.model)
            self._wake.set()
        elif isinstance(event, ModelForgotten):
            self._found.pop(event.model, None)

    def context_length(self, model: str) -> int | None:
        """``model``'s context length in tokens, or None when unknown."""
        definition = self._source.definition(model)
        if definition.capabilities.context:
            return definition.capabilities.context
        found = self._found.get(model)
        if found is None or found[0] != process_definition(definition):
            return None
        return found[1]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read each model's ``GET /props`` once it is ready, until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                for model in self._loaded:
                    nursery.start_soon(self._read, model, name=f"GET /props of {model}")
                self._loaded.clear()

    async def _read(self, model: str) -> None:
        before = self._statistics(model)
        if before is None or before.state is not ModelState.READY or before.address is None:
            return
        definition = self._source.definition(model)
        if definition.capabilities.context:
            return
        answer = None
        with trio.move_on_after(PROPS_TIMEOUT):
            try:
                request = self._pool.request("GET", before.address, "/props", [], None)
                async with request as response:
                    body = await response.read_at_most(PROPS_LIMIT)
                    if response.status == 200 and body is not None:
                        answer = json.loads(body)
            # ValueError: not JSON; RecursionError: nested deeper than Python parses. A
            # model server's answer, whatever it is, never stops llamaswap.
            except (UpstreamFailed, ValueError, RecursionError):
                return
        n_ctx = context_length(answer)
        after = self._statistics(model)
        # The same run is still ready, so it ran this definition: a reload that changes
        # the process stops the running one at once, and the next is another run.
        if (
            n_ctx is not None
            and after is not None
            and after.state is ModelState.READY
            and after.ready_since == before.ready_since
        ):
            self._found[model] = (process_definition(definition), n_ctx)
            logger.debug("model %r: context length %d (GET /props)", model, n_ctx)

    def _statistics(self, model: str) -> ModelStatistics | None:
        """``model``'s statistics; None once a reload removed it and it is forgotten."""
        try:
            return self._source.statistics(model)
        except KeyError:
            return None
