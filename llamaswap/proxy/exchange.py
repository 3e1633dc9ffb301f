"""One request as it passes through the handlers, and its record when it is over.

Each handler on a request's path may add to ``Exchange.metadata`` (the model name it
asked for, the alias it used, the peer it went to, the scheduler's own notes); all of it
lands in the activity log with the request, and its capture, if one was taken, in the
captures under the record's ID.
"""

from __future__ import annotations

import datetime
from typing import Any, final

import attrs
import trio

from llamaswap.observability import (
    ActivityLog,
    ActivityRecord,
    Captures,
    CaptureTap,
    Metrics,
    Usage,
    UsageTap,
)
from llamaswap.observability.activity import iso_time
from llamaswap.observability.tracing import RequestTrace
from llamaswap.router.lease import Lease
from llamaswap.schedulers import band_of

__all__ = ["CLIENT_LEFT", "Exchange", "Recorder"]


@attrs.define(eq=False)
class Exchange:
    method: str
    path: str
    started: float = attrs.field(factory=trio.current_time)
    wall_time: datetime.datetime = attrs.field(
        factory=lambda: datetime.datetime.now(datetime.timezone.utc)
    )
    model: str = ""
    priority: int = 0
    lease: Lease | None = None  # set once the request goes to the scheduler
    status: int | None = None
    finished: bool = False  # the response's last byte has been sent
    error: str | None = None
    tap: UsageTap | None = None
    first_byte: float | None = None  # when the model server's answer began to arrive
    capture: CaptureTap | None = None  # set when its model captures (``capture``)
    trace: RequestTrace | None = None  # set when ``[tracing]`` is on
    metadata: dict[str, Any] = attrs.field(factory=dict)

    def answer(self, data: bytes) -> None:
        """A piece of the model server's answer body passes on its way to the client."""
        if self.first_byte is None and data:
            self.first_byte = trio.current_time()
        if self.tap is not None:
            self.tap.feed(data)


#: The most characters of one text an activity record keeps (its method, path, error and
#: notes). Some are the client's to choose, up to a whole request body (the model name it
#: asked for, the block type it sent), and the log keeps 1000 records in memory and
#: ``store.maxRows`` on disk: what a record holds must not be.
RECORD_TEXT = 4096

#: Recorded when the client went away before any response was sent (as nginx does).
CLIENT_CLOSED = 499
#: The error recorded for a request whose client went away before its answer ended.
CLIENT_LEFT = "client disconnected"


@final
class Recorder:
    """Turns finished exchanges into activity records, captures and metrics."""

    def __init__(self, activity: ActivityLog, metrics: Metrics, captures: Captures) -> None:
        self.activity = activity
        self.metrics = metrics
        self.captures = captures

    def finish(self, exchange: Exchange) -> ActivityRecord:
        ticket = None if exchange.lease is None else exchange.lease.info()
        status = exchange.status if exchange.status is not None else CLIENT_CLOSED
        duration = trio.current_time() - exchange.started
        priority = exchange.priority if ticket is None else ticket.effective_priority
        queue_wait = None if ticket is None else ticket.queue_wait
        first_byte = exchange.first_byte
        usage = exchange.tap.usage() if exchange.tap is not None else Usage()
        metadata = dict(exchange.metadata)
        if ticket is not None:
            metadata.update(ticket.metadata)
        metadata = {k: _kept(v) if isinstance(v, str) else v for k, v in metadata.items()}
        record = ActivityRecord(
            id=self.activity.next_id(),
            time=iso_time(exchange.wall_time),
            model=exchange.model,
            method=_kept(exchange.method),
            path=_kept(exchange.path),
            status=status,
            duration_ms=_ms(duration),
            queue_wait_ms=None if queue_wait is None else _ms(queue_wait),
            scheduler=None if exchange.lease is None else exchange.lease.scheduler,
            priority=priority,
            band=band_of(priority) if ticket is None else ticket.band,
            score=None if ticket is None else ticket.score,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            error=None if exchange.error is None else _kept(exchange.error),
            metadata=metadata,
            prompt_tokens_per_second=usage.prompt_tokens_per_second,
            generation_tokens_per_second=usage.generation_tokens_per_second,
            request=None if ticket is None else ticket.id,
            ttft_ms=None if first_byte is None else _ms(first_byte - exchange.started),
            cached_tokens=usage.cached_tokens,
            draft_tokens=usage.draft_tokens,
            draft_accepted_tokens=usage.draft_accepted_tokens,
            captured=exchange.capture is not None,
        )
        if exchange.capture is not None:  # there before the record's event says so
            self.captures.add(exchange.capture.finish(record.id))
        self.activity.add(record)
        if exchange.trace is not None:
            exchange.trace.finish(record, ticket, first_byte, exchange.started + duration)
        metrics = self.metrics
        series = metrics.series
        if queue_wait is not None:
            series(metrics.queue_wait, record.band).observe(queue_wait)
        if exchange.lease is not None and not metrics.knows(exchange.model):
            # A straggler of a model the router forgot as the request ended (a reload
            # removed it): its series are gone, and must not come back for good.
            return record
        series(metrics.requests, exchange.model, str(status)).inc()
        series(metrics.request_duration, exchange.model).observe(duration)
        for kind, count in (
            ("prompt", record.prompt_tokens),
            ("completion", record.completion_tokens),
        ):
            if count:
                series(metrics.tokens, exchange.model, kind).inc(count)
        return record


def _ms(seconds: float) -> float:
    """``seconds`` as a record's milliseconds."""
    return round(seconds * 1000, 3)


def _kept(text: str) -> str:
    """``text`` as a record keeps it: cut at RECORD_TEXT characters, saying so."""
    if len(text) <= RECORD_TEXT:
        return text
    return f"{text[:RECORD_TEXT]}… ({len(text)} characters)"
