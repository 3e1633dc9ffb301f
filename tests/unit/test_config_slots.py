"""``slotSavePath`` and ``slotSaveLimit``: where a model's slot files are, and how many bytes
of them llamaswap keeps (process/slots.py)."""

from __future__ import annotations

import os
import pathlib
import textwrap

import pytest

from llamaswap.config import Config, load_config, loads_config
from llamaswap.config.model import DEFAULT_SLOT_SAVE_LIMIT
from llamaswap.errors import ConfigError
from llamaswap.router.reload import diff_config
from tests.unit.ports import every_port_free

MODEL = '[models.a]\ncmd = "server --port ${PORT}"\n'


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


def test_by_default_no_slot_is_kept_and_the_limit_is_4_gib() -> None:
    config = load(MODEL)
    assert config.models["a"].slot_save_path is None
    assert config.slot_save_limit == DEFAULT_SLOT_SAVE_LIMIT == 4 * 2**30


def test_the_limit_is_a_size() -> None:
    assert load('slotSaveLimit = "512MiB"\n').slot_save_limit == 512 * 2**20
    assert load("slotSaveLimit = 1000\n").slot_save_limit == 1000
    assert load('slotSaveLimit = "1.5GB"\n').slot_save_limit == 1_500_000_000


@pytest.mark.parametrize(
    ("written", "directory", "resolved"),
    [
        ("slots", "/etc/llamaswap", "/etc/llamaswap/slots"),
        ("../cache/slots", "/etc/llamaswap", "/etc/cache/slots"),
        ("/var/cache/slots", "/etc/llamaswap", "/var/cache/slots"),
        ("~/slots", "/etc/llamaswap", os.path.expanduser("~/slots")),
        ("slots", None, "slots"),  # loads_config without a directory
    ],
)
def test_where_the_path_points(written: str, directory: str | None, resolved: str) -> None:
    config = load(f'{MODEL}slotSavePath = "{written}"\n', directory=directory)
    assert config.models["a"].slot_save_path == resolved


def test_macros_reach_it_as_they_reach_cmd() -> None:
    config = load(
        """
        [macros]
        slots = "/var/cache/slots"

        [models.a]
        cmd = "llama-server --port ${PORT} --slot-save-path ${slots}/${MODEL_ID}"
        slotSavePath = "${slots}/${MODEL_ID}"
        """
    )
    assert config.models["a"].slot_save_path == "/var/cache/slots/a"


def test_load_config_reads_a_relative_path_from_the_files_directory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "llamaswap.toml"
    path.write_text(f'{MODEL}slotSavePath = "slots"\n')
    monkeypatch.chdir(tmp_path)  # not the working directory
    config = load_config(os.path.join("conf", "llamaswap.toml"), free=every_port_free)
    assert config.models["a"].slot_save_path == str(tmp_path / "conf" / "slots")


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        (
            f"{MODEL}slotSavePath = 3\n",
            "models.a.slotSavePath",
            "expected a string, got 3",
        ),
        (
            f'{MODEL}slotSavePath = ""\n',
            "models.a.slotSavePath",
            "expected the directory of the slot files, got ''",
        ),
        (
            f'{MODEL}slotSavePath = "a\\u0000b"\n',
            "models.a.slotSavePath",
            "a directory path cannot contain a NUL character",
        ),
        (
            'slotSaveLimit = "lots"\n',
            "slotSaveLimit",
            "expected a number of bytes or a size like \"22GiB\", got 'lots'",
        ),
        (
            "slotSaveLimit = -1\n",
            "slotSaveLimit",
            "expected a size from 0 to 1 PiB, got -1",
        ),
        (
            f"{MODEL}slotSavepath = 'x'\n",
            "models.a.slotSavepath",
            "unknown key 'slotSavepath'; did you mean 'slotSavePath'?",
        ),
    ],
)
def test_bad_values_are_reported_at_their_key(text: str, path: str, message: str) -> None:
    found = problems_of(text)
    assert list(found) == [path]
    assert found[path].startswith(message)


def test_a_reload_applies_both_without_restarting_the_model() -> None:
    before = load(f'{MODEL}slotSavePath = "/a"\n')
    after = load(f'slotSaveLimit = "1GiB"\n{MODEL}slotSavePath = "/b"\n')
    changes = diff_config(before, after)
    assert (changes.updated, changes.restarted, changes.settings) == (
        ("a",),
        (),
        ("slotSaveLimit",),
    )
