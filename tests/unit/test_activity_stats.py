"""The activity statistics (``GET /api/activity/stats``): a pure function of records."""

from __future__ import annotations

from typing import Any

import pytest

from llamaswap.errors import BadRequest
from llamaswap.observability import ActivityRecord
from llamaswap.observability.activity_stats import (
    DEFAULT_WINDOW,
    ModelStats,
    Percentiles,
    activity_stats,
    percentile,
    stats_window,
)

NONE = Percentiles(0, None, None, None)


def record(model: str = "chat", status: int = 200, **fields: Any) -> ActivityRecord:
    base: dict[str, Any] = dict(
        id=1, time="2026-11-30T07:00:00.000Z", model=model, method="POST",
        path="/v1/chat/completions", status=status, duration_ms=100.0, queue_wait_ms=0.0,
        scheduler="fifo", priority=0, band="normal", score=None, prompt_tokens=None,
        completion_tokens=None, error=None, metadata={},
    )  # fmt: skip
    return ActivityRecord(**{**base, **fields})


def test_percentiles_are_nearest_rank_values_of_the_records() -> None:
    # 1..20 in any order: p50 is the 10th value, p95 the 19th, p99 the 20th (the largest).
    shuffled = (7, 20, 1, 14, 3, 18, 9, 12, 5, 16, 2, 19, 8, 11, 4, 17, 6, 13, 10, 15)
    values = [float(v) for v in shuffled]
    assert Percentiles.of(values) == Percentiles(20, 10.0, 19.0, 20.0)
    # 100 values: p99 is the 99th, not the largest.
    assert Percentiles.of([float(v) for v in range(1, 101)]) == Percentiles(100, 50.0, 95.0, 99.0)
    assert Percentiles.of([0.25]) == Percentiles(1, 0.25, 0.25, 0.25)
    assert Percentiles.of([]) == NONE
    assert percentile([3.0, 1.0, 2.0], 0.0) == 1.0  # the smallest, never an index of -1


def test_each_figure_over_the_served_requests_of_each_model() -> None:
    records = [
        record(queue_wait_ms=10.0, ttft_ms=40.0, duration_ms=400.0,
               generation_tokens_per_second=30.0, prompt_tokens=100, completion_tokens=8,
               cached_tokens=90, draft_tokens=10, draft_accepted_tokens=6),
        record(queue_wait_ms=30.0, ttft_ms=80.0, duration_ms=900.0,
               generation_tokens_per_second=20.0, prompt_tokens=50, completion_tokens=4,
               cached_tokens=0),
        # Not served: an answer of llamaswap's, and a stream whose client left mid-way.
        record(status=429, queue_wait_ms=None, duration_ms=1.0),
        record(queue_wait_ms=5000.0, ttft_ms=5100.0, duration_ms=5200.0, prompt_tokens=7,
               error="client disconnected"),
        # Another model; the names that reached none are left out.
        record(model="embed", queue_wait_ms=None, duration_ms=20.0, prompt_tokens=3),
        record(model="", status=404, queue_wait_ms=None),
    ]  # fmt: skip
    stats = activity_stats(records)
    assert list(stats) == ["chat", "embed"]
    assert stats["chat"] == ModelStats(
        requests=4,
        errors=2,
        queue_wait_ms=Percentiles(2, 10.0, 30.0, 30.0),
        ttft_ms=Percentiles(2, 40.0, 80.0, 80.0),
        generation_tokens_per_second=Percentiles(2, 20.0, 30.0, 30.0),
        duration_ms=Percentiles(2, 400.0, 900.0, 900.0),
        prompt_tokens=150,
        completion_tokens=12,
        cached_tokens=90,
        draft_tokens=10,
        draft_accepted_tokens=6,
    )
    # A figure no served record has (a peer's queue wait, an embedding's speed): none.
    assert stats["embed"] == ModelStats(
        requests=1,
        errors=0,
        queue_wait_ms=NONE,
        ttft_ms=NONE,
        generation_tokens_per_second=NONE,
        duration_ms=Percentiles(1, 20.0, 20.0, 20.0),
        prompt_tokens=3,
        completion_tokens=0,
        cached_tokens=0,
        draft_tokens=0,
        draft_accepted_tokens=0,
    )
    assert activity_stats([]) == {}


def test_the_json_of_a_model() -> None:
    document = activity_stats([record(ttft_ms=12.5)])["chat"].to_json()
    assert document["ttft_ms"] == {"count": 1, "p50": 12.5, "p95": 12.5, "p99": 12.5}
    assert document["queue_wait_ms"] == {"count": 1, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    assert (document["requests"], document["errors"], document["draft_tokens"]) == (1, 0, 0)


def test_the_window_parameter() -> None:
    assert stats_window({}) == DEFAULT_WINDOW == 3600.0
    assert stats_window({"window": ["15m"]}) == 900.0
    assert stats_window({"window": ["90"]}) == 90.0
    assert stats_window({"window": ["1d12h"]}) == 129_600.0


@pytest.mark.parametrize(
    ("args", "param", "message"),
    [
        ({"window": ["soon"]}, "window", "window: expected a number of seconds or a duration"),
        ({"window": ["0"]}, "window", "window: expected a duration from 1 to 315360000"),
        ({"window": ["1m", "2m"]}, "window", "window is given 2 times; give it once"),
        ({"windw": ["1m"]}, "windw", "unknown parameter 'windw'; did you mean 'window'?"),
    ],
)
def test_a_bad_window_is_a_400_naming_it(
    args: dict[str, list[str]], param: str, message: str
) -> None:
    with pytest.raises(BadRequest) as caught:
        stats_window(args)
    assert caught.value.param == param
    assert str(caught.value).startswith(message)
