"""``GET /api/activity``'s filters, parsed from URL parameters and applied in memory."""

from __future__ import annotations

from typing import Any

import pytest

from llamaswap.errors import BadRequest
from llamaswap.observability import ActivityLog, ActivityQuery, ActivityRecord
from llamaswap.observability.activity import DEFAULT_LIMIT, MAX_LIMIT


def make(
    id: int, *, model: str = "a", status: int = 200, band: str = "normal", time: str = ""
) -> ActivityRecord:
    return ActivityRecord(
        id=id, time=time or f"2026-05-09T10:00:{id:02d}.000Z", model=model, method="POST",
        path="/v1/chat/completions", status=status, duration_ms=1.0, queue_wait_ms=0.0,
        scheduler="fifo", priority=0, band=band, score=None, prompt_tokens=None,
        completion_tokens=None, error=None, metadata={},
    )  # fmt: skip


def query(**args: str) -> ActivityQuery:
    return ActivityQuery.from_args({name: [value] for name, value in args.items()})


def bad(args: dict[str, list[str]]) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        ActivityQuery.from_args(args)
    return info.value


#: Records with every kind of value a filter looks at (ID n arrived at 10:00:n).
RECORDS = [
    make(1, model="a", status=200, band="normal"),
    make(2, model="b", status=404, band="batch"),
    make(3, model="a", status=499, band="interactive"),
    make(4, model="b", status=502, band="normal"),
    make(5, model="a", status=201, band="batch"),
    make(6, model="c", status=503, band="normal"),
]

#: (URL parameters, the IDs expected newest first): shared with the SQLite store's tests.
CASES: list[tuple[dict[str, str], list[int]]] = [
    ({}, [6, 5, 4, 3, 2, 1]),
    ({"limit": "2"}, [6, 5]),
    ({"limit": "0"}, []),
    ({"model": "a"}, [5, 3, 1]),
    ({"model": "zzz"}, []),
    ({"band": "batch"}, [5, 2]),
    ({"status": "404"}, [2]),
    ({"status": "2xx"}, [5, 1]),
    ({"status": "4XX"}, [3, 2]),
    ({"status": "5xx"}, [6, 4]),
    ({"since": "2026-05-09T10:00:04Z"}, [6, 5, 4]),  # inclusive
    ({"until": "2026-05-09T10:00:03Z"}, [2, 1]),  # exclusive
    ({"since": "2026-05-09T10:00:02.000001Z"}, [6, 5, 4, 3]),  # 10:00:02.000 is before it
    ({"since": "2026-05-09T12:00:02+02:00"}, [6, 5, 4, 3, 2]),  # the same hour in UTC
    ({"since": "2026-05-09T10:00:02", "until": "2026-05-09T10:00:05"}, [4, 3, 2]),  # UTC
    ({"model": "a", "status": "2xx", "limit": "1"}, [5]),
    ({"model": "b", "band": "normal", "status": "5xx"}, [4]),
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_the_memory_log_applies_each_filter_newest_first(
    args: dict[str, str], expected: list[int]
) -> None:
    log = ActivityLog()
    for record in RECORDS:
        log.add(record)
    assert [record.id for record in log.select(query(**args))] == expected


def test_the_memory_log_keeps_its_capacity_and_starts_at_first_id() -> None:
    log = ActivityLog(capacity=2, first_id=41)
    assert [log.next_id(), log.next_id()] == [41, 42]
    for record in RECORDS:
        log.add(record)
    assert [record.id for record in log.select(query())] == [6, 5]
    assert [record.id for record in log.recent(limit=1)] == [6]


def test_defaults_and_parsed_values() -> None:
    assert ActivityQuery.from_args({}) == ActivityQuery(limit=DEFAULT_LIMIT)
    parsed = query(
        model="m", band="batch", status="5xx", since="2026-05-09", until="2026-05-09T09:30+02:00",
        limit=str(MAX_LIMIT),
    )  # fmt: skip
    assert parsed == ActivityQuery(
        model="m",
        band="batch",
        status=(500, 599),
        since="2026-05-09T00:00:00.000Z",  # a date alone: midnight, UTC
        until="2026-05-09T07:30:00.000Z",
        limit=MAX_LIMIT,
    )
    # Sub-millisecond times round up: records have whole milliseconds.
    assert query(since="2026-05-09T10:00:00.0001Z").since == "2026-05-09T10:00:00.001Z"
    # Read alike on every Python (3.10's fromisoformat takes none of these).
    assert query(since="2026-05-09T12:00:00,5+0200").since == "2026-05-09T10:00:00.500Z"
    assert query(since="2026-05-09t10:00:00.0000001z").since == "2026-05-09T10:00:00.000Z"
    assert query(until="2026-05-09T10:00:00.123Z").until == "2026-05-09T10:00:00.123Z"


@pytest.mark.parametrize(
    ("args", "param", "message"),
    [
        ({"limit": ["ten"]}, "limit", "limit must be an integer from 0 to 10000; got 'ten'"),
        ({"limit": ["-1"]}, "limit", "limit must be an integer from 0 to 10000; got '-1'"),
        ({"limit": ["10001"]}, "limit", "limit must be an integer from 0 to 10000"),
        ({"status": ["20"]}, "status", "status must be a status code (like 404) or a class"),
        ({"status": ["600"]}, "status", "status must be a status code"),
        ({"status": ["6xx"]}, "status", "status must be a status code"),
        ({"band": ["urgent"]}, "band", "band must be one of above_interactive, interactive,"),
        ({"since": ["yesterday"]}, "since", "since must be an ISO 8601 time like"),
        ({"until": ["2026-13-01"]}, "until", "until must be an ISO 8601 time like"),
        ({"since": ["9999-12-31T23:59:59.9999Z"]}, "since", "since must be an ISO 8601 time"),
        ({"since": ["20260509T100000Z"]}, "since", "since must be an ISO 8601 time"),  # basic
        ({"modle": ["a"]}, "modle", "unknown parameter 'modle'; did you mean 'model'?"),
        ({"model": ["a", "b"]}, "model", "model is given 2 times; give it once"),
    ],
)
def test_bad_parameters_are_bad_requests_naming_the_parameter(
    args: dict[str, list[str]], param: str, message: str
) -> None:
    error = bad(args)
    assert error.param == param
    assert str(error).startswith(message), str(error)


def test_a_plus_turned_into_a_space_by_the_url_gets_a_hint() -> None:
    # "?since=2026-05-09T10:00:00+02:00" unencoded arrives with a space for the '+'.
    error = bad({"since": ["2026-05-09T10:00:00 02:00"]})
    assert "a '+' in a URL must be sent as %2B" in str(error)


def test_a_record_round_trips_through_json_and_ignores_unknown_keys() -> None:
    record = make(7)
    record = ActivityRecord(
        **{**record.to_json(), "metadata": {"peer": "gpu2"}, "generation_tokens_per_second": 4.5}
    )
    document: dict[str, Any] = record.to_json()
    assert document["prompt_tokens_per_second"] is None
    assert document["generation_tokens_per_second"] == 4.5
    assert ActivityRecord.from_json({**document, "added_later": 1}) == record
