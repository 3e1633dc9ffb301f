"""logTimeFormat: llama-swap's time layout names as llamaswap's console timestamps."""

from __future__ import annotations

import datetime
import logging
import re
from typing import get_args

import pytest

from llamaswap.config.model import LogTimeFormat
from llamaswap.observability.logs import ConsoleFormatter, log_time

UTC = datetime.timezone.utc
MOMENT = datetime.datetime(2026, 12, 1, 7, 30, 24, 123456, tzinfo=UTC)
EAST = datetime.datetime(
    2026, 12, 1, 19, 5, 0, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
)


@pytest.mark.parametrize(
    ("name", "moment", "expected"),
    [
        ("ansic", MOMENT, "Tue Dec  1 07:30:24 2026"),
        ("unixdate", MOMENT, "Tue Dec  1 07:30:24 UTC 2026"),
        ("rubydate", MOMENT, "Tue Dec 01 07:30:24 +0000 2026"),
        ("rfc822", MOMENT, "01 Dec 26 07:30 UTC"),
        ("rfc822z", EAST, "01 Dec 26 19:05 +0200"),
        ("rfc850", MOMENT, "Tuesday, 01-Dec-26 07:30:24 UTC"),
        ("rfc1123", MOMENT, "Tue, 01 Dec 2026 07:30:24 UTC"),
        ("rfc1123z", EAST, "Tue, 01 Dec 2026 19:05:00 +0200"),
        ("rfc3339", MOMENT, "2026-12-01T07:30:24Z"),
        ("rfc3339", EAST, "2026-12-01T19:05:00+02:00"),
        ("rfc3339nano", MOMENT, "2026-12-01T07:30:24.123456Z"),
        ("kitchen", EAST, "7:05PM"),
        ("stamp", MOMENT, "Dec  1 07:30:24"),
        ("stampmilli", MOMENT, "Dec  1 07:30:24.123"),
        ("stampmicro", MOMENT, "Dec  1 07:30:24.123456"),
        ("stampnano", MOMENT, "Dec  1 07:30:24.123456000"),
    ],
)
def test_each_layout(name: str, moment: datetime.datetime, expected: str) -> None:
    assert log_time(name, moment) == expected


def test_every_name_the_config_accepts_has_a_layout() -> None:
    for name in get_args(LogTimeFormat):
        if name:
            assert log_time(name, MOMENT)


def record() -> logging.LogRecord:
    return logging.LogRecord(
        "llamaswap.proxy", logging.INFO, __file__, 1, "hello %s", ("you",), None
    )


def test_empty_format_means_no_timestamp() -> None:
    assert ConsoleFormatter("").format(record()) == "INFO llamaswap.proxy: hello you"


def test_named_format_and_default() -> None:
    rfc3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)"
    line = ConsoleFormatter("rfc3339").format(record())
    assert re.fullmatch(rf"{rfc3339} INFO llamaswap.proxy: hello you", line)
    default = ConsoleFormatter(None).format(record())
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO llamaswap.proxy: hello you", default
    )
