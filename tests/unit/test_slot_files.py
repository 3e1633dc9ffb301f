"""The slot keeper's pure rules (process/slots.py): whose a file is (its name), which files
the disk bound deletes, and which listed slots are worth saving."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llamaswap.config.model import ModelConfig
from llamaswap.process.slots import (
    SlotFile,
    _enforce_limit,
    _may_hold_tokens,
    _tidy_model,
    definition_tag,
    file_stem,
    over_limit,
    parse_slot_file,
    slot_file,
)

CHAT = ModelConfig(cmd=("llama-server", "-m", "chat.gguf"))


@pytest.mark.parametrize(
    ("model", "stem"),
    [
        ("chat", "chat"),
        ("Qwen2.5-7B", "Qwen2.5-7B"),
        ("qwen:7b", "qwen_3a7b"),
        ("org/model", "org_2fmodel"),
        ("a_b", "a_5fb"),  # "_" itself is escaped: a_b and a/b stay apart
        ("Qwen3 30B", "Qwen3_2030B"),
        ("..", ".."),  # never a whole file name: "llamaswap-" comes first
        ("modèle", "mod_c3_a8le"),
    ],
)
def test_a_model_id_becomes_a_safe_stem(model: str, stem: str) -> None:
    assert file_stem(model) == stem


def test_stems_never_meet() -> None:
    models = ["a/b", "a_b", "a_2fb", "a:b", "a b", "a-b", "A-b", "x" * 200, "x" * 201]
    assert len({file_stem(model) for model in models}) == len(models)


def test_a_long_model_id_is_shortened_with_a_hash() -> None:
    stem = file_stem("m" * 300)
    assert len(stem) == 64 + 2 + 16
    assert stem.startswith("m" * 64 + "_x")
    name = slot_file("m" * 300, CHAT, 3)
    assert len(name) < 255  # llama-server's limit on a file name


def test_a_file_name_says_whose_it_is() -> None:
    name = slot_file("qwen:7b", CHAT, 12)
    tag = definition_tag("qwen:7b", CHAT)
    assert name == f"llamaswap-qwen_3a7b-{tag}-slot12.bin"
    assert parse_slot_file(name) == ("qwen_3a7b", tag, 12)
    # The stem may hold "-": the name still parses from its end.
    assert parse_slot_file(slot_file("a-1234abcd", CHAT, 0)) == (
        "a-1234abcd",
        definition_tag("a-1234abcd", CHAT),
        0,
    )


@pytest.mark.parametrize(
    "name",
    [
        "slot0.bin",
        "llamaswap-chat-slot0.bin",
        "llamaswap-chat-0123456-slot0.bin",  # 7 hex digits
        "llamaswap-chat-0123456g-slot0.bin",
        "llamaswap-chat-01234567-slot0.bin.tmp",
        "llamaswap-chat-01234567-slotx.bin",
        "llamaswap-ch/at-01234567-slot0.bin",
        "llamaswap--01234567-slot0.bin",
    ],
)
def test_other_files_are_not_llamaswaps(name: str) -> None:
    assert parse_slot_file(name) is None


def test_the_definition_tag_changes_with_what_the_server_runs() -> None:
    tag = definition_tag("chat", CHAT)
    assert tag == definition_tag("chat", ModelConfig(cmd=CHAT.cmd, ttl=60, aliases=("c",)))
    other_weights = ModelConfig(cmd=("llama-server", "-m", "chat-q8.gguf"))
    other_env = ModelConfig(cmd=CHAT.cmd, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert (
        len({tag, definition_tag("chat", other_weights), definition_tag("chat", other_env)}) == 3
    )
    assert definition_tag("other", CHAT) != tag


def slot(path: str, size: int, used: int) -> SlotFile:
    return SlotFile(path, "m", "01234567", 0, size, used)


def test_the_bound_deletes_the_least_recently_used_until_the_rest_fit() -> None:
    files = [slot("/d/c", 30, 3), slot("/d/a", 10, 1), slot("/d/b", 20, 2)]
    assert over_limit(files, 60) == []
    assert over_limit(files, 59) == [slot("/d/a", 10, 1)]
    assert over_limit(files, 30) == [slot("/d/a", 10, 1), slot("/d/b", 20, 2)]
    assert over_limit(files, 29) == [slot("/d/a", 10, 1), slot("/d/b", 20, 2), slot("/d/c", 30, 3)]
    assert over_limit(files, 0) == sorted(files, key=lambda file: file.used)
    assert over_limit([], 0) == []


def test_the_bound_spares_the_files_of_the_model_being_loaded() -> None:
    # They are restored a moment later; they count, so the rest may stay over the limit.
    loading = SlotFile("/d/l", "loading", "01234567", 0, 50, 0)
    files = [loading, slot("/d/a", 10, 1), slot("/d/b", 20, 2)]
    assert over_limit(files, 70, spare="loading") == [slot("/d/a", 10, 1)]
    assert over_limit(files, 10, spare="loading") == [slot("/d/a", 10, 1), slot("/d/b", 20, 2)]
    assert over_limit(files, 10, spare="m") == [loading]


def test_files_used_at_the_same_moment_go_by_path() -> None:
    files = [slot("/d/b", 10, 1), slot("/d/a", 10, 1)]
    assert over_limit(files, 10) == [slot("/d/a", 10, 1)]


def write(path: Path, size: int, used_ns: int) -> None:
    path.write_bytes(b"\0" * size)
    os.utime(path, ns=(used_ns, used_ns))


def test_the_bound_spans_every_directory_and_spares_other_files(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    a = slot_file("a", CHAT, 0)
    b = slot_file("b", CHAT, 0)
    c = slot_file("c", CHAT, 1)
    write(one / a, 100, 1_000_000_000)
    write(two / b, 100, 2_000_000_000)
    write(one / c, 100, 3_000_000_000)
    write(one / "mine.bin", 10_000, 0)  # not llamaswap's: never counted, never deleted
    deleted = _enforce_limit({str(one), str(two), str(tmp_path / "gone")}, 150)
    assert [os.path.basename(file.path) for file in deleted] == [a, b]
    assert sorted(os.listdir(one)) == sorted([c, "mine.bin"])
    assert os.listdir(two) == []


def test_after_a_save_only_what_it_saved_and_kept_remains(tmp_path: Path) -> None:
    earlier = ModelConfig(cmd=("llama-server", "-m", "old.gguf"))
    saved, kept, empty = (slot_file("m", CHAT, n) for n in (0, 1, 2))
    for name in (saved, kept, empty, slot_file("m", earlier, 0), slot_file("n", CHAT, 0)):
        (tmp_path / name).write_bytes(b"x")
    missing = _tidy_model(str(tmp_path), "m", {saved, slot_file("m", CHAT, 5)}, {kept})
    assert missing == {slot_file("m", CHAT, 5)}  # the server said saved, yet it is not here
    assert sorted(os.listdir(tmp_path)) == sorted([saved, kept, slot_file("n", CHAT, 0)])


@pytest.mark.parametrize(
    ("listed", "worth"),
    [
        ({"id": 0, "id_task": 3, "n_prompt_tokens": 812}, True),
        ({"id": 0, "id_task": 3, "n_prompt_tokens": 0}, False),
        ({"id": 0, "n_past": 5}, True),
        ({"id": 0, "n_past": 0, "id_task": 3}, False),
        # Says nothing of its tokens: saved, and n_saved tells. A slot never used (as
        # llama-server lists it), one restored and not used since (the same), an older
        # llama-server's (its prompt is the last task's, not the cache).
        ({"id": 0, "n_ctx": 4096, "is_processing": False}, True),
        ({"id": 0, "id_task": -1, "prompt": ""}, True),
        ({"id": 0, "n_prompt_tokens": True}, True),  # not a count
    ],
)
def test_which_listed_slots_are_saved(listed: dict[str, object], worth: bool) -> None:
    assert _may_hold_tokens(listed) is worth
