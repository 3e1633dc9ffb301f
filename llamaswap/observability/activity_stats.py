"""Statistics over the activity log (``GET /api/activity/stats``): per model, the
percentiles of queue wait, time to first token, generation speed and duration, and the
tokens its answers counted, over the requests of a window of time.

The route picks the records (those that arrived in the last ``window``, from memory or
the store, the newest ``MAX_RECORDS`` of them); :func:`activity_stats` is a pure function
of those records, so what it computes is tested on records alone.

Percentiles are nearest-rank: the smallest value that at least that share of the values
is at or below. They are exact values of the records (never interpolated between two),
and with few records they say so: the p99 of 50 requests is the slowest of them. They
are taken over the requests that were **served** (status below 400 and no error, so a
429 answered at once does not make waits look short); ``requests`` and ``errors`` count
every record, and the token sums those served.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from llamaswap.config.values import Bounds, InvalidValue, parse_duration_in
from llamaswap.errors import BadRequest

from .activity import MAX_LIMIT, ActivityRecord, parameters

__all__ = [
    "DEFAULT_WINDOW",
    "MAX_RECORDS",
    "ModelStats",
    "Percentiles",
    "activity_stats",
    "percentile",
    "stats_window",
]

#: Seconds of activity the statistics cover when the request does not say.
DEFAULT_WINDOW = 3600.0
#: ``window``'s range: a second to the longest ``store.maxAge``.
WINDOW = Bounds(1, 315_360_000, "a duration", "seconds", "3650 days")
#: The most records one answer reads: the newest of its window.
MAX_RECORDS = MAX_LIMIT
_PARAMETERS = ("window",)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (``fraction`` in 0..1); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@attrs.frozen
class Percentiles:
    """How ``count`` values are spread: their median, 95th and 99th percentiles."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        p50, p95, p99 = (percentile(values, fraction) for fraction in (0.5, 0.95, 0.99))
        return cls(len(values), p50, p95, p99)


@attrs.frozen
class ModelStats:
    """One model's requests in a window (see the module docstring for which count where)."""

    requests: int
    errors: int
    queue_wait_ms: Percentiles
    ttft_ms: Percentiles
    generation_tokens_per_second: Percentiles
    duration_ms: Percentiles
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    draft_tokens: int
    draft_accepted_tokens: int

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def activity_stats(records: Iterable[ActivityRecord]) -> dict[str, ModelStats]:
    """The statistics of ``records``, by model ID in name order (records of names that
    reached no model, ``""``, are left out)."""
    by_model: dict[str, list[ActivityRecord]] = collections.defaultdict(list)
    for record in records:
        if record.model:
            by_model[record.model].append(record)
    return {model: _model_stats(by_model[model]) for model in sorted(by_model)}


def _model_stats(records: Sequence[ActivityRecord]) -> ModelStats:
    served = [r for r in records if r.status < 400 and r.error is None]

    def spread(figure: Callable[[ActivityRecord], float | None]) -> Percentiles:
        return Percentiles.of([value for r in served if (value := figure(r)) is not None])

    def total(count: Callable[[ActivityRecord], int | None]) -> int:
        return sum(count(r) or 0 for r in served)

    return ModelStats(
        requests=len(records),
        errors=len(records) - len(served),
        queue_wait_ms=spread(lambda r: r.queue_wait_ms),
        ttft_ms=spread(lambda r: r.ttft_ms),
        generation_tokens_per_second=spread(lambda r: r.generation_tokens_per_second),
        duration_ms=spread(lambda r: r.duration_ms),
        prompt_tokens=total(lambda r: r.prompt_tokens),
        completion_tokens=total(lambda r: r.completion_tokens),
        cached_tokens=total(lambda r: r.cached_tokens),
        draft_tokens=total(lambda r: r.draft_tokens),
        draft_accepted_tokens=total(lambda r: r.draft_accepted_tokens),
    )


def stats_window(args: Mapping[str, Sequence[str]]) -> float:
    """The seconds ``GET /api/activity/stats``'s URL parameters ask for (``window``: a
    number of seconds or a duration such as ``15m``; DEFAULT_WINDOW without it).

    Raises:
        BadRequest: an unknown parameter, one given twice, or a bad window.
    """
    text = parameters(args, _PARAMETERS).get("window")
    if text is None:
        return DEFAULT_WINDOW
    try:
        return parse_duration_in(text, WINDOW)
    except InvalidValue as exc:
        raise BadRequest(f"window: {exc}", param="window") from None
