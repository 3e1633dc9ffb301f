"""The SQLite activity store on a temporary file: filters, pruning, reopening, bad files."""

from __future__ import annotations

import contextlib
import datetime
import logging
import sqlite3
from pathlib import Path

import pytest

from llamaswap.errors import ConfigError
from llamaswap.observability import ActivityStore
from llamaswap.observability.store import SCHEMA_VERSION, merge_newest
from tests.unit.test_activity_query import CASES, RECORDS, make, query

#: 2026-05-09T10:00:00Z, the records' day.
TEN_O_CLOCK = datetime.datetime(2026, 5, 9, 10, tzinfo=datetime.timezone.utc).timestamp()


class WallClock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def store_at(
    path: Path, *, max_rows: int = 1000, max_age: float = 86_400.0, now: float = TEN_O_CLOCK
) -> tuple[ActivityStore, WallClock]:
    clock = WallClock(now)
    return ActivityStore(str(path), max_rows=max_rows, max_age=max_age, wall_clock=clock), clock


def ids(store: ActivityStore, **args: str) -> list[int]:
    return [record.id for record in store.query(query(**args))]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_the_store_applies_each_filter_newest_first(
    tmp_path: Path, args: dict[str, str], expected: list[int]
) -> None:
    store, _ = store_at(tmp_path / "activity.db")
    assert store.open() == 1
    store.insert(RECORDS)
    assert ids(store, **args) == expected


def test_records_come_back_as_they_went_in_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "activity.db"
    store, _ = store_at(path)
    store.open()
    stored = make(3, model="coder")
    stored = type(stored)(
        **{
            **stored.to_json(),
            "metadata": {"requested_model": "c", "affinity": True},
            "prompt_tokens_per_second": 812.25,
            "generation_tokens_per_second": 41.5,
        }
    )
    store.insert([make(1), stored])
    again, _ = store_at(path)
    assert again.open() == 4  # the ID after the newest stored one
    assert again.query(query()) == [stored, make(1)]
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_the_same_id_again_replaces_the_record(tmp_path: Path) -> None:
    store, _ = store_at(tmp_path / "activity.db")
    store.open()
    store.insert([make(1, model="a")])
    store.insert([make(1, model="b")])
    assert [(r.id, r.model) for r in store.query(query())] == [(1, "b")]


def test_rows_beyond_max_rows_are_pruned_oldest_first(tmp_path: Path) -> None:
    store, _ = store_at(tmp_path / "activity.db", max_rows=3)
    store.open()
    store.insert(RECORDS[:2])
    assert store.count() == 2
    store.insert(RECORDS[2:])  # six in all: 1, 2 and 3 go
    assert store.count() == 3
    assert ids(store) == [6, 5, 4]
    store.insert([make(7)])
    assert ids(store) == [7, 6, 5]


def test_records_older_than_max_age_are_pruned_and_never_returned(tmp_path: Path) -> None:
    # One minute of age; the records arrived at 10:00:01 ... 10:00:06.
    store, clock = store_at(tmp_path / "activity.db", max_age=60.0, now=TEN_O_CLOCK + 62.5)
    store.open()
    store.insert(RECORDS)  # the horizon is 10:00:02.500: 1 and 2 are pruned
    assert store.count() == 4
    assert ids(store) == [6, 5, 4, 3]
    clock.now += 2.0  # horizon 10:00:04.500: 4 is too old, though still in the file
    assert ids(store) == [6, 5]
    assert ids(store, since="2026-05-09T10:00:00Z") == [6, 5]  # not even when asked
    assert ids(store, since="2026-05-09T10:00:05.500Z") == [6]
    assert store.count() == 4
    store.insert([make(7)])  # the next write prunes them
    assert store.count() == 3
    assert store.horizon() == "2026-05-09T10:00:04.500Z"


def test_merging_the_file_with_the_ring_keeps_one_record_per_id_newest_first() -> None:
    stored = [make(4), make(3), make(1)]
    ring = [make(6), make(5), make(4)]
    assert [r.id for r in merge_newest(stored, ring, limit=10)] == [6, 5, 4, 3, 1]
    assert [r.id for r in merge_newest(stored, ring, limit=2)] == [6, 5]
    assert merge_newest([], [], limit=5) == []


