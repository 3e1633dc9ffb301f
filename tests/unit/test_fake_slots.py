"""The fake server's slots (fake_server/_slots.py): which slot a prompt goes to, how much of it
the slot's cache covers, and the slot files of ``--slot-save-path``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamaswap.fake_server._slots import (
    BYTES_PER_TOKEN,
    CANNOT_RESTORE,
    INVALID_FILENAME,
    INVALID_SLOT,
    NO_SAVE_PATH,
    SlotCaches,
    SlotRefused,
)

TURN = ["tell", "me", "about", "rivers"]
ANSWER = ["amber", "basalt", "cedar"]


def test_a_returning_conversation_is_processed_from_where_the_cache_ends() -> None:
    caches = SlotCaches(1, "m", None)
    assert caches.take(TURN) == (0, 0)  # a cold slot: every word processed
    caches.generated(0, TURN + ANSWER)
    slot, cached = caches.take([*TURN, *ANSWER, "and", "lakes"])
    assert (slot, cached) == (0, 7)  # only "and lakes" processed


def test_the_last_word_of_a_cached_prompt_is_processed_again() -> None:
    # As llama-server: the last prompt token is evaluated again, for its logits.
    caches = SlotCaches(1, "m", None)
    caches.take(TURN)
    assert caches.take(TURN) == (0, 3)
    assert caches.take([]) == (0, 0)


def test_a_prompt_goes_to_the_slot_sharing_most_else_the_least_recently_used() -> None:
    caches = SlotCaches(3, "m", None)
    assert caches.take(["a", "b"])[0] == 0
    assert caches.take(["c", "d"])[0] == 1
    assert caches.take(["e"])[0] == 2  # the unused one
    assert caches.take(["x"])[0] == 0  # nothing shared: the least recently used
    assert caches.take(["c", "d", "e"]) == (1, 2)
    assert caches.take(["a", "b"]) == (2, 0)  # slot 0 holds "x" now; 2 is the oldest


def test_slots_are_listed_as_llama_server_lists_them() -> None:
    caches = SlotCaches(2, "m", None)
    caches.take(TURN)
    assert caches.describe() == [
        {
            "id": 0,
            "n_ctx": 4096,
            "speculative": False,
            "is_processing": False,
            "id_task": 1,
            "n_prompt_tokens": 4,
        },
        {"id": 1, "n_ctx": 4096, "speculative": False, "is_processing": False},
    ]


def test_a_saved_slot_restores_into_a_fresh_server(tmp_path: Path) -> None:
    first = SlotCaches(2, "m", str(tmp_path))
    first.take(TURN)
    first.generated(0, TURN + ANSWER)
    assert first.save("0", "s.bin") == {
        "id_slot": 0,
        "filename": "s.bin",
        "n_saved": 7,
        "n_written": 7 * BYTES_PER_TOKEN,
    }
    assert (tmp_path / "s.bin").stat().st_size == 7 * BYTES_PER_TOKEN
    fresh = SlotCaches(2, "m", str(tmp_path))
    assert fresh.restore("1", "s.bin")["n_restored"] == 7
    # As llama-server lists it: no task yet, so nothing said of the tokens it holds.
    assert fresh.describe()[1] == {
        "id": 1,
        "n_ctx": 4096,
        "speculative": False,
        "is_processing": False,
    }
    assert fresh.save("1", "again.bin")["n_saved"] == 7  # yet they are there
    assert fresh.take([*TURN, *ANSWER, "and", "lakes"]) == (1, 7)


def test_a_never_used_slot_saves_nothing(tmp_path: Path) -> None:
    answer = SlotCaches(1, "m", str(tmp_path)).save("0", "empty.bin")
    assert answer["n_saved"] == 0
    assert answer["n_written"] == (tmp_path / "empty.bin").stat().st_size
    assert json.loads((tmp_path / "empty.bin").read_text()) == {"model": "m", "tokens": []}


@pytest.mark.parametrize(
    ("directory", "slot", "filename", "status", "message"),
    [
        (None, "0", "s.bin", 501, NO_SAVE_PATH),
        ("dir", "2", "s.bin", 400, INVALID_SLOT),
        ("dir", "x", "s.bin", 400, INVALID_SLOT),
        ("dir", "0", "../s.bin", 400, INVALID_FILENAME),
        ("dir", "0", "..", 400, INVALID_FILENAME),
        ("dir", "0", "", 400, INVALID_FILENAME),
        ("dir", "0", 7, 400, INVALID_FILENAME),
    ],
)
def test_refusals_say_what_llama_server_says(
    tmp_path: Path, directory: str | None, slot: str, filename: object, status: int, message: str
) -> None:
    caches = SlotCaches(2, "m", None if directory is None else str(tmp_path))
    for action in (caches.save, caches.restore):
        with pytest.raises(SlotRefused) as info:
            action(slot, filename)
        assert (info.value.status, str(info.value)) == (status, message)


def test_a_missing_or_foreign_file_is_not_restored(tmp_path: Path) -> None:
    caches = SlotCaches(1, "m", str(tmp_path))
    other = SlotCaches(1, "other", str(tmp_path))
    other.take(TURN)
    other.save("0", "other.bin")
    (tmp_path / "junk.bin").write_text("not json")
    for name in ("missing.bin", "other.bin", "junk.bin"):
        with pytest.raises(SlotRefused) as info:
            caches.restore("0", name)
        assert (info.value.status, str(info.value)) == (400, CANNOT_RESTORE)
