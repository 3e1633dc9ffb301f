"""Parsers for the value syntaxes a config file allows: scalars, durations, commands, env.

Each parser takes the raw TOML value and returns the typed value, or raises
:class:`InvalidValue` whose message is shown to the user after the key path. The cattrs
converter (``convert.py``) installs them as structure hooks.
"""

from __future__ import annotations

import datetime
import math
import re
import shlex
from collections.abc import Iterator, Sequence

import attrs

from llamaswap.keypaths import Path, leaves

__all__ = [
    "DEFAULT_DEVICE",
    "DURATION_HINT",
    "MAX_COMMAND_LENGTH",
    "SIZE_HINT",
    "Bounds",
    "EnvText",
    "InvalidValue",
    "MacroValue",
    "describe",
    "json_problems",
    "number_text",
    "parse_bool",
    "parse_command",
    "parse_duration",
    "parse_duration_in",
    "parse_env",
    "parse_int",
    "parse_int_in",
    "parse_memory",
    "parse_names",
    "parse_size",
    "parse_sizes_option",
    "parse_str",
    "plain",
    "scalar",
]

DURATION_HINT = 'expected a number of seconds or a duration like "90s"'
#: The longest command line (characters, all arguments together). Linux refuses a single
#: argument over 128 KiB anyway, and splitting a string this long already takes ~50 ms.
MAX_COMMAND_LENGTH = 65_536

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h|d)")
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")

#: The device a model's ``memory`` given as one size is on: the first GPU NVML lists.
DEFAULT_DEVICE = "gpu0"
SIZE_HINT = 'expected a number of bytes or a size like "22GiB"'
#: Binary units as GPU tools show them (nvidia-smi's MiB), decimal ones as disks do.
_UNIT_BYTES = {
    "b": 1,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip
_SIZE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)")
#: The largest size a key takes: 1 PiB, beyond any device's memory.
MAX_SIZE = 2**50


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


class MacroValue(str):
    """A value that was one macro of a number or a boolean (``"${n}"``, ``"${PORT}"``): a
    key that takes text reads the text, any other key the number or boolean, as in
    llama-swap."""

    typed: int | float | bool

    def __new__(cls, text: str, typed: int | float | bool) -> MacroValue:
        value = super().__new__(cls, text)
        value.typed = typed
        return value

    def __getnewargs__(self) -> tuple[str, int | float | bool]:  # type: ignore[override]
        return str(self), self.typed  # for copy.deepcopy


class EnvText(str):
    """A value that was exactly one ``${env.NAME}``: a key that takes an integer or a boolean
    reads the variable's text as one (``"4"``, ``"true"``), as llama-swap does (it expands
    ``${env.NAME}`` in the YAML text, before reading it); any other key reads the text."""


_INTEGER = re.compile(r"[-+]?[0-9]+")


def scalar(value: object) -> object:
    """``value`` as a key that takes an integer or a boolean reads it."""
    if isinstance(value, EnvText):
        text = value.strip()
        if text in ("true", "false"):
            return text == "true"
        return int(text) if _INTEGER.fullmatch(text) else str(value)
    return plain(value)


def json_problems(value: object, path: Path = ()) -> Iterator[tuple[Path, str]]:
    """What in ``value`` (a free-form table's, sent as JSON) JSON cannot hold: NaN and
    infinities, and TOML's dates and times; each with its path under ``value``."""
    for at, leaf in leaves(value, path):
        if isinstance(leaf, float) and not math.isfinite(leaf):
            yield at, f"JSON has no {leaf}: write a finite number"
        elif isinstance(leaf, (datetime.date, datetime.time)):
            yield at, f'JSON has no dates or times: write it as a string, "{leaf.isoformat()}"'


def plain(value: object) -> object:
    """``value`` without :class:`MacroValue` s: each replaced by its number or boolean."""
    if isinstance(value, MacroValue):
        return value.typed
    if isinstance(value, EnvText):
        return str(value)  # free-form keys read the text
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def describe(value: object) -> str:
    """A short description of a raw TOML value for messages: its repr, or its kind."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"an array {_shorten(repr(value))}"
    return _shorten(repr(value))


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def number_text(value: int | float) -> str:
    """A number for a message: ``90``, ``0.5``, ``1e+300``, or ``a 4000-digit number``."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if abs(value) >= 10**15:
        return f"a {len(str(abs(value)))}-digit number"
    return str(value)