def test_a_missing_directory_is_a_config_problem_at_store_path(tmp_path: Path) -> None:
    store, _ = store_at(tmp_path / "nowhere" / "activity.db")
    with pytest.raises(ConfigError) as info:
        store.open(config_file="llamaswap.toml")
    (problem,) = info.value.problems
    assert problem.path == "store.path"
    assert problem.message.startswith(
        f"cannot use {str(tmp_path / 'nowhere' / 'activity.db')!r} as the activity store: "
        "unable to open database file; "
    )
    assert str(info.value).startswith("1 problem in llamaswap.toml:")


def test_a_directory_is_refused_as_one(tmp_path: Path) -> None:
    store, _ = store_at(tmp_path)
    with pytest.raises(ConfigError) as info:
        store.open()
    assert f"cannot use {str(tmp_path)!r} as the activity store: it is a directory" in str(
        info.value
    )


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my precious notes, not a database\n" * 100)
    store, _ = store_at(path)
    with pytest.raises(ConfigError) as info:
        store.open()
    assert "file is not a database" in info.value.problems[0].message
    assert path.read_bytes() == b"my precious notes, not a database\n" * 100


def test_a_store_written_by_a_newer_llamaswap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "activity.db"
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store, _ = store_at(path)
    with pytest.raises(ConfigError) as info:
        store.open()
    assert f"it was written by a newer llamaswap (layout {SCHEMA_VERSION + 1})" in str(info.value)


@pytest.mark.parametrize(
    "columns", ["id INTEGER PRIMARY KEY, time TEXT", "name TEXT"], ids=["some", "none"]
)
def test_a_table_of_another_layout_is_refused(tmp_path: Path, columns: str) -> None:
    path = tmp_path / "activity.db"
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute(f"CREATE TABLE activity ({columns})")
    store, _ = store_at(path)
    with pytest.raises(ConfigError) as info:
        store.open()
    assert "it holds an 'activity' table that is not llamaswap's" in str(info.value)


def test_another_programs_database_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE users (name TEXT)")
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT)")
        connection.execute("PRAGMA user_version = 7")
    store, _ = store_at(path)
    with pytest.raises(ConfigError) as info:
        store.open()
    assert "it holds tables of another program (orders, users)" in str(info.value)
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == 7
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        assert sorted(name for (name,) in tables) == ["orders", "sqlite_sequence", "users"]


def test_rows_damaged_outside_llamaswap_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "activity.db"
    store, _ = store_at(path)
    store.open()
    store.insert([make(1), make(2), make(3), make(4)])
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("UPDATE activity SET record = 'null' WHERE id = 1")
        connection.execute("UPDATE activity SET record = '[1, 2]' WHERE id = 2")
        # An ID in the record that disagrees with its row: the row's counts.
        connection.execute(
            "UPDATE activity SET record = json_set(record, '$.id', '100') WHERE id = 3"
        )
    assert ids(store) == [4, 3]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def remove(path: Path) -> None:
    """``rm activity.db*``, as a user cleaning up would."""
    for file in path.parent.glob(f"{path.name}*"):
        file.unlink()


def test_a_store_deleted_while_running_is_created_again_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "activity.db"
    store, _ = store_at(path)
    store.open()
    store.insert([make(1), make(2)])
    remove(path)
    store.insert([make(3)])
    store.insert([make(4)])
    assert ids(store) == [4, 3]
    assert warnings_of(caplog) == [
        f"the activity store {path} was deleted while llamaswap ran; created it again there "
        "(the records it held are gone, the last ones are still in memory)"
    ]
    with contextlib.closing(sqlite3.connect(path)) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        indexes = connection.execute("SELECT name FROM sqlite_master WHERE type='index'")
        assert [name for (name,) in indexes] == ["activity_time"]
    remove(path)  # again: again one warning
    store.insert([make(5)])
    assert ids(store) == [5]
    assert len(warnings_of(caplog)) == 2


def test_a_query_after_the_store_was_deleted_finds_nothing_and_creates_it_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "activity.db"
    store, _ = store_at(path)
    store.open()
    store.insert([make(1)])
    remove(path)
    assert ids(store) == []
    store.insert([make(2)])
    assert ids(store) == [2]
    assert len(warnings_of(caplog)) == 1


def test_a_store_replaced_by_another_programs_database_is_left_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "activity.db"
    store, _ = store_at(path)
    store.open()
    remove(path)
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(sqlite3.OperationalError, match=r"replaced by a database with other"):
        store.insert([make(1)])
    with contextlib.closing(sqlite3.connect(path)) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        assert [name for (name,) in tables] == ["notes"]
    assert warnings_of(caplog) == []
