"""``llamaswap import-config`` and ``check-config`` on YAML files, run as commands (each a
process: they are not for the pure unit tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from llamaswap.config import loads_config
from llamaswap.migrate.translate import import_yaml
from tests.unit.ports import every_port_free
from tests.unit.test_import_config import ENV, FIXTURE


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamaswap", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_the_command_prints_the_toml_and_lists_what_it_left_out(tmp_path: Path) -> None:
    done = run("import-config", str(FIXTURE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == import_yaml(FIXTURE.read_text(encoding="utf-8")).toml
    lines = done.stderr.splitlines()
    assert f"{FIXTURE}: models.qwen.timeouts.expectContinue: not translated: " in done.stderr
    assert lines[-1] == f"{FIXTURE}: translated; 3 keys not translated (listed above)"


def test_the_command_writes_a_file_that_check_config_accepts(tmp_path: Path) -> None:
    done = run("import-config", str(FIXTURE), "-o", "config.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(
        "wrote config.toml; 3 keys not translated (listed above)"
    )
    written = (tmp_path / "config.toml").read_text(encoding="utf-8")
    loads_config(written, environ=ENV, free=every_port_free)

    (tmp_path / "config.toml").write_text("# mine\n", encoding="utf-8")
    again = run("import-config", str(FIXTURE), "-o", "config.toml", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr == "config.toml: already exists; add --force to overwrite it\n"
    assert (tmp_path / "config.toml").read_text(encoding="utf-8") == "# mine\n"

    forced = run("import-config", str(FIXTURE), "-o", "config.toml", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "config.toml").read_text(encoding="utf-8") == written

    (tmp_path / "mine.yaml").write_text(FIXTURE.read_text(encoding="utf-8"), encoding="utf-8")
    onto = run("import-config", "mine.yaml", "-o", "./mine.yaml", "--force", cwd=tmp_path)
    assert onto.returncode == 2
    assert onto.stderr == "./mine.yaml: is the file being translated; write the TOML elsewhere\n"
    assert (tmp_path / "mine.yaml").read_text(encoding="utf-8") == FIXTURE.read_text("utf-8")


def test_the_command_says_when_every_key_was_translated(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(
        "models:\n  a:\n    cmd: a --port ${PORT}\nperformance: {every: 5s}\n",
        encoding="utf-8",
    )
    done = run("import-config", "small.yaml", cwd=tmp_path)
    assert done.returncode == 0
    assert (
        done.stderr.splitlines()[-1]
        == "small.yaml: translated; 1 key not translated (listed above)"
    )
    (tmp_path / "small.yaml").write_text(
        "models:\n  a:\n    cmd: a --port ${PORT}\n", encoding="utf-8"
    )
    done = run("import-config", "small.yaml", cwd=tmp_path)
    assert done.stderr == "small.yaml: translated; every key translated\n"
    assert done.stdout == '[models.a]\ncmd = "a --port ${PORT}"\n'


def test_the_command_fails_when_the_translation_is_not_a_valid_config(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "models:\n  a:\n    cmd: a --port ${PORT}\ngroups:\n  g:\n    members: [a, nope]\n",
        encoding="utf-8",
    )
    done = run("import-config", "bad.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "the translated config: routing.router.settings.groups.g.members[1]: "
        "unknown model 'nope'; known models: 'a'",
        "the translated config is not a valid llamaswap config yet: fix the problems above "
        "(llamaswap refuses some values llama-swap lets through; the notes above name those "
        "it knows of)",
    ]
    assert "[routing.router.settings.groups.g]" in done.stdout  # still printed, to fix


def test_the_check_config_command_on_a_yaml_file(tmp_path: Path) -> None:
    done = run("check-config", str(FIXTURE), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{FIXTURE}: this is YAML (llama-swap's format), not TOML; translate it with: "
        f"llamaswap import-config {FIXTURE} -o config.toml",
        "1 problem found",
    ]


def test_the_command_leaves_a_whole_env_value_to_the_variable(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text(
        "sendLoadingState: ${env.SLS}\nmodels:\n  a:\n    cmd: a --port ${PORT}\n",
        encoding="utf-8",
    )
    done = run("import-config", "env.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "env.yaml: translated; every key translated\n"
