"""Several config files as one: ``--config DIR`` reads every ``*.toml`` directly in it.

The files are merged in the sorted order of their names, as llama-swap merges a
``-config-dir`` of YAML files:

* a key set in one file only is taken as it is; a table set in several is merged key by
  key, and an array set in several is the first file's items followed by the next's;
* a plain value set in several files must be the same in each;
* **one entry split across files is refused**: a model, peer, device, group, profile or
  selector ID (a key directly under ``models``, ``peers``, ``devices``,
  ``routing.router.settings.groups``, ``profiles``, ``selectors``), or a key of the
  matrix, set in two files.

Every problem found later names the file its key came from (``Origins``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from llamaswap.errors import ConfigProblem
from llamaswap.keypaths import Path, format_path

__all__ = ["Origins", "merge_documents"]

#: The tables whose every key is one entry, which one file must hold whole.
_ENTRIES: frozenset[Path] = frozenset(
    {
        ("models",),
        ("peers",),
        ("devices",),
        ("profiles",),
        ("selectors",),
        ("routing", "router", "settings", "groups"),
        ("routing", "router", "settings", "matrix"),
    }
)


@attrs.define
class Origins:
    """Which file each key came from."""

    files: dict[Path, str] = attrs.field(factory=dict)

    def file_of(self, path: Path) -> str | None:
        """The file of the nearest key at or above ``path`` that a file set."""
        for cut in range(len(path), 0, -1):
            file = self.files.get(path[:cut])
            if file is not None:
                return file
        return None


def merge_documents(
    documents: Mapping[str, dict[str, Any]],
) -> tuple[dict[str, Any], Origins, list[ConfigProblem]]:
    """``documents`` (parsed TOML by file, in order) as one, where each key came from,
    and what could not be merged (each problem naming both files)."""
    merged: dict[str, Any] = {}
    origins = Origins()
    problems: list[ConfigProblem] = []
    for file, document in documents.items():
        _merge_into(merged, document, (), file, origins, problems)
    return merged, origins, problems


def _merge_into(
    into: dict[str, Any],
    document: Mapping[str, Any],
    path: Path,
    file: str,
    origins: Origins,
    problems: list[ConfigProblem],
) -> None:
    for key, value in document.items():
        where = (*path, key)
        if key not in into:
            into[key] = value
            origins.files[where] = file
            continue
        first = origins.file_of(where)
        old = into[key]
        if path in _ENTRIES:
            message = f"set in {first} too: one entry is written in one file"
        elif isinstance(old, dict) and isinstance(value, dict):
            _merge_into(old, value, where, file, origins, problems)
            continue
        elif isinstance(old, list) and isinstance(value, list):
            into[key] = [*old, *value]
            continue
        elif old == value:
            continue
        else:
            message = f"set in {first} to another value ({old!r}): say it once, or the same"
        problems.append(ConfigProblem(format_path(where), message, file=file))