@attrs.frozen
class Bounds:
    """The numbers a key accepts: ``low`` to ``high`` inclusive, and 0 when ``zero`` says
    what 0 means (``agingDivisor = 0`` turns aging off).

    ``describe()`` gives the range for messages and docs, e.g.
    ``a duration from 0 to 3600 seconds (1 hour)``.
    """

    low: float
    high: float
    noun: str
    unit: str = ""
    note: str = ""
    zero: str = ""

    def __contains__(self, value: int | float) -> bool:
        return self.low <= value <= self.high or (bool(self.zero) and value == 0)

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        note = f" ({self.note})" if self.note else ""
        text = f"{self.noun} from {number_text(self.low)} to {number_text(self.high)}{unit}{note}"
        return f"0 ({self.zero}) or {text}" if self.zero else text

    def check(self, value: int | float) -> None:
        """Raise :class:`InvalidValue` unless ``value`` is within the bounds."""
        if value in self:
            return
        shown = number_text(value)
        if self.unit:
            shown += f" of {self.unit}" if shown.startswith("a ") else f" {self.unit}"
        raise InvalidValue(f"expected {self.describe()}, got {shown}")


def parse_str(value: object) -> str:
    """A TOML string, unchanged."""
    if not isinstance(value, str):
        raise InvalidValue(f"expected a string, got {describe(value)}")
    return str(value)  # a plain string, not a MacroValue


def parse_names(value: object) -> tuple[str, ...]:
    """``stripParams``: an array of key names, or one string of names separated by commas
    (llama-swap's spelling; split after macros are expanded, so a macro may hold several).
    Blank names are dropped, and so are repeats."""
    if isinstance(value, str):
        return tuple(dict.fromkeys(name for part in value.split(",") if (name := part.strip())))
    if not isinstance(value, list):
        raise InvalidValue(
            f"expected an array of strings or one comma-separated string, got {describe(value)}"
        )
    return tuple(dict.fromkeys(_strings(value)))


def _strings(items: list[object]) -> tuple[str, ...]:
    """An array's strings (plain ones); one problem per item that is not a string."""
    problems = [
        ((index,), f"expected a string, got {describe(item)}")
        for index, item in enumerate(items)
        if not isinstance(item, str)
    ]
    if problems:
        raise InvalidValue.many(problems)
    return tuple(map(str, items))


def parse_int(value: object) -> int:
    """A TOML integer (``true``/``false`` and floats are rejected)."""
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"expected an integer, got {describe(value)}")
    return value


def parse_int_in(value: object, bounds: Bounds) -> int:
    """A TOML integer within ``bounds``."""
    number = parse_int(value)
    bounds.check(number)
    return number


def parse_bool(value: object) -> bool:
    """A TOML boolean: ``true`` or ``false``, not a string or a number."""
    value = scalar(value)
    if not isinstance(value, bool):
        raise InvalidValue(f"expected true or false, got {describe(value)}")
    return value


def parse_duration(value: object) -> float:
    """Seconds, from a number or a string such as ``"500ms"``, ``"90s"``, ``"2m"``, ``"1m30s"``.

    Units are ``ms``, ``s``, ``m``, ``h`` and ``d`` (days); several may be joined
    (``"1h30m"``, ``"1d12h"``). A string
    holding only a number counts as seconds. The result must be finite and not negative.

    Raises:
        InvalidValue: the value is of another type, malformed, negative or not finite.
    """
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValue(f"{DURATION_HINT}, got {describe(value)}")
    try:
        seconds = _parse_duration_text(value) if isinstance(value, str) else float(value)
    except OverflowError:  # an integer beyond a float's range: infinite, for our purposes
        seconds = math.inf if not isinstance(value, int) or value > 0 else -math.inf
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidValue(f"{DURATION_HINT}, got {describe(value)}")
    if seconds < 0:
        raise InvalidValue(f"expected a duration of 0 seconds or more, got {describe(value)}")
    return seconds


