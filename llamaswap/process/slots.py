"""Keeping a model server's KV cache across a swap: its slots saved to files before a swap
stops it, and restored after its next load.

The problem. A swap stops a model's server, and its KV cache goes with it: the prompt each
slot last processed. When the model comes back, a returning conversation, or a request
resumed after a preemption, pays its whole prefill again ("it has to do the prefill again
whenever a model swap happens", llama.cpp #28998), which for a long context is most of
the request's time. llama-server can write a slot's cache to a file and read it back
(``POST /slots/{id}?action=save|restore`` with ``{"filename": ...}``, in the directory
its ``--slot-save-path`` names); no other model-swapping proxy uses that across a swap.

The design. For a model whose ``slotSavePath`` is set (the same directory as its server's
``--slot-save-path``), the router calls:

* ``save`` before a swap stops the model (evicted while ready): ``GET /slots``, then
  ``action=save`` for each slot that does not say it is empty, to a file llamaswap
  names; then the model's files that no longer hold anything go (a save that wrote no
  token, ``n_saved`` 0, included), and the disk bound is applied.
* ``restore`` after the model's next load, before the swap's waiters are granted:
  ``action=restore`` for each file of the model's current definition. The files stay:
  a later load (after a TTL unload, say, which saves nothing) restores them again.
* ``forget`` when a model a reload removed is forgotten: its files are deleted.

A file's name says whose it is: ``llamaswap-{model}-{definition}-slot{id}.bin``, the
model's ID escaped to a safe file name (``file_stem``) and a hash of its ``cmd`` and
``env`` (``definition_tag``). A cache is only restored into a server started the same
way: a KV cache restored into another model of the same shape (a fine-tune after an
edit of ``cmd``) would be read without complaint, and answer wrongly. Files of an
earlier definition go at the model's next save, or under the disk bound.

Bounds. On disk, the files llamaswap named, in every slot directory it knows of, are kept
to ``slotSaveLimit`` bytes after each save, the least recently saved or restored going
first (``over_limit``; a restore touches its file), but for the files of the model the
swap is loading, which it restores a moment later. In time, a model's whole save or
restore takes at most ``SLOT_TIMEOUT`` seconds: a swap waits that long at most for its
saves (side by side, one per evicted model), and that long for its restore.

**A slot save or restore never fails a load or a swap**: whatever goes wrong (the server
refuses, answers nonsense, is too slow, the directory is not the one it saves in) is
logged once, at warning, with what was done before it, and the swap goes on.

Rejected: saving after every request (a write of the whole cache per request, whether the
model is ever swapped out or not); restoring at the first request (it would wait for the
restore all the same, and the grant would no longer mean "ready to serve"); keeping the
files in llamaswap's own store (the server writes them itself, in its own directory).

*Cancellation*: ``save`` and ``restore`` are cancelled with the swap that runs them (its
waiters left, or the shutdown): the request in flight is abandoned, its connection closed.
A file the server wrote anyway is a valid cache, and counts under the bound at the next
save. File work runs in worker threads abandoned on cancel (deleting or stat-ing a few
files: nothing to leave half done that matters).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import string
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable
from contextlib import aclosing
from functools import partial
from typing import Any, Protocol, TypeGuard, final

import attrs
import trio

from llamaswap.config.model import Config, ModelConfig
from llamaswap.http.client import UpstreamFailed, UpstreamPool

__all__ = [
    "SLOT_TIMEOUT",
    "NoSlots",
    "SlotFile",
    "SlotKeeper",
    "Slots",
    "definition_tag",
    "file_stem",
    "over_limit",
    "parse_slot_file",
    "slot_file",
]

logger = logging.getLogger("llamaswap.process.slots")

#: Seconds a model's whole save, or whole restore, may take before it is given up.
SLOT_TIMEOUT = 60.0
#: The most of a ``/slots`` answer read (a slot's JSON is a few KiB, with its prompt).
MAX_ANSWER = 16 * 2**20

_JSON = [(b"content-type", b"application/json")]
_SAFE = frozenset(string.ascii_letters + string.digits + ".-")
#: A model ID escaped longer than this is shortened, its hash keeping it apart.
_STEM_LIMIT = 96
_FILE = re.compile(
    r"llamaswap-(?P<stem>[A-Za-z0-9._-]+)-(?P<definition>[0-9a-f]{8})-slot(?P<slot>[0-9]{1,5})\.bin"
)


# ------------------------------------------------------------------------------- names


def file_stem(model: str) -> str:
    """``model`` (any ID) as the part of a file name that says whose the file is: letters,
    digits, ``.`` and ``-`` kept, every other byte of its UTF-8 as ``_hh``, so that two IDs
    never share a stem. One escaped beyond ``_STEM_LIMIT`` characters keeps its start and
    gets ``_x`` and a hash of the whole ID (``_x`` is no escape, so it meets no other)."""
    stem = "".join(
        chr(byte) if chr(byte) in _SAFE else f"_{byte:02x}" for byte in model.encode("utf-8")
    )
    if len(stem) > _STEM_LIMIT:
        digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:16]
        stem = f"{stem[:64]}_x{digest}"
    return stem


def definition_tag(model: str, definition: ModelConfig) -> str:
    """Eight hex digits that change when the model's server would start differently: its
    ID, ``cmd`` and ``env`` (the weights, the context, the slots)."""
    text = json.dumps([model, list(definition.cmd), sorted(definition.env.items())])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def slot_file(model: str, definition: ModelConfig, slot: int) -> str:
    """The name of the file llamaswap saves ``model``'s slot ``slot`` in."""
    return f"llamaswap-{file_stem(model)}-{definition_tag(model, definition)}-slot{slot}.bin"


def parse_slot_file(name: str) -> tuple[str, str, int] | None:
    """``(stem, definition tag, slot)`` of a file llamaswap named; None for any other."""
    match = _FILE.fullmatch(name)
    if match is None:
        return None
    return match["stem"], match["definition"], int(match["slot"])


@attrs.frozen
class SlotFile:
    """A slot file llamaswap named, as found on disk."""

    path: str
    stem: str
    definition: str
    slot: int
    size: int
    #: When it was last saved or restored (``st_mtime_ns``).
    used: int


def over_limit(files: Iterable[SlotFile], limit: int, *, spare: str = "") -> list[SlotFile]:
    """The files to delete so that the rest take at most ``limit`` bytes: the least
    recently used first (ties: by path), and no more than needed. The files of the stem
    ``spare`` count, but are not deleted (then the rest may stay over the limit)."""
    ordered = sorted(files, key=lambda file: (file.used, file.path))
    total = sum(file.size for file in ordered)
    doomed = []
    for file in ordered:
        if total <= limit:
            break
        if file.stem != spare:
            doomed.append(file)
            total -= file.size
    return doomed


def _scan(directories: Iterable[str]) -> list[SlotFile]:
    """Every file llamaswap named in ``directories`` (blocking; a missing directory has
    none)."""
    found = []
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            parsed = parse_slot_file(entry.name)
            if parsed is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # deleted meanwhile
            found.append(SlotFile(entry.path, *parsed, info.st_size, info.st_mtime_ns))
    return found


def _delete(files: Iterable[SlotFile]) -> list[SlotFile]:
    """Delete ``files``; those that were there (blocking)."""
    deleted = []
    for file in files:
        try:
            os.unlink(file.path)
        except FileNotFoundError:
            continue
        deleted.append(file)
    return deleted


# ------------------------------------------------------------------------------ keeper


class Slots(Protocol):
    """What the router asks of whoever keeps the slots (``Router``'s ``slots``)."""

    async def save(
        self, model: str, definition: ModelConfig, config: Config, *, loading: str
    ) -> None:
        """Save the slots of ``model``'s ready server before it stops for the load of
        ``loading`` (whose files the disk bound spares: it restores them next); never
        raises but ``Cancelled``."""

    async def restore(self, model: str, definition: ModelConfig) -> None:
        """Restore ``model``'s saved slots into its server, just loaded; never raises but
        ``Cancelled``."""

    def forget(self, model: str, definition: ModelConfig) -> None:
        """``model`` was removed from the configuration: delete its files."""


