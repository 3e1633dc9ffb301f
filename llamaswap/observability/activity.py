"""The activity log (SPEC §9.2): one record per proxied request, newest first, bounded.

Two backends answer the same :class:`ActivityQuery`: :class:`ActivityLog`, the last
records in memory (always there, and what the event stream reads), and, when the config
has a ``[store]``, the SQLite file of ``store.py`` that keeps them across restarts.

Times are compared as text: every record's ``time`` is UTC in one fixed-width form
(``2026-05-09T07:35:25.123Z``), so string order is time order, in Python and in SQL alike.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs

from llamaswap.errors import BadRequest
from llamaswap.keypaths import suggestion
from llamaswap.schedulers.priority import BANDS

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "ActivityLog",
    "ActivityQuery",
    "ActivityRecord",
    "iso_time",
    "parameters",
]

#: Records ``GET /api/activity`` returns without ``limit``, and the most it returns.
DEFAULT_LIMIT = 100
MAX_LIMIT = 10_000


def iso_time(moment: datetime.datetime) -> str:
    """``moment`` as the activity log writes times: UTC, milliseconds, ``Z``."""
    utc = moment.astimezone(datetime.timezone.utc)
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.frozen
class ActivityRecord:
    """What happened to one request.

    ``priority``/``band``/``score``/``queue_wait_ms`` describe its time with the scheduler
    (``score`` is ``None`` unless ``serial`` picked it); ``ttft_ms`` runs from its arrival
    to the first byte of the model server's answer; token counts come from the response's
    ``usage`` when it reports one, token speeds and cached and draft tokens from llama.cpp's
    ``timings``; ``metadata`` is whatever the handlers on the request's path added.
    """

    id: int
    time: str
    model: str
    method: str
    path: str
    status: int
    duration_ms: float
    queue_wait_ms: float | None
    scheduler: str | None
    priority: int
    band: str
    score: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None
    metadata: Mapping[str, Any]
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    request: int | None = None  # the request's number (``RequestInfo.id``), if admitted
    ttft_ms: float | None = None
    cached_tokens: int | None = None
    draft_tokens: int | None = None
    draft_accepted_tokens: int | None = None
    captured: bool = False  # its capture was taken (``GET /api/captures/{id}``)

    def to_json(self) -> dict[str, Any]:
        document = attrs.asdict(self, recurse=False)
        document["metadata"] = dict(self.metadata)
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ActivityRecord:
        """The record ``to_json`` wrote (keys this version does not know are ignored)."""
        known = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in document.items() if key in known})


_STATUS_CODE = re.compile(r"[1-5][0-9][0-9]")
_STATUS_CLASS = re.compile(r"([1-5])xx", re.IGNORECASE)
_PARAMETERS = ("model", "band", "status", "since", "until", "limit")
_EXAMPLE_TIME = "2026-05-09T07:35:00Z"


@attrs.frozen
class ActivityQuery:
    """Which records to return, newest first (``GET /api/activity``'s parameters).

    ``status`` is an inclusive range of codes (``(404, 404)``, or ``(500, 599)`` for
    ``5xx``). ``since`` (inclusive) and ``until`` (exclusive) are times in the records'
    own form (see :func:`iso_time`), compared with each record's ``time``: when the
    request arrived.
    """

    model: str | None = None
    band: str | None = None
    status: tuple[int, int] | None = None
    since: str | None = None
    until: str | None = None
    limit: int = DEFAULT_LIMIT

    @classmethod
    def from_args(cls, args: Mapping[str, Sequence[str]]) -> ActivityQuery:
        """The query that URL parameters ask for (each name → its values).

        Raises:
            BadRequest: an unknown parameter, one given twice, or a bad value; ``param``
                names it.
        """
        values = parameters(args, _PARAMETERS)
        band = values.get("band")
        if band is not None and band not in BANDS:
            known = ", ".join(BANDS)
            raise BadRequest(f"band must be one of {known}; got {band!r}", param="band")
        return cls(
            model=values.get("model"),
            band=band,
            status=_parse_status(values.get("status")),
            since=_parse_time("since", values.get("since")),
            until=_parse_time("until", values.get("until")),
            limit=_parse_limit(values.get("limit")),
        )

    def matches(self, record: ActivityRecord) -> bool:
        """Whether ``record`` passes every filter (``limit`` aside)."""
        return (
            (self.model is None or record.model == self.model)
            and (self.band is None or record.band == self.band)
            and (self.status is None or self.status[0] <= record.status <= self.status[1])
            and (self.since is None or record.time >= self.since)
            and (self.until is None or record.time < self.until)
        )


def parameters(args: Mapping[str, Sequence[str]], known: Sequence[str]) -> dict[str, str]:
    """URL parameters (each name → its values) as name → value, each of them ``known``
    and given once.

    Raises:
        BadRequest: an unknown parameter, or one given twice; ``param`` names it.
    """
    values: dict[str, str] = {}
    for name, given in args.items():
        if name not in known:
            hint = suggestion(name, known, noun="parameters")
            raise BadRequest(f"unknown parameter {name!r}; {hint}", param=name)
        if len(given) != 1:
            raise BadRequest(f"{name} is given {len(given)} times; give it once", param=name)
        values[name] = given[0]
    return values


def _parse_status(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    if _STATUS_CODE.fullmatch(text):
        return int(text), int(text)
    if match := _STATUS_CLASS.fullmatch(text):
        low = int(match.group(1)) * 100
        return low, low + 99
    raise BadRequest(
        f"status must be a status code (like 404) or a class (2xx, 4xx, 5xx); got {text!r}",
        param="status",
    )


def _parse_limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if not 0 <= limit <= MAX_LIMIT:
        raise BadRequest(
            f"limit must be an integer from 0 to {MAX_LIMIT}; got {text[:40]!r}", param="limit"
        )
    return limit


#: ISO 8601's extended format, as far as a time filter needs it: a date; then a time to
#: the minute, the second, or a fraction of any length (``.`` or ``,``); then ``Z`` or an
#: offset. Python 3.10's ``fromisoformat`` reads only what ``isoformat`` writes, so the
#: text is put in that form first: every Python reads the same times.
_ISO_TIME = re.compile(
    r"(\d{4}-\d\d-\d\d)(?:[Tt ](\d\d:\d\d)(?::(\d\d)(?:[.,](\d+))?)?)?([Zz]|[+-]\d\d:?\d\d)?"
)


def _extended_iso(text: str) -> str:
    """``text`` as ``fromisoformat`` reads it on every Python; ValueError if it is not an
    ISO 8601 time in the extended format."""
    if (match := _ISO_TIME.fullmatch(text)) is None:
        raise ValueError(text)
    date, minute, second, fraction, zone = match.groups()
    fraction = (fraction or "")[:6].ljust(6, "0")  # beyond microseconds: cut, as 3.11 does
    if zone is None or zone in ("Z", "z"):  # none: UTC, like the records
        zone = "+00:00"
    elif ":" not in zone:
        zone = f"{zone[:3]}:{zone[3:]}"
    return f"{date}T{minute or '00:00'}:{second or '00'}.{fraction}{zone}"


def _parse_time(name: str, text: str | None) -> str | None:
    """An ISO 8601 time as the records write it, rounded up to the millisecond.

    Records have whole milliseconds, so rounding up keeps ``time >= since`` and
    ``time < until`` exact. A time without an offset is UTC, like the records.
    """
    if text is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(_extended_iso(text.strip()))
        moment = moment.astimezone(datetime.timezone.utc)
        if spare := moment.microsecond % 1000:
            moment += datetime.timedelta(microseconds=1000 - spare)
    except (ValueError, OverflowError):
        hint = ""
        if " " in text.strip():
            hint = " (a '+' in a URL must be sent as %2B, or give the time in UTC with 'Z')"
        raise BadRequest(
            f"{name} must be an ISO 8601 time like {_EXAMPLE_TIME!r}; got {text[:60]!r}{hint}",
            param=name,
        ) from None
    return iso_time(moment)


@final
class ActivityLog:
    """The last ``capacity`` records, in memory.

    ``first_id`` is the first record ID handed out: with a store, the one after the
    newest stored record, so IDs keep increasing across restarts.
    """

    def __init__(self, capacity: int = 1000, *, first_id: int = 1) -> None:
        self._records: collections.deque[ActivityRecord] = collections.deque(maxlen=capacity)
        self._ids = itertools.count(first_id)
        self._listeners: list[Callable[[ActivityRecord], None]] = []

    def next_id(self) -> int:
        return next(self._ids)

    def add_listener(self, listener: Callable[[ActivityRecord], None]) -> None:
        """``listener`` is told of each record as it is added (events); must not raise."""
        self._listeners.append(listener)

    def add(self, record: ActivityRecord) -> None:
        self._records.append(record)
        for listener in self._listeners:
            listener(record)

    def select(self, query: ActivityQuery) -> list[ActivityRecord]:
        """Up to ``query.limit`` records that match ``query``, newest first."""
        found: list[ActivityRecord] = []
        for record in reversed(self._records):
            if len(found) >= query.limit:
                break
            if query.matches(record):
                found.append(record)
        return found

    def recent(self, limit: int = DEFAULT_LIMIT, model: str | None = None) -> list[ActivityRecord]:
        """Up to ``limit`` records, newest first, optionally only those of ``model``."""
        return self.select(ActivityQuery(model=model, limit=limit))