def parse_duration_in(value: object, bounds: Bounds) -> float:
    """A duration (see :func:`parse_duration`) within ``bounds``."""
    value = plain(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > bounds.high:
        bounds.check(value)  # before it becomes a float: it may be too large for one
    seconds = parse_duration(value)
    bounds.check(seconds)
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


_NUL = "\0"
_NO_NUL = "the operating system cannot pass one to a program"


def parse_command(value: object) -> tuple[str, ...]:
    """A command line as an argument tuple, from a string or an array of strings.

    A string is split like a POSIX shell would (quotes, backslash escapes), but no shell runs:
    there is no globbing, no variable expansion and no pipes. Lines whose first non-blank
    character is ``#`` are comments, and a backslash at the end of a line joins the next line.

    Raises:
        InvalidValue: not a string or an array of strings, unbalanced quotes, empty, a NUL
            character, or longer than :data:`MAX_COMMAND_LENGTH` characters.
    """
    if isinstance(value, str):
        _check_command_length(len(value))
        args = tuple(_split_command(value))
    elif isinstance(value, list):
        args = _strings(value)
        _check_command_length(sum(len(arg) + 1 for arg in args) - 1)
    else:
        raise InvalidValue(
            f"expected a command line string or an array of strings, got {describe(value)}"
        )
    if not args or not args[0]:
        raise InvalidValue("the command is empty; give the program to run and its arguments")
    if any(_NUL in arg for arg in args):
        raise InvalidValue(f"contains a NUL character ({_NUL!r}): {_NO_NUL}")
    return args


def _check_command_length(length: int) -> None:
    if length > MAX_COMMAND_LENGTH:
        raise InvalidValue(
            f"the command line is {length} characters long; "
            f"at most {MAX_COMMAND_LENGTH} are allowed"
        )


def without_comments(command: str) -> str:
    """A command line string without its comment lines (first non-blank character ``#``)."""
    return "\n".join(line for line in command.splitlines() if not line.lstrip().startswith("#"))


def _split_command(text: str) -> list[str]:
    # Join continuations before shlex: shlex would keep a backslash-newline as a "\n" word.
    joined = re.sub(r"\\[ \t]*\r?\n", " ", without_comments(text))
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
            elif not name or "=" in name or _NUL in name:
                problems.append(((name,), f"invalid environment variable name {name!r}"))
            elif _NUL in item:
                problems.append(((name,), f"contains a NUL character ({_NUL!r}): {_NO_NUL}"))
            else:
                env[name] = str(item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                problems.append(((index,), f'expected "NAME=value", got {describe(item)}'))
                continue
            name, sep, text = item.partition("=")
            if not sep or not name.strip() or _NUL in name:
                problems.append(((index,), f'expected "NAME=value", got {item!r}'))
            elif _NUL in text:
                problems.append(((index,), f"contains a NUL character ({_NUL!r}): {_NO_NUL}"))
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


def parse_size(value: object) -> int:
    """Bytes, from an integer or a string such as ``"22GiB"``, ``"512MiB"``, ``"1.5GB"``.

    Units are ``B``, ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of 1024) and ``KB``, ``MB``,
    ``GB``, ``TB`` (powers of 1000), in any case; a plain number is bytes. The result is
    rounded to whole bytes and is at most 1 PiB.
    """
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidValue(f"{SIZE_HINT}, got {describe(value)}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value.strip().lower())
        if match is None or match.group(2) not in ("", *_UNIT_BYTES):
            raise InvalidValue(f"{SIZE_HINT}, got {value!r}")
        number, unit = match.groups()
        size = round(float(number) * _UNIT_BYTES.get(unit, 1))
    if not 0 <= size <= MAX_SIZE:
        raise InvalidValue(f"expected a size from 0 to 1 PiB, got {describe(value)}")
    return size


def parse_memory(value: object) -> dict[str, int]:
    """A model's ``memory``: one size (on ``gpu0``), or a table of sizes by device name
    (``{ gpu0 = "20GiB", gpu1 = "4GiB", cpu = "8GiB" }``)."""
    value = plain(value)
    if not isinstance(value, dict):
        return {DEFAULT_DEVICE: parse_size(value)}
    sizes: dict[str, int] = {}
    problems: list[tuple[Path, str]] = []
    for device, size in value.items():
        try:
            sizes[str(device)] = parse_size(size)
        except InvalidValue as exc:
            problems.extend(((device, *at), text) for at, text in exc.problems)
    if problems:
        raise InvalidValue.many(problems)
    return sizes


def parse_sizes_option(text: str) -> dict[str, int]:
    """A command line's memory option (``simulate --memory``, the fake server's
    ``--memory``): one size, on ``gpu0`` as a model's ``memory`` is, or ``DEVICE=SIZE``
    pairs separated by commas (``gpu0=6GiB,gpu1=2GiB``).

    Raises:
        ValueError: what is wrong with ``text``, for people (with an example).
    """
    try:
        if "=" not in text:
            return {DEFAULT_DEVICE: parse_size(text)}
        sizes: dict[str, int] = {}
        for part in text.split(","):
            device, equals, size = part.partition("=")
            device = device.strip()
            if not equals or not device:
                raise ValueError(f"expected DEVICE=SIZE, got {part.strip()!r}")
            if device in sizes:
                raise ValueError(f"device {device!r} is named twice")
            try:
                sizes[device] = parse_size(size)
            except InvalidValue as exc:
                raise ValueError(f"{device}: {exc}") from None
    except ValueError as exc:  # InvalidValue too
        raise ValueError(f"{exc} (e.g. 24GiB, or gpu0=20GiB,gpu1=4GiB)") from None
    return sizes