@final
class NoSlots:
    """Keeps nothing (the router's default: tests, ``simulate``)."""

    async def save(
        self, model: str, definition: ModelConfig, config: Config, *, loading: str
    ) -> None:
        return None

    async def restore(self, model: str, definition: ModelConfig) -> None:
        return None

    def forget(self, model: str, definition: ModelConfig) -> None:
        return None


class _Failed(Exception):
    """A step of a save or restore failed; the message says which and why."""


@final
@attrs.define(eq=False)
class _Tally:
    """What one save or restore did, for its log line."""

    slots: int = 0
    tokens: int = 0
    failures: list[str] = attrs.field(factory=list)

    def slots_text(self) -> str:
        return f"{self.slots} slot{'' if self.slots == 1 else 's'} ({self.tokens} tokens)"


@final
class SlotKeeper:
    """Saves and restores model servers' slots through llama-server's slot API.

    Args:
        pool: the shared ``UpstreamPool`` (the forwarder's and the readiness probe's).
        timeout: seconds a model's whole save or restore may take.
    """

    def __init__(self, pool: UpstreamPool, *, timeout: float = SLOT_TIMEOUT) -> None:
        self._pool = pool
        self._timeout = timeout
        #: Every slot directory a save wrote to: the disk bound covers them all, even one
        #: a reload has taken out of the configuration.
        self._directories: set[str] = set()

    async def save(
        self, model: str, definition: ModelConfig, config: Config, *, loading: str
    ) -> None:
        directory = definition.slot_save_path
        if directory is None:
            return
        self._directories.add(directory)
        began = trio.current_time()
        save = partial(self._save, model, definition, directory)
        tally = await self._tallied(model, "saving", save)
        elapsed = trio.current_time() - began
        if tally.failures:
            logger.warning(
                "model %r: could not save its slots: %s (saved %s); it will prefill again",
                model,
                "; ".join(tally.failures),
                tally.slots_text(),
            )
        elif tally.slots:
            logger.info(
                "model %r: saved %s to %s in %.2fs",
                model,
                tally.slots_text(),
                directory,
                elapsed,
            )
        await self._bound(config, spare=file_stem(loading))

    async def _tallied(
        self, model: str, doing: str, work: Callable[[_Tally], Awaitable[None]]
    ) -> _Tally:
        """``work(tally)`` within the timeout: what went wrong is in the tally,
        never raised (a bug here must not fail the swap or the load: it is said, and the
        swap goes on)."""
        tally = _Tally()
        with trio.move_on_after(self._timeout) as bound:
            try:
                await work(tally)
            except _Failed as exc:
                tally.failures.insert(0, str(exc))
            except Exception as exc:
                logger.exception("model %r: %s its slots failed", model, doing)
                tally.failures.insert(0, f"llamaswap's own error ({exc!r})")
        if bound.cancelled_caught:
            tally.failures.insert(0, f"gave up after {self._timeout:g}s")
        return tally

    async def _save(
        self, model: str, definition: ModelConfig, directory: str, tally: _Tally
    ) -> None:
        slots = await self._call(
            definition, "GET", "/slots", None, "listing its slots (GET /slots)"
        )
        if not isinstance(slots, list):
            raise _Failed(f"GET /slots answered {_shown(slots)}, not a list of slots")
        stem = file_stem(model)
        saved: set[str] = set()  # the files this save wrote
        kept: set[str] = set()  # the last files of the slots it failed on: still valid
        for slot in slots:
            if not isinstance(slot, dict) or not _is_id(slot.get("id")):
                raise _Failed(f"GET /slots listed {_shown(slot)}, not a slot with an id")
            slot_id: int = slot["id"]
            if not _may_hold_tokens(slot):
                continue  # its file, if any, goes below: the slot holds nothing now
            name = slot_file(model, definition, slot_id)
            target = f"/slots/{slot_id}?action=save"
            what = f"saving slot {slot_id}"
            try:
                answer = await self._call(definition, "POST", target, name, what)
            except _Failed as exc:
                tally.failures.append(str(exc))
                kept.add(name)
                continue
            tokens = answer.get("n_saved") if isinstance(answer, dict) else None
            if tokens == 0:
                continue  # nothing cached after all: its file goes below
            saved.add(name)
            tally.slots += 1
            tally.tokens += tokens if _is_id(tokens) else 0
        try:
            missing = await trio.to_thread.run_sync(
                _tidy_model, directory, stem, saved, kept, abandon_on_cancel=True
            )
        except OSError as exc:
            raise _Failed(f"tidying {directory}: {exc}") from exc
        if missing:
            tally.slots -= len(missing)
            raise _Failed(
                f"the server saved {', '.join(sorted(missing))}, but not in slotSavePath "
                f"({directory}): give its --slot-save-path the same directory"
            )

    async def restore(self, model: str, definition: ModelConfig) -> None:
        directory = definition.slot_save_path
        if directory is None:
            return
        began = trio.current_time()
        restore = partial(self._restore, model, definition, directory)
        tally = await self._tallied(model, "restoring", restore)
        if tally.failures:
            logger.warning(
                "model %r: could not restore its slots: %s (restored %s)",
                model,
                "; ".join(tally.failures),
                tally.slots_text(),
            )
        elif tally.slots:
            logger.info(
                "model %r: restored %s in %.2fs",
                model,
                tally.slots_text(),
                trio.current_time() - began,
            )

    async def _restore(
        self, model: str, definition: ModelConfig, directory: str, tally: _Tally
    ) -> None:
        files = await trio.to_thread.run_sync(
            _model_files, directory, file_stem(model), abandon_on_cancel=True
        )
        tag = definition_tag(model, definition)
        for file in sorted(files, key=lambda file: file.slot):
            if file.definition != tag:
                continue  # an earlier definition's: never restored (its next save deletes it)
            name = os.path.basename(file.path)
            target = f"/slots/{file.slot}?action=restore"
            what = f"restoring slot {file.slot} from {name}"
            try:
                answer = await self._call(definition, "POST", target, name, what)
            except _Failed as exc:
                tally.failures.append(str(exc))
                continue
            tokens = answer.get("n_restored") if isinstance(answer, dict) else None
            tally.slots += 1
            tally.tokens += tokens if _is_id(tokens) else 0
            # Restored is used: the disk bound keeps it over files less recently used.
            await trio.to_thread.run_sync(_touch, file.path, abandon_on_cancel=True)

    def forget(self, model: str, definition: ModelConfig) -> None:
        """Delete ``model``'s files, whatever definition saved them (a few unlinks,
        done at once: the router calls this synchronously)."""
        directory = definition.slot_save_path
        if directory is None:
            return
        try:
            deleted = _delete(_model_files(directory, file_stem(model)))
        except OSError as exc:
            logger.warning("model %r: could not delete its slot files: %s", model, exc)
            return
        if deleted:
            logger.info(
                "model %r: removed from the configuration; deleted its %d slot file(s)",
                model,
                len(deleted),
            )

    async def _bound(self, config: Config, *, spare: str) -> None:
        """Delete the least recently used files beyond ``slotSaveLimit``, but those of the
        model whose stem is ``spare`` (it is about to restore them)."""
        directories = self._directories | _directories(config)
        limit = config.slot_save_limit
        try:
            deleted = await trio.to_thread.run_sync(
                _enforce_limit, directories, limit, spare, abandon_on_cancel=True
            )
        except OSError as exc:
            logger.warning("could not keep the slot files within slotSaveLimit: %s", exc)
            return
        if deleted:
            logger.info(
                "slot files over slotSaveLimit (%d bytes): deleted %d, %d bytes, the least "
                "recently used (%s)",
                limit,
                len(deleted),
                sum(file.size for file in deleted),
                ", ".join(os.path.basename(file.path) for file in deleted),
            )

    async def _call(
        self, definition: ModelConfig, method: str, target: str, filename: str | None, what: str
    ) -> Any:
        """``method target`` on the model's server (with ``{"filename": filename}`` as its
        body, if given): the JSON of a 200 answer, else ``_Failed`` saying ``what`` failed."""
        body = None if filename is None else json.dumps({"filename": filename}).encode()
        try:
            async with (
                self._pool.request(
                    method, definition.proxy, target, _JSON if body else [], body
                ) as response,
                aclosing(response.chunks()) as chunks,
            ):
                data = await _read(chunks)
                status = response.status
        except UpstreamFailed as exc:
            raise _Failed(f"{what}: {exc}") from exc
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if status != 200:
            raise _Failed(f"{what}: the server answered {status}{_message(answer, data)}")
        if answer is None:
            raise _Failed(f"{what}: the server's answer is not JSON")
        return answer


