"""What a response reports about itself, read as it streams past: token counts (``usage``)
and llama.cpp's token speeds (``timings``), in JSON or in the last SSE events.

The tap sees every chunk but keeps little: a JSON body up to ``JSON_LIMIT`` bytes, or the
last ``SSE_TAIL`` bytes of an event stream (``usage`` and ``timings`` travel in the final
chunks, just before ``data: [DONE]``; the Responses API's stream ends with the whole
response, its ``usage`` inside). Parsing happens once, at the end, and builds only
those two fields: msgspec checks the whole document is JSON but skips the rest (an 850 KB
embeddings answer: 0.8 ms, against 14.5 ms for ``json.loads``; docs/performance.md).
Whatever msgspec cannot read goes to ``json.loads``, which decides as it always did.

llama-server (llama.cpp) adds ``timings`` to a whole JSON answer, and to the last chunk of
a stream::

    "timings": {"cache_n": 230, "prompt_n": 12, "prompt_ms": 35.2, "prompt_per_second": 340.9,
                "predicted_n": 64, "predicted_ms": 1502.4, "predicted_per_second": 42.6,
                "draft_n": 40, "draft_n_accepted": 31, ...}

``cache_n`` counts the prompt tokens found in the slot's KV cache (not processed again);
``draft_n`` and ``draft_n_accepted`` are there with speculative decoding (a draft model):
the tokens it proposed and those the model accepted.
"""

from __future__ import annotations

import json
import math
from typing import Any, final

import attrs
import msgspec

__all__ = ["Usage", "UsageTap"]

JSON_LIMIT = 1 << 20
SSE_TAIL = 16 * 1024


@attrs.frozen
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: llama.cpp's ``timings.prompt_per_second``: how fast the prompt was read.
    prompt_tokens_per_second: float | None = None
    #: llama.cpp's ``timings.predicted_per_second``: how fast tokens were generated.
    generation_tokens_per_second: float | None = None
    #: llama.cpp's ``timings.cache_n``: prompt tokens reused from the KV cache.
    cached_tokens: int | None = None
    #: llama.cpp's ``timings.draft_n``: tokens a draft model proposed.
    draft_tokens: int | None = None
    #: llama.cpp's ``timings.draft_n_accepted``: the proposed tokens the model accepted.
    draft_accepted_tokens: int | None = None


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
            # The last event that has each: a stream may send usage and timings apart.
            usage = timings = None
            for line in reversed(self._buffer.split(b"\n")):
                if not line.startswith(b"data:"):
                    continue
                if (usage is None and b'"usage"' in line) or (
                    timings is None and b'"timings"' in line
                ):
                    report = _report(line[5:])
                    usage = usage if usage is not None else _table(report.counted())
                    timings = timings if timings is not None else _table(report.timings)
                if usage is not None and timings is not None:
                    break
            return _usage(usage, timings)
        if self._json and not self._overflow:
            report = _report(self._buffer)
            return _usage(_table(report.counted()), _table(report.timings))
        return Usage()


class _Report(msgspec.Struct):
    """The fields of an answer that say what it cost."""

    usage: Any = None
    timings: Any = None
    #: The Responses API's last stream event: the whole response.
    response: Any = None

    def counted(self) -> Any:
        """The ``usage``: the answer's own, or its ``response``'s."""
        if self.usage is None and isinstance(self.response, dict):
            return self.response.get("usage")
        return self.usage


_REPORT = msgspec.json.Decoder(_Report)


def _report(data: bytes | bytearray) -> _Report:
    """``usage`` and ``timings`` of the JSON object ``data``; None for what is missing, and
    for both if ``data`` is not a JSON object."""
    try:
        return _REPORT.decode(data)
    except (msgspec.MsgspecError, RecursionError):  # json.loads decides (NaN, BOMs…)
        pass
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return _Report()
    if not isinstance(document, dict):
        return _Report()
    return _Report(document.get("usage"), document.get("timings"), document.get("response"))


def _table(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a JSON object (JSON may say anything)."""
    return value if isinstance(value, dict) else None


def _usage(usage: dict[str, Any] | None, timings: dict[str, Any] | None) -> Usage:
    usage = usage or {}
    timings = timings or {}
    # OpenAI names them prompt/completion tokens; Anthropic input/output tokens.
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        completion_tokens=_count(usage.get("completion_tokens", usage.get("output_tokens"))),
        prompt_tokens_per_second=_rate(timings.get("prompt_per_second")),
        generation_tokens_per_second=_rate(timings.get("predicted_per_second")),
        cached_tokens=_count(timings.get("cache_n")),
        draft_tokens=_count(timings.get("draft_n")),
        draft_accepted_tokens=_count(timings.get("draft_n_accepted")),
    )


#: Token counts beyond this are nonsense, and would not survive the metrics, the activity
#: store (SQLite integers are 64-bit) or the dashboard (JavaScript numbers) exactly.
_MAX_COUNT = 2**53


def _count(value: object) -> int | None:
    """A token count: an integer (not a boolean), 0 or more (JSON may say anything)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT:
        return value
    return None


def _rate(value: object) -> float | None:
    """A tokens-per-second figure: a finite number, 0 or more (JSON may say anything)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        rate = float(value)
    except OverflowError:  # an integer beyond a float's range
        return None
    return rate if math.isfinite(rate) and rate >= 0 else None
