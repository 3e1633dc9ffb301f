"""Looking back at requests: the activity log, its statistics and the captures.

``GET /api/activity`` lists the records that match its filters, newest first;
``GET /api/activity/stats`` summarises the records of a window of time, model by model
(``observability/activity_stats.py``). Both read the records in memory and, with a
``[store]``, those in its file. ``GET /api/captures/{id}`` gives what the request of
record ``id`` sent and was answered, while the captures in memory still hold it
(``observability/captures.py``).
"""

from __future__ import annotations

import datetime

from quart import Response, request
from quart_trio import QuartTrio

from llamaswap.errors import NotFound
from llamaswap.observability import (
    ActivityLog,
    ActivityQuery,
    ActivityRecord,
    ActivityStore,
    Captures,
)
from llamaswap.observability.activity import iso_time
from llamaswap.observability.activity_stats import MAX_RECORDS, activity_stats, stats_window

from .operations import json_response

__all__ = ["register"]


def register(
    quart: QuartTrio, activity: ActivityLog, store: ActivityStore | None, captures: Captures
) -> None:
    """Add the routes over ``activity`` (the records in memory), ``store`` (the opened
    SQLite store, if there is one) and ``captures``."""

    async def select(query: ActivityQuery) -> list[ActivityRecord]:
        if store is None:
            return activity.select(query)
        return await store.select(query, activity)

    @quart.get("/api/activity")
    async def activity_log() -> Response:
        records = await select(ActivityQuery.from_args(request.args.to_dict(flat=False)))
        return json_response({"activity": [record.to_json() for record in records]})

    @quart.get("/api/activity/stats")
    async def activity_statistics() -> Response:
        window = stats_window(request.args.to_dict(flat=False))
        now = datetime.datetime.now(datetime.timezone.utc)
        since = iso_time(now - datetime.timedelta(seconds=window))
        # One more than is read: whether the window held more than MAX_RECORDS.
        records = await select(ActivityQuery(since=since, limit=MAX_RECORDS + 1))
        read = records[:MAX_RECORDS]
        document = {
            "window_seconds": window,
            "since": since,
            "records": len(read),
            "truncated": len(records) > len(read),
            "models": {model: stats.to_json() for model, stats in activity_stats(read).items()},
        }
        return json_response(document)

    @quart.get("/api/captures/<int:record_id>")
    async def capture(record_id: int) -> Response:
        found = captures.get(record_id)
        if found is None:
            raise NotFound(
                f"no capture of request record {record_id}: its model does not capture "
                "(capture = true in the config), or newer captures have taken its place "
                "(captureBuffer); the activity records with captured = true may have one"
            )
        return json_response(found.to_json())
