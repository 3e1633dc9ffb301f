"""``--config DIR``: every ``*.toml`` directly in it, merged as llama-swap merges a
``-config-dir``, every problem naming the file its key came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaswap.config import load_config
from llamaswap.errors import ConfigError
from tests.unit.ports import every_port_free


def files(tmp_path: Path, **texts: str) -> Path:
    for name, text in texts.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


def problems(folder: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(folder, free=every_port_free)
    error = caught.value
    return [problem.render(error.file) for problem in error.problems]


def test_the_files_are_merged_in_name_order(tmp_path: Path) -> None:
    folder = files(
        tmp_path,
        a_base='healthCheckTimeout = 60\napiKeys = ["k1"]\n[routing.scheduler]\nuse = "serial"\n',
        b_chat='apiKeys = ["k2"]\nhealthCheckTimeout = 60\n[models.chat]\ncmd = "s ${PORT}"\n',
        c_coder='[models.coder]\ncmd = "s ${PORT}"\n'
        "[routing.scheduler.settings.serial]\nslots = 2\n",
    )
    (folder / "notes.txt").write_text("not a config")
    config = load_config(folder, free=every_port_free)
    assert list(config.models) == ["chat", "coder"]
    assert config.api_keys == ("k1", "k2")  # arrays: one file's, then the next's
    assert config.health_check_timeout == 60  # the same value twice is one value
    assert config.routing.scheduler.use == "serial"  # tables: merged key by key
    assert config.routing.scheduler.settings.serial.slots == 2


def test_what_cannot_be_merged_names_both_files(tmp_path: Path) -> None:
    folder = files(
        tmp_path,
        a='healthCheckTimeout = 60\n[models.chat]\ncmd = "s ${PORT}"\n',
        b="healthCheckTimeout = 90\n[models.chat]\nttl = 5\n",
    )
    a, b = folder / "a.toml", folder / "b.toml"
    assert problems(folder) == [
        f"{b}: healthCheckTimeout: set in {a} to another value (60): say it once, or the same",
        f"{b}: models.chat: set in {a} too: one entry is written in one file",
    ]


def test_every_later_problem_names_the_file_its_key_is_in(tmp_path: Path) -> None:
    folder = files(
        tmp_path,
        a='[models.chat]\ncmd = "s ${PORT}"\nttl = "soon"\n',
        b='[models.coder]\ncmd = "s ${PORT}"\nnope = 1\n',
    )
    found = problems(folder)
    assert found[0].startswith(f"{folder / 'a.toml'}: models.chat.ttl: ")
    assert found[1].startswith(f"{folder / 'b.toml'}: models.coder.nope: unknown key")


def test_a_syntax_error_names_its_file_and_line(tmp_path: Path) -> None:
    folder = files(tmp_path, a='[models.chat]\ncmd = "s ${PORT}"\n', b="x = = 1\n")
    (found,) = problems(folder)
    assert found.startswith(f"{folder / 'b.toml'}:1:")


def test_a_directory_without_config_files_says_so(tmp_path: Path) -> None:
    assert problems(tmp_path) == [f"{tmp_path}: the directory holds no *.toml file"]
