"""``llamaswap import-config FILE [-o OUT] [--force]``: translate a llama-swap config."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence

import tomli

from llamaswap.keypaths import Path, format_path, leaves

from ..config import loads_config
from ..errors import ConfigError
from .translate import YamlError, import_yaml

__all__ = ["import_config"]


class _AnyEnvironment(Mapping[str, str]):
    """Every environment variable set, to a placeholder: the output is checked as it would
    be where llamaswap runs, not against this shell's variables."""

    def __getitem__(self, name: str) -> str:
        return "1"

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_ENV_VALUE = re.compile(r"\$\{env\.[^}]*\}")


def _from_env(value: object, path: Path = ()) -> Iterator[str]:
    """The paths of the values in the TOML ``value`` that are exactly one ``${env.NAME}``:
    whether such a value is right (a number, a boolean, ...) depends on the variable where
    llamaswap runs, not on the placeholder it is checked with here."""
    for at, leaf in leaves(value, path):
        if isinstance(leaf, str) and _ENV_VALUE.fullmatch(leaf):
            yield format_path(at)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamaswap import-config",
        description="Translate a llama-swap YAML config into a llamaswap TOML config, "
        "keeping its comments. What cannot be translated is listed on standard error.",
    )
    parser.add_argument("file", metavar="FILE", help="the llama-swap YAML config")
    parser.add_argument(
        "-o", "--output", metavar="OUT", help="write the TOML here (default: standard output)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    return parser


def import_config(argv: Sequence[str]) -> int:
    """Run the subcommand; the exit status: 0 when the TOML is valid, 2 otherwise."""
    options = _parser().parse_args(argv)
    source: str = options.file
    output: str | None = options.output
    if output is not None and os.path.exists(output) and not options.force:
        print(f"{output}: already exists; add --force to overwrite it", file=sys.stderr)
        return 2
    if output is not None and os.path.exists(output) and os.path.samefile(source, output):
        print(f"{output}: is the file being translated; write the TOML elsewhere", file=sys.stderr)
        return 2
    try:
        with open(source, encoding="utf-8") as stream:
            text = stream.read()
        result = import_yaml(text)
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        print(f"{source}: cannot read the file: {reason}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:
        print(f"{source}: the file is not UTF-8 text (byte {exc.start})", file=sys.stderr)
        return 2
    except YamlError as exc:
        where = f"{source}:{exc.line}:{exc.column}" if exc.line is not None else source
        print(f"{where}: {exc}", file=sys.stderr)
        return 2
    for remark in result.remarks:
        print(f"{source}: {remark.render()}", file=sys.stderr)
    name = output or "the translated config"
    try:
        loads_config(result.toml, file=name, environ=_AnyEnvironment())
        problems: tuple[str, ...] = ()
    except ConfigError as exc:
        unknown = set(_from_env(tomli.loads(result.toml)))
        problems = tuple(
            problem.render(exc.file) for problem in exc.problems if problem.path not in unknown
        )
    if output is None:
        sys.stdout.write(result.toml)
    else:
        try:
            with open(output, "w" if options.force else "x", encoding="utf-8") as stream:
                stream.write(result.toml)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).lower()
            print(f"{output}: cannot write the file: {reason}", file=sys.stderr)
            return 2
    skipped = sum(remark.skipped for remark in result.remarks)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        print(
            f"{name} is not a valid llamaswap config yet: fix the problems above "
            "(llamaswap refuses some values llama-swap lets through; the notes above name "
            "those it knows of)",
            file=sys.stderr,
        )
        return 2
    done = f"wrote {output}" if output else "translated"
    keys = f"{skipped} key{'s' if skipped != 1 else ''}"
    left = f"{keys} not translated (listed above)" if skipped else "every key translated"
    print(f"{source}: {done}; {left}", file=sys.stderr)
    return 0
