"""``llamaswap simulate`` run as a command (a process: not for the pure unit tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def simulate_command(
    *args: str, config: Path = EXAMPLES / "config.toml"
) -> subprocess.CompletedProcess[str]:
    """``llamaswap simulate`` on ``config`` (the bundled example's), as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "llamaswap", "simulate", "--config", str(config), *args],
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
    names = [line.split("|")[1].strip() for line in done.stdout.splitlines()[2:7]]
    assert names == [
        "serial (this config)",
        "arrival order",
        "strict priority",
        "fifo",
        "serial + preempt",
    ]
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


MEMORY_CONFIG = """
[models.a]
cmd = "server ${PORT}"
memory = "10GiB"
[models.b]
cmd = "server ${PORT}"
memory = "10GiB"
[models.c]
cmd = "server ${PORT}"
memory = "10GiB"
[models.big]
cmd = "server ${PORT}"
memory = "30GiB"
[routing.scheduler]
use = "serial"
"""
# a, b beside it, c (which needs room under 24 GiB), a again; then big.
MEMORY_TRACE = "".join(
    f'[[requests]]\nat = "{at}s"\nmodel = "{model}"\njob = "1s"\n'
    for at, model in ((0, "a"), (2, "b"), (4, "c"), (6, "a"), (8, "big"))
)


def memory_files(tmp_path: Path) -> tuple[Path, Path]:
    config, workload = tmp_path / "config.toml", tmp_path / "w.toml"
    config.write_text(MEMORY_CONFIG)
    workload.write_text(MEMORY_TRACE)
    return config, workload


def test_memory_budgets_run_side_by_side(tmp_path: Path) -> None:
    config, workload = memory_files(tmp_path)
    done = simulate_command(
        "--workload",
        str(workload),
        "--memory",
        "gpu0=24GiB",
        "--memory",
        "48GiB",
        config=config,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the failed load is in the table, not logged
    lines = done.stdout.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in lines[2:4]
    ]
    wanted = ("policy", "memory", "loads", "evictions", "not served", "out of memory", "peak gpu0")
    assert [tuple(row[key] for key in wanted) for row in rows] == [
        ("serial (this config)", "gpu0=24 GiB", "5", "4", "1", "1", "20 GiB"),
        ("serial (this config)", "gpu0=48 GiB", "4", "2", "0", "0", "40 GiB"),
    ]
    assert lines[4:] == [
        "note (gpu0=24 GiB): model 'big' needs 30 GiB on gpu0, more than the 23.5 GiB of "
        "its budget even alone: its loads fail out of memory"
    ]


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        (
            "gpu0=lots",
            "llamaswap simulate: error: argument --memory: gpu0: expected a number of bytes "
            "or a size like \"22GiB\", got 'lots' (e.g. 24GiB, or gpu0=20GiB,gpu1=4GiB)",
        ),
        (
            "gpu1=8GiB",
            "--memory gpu1=8 GiB: no model's memory is on gpu1; the models' devices: gpu0",
        ),
    ],
)
def test_a_budget_that_cannot_be_read_or_used_is_refused_before_the_runs(
    tmp_path: Path, memory: str, message: str
) -> None:
    config, workload = memory_files(tmp_path)
    done = simulate_command("--workload", str(workload), "--memory", memory, config=config)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == message
    assert done.stdout == ""


def test_a_budget_for_a_config_without_memory_is_refused() -> None:
    workload = str(EXAMPLES / "mixed.workload.toml")
    done = simulate_command("--workload", workload, "--memory", "gpu0=24GiB")
    assert done.returncode == 2
    assert "no model in the config declares memory" in done.stderr
