"""``llamaswap check-config PATH``: every problem in a config, without starting anything."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

from llamaswap.keypaths import format_path

from ..errors import ConfigError
from .load import load_config
from .model import Config

__all__ = ["check_config", "main", "missing_programs"]

USAGE = "usage: llamaswap check-config PATH"
HELP = (
    "Print every problem in the TOML config at PATH (a file, or a directory whose *.toml "
    "files are merged), one per line, without starting anything.\nExit status 0 when it "
    "is valid (a program not found on PATH is only a warning), 2 when not."
)


def main(argv: Sequence[str]) -> int:
    """Run the subcommand on its arguments; the exit status."""
    if list(argv[:1]) in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{HELP}")
        return 0
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    return check_config(argv[0])


def check_config(path: str) -> int:
    """Print every problem in the config at ``path``; 0 when valid, 2 when not.

    A program that a command names but this machine lacks is a warning, not a problem: the
    config may be checked on one machine and served on another.
    """
    try:
        config = load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem.render(exc.file), file=sys.stderr)
        count = len(exc.problems)
        print(f"{count} problem{'s' if count != 1 else ''} found", file=sys.stderr)
        return 2
    for warning in missing_programs(config):
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(f"{path}: ok")
    return 0


def missing_programs(config: Config) -> list[str]:
    """``models.ID.cmd: program 'x' not found on PATH`` for each command whose program is
    not here (looked up on the model's own ``env`` PATH if it sets one)."""
    found = []
    for model_id, model in config.models.items():
        search = model.env.get("PATH", os.environ.get("PATH", os.defpath))
        for key, command in (("cmd", model.cmd), ("cmdStop", model.cmd_stop)):
            if command is None or shutil.which(command[0], path=search) is not None:
                continue
            path = format_path(("models", model_id, key))
            if os.sep in command[0] and os.path.isfile(command[0]):
                found.append(f"{path}: program {command[0]!r} is not executable (chmod +x it)")
                continue
            where = "" if os.sep in command[0] else " on PATH"
            found.append(
                f"{path}: program {command[0]!r} not found{where} "
                "(it may exist where llamaswap will run)"
            )
    return found