async def _read(chunks: AsyncIterator[bytes]) -> bytes:
    """A body, at most ``MAX_ANSWER`` bytes of it (``_Failed`` beyond)."""
    parts: list[bytes] = []
    read = 0
    async for chunk in chunks:
        read += len(chunk)
        if read > MAX_ANSWER:
            raise _Failed(f"an answer over {MAX_ANSWER} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _message(answer: object, data: bytes) -> str:
    """What an error answer says: llama-server's ``error.message``, or its first bytes."""
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f": {error['message']}"
    text = data[:200].decode("utf-8", "replace").strip()
    return f": {text!r}" if text else ""


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_id(value: object) -> TypeGuard[int]:
    """A count or an ID as llama-server writes one: an integer, not negative."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _may_hold_tokens(slot: dict[str, Any]) -> bool:
    """Whether a slot of ``GET /slots`` may hold a cache worth saving: unless it says it
    holds no token, it is saved, and a save that wrote none (``n_saved`` 0) leaves no file.

    llama-server says how many tokens a slot holds in ``n_prompt_tokens`` (its cached
    prompt and generated tokens; since 2025), some builds in ``n_past``; but only once
    the slot has run a task: a slot restored and not used since says nothing, nor does
    an older server's (it shows the last task's ``prompt``, not the cache)."""
    for key in ("n_prompt_tokens", "n_past"):
        value = slot.get(key)
        if _is_id(value):
            return bool(value)
    return True


def _directories(config: Config) -> set[str]:
    return {
        model.slot_save_path
        for model in config.models.values()
        if model.slot_save_path is not None
    }


def _model_files(directory: str, stem: str) -> list[SlotFile]:
    """The files of the model whose stem is ``stem`` in ``directory`` (blocking)."""
    return [file for file in _scan([directory]) if file.stem == stem]


def _tidy_model(
    directory: str, stem: str, saved: Collection[str], kept: Collection[str]
) -> set[str]:
    """After a save: delete the model's files but those ``saved`` and ``kept`` (so an
    earlier definition's, and an empty slot's, go); return those of ``saved`` that are
    not there (blocking)."""
    files = _model_files(directory, stem)
    keep = {*saved, *kept}
    _delete(file for file in files if os.path.basename(file.path) not in keep)
    present = {os.path.basename(file.path) for file in files}
    return {name for name in saved if name not in present}


def _enforce_limit(directories: Collection[str], limit: int, spare: str = "") -> list[SlotFile]:
    """Delete the least recently used files beyond ``limit`` bytes, but the spared stem's
    (blocking)."""
    return _delete(over_limit(_scan(sorted(directories)), limit, spare=spare))


def _touch(path: str) -> None:
    with contextlib.suppress(OSError):  # deleted meanwhile: nothing to keep
        os.utime(path)
