"""Parsers for the value syntaxes a config file allows: scalars, durations, commands, env.

Each parser takes the raw TOML value and returns the typed value, or raises
:class:`InvalidValue` whose message is shown to the user after the key path. The cattrs
converter (``convert.py``) installs them as structure hooks.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence

from .paths import Path

__all__ = [
    "DURATION_HINT",
    "InvalidValue",
    "describe",
    "parse_bool",
    "parse_command",
    "parse_duration",
    "parse_env",
    "parse_int",
    "parse_str",
]

DURATION_HINT = 'expected a number of seconds or a duration like "90s"'

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h)")
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")


class InvalidValue(ValueError):
    """A raw value that does not fit its key.

    Attributes:
        problems: ``(sub_path, message)`` pairs; ``sub_path`` is relative to the value's own
            key (``(2,)`` for the third item of an array), usually empty.
    """

    def __init__(self, message: str, *, at: Path = (), more: Sequence[tuple[Path, str]] = ()):
        self.problems: tuple[tuple[Path, str], ...] = ((at, message), *more)
        super().__init__("; ".join(text for _, text in self.problems))

    @classmethod
    def many(cls, problems: Sequence[tuple[Path, str]]) -> InvalidValue:
        """One exception carrying several problems (``problems`` must not be empty)."""
        (first_at, first), *rest = problems
        return cls(first, at=first_at, more=rest)


def describe(value: object) -> str:
    """A short description of a raw TOML value for messages: its repr, or its kind."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"an array {_shorten(repr(value))}"
    return _shorten(repr(value))


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_str(value: object) -> str:
    """A TOML string, unchanged."""
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {describe(value)}")
    return value


def parse_int(value: object) -> int:
    """A TOML integer (``true``/``false`` and floats are rejected)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"expected an integer, got {describe(value)}")
    return value


def parse_bool(value: object) -> bool:
    """A TOML boolean: ``true`` or ``false``, not a string or a number."""
    if not isinstance(value, bool):
        raise InvalidValue(f"expected true or false, got {describe(value)}")
    return value


def parse_duration(value: object) -> float:
    """Seconds, from a number or a string such as ``"500ms"``, ``"90s"``, ``"2m"``, ``"1m30s"``.

    Units are ``ms``, ``s``, ``m`` and ``h``; several may be joined (``"1h30m"``). A string
    holding only a number counts as seconds. The result must be finite and not negative.

    Raises:
        InvalidValue: the value is of another type, malformed, negative or not finite.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValue(f"{DURATION_HINT}, got {describe(value)}")
    seconds = _parse_duration_text(value) if isinstance(value, str) else float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidValue(f"{DURATION_HINT}, got {describe(value)}")
    if seconds < 0:
        raise InvalidValue(f"expected a duration of 0 seconds or more, got {describe(value)}")
    return seconds


def _parse_duration_text(value: str) -> float:
    text = value.strip()
    if _PLAIN_NUMBER.fullmatch(text):
        return float(text)
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise InvalidValue(f"{DURATION_HINT}, got {value!r}")
    return total


def parse_command(value: object) -> tuple[str, ...]:
    """A command line as an argument tuple, from a string or an array of strings.

    A string is split like a POSIX shell would (quotes, backslash escapes), but no shell runs:
    there is no globbing, no variable expansion and no pipes. Lines whose first non-blank
    character is ``#`` are comments, and a backslash at the end of a line joins the next line.

    Raises:
        InvalidValue: not a string or an array of strings, unbalanced quotes, or empty.
    """
    if isinstance(value, str):
        args = tuple(_split_command(value))
    elif isinstance(value, list):
        bad = [
            ((index,), f"expected a string, got {describe(item)}")
            for index, item in enumerate(value)
            if not isinstance(item, str)
        ]
        if bad:
            raise InvalidValue.many(bad)
        args = tuple(value)
    else:
        raise InvalidValue(
            f"expected a command line string or an array of strings, got {describe(value)}"
        )
    if not args or not args[0]:
        raise InvalidValue("the command is empty; give the program to run and its arguments")
    return args


def _split_command(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    # Join continuations before shlex: shlex would keep a backslash-newline as a "\n" word.
    joined = re.sub(r"\\[ \t]*\r?\n", " ", "\n".join(lines))
    try:
        return shlex.split(joined, comments=False, posix=True)
    except ValueError as exc:
        raise InvalidValue(f"cannot split the command line: {str(exc).lower()}") from None


def parse_env(value: object) -> dict[str, str]:
    """Environment variables from a table of strings or an array of ``"NAME=value"`` strings.

    Raises:
        InvalidValue: with one problem per bad entry, at the entry's key or index.
    """
    env: dict[str, str] = {}
    problems: list[tuple[Path, str]] = []
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(item, str):
                problems.append(((name,), f"expected a string, got {describe(item)}"))
            elif not name or "=" in name:
                problems.append(((name,), f"invalid environment variable name {name!r}"))
            else:
                env[name] = item
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                problems.append(((index,), f'expected "NAME=value", got {describe(item)}'))
                continue
            name, sep, text = item.partition("=")
            if not sep or not name.strip():
                problems.append(((index,), f'expected "NAME=value", got {item!r}'))
            elif name in env:
                problems.append(((index,), f"variable {name!r} is set twice"))
            else:
                env[name] = text
    else:
        raise InvalidValue(
            f'expected a table of strings or an array of "NAME=value", got {describe(value)}'
        )
    if problems:
        raise InvalidValue.many(problems)
    return env
