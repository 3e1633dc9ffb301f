"""``[store]``: the activity log's SQLite file, its bounds, and where a relative path points."""

from __future__ import annotations

import os
import pathlib
import textwrap

import pytest

from llamaswap.config import Config, StoreConfig, load_config, loads_config
from llamaswap.config.values import parse_duration
from llamaswap.errors import ConfigError
from llamaswap.router.reload import diff_config
from tests.unit.ports import every_port_free


def load(text: str, directory: str | None = "/etc/llamaswap") -> Config:
    return loads_config(
        textwrap.dedent(text),
        file="test.toml",
        environ={},
        directory=directory,
        free=every_port_free,
    )


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load(text)
    return {problem.path: problem.message for problem in info.value.problems}


def test_without_a_store_the_activity_log_stays_in_memory() -> None:
    assert load("").store is None


def test_a_store_has_bounds_by_default() -> None:
    store = load('[store]\npath = "activity.db"\n').store
    assert store == StoreConfig(path="/etc/llamaswap/activity.db", max_rows=100_000,
                                max_age=30 * 86_400.0)  # fmt: skip


def test_every_store_key_can_be_set() -> None:
    store = load(
        """
        [store]
        path = "/var/lib/llamaswap/activity.db"
        maxRows = 5000
        maxAge = "7d"
        """
    ).store
    assert store == StoreConfig("/var/lib/llamaswap/activity.db", 5000, 7 * 86_400.0)


@pytest.mark.parametrize(
    ("written", "directory", "resolved"),
    [
        ("activity.db", "/etc/llamaswap", "/etc/llamaswap/activity.db"),
        ("../data/activity.db", "/etc/llamaswap", "/etc/data/activity.db"),
        ("/srv/activity.db", "/etc/llamaswap", "/srv/activity.db"),
        ("~/activity.db", "/etc/llamaswap", os.path.expanduser("~/activity.db")),
        ("activity.db", None, "activity.db"),  # loads_config without a directory
    ],
)
def test_where_the_path_points(written: str, directory: str | None, resolved: str) -> None:
    store = load(f'[store]\npath = "{written}"\n', directory=directory).store
    assert store is not None
    assert store.path == resolved


def test_load_config_reads_a_relative_path_from_the_files_directory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "llamaswap.toml"
    path.write_text('[store]\npath = "state/activity.db"\n')
    monkeypatch.chdir(tmp_path)  # not the working directory
    store = load_config(os.path.join("conf", "llamaswap.toml"), free=every_port_free).store
    assert store is not None
    assert store.path == str(tmp_path / "conf" / "state" / "activity.db")


@pytest.mark.parametrize(
    ("lines", "path", "message"),
    [
        (
            "maxRows = 0",
            "store.maxRows",
            "expected a number of records from 1 to 10000000, got 0",
        ),
        (
            "maxRows = 10_000_001",
            "store.maxRows",
            "expected a number of records from 1 to 10000000, got 10000001",
        ),
        ("maxRows = 1.5", "store.maxRows", "expected an integer, got 1.5"),
        (
            'maxAge = "59s"',
            "store.maxAge",
            "expected a duration from 60 to 315360000 seconds (1 minute to 3650 days), "
            "got 59 seconds",
        ),
        (
            'maxAge = "3651d"',
            "store.maxAge",
            "expected a duration from 60 to 315360000 seconds (1 minute to 3650 days), "
            "got 315446400 seconds",
        ),
        (
            'maxAge = "a month"',
            "store.maxAge",
            "expected a number of seconds or a duration like \"90s\", got 'a month'",
        ),
        (
            "maxage = 60",
            "store.maxage",
            "unknown key 'maxage'; did you mean 'maxAge'? "
            "this table's keys are 'maxAge', 'maxRows', 'path'",
        ),
        (
            "journal = 1",
            "store.journal",
            "unknown key 'journal'; this table's keys are 'maxAge', 'maxRows', 'path'",
        ),
    ],
)
def test_bad_store_values_are_reported_at_their_key(lines: str, path: str, message: str) -> None:
    found = problems_of(f'[store]\npath = "a.db"\n{lines}\n')
    assert found == {path: message}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[store]\nmaxRows = 10\n", {"store.path": "required key is missing"}),
        (
            '[store]\npath = " "\n',
            {"store.path": "expected the path of a SQLite file, got ''"},
        ),
        ("[store]\npath = 3\n", {"store.path": "expected a string, got 3"}),
        ('store = "a.db"\n', {"store": "expected a table, got 'a.db'"}),
    ],
)
def test_a_store_needs_a_path(text: str, problem: dict[str, str]) -> None:
    assert problems_of(text) == problem


def test_a_misspelt_store_table_is_named() -> None:
    found = problems_of('[stroe]\npath = "a.db"\n')
    assert list(found) == ["stroe"]
    assert found["stroe"].startswith("unknown key 'stroe'; did you mean 'store'? ")


def test_durations_in_days() -> None:
    assert parse_duration("30d") == 30 * 86_400.0
    assert parse_duration("1d12h") == 1.5 * 86_400.0
    assert parse_duration("0.5d") == 43_200.0


def test_a_reload_that_changes_the_store_applies_at_the_next_start() -> None:
    before = load('[store]\npath = "a.db"\n')
    after = load('[store]\npath = "b.db"\n')
    changes = diff_config(before, after)
    assert (changes.at_start, changes.settings) == (("store",), ())
    assert diff_config(before, load("")).at_start == ("store",)


def test_a_reload_that_changes_the_console_log_applies_at_the_next_start() -> None:
    # Listed with the settings applied at once, and not applied (the console log is set
    # up when llamaswap starts).
    after = load(
        'logLevel = "debug"\nlogToStdout = "both"\nlogTimeFormat = "rfc3339"\nglobalTTL = 5\n'
    )
    changes = diff_config(load(""), after)
    assert changes.at_start == ("logLevel", "logToStdout", "logTimeFormat")
    assert changes.settings == ("globalTTL",)
