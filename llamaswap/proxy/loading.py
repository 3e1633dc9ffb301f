"""Loading state (SPEC §7.8): tell a waiting streaming chat client what it waits for.

With ``sendLoadingState``, a streaming ``/v1/chat/completions`` request that has to wait
gets a 200 event stream at once, with ``reasoning_content`` chunks saying its place in
the queue (the scheduler's ``position``, the same order as the pick) or how long its
model has been loading, and about how long it has left to wait where that is estimated
(``observability/estimates.py``); then the model's own answer follows on the same stream.
The request was admitted before the first byte, so a 429 still comes as a 429.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

import trio

from llamaswap.observability.estimates import Estimator, estimates
from llamaswap.router import Router
from llamaswap.router.lease import Lease

__all__ = ["SSE_HEADERS", "about", "event", "progress", "report_progress"]

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


def about(seconds: float) -> str:
    """``about 12 s``, ``about 3 min``: an estimate for people (at least 1 s)."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {round(seconds / 60)} min"


def progress(router: Router, lease: Lease, estimator: Estimator | None = None) -> str:
    """What the request is waiting for, in one line, with the estimate of how long it
    has left where there is one (``estimator``'s, else a fresh one)::

        llamaswap: waiting for a turn, position 2 of 5, about 40 s
        llamaswap: loading model 'coder' (3s), about 12 s to go
    """
    info = lease.info()
    now = trio.current_time()
    if estimator is not None:
        left = estimator.start(lease.id)
    else:
        left = estimates(router).start(lease.id, now)
    if info.state == "queued":
        position, waiting = router.position(lease)
        place = "" if position is None else f", position {position} of {waiting}"
        estimate = "" if left is None else f", {about(left)}"
        return f"llamaswap: waiting for a turn{place}{estimate}\n"
    elapsed = now - (info.dispatched_at or info.arrival)
    estimate = "" if left is None else f", {about(left)} to go"
    return f"llamaswap: loading model {info.model!r} ({elapsed:.0f}s){estimate}\n"


async def report_progress(
    router: Router,
    model: str,
    start: Callable[[], Awaitable[None]],
    send: Callable[[bytes], Awaitable[None]],
    lease: Lease,
    *,
    estimator: Estimator | None = None,
) -> None:
    """Start the event stream, then send progress until cancelled (the wait is over)."""
    await start()
    while True:
        await send(event(model, progress(router, lease, estimator)))
        await trio.sleep(INTERVAL)
