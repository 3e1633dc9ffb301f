"""Token counts from a response as it streams past: ``usage`` in JSON or in the last SSE events.

The tap sees every chunk but keeps little: a JSON body up to ``JSON_LIMIT`` bytes, or the
last ``SSE_TAIL`` bytes of an event stream (``usage`` travels in the final chunks, just
before ``data: [DONE]``). Parsing happens once, at the end.
"""

from __future__ import annotations

import json
from typing import Any, final

import attrs

__all__ = ["Usage", "UsageTap"]

JSON_LIMIT = 1 << 20
SSE_TAIL = 16 * 1024


@attrs.frozen
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@final
class UsageTap:
    def __init__(self, content_type: str) -> None:
        self._sse = content_type.startswith("text/event-stream")
        self._json = content_type.startswith("application/json")
        self._buffer = bytearray()
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self._sse:
            self._buffer += chunk
            if len(self._buffer) > 2 * SSE_TAIL:
                del self._buffer[:-SSE_TAIL]
        elif self._json and not self._overflow:
            self._buffer += chunk
            if len(self._buffer) > JSON_LIMIT:
                self._overflow = True
                self._buffer.clear()

    def usage(self) -> Usage:
        if self._sse:
            for line in reversed(self._buffer.split(b"\n")):
                if line.startswith(b"data:") and b'"usage"' in line:
                    found = _usage(_loads(line[5:]))
                    if found is not None:
                        return found
        elif self._json and not self._overflow:
            found = _usage(_loads(bytes(self._buffer)))
            if found is not None:
                return found
        return Usage()


def _loads(data: bytes | bytearray) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _usage(document: Any) -> Usage | None:
    if not isinstance(document, dict):
        return None
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    # OpenAI names them prompt/completion tokens; Anthropic input/output tokens.
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return Usage(
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )
