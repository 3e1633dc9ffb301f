"""llama-swap's own comments that llamaswap makes false, rewritten as they are carried over.

llama-swap's ``config.example.yaml`` explains each key in comments, and configs grown from
it carry those comments along. Most stay true of llamaswap, which reads the same keys the
same way; a few do not, and a comment that now says something false is worse than none.
These are rewritten, each marked as llamaswap's words:

* the YAML schema modeline (``# yaml-language-server: $schema=...``), which names
  llama-swap's JSON schema for YAML, becomes a note of where it was;
* "The default and only valid scheduler is fifo": llamaswap has ``serial`` too;
* in the comments of a ``timeouts`` table, a default that differs from llamaswap's
  (``connect``, ``keepalive``, ``idleConn``) is said as llama-swap's, next to llamaswap's,
  and "defaults shown below" says whose they are.

Only llama-swap's own wording is matched: a comment the user wrote is left as written.
"""

from __future__ import annotations

import re

import attrs

from llamaswap.keypaths import Path

from ..config import model as schema
from .comments import Comments

__all__ = ["correct"]

#: llamaswap's default of each ``timeouts`` key.
TIMEOUT_DEFAULTS: dict[str, float] = {
    schema.toml_key(field): getattr(schema.Timeouts(), field.name)
    for field in attrs.fields(schema.Timeouts)
}

_SCHEMA_LINE = re.compile(r"#\s*yaml-language-server:\s*\$schema=")
_SCHEMA_NOTE = "# llamaswap: llama-swap's YAML schema line was here; no schema applies to TOML"
_ONLY_FIFO = re.compile(r"only valid scheduler is \W*fifo\b", re.IGNORECASE)
_FIFO_NOTE = '# llamaswap: the default scheduler is "fifo"; "serial" orders by priority too'
#: ``# - connect: TCP dial connection timeout in seconds, default: 30 seconds``
_TIMEOUT_DEFAULT = re.compile(
    rf"(?P<head>#\s*-\s*(?P<key>{'|'.join(TIMEOUT_DEFAULTS)}):.*\bdefault:\s*)"
    r"(?P<theirs>(?P<seconds>\d+(?:\.\d+)?)\b.*?)\s*$"
)
_DEFAULTS_SHOWN = re.compile(r"\bdefaults shown below\b")


def correct(comments: Comments) -> Comments:
    """``comments`` with the lines llamaswap makes false rewritten (the module docstring
    lists them)."""
    return attrs.evolve(
        comments,
        leading={
            path: tuple(_correct(line, path) for line in lines)
            for path, lines in comments.leading.items()
        },
        trailing={path: _correct(line, path) for path, line in comments.trailing.items()},
        end=tuple(_correct(line, ()) for line in comments.end),
    )


def _correct(line: str, path: Path) -> str:
    """``line``, a comment belonging to the YAML key at ``path``, made true of llamaswap."""
    if _SCHEMA_LINE.match(line):
        return _SCHEMA_NOTE
    if _ONLY_FIFO.search(line):
        return _FIFO_NOTE
    if "timeouts" not in path:
        return line
    if match := _TIMEOUT_DEFAULT.match(line):
        default = TIMEOUT_DEFAULTS[match["key"]]
        if float(match["seconds"]) == default:
            return line
        return f"{match['head']}{match['theirs']} in llama-swap; llamaswap's: {_seconds(default)}"
    defaults = ", ".join(f"{key} {value:g}" for key, value in TIMEOUT_DEFAULTS.items())
    shown = f"llama-swap's defaults shown below (llamaswap's: {defaults} seconds; 0: off)"
    return _DEFAULTS_SHOWN.sub(shown, line)


def _seconds(value: float) -> str:
    return f"{value:g} seconds" if value else "0 (off)"
