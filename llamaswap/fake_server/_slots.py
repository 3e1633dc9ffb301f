"""The fake server's slots: each one's prompt cache, as llama-server keeps it, and the slot
files of ``--slot-save-path`` (``GET /slots``, ``POST /slots/{id}?action=save|restore``).

A token is a whitespace-separated word, as everywhere in the fake (``prompt_tokens``). A
slot caches the words of the last prompt it processed and, once that answer is complete,
the answer's words after them, as llama-server's slot holds the prompt and the generated
tokens. A prompt goes to the slot that shares the longest prefix of words with it (among
those that share none, the least recently used one); the shared prefix is not processed
again, so ``timings.prompt_n`` counts only the words after it, but never fewer than one
(llama-server always evaluates the last prompt token again, for its logits). The slots
are ``--parallel`` of them (one without it), whatever the requests in service: the fake
needs no exclusive slot to answer.

A saved slot is a file in the ``--slot-save-path`` directory: one JSON line
(``{"model": NAME, "tokens": [...]}``), padded with spaces to ``BYTES_PER_TOKEN`` bytes per
token, so its size grows with the cache as a real one does (by far less), and a test can
work out the disk bound. Restoring checks the model name: a cache of another model is
refused, as llama-server refuses a file for another model's shape.

Pure but for the files: the ASGI app (``_app``) answers with what these return.
"""

from __future__ import annotations

import json
import os
from typing import Any, Final, final

__all__ = ["BYTES_PER_TOKEN", "N_CTX", "SlotCaches", "SlotRefused"]

#: The size of a saved slot file per cached token.
BYTES_PER_TOKEN: Final = 1024
#: Each slot's context, as ``GET /slots`` reports it (the fake enforces none).
N_CTX: Final = 4096

#: llama-server's own words for what it refuses.
NO_SAVE_PATH: Final = "This server does not support slots action. Start it with `--slot-save-path`"
INVALID_SLOT: Final = "Invalid slot ID"
INVALID_FILENAME: Final = "Invalid filename"
CANNOT_RESTORE: Final = (
    "Unable to restore slot, no available space in KV cache or invalid slot save file"
)


class SlotRefused(Exception):
    """A slot action llama-server would refuse: the status and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = "not_supported_error" if status == 501 else "invalid_request_error"


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading words ``a`` and ``b`` share."""
    count = 0
    for left, right in zip(a, b, strict=False):
        if left != right:
            break
        count += 1
    return count


def valid_filename(name: str) -> bool:
    """What llama-server takes for a slot file name: one plain file name, no path."""
    return (
        0 < len(name.encode()) <= 255
        and name not in (".", "..")
        and not any(c in name for c in '/\\:*?"<>|')
        and all(c.isprintable() for c in name)
    )


@final
class SlotCaches:
    """Every slot's cached words, and its files.

    Args:
        count: the number of slots.
        model: the model name written in (and checked against) slot files.
        directory: ``--slot-save-path``; None: saving and restoring are refused (501).
    """

    def __init__(self, count: int, model: str, directory: str | None) -> None:
        self._model = model
        self._directory = directory
        self._tokens: list[list[str]] = [[] for _ in range(max(count, 1))]
        #: Each slot's last task (a counter), or None if it has had none.
        self._tasks: list[int | None] = [None] * len(self._tokens)
        self._task = 0
        #: When each slot was last used (a task or a restore), for the least recently used.
        self._used = [0] * len(self._tokens)
        self._uses = 0

    def take(self, words: list[str]) -> tuple[int, int]:
        """Process a prompt of ``words``: the slot it goes to, and how many of its words
        that slot's cache covers (not processed again). The slot caches them from now on."""

        def preference(slot: int) -> tuple[int, int, int]:
            # The longest shared prefix, then the least recently used, then the first.
            shared = common_prefix(self._tokens[slot], words)
            return shared, -self._used[slot], -slot

        slot = max(range(len(self._tokens)), key=preference)
        shared = common_prefix(self._tokens[slot], words)
        self._task += 1
        self._tasks[slot] = self._task
        self._use(slot)
        self._tokens[slot] = list(words)
        return slot, min(shared, max(len(words) - 1, 0))

    def _use(self, slot: int) -> None:
        self._uses += 1
        self._used[slot] = self._uses

    def generated(self, slot: int, words: list[str]) -> None:
        """Slot ``slot`` finished an answer: it caches ``words``, the prompt's and the
        answer's."""
        self._tokens[slot] = list(words)

    def describe(self) -> list[dict[str, Any]]:
        """``GET /slots``: llama-server's shape, the fields it has had since 2025: the
        task and the tokens held only once the slot has run a task (a restored slot that
        has not says nothing of what it holds)."""
        slots = []
        for slot, tokens in enumerate(self._tokens):
            entry: dict[str, Any] = {
                "id": slot,
                "n_ctx": N_CTX,
                "speculative": False,
                "is_processing": False,
            }
            task = self._tasks[slot]
            if task is not None:  # llama-server shows these once the slot has had a task
                entry.update(id_task=task, n_prompt_tokens=len(tokens))
            slots.append(entry)
        return slots

    def _file(self, slot: str, filename: object) -> tuple[int, str]:
        if self._directory is None:
            raise SlotRefused(501, NO_SAVE_PATH)
        if not slot.isdigit() or int(slot) >= len(self._tokens):
            raise SlotRefused(400, INVALID_SLOT)
        if not isinstance(filename, str) or not valid_filename(filename):
            raise SlotRefused(400, INVALID_FILENAME)
        return int(slot), os.path.join(self._directory, filename)

    def save(self, slot: str, filename: object) -> dict[str, Any]:
        """``POST /slots/{slot}?action=save``: write the slot's cache to ``filename``."""
        index, path = self._file(slot, filename)
        tokens = self._tokens[index]
        line = json.dumps({"model": self._model, "tokens": tokens}) + "\n"
        data = line.encode().ljust(BYTES_PER_TOKEN * len(tokens), b" ")
        with open(path, "wb") as file:
            file.write(data)
        return {
            "id_slot": index,
            "filename": filename,
            "n_saved": len(tokens),
            "n_written": len(data),
        }

    def restore(self, slot: str, filename: object) -> dict[str, Any]:
        """``POST /slots/{slot}?action=restore``: the slot caches what ``filename`` holds."""
        index, path = self._file(slot, filename)
        try:
            with open(path, "rb") as file:
                data = file.read()
            saved = json.loads(data)
        except (OSError, ValueError):
            raise SlotRefused(400, CANNOT_RESTORE) from None
        if not isinstance(saved, dict):
            raise SlotRefused(400, CANNOT_RESTORE)
        tokens = saved.get("tokens")
        if (
            saved.get("model") != self._model
            or not isinstance(tokens, list)
            or not all(isinstance(token, str) for token in tokens)
        ):
            raise SlotRefused(400, CANNOT_RESTORE)
        self._tokens[index] = tokens
        self._use(index)  # no task: it is listed as unused until it serves, as llama-server's
        return {
            "id_slot": index,
            "filename": filename,
            "n_restored": len(tokens),
            "n_read": len(data),
        }
