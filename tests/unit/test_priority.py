from __future__ import annotations

import pytest

from llamaswap.schedulers.priority import BANDS, band_of, parse_priority


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], 0),
        (["interactive"], 100),
        (["  Interactive "], 100),
        (["NORMAL"], 0),
        (["batch"], -100),
        (["+25"], 25),
        (["-7"], -7),
        (["100000"], 100000),
        (["  42\t"], 42),
        ([str(10**40)], 10**40),
        (["-" + "9" * 4000], -int("9" * 4000)),
        (["9" * 4001], 0),  # longer than Python will print back: treated as garbage
        (["high"], 0),
        (["1.5"], 0),
        (["0x10"], 0),
        (["1_000"], 0),
        (["٣"], 0),  # a non-ASCII digit
        ([""], 0),
        (["+"], 0),
        (["batch", "interactive"], -100),  # the first occurrence counts
        (["garbage", "interactive"], 0),
    ],
)
def test_parse_priority(values: list[str], expected: int) -> None:
    assert parse_priority(values) == expected


@pytest.mark.parametrize(
    ("priority", "band"),
    [
        (0, "normal"),
        (49, "normal"),
        (50, "interactive"),
        (-50, "normal"),
        (-51, "batch"),
        (100, "interactive"),
        (105, "interactive"),
        (149, "interactive"),
        (150, "above_interactive"),
        (-100, "batch"),
        (-150, "batch"),
        (-151, "below_batch"),
        (10**40, "above_interactive"),
        (-(10**40), "below_batch"),
    ],
)
def test_band_is_the_nearest_multiple_of_100_halves_up(priority: int, band: str) -> None:
    assert band_of(priority) == band


def test_five_bands() -> None:
    assert BANDS == ("above_interactive", "interactive", "normal", "batch", "below_batch")
