"""``llamaswap simulate`` run as a command (a process: not for the pure unit tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def simulate_command(*args: str) -> subprocess.CompletedProcess[str]:
    """``llamaswap simulate`` on the bundled example config, as a user runs it."""
    config = str(EXAMPLES / "config.toml")
    return subprocess.run(
        [sys.executable, "-m", "llamaswap", "simulate", "--config", config, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_command_runs_the_bundled_example_and_plots(tmp_path: Path) -> None:
    png = tmp_path / "waits.png"
    workload = str(EXAMPLES / "mixed.workload.toml")
    done = simulate_command("--workload", workload, "--compare", "--plot", str(png))
    assert done.returncode == 0, done.stderr
    names = [line.split("|")[1].strip() for line in done.stdout.splitlines()[2:6]]
    assert names == ["serial (this config)", "arrival order", "strict priority", "fifo"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_reports_a_bad_workload_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "w.toml"
    bad.write_text('[[requests]]\nat = "1s"\nmodel = "zzz"\njob = 1\n')
    done = simulate_command("--workload", str(bad))
    assert done.returncode == 2
    assert "requests[0].model: no model 'zzz'" in done.stderr


def test_the_command_says_where_a_workload_has_a_toml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text("[[streams]\n")
    done = simulate_command("--workload", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"1 problem in {path}:",
        f"  {path}:1:10: invalid TOML: expected ']]' at the end of an array declaration",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe", "the file is not UTF-8 text (byte 0)"),
        (None, "cannot read the file: no such file or directory"),
    ],
)
def test_the_command_says_what_is_wrong_with_a_workload_file_without_a_traceback(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "w.toml"
    if content is not None:
        path.write_bytes(content)
    done = simulate_command("--workload", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"1 problem in {path}:", f"  {path}: {message}"]
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("plot", "message"),
    [
        ("missing/waits.png", "--plot {tmp}/missing/waits.png: {tmp}/missing does not exist"),
        ("file/waits.png", "--plot {tmp}/file/waits.png: {tmp}/file is not a directory"),
        ("waits.txt", "--plot {tmp}/waits.txt: the file name must end in .png, .svg or .pdf"),
        ("waits", "--plot {tmp}/waits: the file name must end in .png, .svg or .pdf"),
        (
            "",
            "--plot {tmp}/: is a directory; give a file name in it, such as {tmp}/waits.png",
        ),
    ],
)
def test_a_plot_path_that_cannot_be_written_is_refused_before_the_runs(
    tmp_path: Path, plot: str, message: str
) -> None:
    (tmp_path / "file").write_text("")
    workload = str(EXAMPLES / "mixed.workload.toml")
    done = simulate_command("--workload", workload, "--plot", f"{tmp_path}/{plot}")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [message.format(tmp=tmp_path)]
    assert done.stdout == ""  # no table: nothing was simulated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # and nothing written


def test_an_empty_plot_path_is_refused_not_ignored(tmp_path: Path) -> None:
    workload = str(EXAMPLES / "mixed.workload.toml")
    done = simulate_command("--workload", workload, "--plot", "")
    assert done.returncode == 2
    assert done.stderr == "--plot '': the file name must end in .png, .svg or .pdf\n"


def test_the_plot_may_be_an_svg_and_its_printed_path_is_the_file_written(tmp_path: Path) -> None:
    svg = tmp_path / "waits.svg"
    done = simulate_command(
        "--workload", str(EXAMPLES / "mixed.workload.toml"), "--plot", str(svg)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"plot: {svg}"
    assert b"<svg" in svg.read_bytes()[:1000]
    assert [p.name for p in tmp_path.iterdir()] == ["waits.svg"]
