"""The ``data`` of server-sent events, from bytes that arrive in any pieces.

The translations (``anthropic.py``, ``ollama.py``) read a chat-completions event stream as
it arrives and re-tell it: each needs the events' data, one event at a time, whatever the
piece a read returned ended in (half a line, or an event's blank line not yet come).
"""

from __future__ import annotations

import json
from typing import Any, final

__all__ = ["SseData", "json_chunk"]


def json_chunk(data: bytes) -> dict[str, Any] | None:
    """An event's data as the JSON object a chat-completions chunk is; None for the
    stream's ``[DONE]`` and for anything else a translation does not know."""
    if data.strip() == b"[DONE]":
        return None
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return chunk if isinstance(chunk, dict) else None


@final
class SseData:
    """Feed it the stream's bytes; it returns the data of each event they complete (an
    event's ``data:`` lines joined by line breaks; other fields are skipped)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []  # the current event's data lines

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                self._data.append(line[5:].removeprefix(b" "))
            elif not line and self._data:
                events.append(b"\n".join(self._data))
                self._data = []
        return events

    def close(self) -> list[bytes]:
        """The event the stream left unterminated, if any."""
        return self.feed(b"\n\n")
