"""Loading state (SPEC §7.8): tell a waiting streaming chat client what it waits for.

With ``sendLoadingState``, a streaming ``/v1/chat/completions`` request that has to wait
gets a 200 event stream at once, with ``reasoning_content`` chunks saying its place in
the queue (the scheduler's ``position``, the same order as the pick) or how long its
model has been loading; then the model's own answer follows on the same stream. The
request was admitted before the first byte, so a 429 still comes as a 429.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

import trio

from llamaswap.router import Router
from llamaswap.router.lease import Lease

__all__ = ["SSE_HEADERS", "event", "progress", "report_progress"]

#: Seconds between progress chunks.
INTERVAL = 1.0

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def event(model: str, reasoning: str) -> bytes:
    """One SSE event: a chat.completion.chunk with ``reasoning_content``."""
    document = {
        "id": "llamaswap-loading",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "reasoning_content": reasoning},
                "finish_reason": None,
            }
        ],
    }
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def progress(router: Router, lease: Lease) -> str:
    """What the request is waiting for, in one line."""
    info = lease.info()
    if info.state == "queued":
        position, waiting = router.position(lease)
        if position is not None:
            return f"llamaswap: waiting for a turn, position {position} of {waiting}\n"
        return "llamaswap: waiting for a turn\n"
    elapsed = trio.current_time() - (info.dispatched_at or info.arrival)
    return f"llamaswap: loading model {info.model!r} ({elapsed:.0f}s)\n"


async def report_progress(
    router: Router,
    model: str,
    start: Callable[[], Awaitable[None]],
    send: Callable[[bytes], Awaitable[None]],
    lease: Lease,
) -> None:
    """Start the event stream, then send progress until cancelled (the wait is over)."""
    await start()
    while True:
        await send(event(model, progress(router, lease)))
        await trio.sleep(INTERVAL)
