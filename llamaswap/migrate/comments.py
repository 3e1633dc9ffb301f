"""Where the comments of a YAML file belong, by key path.

ruamel.yaml's round-trip loader keeps every comment, but hangs each on the node *before*
it: the comment block above ``models:`` arrives as the trailing text of the previous key.
A converter wants the opposite, the way a reader sees the file: a comment block belongs to
the key right below it, and a comment at the end of a line belongs to that line's key.

So this module only takes from ruamel what it knows for certain, which text is a comment
and where it starts (never a ``#`` line inside a ``cmd: |`` block), and re-attaches each
comment line by line number: a full-line comment to the next key or list item below it, an
end-of-line comment to the last key or item starting on its line. Comments after the last
key are the file's trailing comments.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
from ruamel.yaml.comments import CommentedBase, CommentedMap, CommentedSeq
from ruamel.yaml.tokens import CommentToken

from llamaswap.keypaths import Path

__all__ = ["Comments", "find_comments"]


@attrs.frozen
class Comments:
    """The comments of one YAML document, by the key path they belong to.

    Attributes:
        leading: the comment lines above each key or list item, each as written from its
            ``#`` on (``""``: a blank line between two paragraphs of comments).
        trailing: the end-of-line comment of each key or list item.
        end: the comment lines after the last key.
        lines: the line (from 0) of each key and list item.
    """

    leading: Mapping[Path, tuple[str, ...]] = attrs.field(factory=dict)
    trailing: Mapping[Path, str] = attrs.field(factory=dict)
    end: tuple[str, ...] = ()
    lines: Mapping[Path, int] = attrs.field(factory=dict)


def find_comments(root: object, text: str) -> Comments:
    """Attach the comments of the YAML ``text`` (loaded as ``root``) to key paths."""
    lines = text.splitlines()
    anchors = sorted(_anchors(root, ()), key=lambda anchor: anchor[0])
    starts = [line for line, _ in anchors]
    leading: dict[Path, list[str]] = {}
    trailing: dict[Path, str] = {}
    end: list[str] = []
    previous: dict[Path | None, int] = {}  # the last comment line above each key (None: end)
    for line, column, body in _comment_lines(root):
        first = column if column is not None else len(lines[line]) - len(lines[line].lstrip())
        if line < len(lines) and lines[line][:first].strip():
            # After content on its line: the last key or item that starts on or before it.
            index = bisect.bisect_right(starts, line) - 1
            if index >= 0:
                path = anchors[index][1]
                trailing[path] = f"{trailing[path]} {body}" if path in trailing else body
            continue
        index = bisect.bisect_right(starts, line)
        below = anchors[index][1] if index < len(anchors) else None
        block = end if below is None else leading.setdefault(below, [])
        if block and line > previous[below] + 1:
            block.append("")  # a blank line between two paragraphs of comments
        block.append(body)
        previous[below] = line
    return Comments(
        {path: tuple(found) for path, found in leading.items()},
        trailing,
        tuple(end),
        {path: line for line, path in anchors},
    )


def _anchors(node: object, path: Path) -> Iterator[tuple[int, Path]]:
    """``(line, path)`` of every key and list item under ``node``, 0-based lines."""
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            child: Path = (*path, str(key))
            try:
                line = node.lc.key(key)[0]
            except (KeyError, TypeError):  # a key merged in with '<<' has no position here
                continue
            yield line, child
            yield from _anchors(value, child)
    elif isinstance(node, CommentedSeq):
        for index, value in enumerate(node):
            child = (*path, index)
            try:
                line = node.lc.item(index)[0]
            except (KeyError, TypeError):
                continue
            yield line, child
            yield from _anchors(value, child)


def _comment_lines(root: object) -> list[tuple[int, int | None, str]]:
    """Every comment line: ``(line, column or None, text from '#' on)``, in file order.

    The column is known for the first line of each comment token only; the others are
    whole-line comments (their ``#`` is the first character that is not blank).
    """
    found: dict[int, tuple[int | None, str]] = {}
    for token in _tokens(root):
        parts = token.value.split("\n")
        first = next((i for i, part in enumerate(parts) if "#" in part), None)
        if first is None:
            continue
        for offset, part in enumerate(parts[first:]):
            stripped = part.strip()
            if not stripped.startswith("#"):
                continue
            line = token.start_mark.line + offset
            column = token.start_mark.column if offset == 0 else None
            found.setdefault(line, (column, stripped))
    return [(line, column, body) for line, (column, body) in sorted(found.items())]


def _tokens(node: object) -> Iterator[CommentToken]:
    """Every comment token ruamel attached anywhere under ``node`` (some twice)."""
    seen: set[int] = set()
    stack: list[object] = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue  # an anchor used again ('*name') is the same object
        seen.add(id(current))
        if isinstance(current, CommentedBase):
            attached = current.ca
            yield from _flatten([attached.comment, attached.end, list(attached.items.values())])
        if isinstance(current, dict):
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)


def _flatten(value: Any) -> Iterator[CommentToken]:
    if isinstance(value, CommentToken):
        yield value
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            yield from _flatten(item)
