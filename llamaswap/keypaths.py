"""TOML key paths and near-miss suggestions, for error messages.

Every configuration problem names the place it was found as a dotted TOML key path, written
the way a user would write it in the file: ``models.chat.ttl``, ``models."qwen2.5".env.HOME``,
``models.chat.aliases[1]``. A path is built as a tuple of parts (``str`` for a table key,
``int`` for an array index) and turned into text here and nowhere else.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Sequence

import attrs

__all__ = [
    "Part",
    "Path",
    "Problem",
    "did_you_mean",
    "format_path",
    "known_list",
    "leaves",
    "suggestion",
]

Part = str | int
Path = tuple[Part, ...]


@attrs.frozen
class Problem:
    """One problem found before the config exists as objects, at a raw key path.

    Attributes:
        path: the offending key (for a missing or unknown key, that key itself).
        message: the user-facing message.
    """

    path: Path
    message: str


# A key TOML accepts without quotes.
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def format_path(parts: Sequence[Part]) -> str:
    """Render a key path as TOML would spell it.

    Args:
        parts: table keys (``str``) and array indices (``int``), outermost first.

    Returns:
        The dotted path, e.g. ``models.chat.aliases[0]``; keys that are not bare TOML keys
        are double-quoted (``models."qwen2.5".ttl``). An empty path renders as ``""``.
    """
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if _BARE_KEY.fullmatch(part) else _quote(part)
        out = f"{out}.{text}" if out else text
    return out


#: What TOML writes as an escape in a quoted key: control characters.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _quote(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    escaped = _CONTROL.sub(lambda match: f"\\u{ord(match[0]):04X}", escaped)
    return f'"{escaped}"'


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` when one is close enough to be a likely typo.

    Case differences alone always count as close (``healthchecktimeout`` finds
    ``healthCheckTimeout``).
    """
    options = list(choices)
    by_lower = {choice.lower(): choice for choice in options}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    matches = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.7)
    if matches:
        return by_lower[matches[0]]
    # difflib's ratio is too strict for short words: "tll" is 0.67 from "ttl". One slip of
    # the finger (a letter wrong, missing, extra or two swapped) is a likely typo at any length.
    if len(word) >= 3:
        for lower, choice in by_lower.items():
            if _one_edit_apart(word.lower(), lower):
                return choice
    # A truncated or extended word ("warning" for "warn") is a likely typo too.
    for lower, choice in by_lower.items():
        if min(len(lower), len(word)) >= 3 and (
            lower.startswith(word.lower()) or word.lower().startswith(lower)
        ):
            return choice
    return None


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether ``a`` becomes ``b`` by one substitution, insertion, deletion or swap of two
    neighbouring letters (a Damerau-Levenshtein distance of 1)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    start = 0
    while start < len(a) and a[start] == b[start]:
        start += 1
    if len(a) < len(b):
        return a[start:] == b[start + 1 :]
    swapped = a[start + 1 : start + 2] + a[start : start + 1]
    return a[start + 1 :] == b[start + 1 :] or (
        swapped == b[start : start + 2] and a[start + 2 :] == b[start + 2 :]
    )


def known_list(choices: Iterable[str]) -> str:
    """Quoted, sorted, comma-separated choices for a message: ``'a', 'b'``."""
    return ", ".join(repr(choice) for choice in sorted(choices))


def suggestion(word: str, choices: Iterable[str], *, noun: str = "keys") -> str:
    """A message tail: ``did you mean 'x'?`` or, with no close match, the known choices."""
    options = list(choices)
    close = did_you_mean(word, options)
    if close is not None:
        return f"did you mean {close!r}?"
    if not options:
        return f"no {noun} are defined"
    return f"known {noun}: {known_list(options)}"


def leaves(value: object, path: Path = ()) -> Iterator[tuple[Path, object]]:
    """Every value in ``value`` (a parsed TOML document or part of one) that is not a table
    or an array, with its path under ``value``, in document order."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path, value
