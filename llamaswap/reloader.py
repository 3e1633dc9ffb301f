"""Reloading the configuration while serving (SPEC §3.7): SIGHUP, the API, a file watch.

Every trigger ends in ``Reloader.reload``: read and validate the file first — an invalid
one changes nothing, and every problem is logged with its key path — then hand the new
configuration to ``Router.reconfigure``, which applies it model by model. Reloads run
one at a time. Each is counted (``llamaswap_config_reloads_total{result}``), and the time
of the last success is kept.

A file that defines no model and has no ``[models]`` table is refused while models are
configured (``load_config(replacing=...)``): an empty or half-written file must not remove
them all, while an empty ``[models]`` table really means "no models".

``--watch-config`` watches the file's *directory* with ``watchfiles`` (its async API
runs on Trio through anyio): an editor that saves by writing a new file and renaming it
over the old one replaces the inode, which a watch on the file itself would lose. A burst
of writes is one reload, once the file has *settled*: no change for ``SETTLE_DELAY``
seconds after the last one, on Trio's clock. A writer that truncates the file and then
writes it (a shell's ``>``, many scripts) is thus read once, complete, not empty first;
changes during a reload lead to one more reload once they have settled too.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterable, Callable, Collection
from contextlib import aclosing
from functools import partial
from typing import Any, final
from urllib.parse import urlsplit

import attrs
import trio
import watchfiles

from llamaswap.config import Config, load_config
from llamaswap.errors import ConfigError
from llamaswap.router import Router
from llamaswap.router.reload import ConfigChanges

__all__ = ["ReloadResult", "Reloader"]

logger = logging.getLogger("llamaswap.reload")

#: Milliseconds of quiet in which ``watchfiles`` gathers changes into one set.
DEBOUNCE_MS = 50
#: Seconds the watched file must be left unchanged, after its last change, to be reloaded.
SETTLE_DELAY = 0.5
#: How often the watch thread returns, so that cancelling the watch is prompt.
WATCH_STEP_MS = 250
#: Seconds a reload may take to read and check the file.
READ_TIMEOUT = 10.0


@attrs.frozen
class ReloadResult:
    ok: bool
    trigger: str
    changes: ConfigChanges | None = None
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        changed = None if self.changes is None else self.changes.to_json()
        return {
            "ok": self.ok,
            "trigger": self.trigger,
            "changed": changed,
            "problems": list(self.problems),
        }


@final
class Reloader:
    """Reloads ``path`` into ``router``.

    Args:
        path: the configuration file llamaswap was started with.
        router: applies each new configuration.
        on_result: told of every reload (metrics, events); must not block.
    """

    def __init__(
        self,
        path: str,
        router: Router,
        on_result: Callable[[ReloadResult], None] = lambda _: None,
    ) -> None:
        self.path = os.path.abspath(path)
        self._router = router
        self._on_result = on_result
        self._lock = trio.Lock()
        #: The file is read on a thread of its own, one read at a time. A read that hangs (a
        #: hung network mount) keeps it, and later reloads time out waiting for it: a
        #: thread left behind by each reload held one of Trio's 40 default worker tokens for
        #: good, and once they were gone nothing else got a thread (the activity store,
        #: looking up a model's host name to connect to it).
        self._reader = trio.CapacityLimiter(1)
        self._closed = False
        self.last_success: float | None = None  # wall-clock time (for metrics and the UI)

    def close(self) -> None:
        """llamaswap is shutting down: a reload in progress, or asked for later, fails."""
        self._closed = True

    async def reload(self, trigger: str) -> ReloadResult:
        """Validate the file, then apply it; an invalid file changes nothing.

        Reading the file may take at most ``READ_TIMEOUT`` seconds (a hung network mount
        must not hold reloads, and shutdown, forever); a read still hung from an earlier
        reload counts against it.

        *Cancellation*: validation is abandoned at once (its thread is left to finish on
        its own); once applying has begun it finishes (shielded), so a configuration is
        never half applied.
        """
        async with self._lock:
            config, problems = await self._read()
            if config is not None and self._closed:
                problems = ("llamaswap is shutting down; the running config stays",)
            if config is None or problems:
                result = ReloadResult(False, trigger, problems=problems)
            else:
                with trio.CancelScope(shield=True):
                    changes = await self._router.reconfigure(config)
                result = ReloadResult(True, trigger, changes=changes)
                self.last_success = trio.current_time()
            self._report(result)
            return result

    async def _read(self) -> tuple[Config | None, tuple[str, ...]]:
        """The file's configuration, or why there is none."""
        running = tuple(self._router.config.models)
        load = partial(load_config, self.path, keep=self._own_ports(), replacing=running)
        try:
            with trio.fail_after(READ_TIMEOUT):
                read = trio.to_thread.run_sync(load, abandon_on_cancel=True, limiter=self._reader)
                return await read, ()
        except ConfigError as exc:
            return None, tuple(problem.render(exc.file) for problem in exc.problems)
        except trio.TooSlowError:
            return None, (
                f"{self.path}: not read within {READ_TIMEOUT:g} s; is it on a hung mount?",
            )

    def _own_ports(self) -> dict[str, int]:
        """The port of each of the running configuration's models: a model keeps it across
        the reload (a new model taking the first place in sorted order moves no other)."""
        ports = {}
        for model_id, model in self._router.config.models.items():
            with contextlib.suppress(ValueError):
                if (port := urlsplit(model.proxy).port) is not None:
                    ports[model_id] = port
        return ports

    def _report(self, result: ReloadResult) -> None:
        if result.ok:
            assert result.changes is not None
            logger.info(
                "reloaded %s (%s): %s", self.path, result.trigger, result.changes.describe()
            )
            for key in result.changes.at_start:
                logger.warning("reload: %s changed; it applies when llamaswap starts again", key)
        else:
            logger.error(
                "reload (%s) failed; the running config stays. %d problem(s):",
                result.trigger,
                len(result.problems),
            )
            for problem in result.problems:
                logger.error("  %s", problem)
        self._on_result(result)

    async def watch(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reload whenever the file changes (``--watch-config``; with ``--config DIR``,
        any ``*.toml`` directly in it), until cancelled."""
        if await trio.Path(self.path).is_dir():
            directory, name = self.path, None
        else:
            directory, name = os.path.split(self.path)

        def is_ours(_: watchfiles.Change, changed: str) -> bool:
            if name is None:
                return changed.endswith(".toml")
            return os.path.basename(changed) == name

        changes = watchfiles.awatch(
            directory,
            watch_filter=is_ours,
            debounce=DEBOUNCE_MS,
            rust_timeout=WATCH_STEP_MS,
            yield_on_timeout=True,  # an empty set each step: the first one says "armed"
            recursive=False,
        )
        async with aclosing(changes):
            await self.follow(changes, task_status=task_status)

    async def follow(
        self,
        changes: AsyncIterable[Collection[object]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Reload once the file has settled after each burst of ``changes`` (sets of
        changes to the file, an empty set when there was none; the first set means the
        watch is armed), until cancelled or ``changes`` ends."""
        # Size 1: a change during a settle or a reload needs one more reload, not one each.
        send, receive = trio.open_memory_channel[None](1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reload_settled, receive)
            async with send:
                armed = False
                async for changed in changes:
                    if not armed:
                        armed = True
                        logger.info("watching %s: each saved change reloads it", self.path)
                        task_status.started()
                    if changed:
                        with contextlib.suppress(trio.WouldBlock):
                            send.send_nowait(None)

    async def _reload_settled(self, changed: trio.MemoryReceiveChannel[None]) -> None:
        async with changed:
            async for _ in changed:
                while True:  # until SETTLE_DELAY passes with no further change
                    with trio.move_on_after(SETTLE_DELAY) as quiet:
                        try:
                            await changed.receive()
                        except trio.EndOfChannel:
                            return  # the watch ended while the file was changing
                    if quiet.cancelled_caught:
                        break
                await self.reload("file changed")
