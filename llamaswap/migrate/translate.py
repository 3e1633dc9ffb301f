"""llama-swap YAML → llamaswap TOML, keeping the user's comments.

llamaswap spells its keys as llama-swap does, so most of a llama-swap file carries over
as it is: the translator walks the YAML beside llamaswap's own config classes
(``config/model.py``) and copies every key those classes have, one TOML table per YAML
mapping. That makes the rule for what is *not* translated mechanical: a key llamaswap's
classes do not have is reported with its YAML path and the reason (or the key it may be
a typo of), never written, so the output never holds a key llamaswap would refuse. The
exceptions are the places where the two formats differ, each handled by name:

* llama-swap's "unset" spellings (``ttl: -1``, ``concurrencyLimit: 0`` or less, a model's
  ``unloadTimeout: 0``, an empty string) are left out, so llamaswap's defaults apply;
* a value is read as llama-swap's YAML library reads it into the key's type (the type
  hints of the config classes): ``yes``/``no``/``on``/``off`` in a boolean key, a number
  in a string key as the text Go writes for it, and an unquoted date as the text written;
  only the first YAML document of the file is read;
* ``env`` lists become tables, and ``filters.stripParams`` (a comma-separated string)
  an array, unless it holds a macro: then the loader splits it after expanding it;
* top-level ``groups`` and ``matrix`` (llama-swap's older spelling) move under
  ``[routing.router]`` when ``routing.router`` sets nothing, and matrix sets that name
  models directly get a var each; a matrix the router does not use is left out. Above
  the matrix, or the groups when the router uses them, a comment of llamaswap's own
  (``_memory_advice``) says that each model's ``memory`` lets the fit rule work out what
  they say by hand (docs/resources.md);
* values llamaswap bounds or spells more strictly are written as llama-swap runs them
  (``healthCheckTimeout`` below 15 s becomes 15, a TTL over 30 days 0, ``logLevel`` in
  lower case, ``checkEndpoint`` with its leading ``/``), and ``preload`` names of no model
  and aliases that are another model's ID (llama-swap looks IDs up first) are left out;
* a profile's pin to ``~`` (YAML null: the name is turned off) becomes ``""``, and
  llama-swap's older profile form (a list of models that run together) becomes the
  profile's ``members`` (model IDs: an alias is written as its model's ID);
* what llamaswap reads differently and cannot be rewritten (a macro in a key, an unquoted
  ``${env.NAME}`` where a number may be meant, a model ID or peer ID llamaswap refuses, a
  command written for Windows, a model without ``cmd``, ``comfyui_auto``) is noted.

Comments (``comments.py``) are placed before the key, table or array item they were
above, and end-of-line comments stay at the end of their line; those of llama-swap's own
that llamaswap makes false are rewritten (``corrections.py``). A TOML table's values must
come before its sub-tables, so within each table the values are written first; a comment
above a sub-table is written as the last line before that sub-table's header.
"""

from __future__ import annotations

import decimal
import functools
import math
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import Any, Literal

import attrs
import tomlkit
from ruamel.yaml import YAML
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean
from tomlkit.container import Container
from tomlkit.items import Array, Comment, Item, String, StringType, Table, Trivia

from llamaswap.keypaths import Path, did_you_mean, format_path

from ..config import model as schema
from ..config.matrix_expr import And, MatrixExprError, Name, Node, Or, parse_expr
from ..config.validate import NAME_RULE, bad_name
from ..config.values import InvalidValue, parse_command, without_comments
from .comments import Comments, find_comments
from .corrections import correct

__all__ = ["ImportResult", "Remark", "YamlError", "import_yaml"]

#: llama-swap raises a smaller ``healthCheckTimeout`` to this many seconds.
MIN_HEALTH_CHECK_TIMEOUT = 15
_LONG_ARRAY = 80  # characters: a longer array is written one item per line

#: The YAML 1.1 booleans Go's yaml.v3 still reads into a boolean key (as llama-swap does).
_YAML11_BOOLS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "on", "On", "ON"), True),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "off", "Off", "OFF"), False),
}
#: What llama-swap reads these keys as: the values it knows, and what it takes for others.
_LOG_SETTINGS: dict[str, tuple[frozenset[str], str]] = {
    "logLevel": (frozenset(level.value for level in schema.LogLevel), schema.LogLevel.INFO.value),
    "logTimeFormat": (frozenset(typing.get_args(schema.LogTimeFormat)), ""),
}
#: The model ID llama-swap serves under /comfyui/, with a concurrencyLimit of at least this.
_COMFYUI, _COMFYUI_LIMIT = "comfyui_auto", 50
#: A path with a drive letter (``C:\`` or ``C:/``), and a program only Windows has.
_WINDOWS_PATH = re.compile(r"(?<![\w])[A-Za-z]:[\\/]")
_WINDOWS_PROGRAM = re.compile(r"\s*(\S*\.exe|taskkill)(\s|$)", re.IGNORECASE)
#: Where the remark about the YAML documents after the first is reported.
_LATER_DOCUMENTS = "(the documents after the first)"
#: ``${name}`` (a macro, or an environment variable as ``env.NAME``).
_MACRO = re.compile(r"\$\{([^}]*)\}")
#: Where the groups and the matrix are, in the translated tree.
_ROUTER_SETTINGS: Path = ("routing", "router", "settings")

#: Why a llama-swap key has no place in llamaswap (keys not listed: "no such key").
_REASONS = {
    "logRequests": "an old llama-swap switch; llamaswap has no such key",
    "metricsMaxInMemory": "llamaswap keeps the last 1000 requests in memory; "
    "a [store] table keeps more, on disk",
    "ui": "llamaswap's dashboard has no settings",
    "performance": "llamaswap does not collect system statistics",
    "compat": "llamaswap has no compat settings",
    "healthCheckTimeout": "llama-swap takes it from the top-level healthCheckTimeout, "
    "and so does llamaswap",
}


class YamlError(ValueError):
    """The input is not YAML llamaswap can translate (a syntax error, or not a mapping).

    Attributes:
        line: the 1-based line of a syntax error, else ``None``.
        column: the 1-based column of a syntax error, else ``None``.
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        super().__init__(message)


@attrs.frozen
class Remark:
    """Something about the translation the user should know.

    Attributes:
        path: the YAML key path, e.g. ``models.qwen.timeouts.tlsHandshake`` (or
            ``(the documents after the first)``).
        message: what happened and why.
        skipped: ``True`` when the key was left out of the TOML.
    """

    path: str
    message: str
    skipped: bool = True

    def render(self) -> str:
        text = f"not translated: {self.message}" if self.skipped else self.message
        return f"{self.path or '(top level)'}: {text}"


@attrs.frozen
class ImportResult:
    """The TOML text and what the translation could not carry over (in file order)."""

    toml: str
    remarks: tuple[Remark, ...]


def import_yaml(text: str) -> ImportResult:
    """Translate a llama-swap YAML configuration into llamaswap TOML.

    Only the first YAML document is read, as llama-swap reads it. The result is not
    validated: ``loads_config(result.toml)`` does that.

    Raises:
        YamlError: ``text`` is not valid YAML, or its top level is not a mapping.
    """
    yaml = YAML(typ="rt")
    yaml.Constructor = _Constructor
    yaml.preserve_quotes = True  # a quoted "${env.N}" is text in llama-swap too
    documents = yaml.load_all(text)
    try:
        root = next(documents, None)
    except YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise YamlError(f"invalid YAML: {problem}", line, column) from None
    # llama-swap's YAML library decodes the first document only and never reads on, so
    # what follows is ignored there, even if it is not valid YAML. An empty one (a stray
    # '---' at the end) holds nothing to mention.
    try:
        more = any(document is not None for document in documents)
    except YAMLError:
        more = True
    if root is None:
        root = {}
    if not isinstance(root, Mapping):
        raise YamlError("expected a mapping of keys (healthCheckTimeout, models, ...)")
    result = _Translator(root, correct(find_comments(root, text))).run()
    if more:
        ignored = Remark(
            _LATER_DOCUMENTS,
            "llama-swap reads only the first YAML document of a file and ignores the rest; "
            "move what they hold into the first if it is meant to apply",
        )
        result = attrs.evolve(result, remarks=(*result.remarks, ignored))
    return result


class _Constructor(RoundTripConstructor):
    """ruamel's round-trip constructor, but an unquoted date or time (``2024-05-01``)
    stays the text it was written as. llama-swap's YAML library keeps such a value as text
    wherever it is not asked for a time, and llamaswap has no key that takes one."""


_Constructor.add_constructor(
    "tag:yaml.org,2002:timestamp", RoundTripConstructor.construct_yaml_str
)


@attrs.frozen
class _Value:
    """``key = value`` in the table being written."""

    key: str
    item: Item
    path: Path  # where its comments come from


@attrs.frozen
class _Table:
    """A sub-table ``[...key]`` and what goes in it."""

    key: str
    path: Path
    entries: tuple[_Value | _Table, ...]


_Entry = _Value | _Table
_Hook = Callable[["_Translator", str, object, Path], Iterator[_Entry]]
_HOOKS: dict[tuple[type, str], _Hook] = {}


def _hook(cls: type, *keys: str) -> Callable[[_Hook], _Hook]:
    """Register a translation of ``keys`` in the table of ``cls`` that is not a plain copy."""

    def register(function: _Hook) -> _Hook:
        for name in keys:
            _HOOKS[cls, name] = function
        return function

    return register


class _Translator:
    def __init__(self, root: Mapping[Any, Any], comments: Comments) -> None:
        self.comments = comments
        self.doc = tomlkit.document()
        #: The table written last: a comment above the next header goes at its end.
        self.tail: Container | Table = self.doc
        self.remarks: list[tuple[int, Remark]] = []
        #: (path in the translated tree, path in the YAML file) for moved sections.
        self.moved: list[tuple[Path, Path]] = []
        self.root = self._normalise(root)
        models = self.root.get("models")
        self.model_ids = {str(k) for k in models} if isinstance(models, Mapping) else set()
        #: Every name a model answers to: IDs, aliases and setParamsByID keys.
        self.names = set(self.model_ids)
        for model in models.values() if isinstance(models, Mapping) else ():
            aliases = model.get("aliases") if isinstance(model, Mapping) else None
            filters = model.get("filters") if isinstance(model, Mapping) else None
            by_id = filters.get("setParamsByID") if isinstance(filters, Mapping) else None
            for name in [*(aliases if isinstance(aliases, list) else ()), *(by_id or ())]:
                self.names.add(_go_text(name) if isinstance(name, (int, float)) else str(name))

    def run(self) -> ImportResult:
        self._write(self.doc, list(self.entries(self.root, (), _Kind(schema.Config))))
        self._comment(self.tail, self.comments.end)
        remarks = [remark for _, remark in sorted(self.remarks, key=lambda pair: pair[0])]
        return ImportResult(tomlkit.dumps(self.doc), tuple(remarks))

    # -- reporting ---------------------------------------------------------------------

    def skip(self, path: Path, reason: str) -> None:
        self._remark(path, reason, skipped=True)

    def note(self, path: Path, message: str) -> None:
        self._remark(path, message, skipped=False)

    def _remark(self, path: Path, message: str, *, skipped: bool) -> None:
        where = self.origin(path)
        line = next(
            (
                self.comments.lines[where[:n]]
                for n in range(len(where), 0, -1)
                if where[:n] in self.comments.lines
            ),
            0,
        )
        self.remarks.append((line, Remark(format_path(where), message, skipped)))

    def source(self, path: Path) -> object:
        """The YAML value at ``path`` of the translated tree (``None`` if there is none)."""
        value: object = self.root
        for part in path:
            if isinstance(value, Mapping):
                value = value.get(part)
            elif isinstance(value, list) and isinstance(part, int) and part < len(value):
                value = value[part]
            else:
                return None
        return value

    def origin(self, path: Path) -> Path:
        """Where ``path`` of the translated tree is in the YAML file."""
        for moved_to, moved_from in self.moved:
            if path[: len(moved_to)] == moved_to:
                return (*moved_from, *path[len(moved_to) :])
        return path

    # -- the tree ------------------------------------------------------------------------

    def _normalise(self, root: Mapping[Any, Any]) -> dict[str, Any]:
        """``root`` with llama-swap's top-level ``groups``/``matrix`` under ``routing``, as
        llama-swap reads them (load.go): only a matrix or non-empty groups count, and only
        when ``routing.router`` sets nothing (llama-swap refuses both)."""
        legacy = [key for key in ("groups", "matrix") if key in root]
        # A null one, or empty groups, is absent for llama-swap: dropped.
        used = [key for key in legacy if root[key] is not None and (key == "matrix" or root[key])]
        routing = root.get("routing")
        router = routing.get("router") if isinstance(routing, Mapping) else None
        settings = router.get("settings") if isinstance(router, Mapping) else None
        chosen = isinstance(router, Mapping) and bool(router.get("use"))
        if isinstance(settings, Mapping):
            chosen = chosen or settings.get("matrix") is not None or bool(settings.get("groups"))
        if not used or chosen:
            for key in used:
                self.skip((key,), "llama-swap refuses it beside routing.router; move it there")
            return {str(k): v for k, v in root.items() if k not in ("groups", "matrix")}
        new_router: dict[str, Any] = {"settings": {key: root[key] for key in used}}
        if "matrix" in used:
            new_router["use"] = "matrix"
        new_routing = {**(routing if isinstance(routing, Mapping) else {}), "router": new_router}
        for key in used:
            self.moved.append((("routing", "router", "settings", key), (key,)))
        result: dict[str, Any] = {}
        for key, value in root.items():
            if key in legacy or key == "routing":
                result.setdefault("routing", new_routing)
            else:
                result[str(key)] = value
        return result

    def entries(self, src: Mapping[Any, Any], path: Path, kind: _Kind) -> Iterator[_Entry]:
        """The TOML entries for the YAML mapping ``src`` at ``path``, read as ``kind`` (a
        config class, or a free-form table such as ``metadata``)."""
        cls = kind.cls
        for raw_key, value in src.items():
            key = str(raw_key)
            at: Path = (*path, key)
            self._check_key(key, at)
            if cls is None:
                yield from self.copy(key, value, at, kind.scalar)
                continue
            hook = _HOOKS.get((cls, key))
            if hook is not None:
                yield from hook(self, key, value, at)
            elif key not in _fields(cls):
                self.skip(at, _REASONS.get(key) or _no_such_key(key, _fields(cls)))
            elif value is None or value == "":
                continue  # llama-swap's "not set": llamaswap's default applies
            else:
                yield from self.copy(key, value, at, _fields(cls)[key])

    def copy(self, key: str, value: object, path: Path, kind: _Kind | _Scalar) -> Iterator[_Entry]:
        """``key`` copied as it is; a mapping becomes a table of ``kind``."""
        if isinstance(value, Mapping):
            yield from self.table(
                key, value, path, kind if isinstance(kind, _Kind) else _Kind(None)
            )
        else:
            item = self._item(value, path, kind.scalar if isinstance(kind, _Kind) else kind)
            if item is not None:
                yield _Value(key, item, path)

    def table(
        self,
        key: str,
        value: Mapping[Any, Any],
        path: Path,
        kind: _Kind,
        *,
        named: bool = False,
    ) -> Iterator[_Table]:
        """``[key]`` from the mapping ``value``; nothing when nothing in it is kept, unless
        it is ``named`` (one of ``models``, ``peers``, ...: left out, it would go unnoticed)."""
        entries: list[_Entry] = []
        if kind.each:
            for name, item in value.items():
                at: Path = (*path, str(name))
                self._check_key(str(name), at)
                if kind.cls is schema.ModelConfig and isinstance(item, Mapping):
                    self._check_model(str(name), item, at)
                if isinstance(item, Mapping):
                    entries.extend(self.table(str(name), item, at, _Kind(kind.cls), named=True))
                else:
                    self.skip(at, "expected a mapping of keys")
        else:
            entries.extend(self.entries(value, path, kind))
        if entries or named:
            yield _Table(key, path, tuple(entries))

    def _check_key(self, key: str, path: Path) -> None:
        """Remark what llamaswap reads differently in a key: a macro (llama-swap fills in
        ``${env.NAME}`` everywhere; llamaswap fills in macros in no key but those of a
        model's ``setParamsByID``), or a model ID it refuses."""
        if "${" in key and path[-2:-1] != ("setParamsByID",):
            env = " (llama-swap fills in ${env.NAME} there)" if "${env." in key else ""
            self.note(path, f"llamaswap fills in no macro in a key{env}: write the name itself")
        if len(path) == 2 and path[0] == "models":
            self.check_name(key, path, "a model ID")
        if len(path) == 2 and path[0] == "peers" and _bad_peer_id(key):
            self.note(
                path,
                f"llamaswap refuses {key!r}: a peer ID must not be empty or contain '/' or "
                "whitespace (a peer's models are also named 'ID/model'); rename it here and "
                "in the clients that use those names",
            )

    def check_command(self, command: str, path: Path) -> None:
        """Remark a ``cmd`` or ``cmdStop`` written for Windows, with its macros filled in:
        llama-swap splits a command by Windows' rules there (commands.go), where a
        backslash is a path separator; llamaswap splits it as a POSIX shell does, where a
        backslash outside quotes escapes the next character and is dropped."""
        text = without_comments(self.fill_macros(command, path[:-1]))
        if not _windows_command(text):
            return
        try:
            program = f" (the program here would be {parse_command(text)[0]!r})"
        except InvalidValue:
            program = ""  # reported when the output is checked
        stop = (
            ", or leave cmdStop out: llamaswap stops a model by signalling its process group"
            if path[-1] == "cmdStop"
            else ""
        )
        self.note(
            path,
            "this looks like a Windows command line, but llamaswap runs models as POSIX "
            "processes and splits a command as a POSIX shell does, where a backslash outside "
            f"quotes escapes the next character and is dropped{program}: write the command "
            f"as it runs where llamaswap runs, with '/' in paths{stop}",
        )

    def fill_macros(self, text: str, model_path: Path) -> str:
        """``text`` with the macros it uses filled in as far as the YAML defines them: the
        model's at ``model_path`` first, then the top-level ones (macros may use macros)."""
        known: dict[str, object] = {}
        model = self.source(model_path)
        for macros in (
            self.root.get("macros"),
            model.get("macros") if isinstance(model, Mapping) else None,
        ):
            if isinstance(macros, Mapping):
                known.update((str(name), value) for name, value in macros.items())
        for _ in range(10):  # a macro that uses itself is reported when the output is checked
            filled = _MACRO.sub(lambda m: str(known.get(m[1], m[0])), text)
            if filled == text:
                break
            text = filled
        return text

    def _check_model(self, model_id: str, model: Mapping[Any, Any], path: Path) -> None:
        """Remark a model llama-swap runs otherwise: ``comfyui_auto``, or one without cmd."""
        if model_id == _COMFYUI:
            self.note(
                path,
                f"llamaswap serves {_COMFYUI!r} under /comfyui/ as llama-swap does, but "
                f"llama-swap also lets it take at least {_COMFYUI_LIMIT} requests at once: "
                f"write concurrencyLimit = {_COMFYUI_LIMIT} for that limit",
            )
        if model.get("cmd") in (None, ""):
            self.note(
                path,
                "no cmd: llama-swap could not start this model (every request for it failed), "
                "and llamaswap requires one: give the command that starts its server, or, "
                "for a server that runs on its own, list its models under [peers] instead",
            )

    def check_name(self, name: str, path: Path, what: str) -> None:
        """Remark a model ID or alias llamaswap refuses (llama-swap takes any)."""
        if bad_name(name):
            self.note(
                path,
                f"llamaswap refuses {name!r}: {what} {NAME_RULE}; "
                "rename it here and in the clients that use it",
            )

    def _write(self, table: Container | Table, entries: list[_Entry]) -> None:
        """Write values first, then sub-tables (TOML's order), each with its comments."""
        for entry in entries:
            if isinstance(entry, _Value):
                self._comment(table, self._leading(entry.path))
                trailing = self._trailing(entry.path)
                if trailing:
                    entry.item.comment(trailing)
                table.add(entry.key, entry.item)
        for entry in entries:
            if isinstance(entry, _Table):
                self._write_table(table, entry, [])

    def _write_table(self, parent: Container | Table, entry: _Table, above: list[str]) -> bool:
        """Write ``entry`` and what is in it, with the comment lines ``above`` and its own
        above its header; whether there were any."""
        # A table holding only tables has no header of its own: its comments go above the
        # header of its first sub-table.
        header = not entry.entries or any(isinstance(inner, _Value) for inner in entry.entries)
        sub = tomlkit.table(is_super_table=not header)
        advice, leading = self._advice(entry.path), self._leading(entry.path)
        # llamaswap's own comment is a paragraph of its own between the user's.
        above = _paragraphs(above, advice, leading) if advice else [*above, *leading]
        trailing = self._trailing(entry.path)
        if trailing and header:
            sub.comment(trailing)
        elif trailing:
            above.append(trailing)
        if header and above:
            # The blank line goes above the comments, not between them and the header.
            self._comment(self.tail, ["", *above])
        if header:
            parent.add(entry.key, sub)
            self.tail = sub
            self._write(sub, list(entry.entries))
            commented = bool(above)
        else:
            # Filled before it is added: the comments above its first sub-table must reach
            # the table written before this one, not follow this one in its parent.
            first, *rest = (inner for inner in entry.entries if isinstance(inner, _Table))
            commented = self._write_table(sub, first, above)
            for inner in rest:
                self._write_table(sub, inner, [])
            parent.add(entry.key, sub)
        if commented:
            sub.trivia.indent = ""  # tomlkit's blank line above the header: now above them
        return commented

    def _advice(self, path: Path) -> list[str]:
        """llamaswap's own comment above the table at ``path``: ``_memory_advice`` above the
        matrix, or above the groups when the router uses them (under ``use = "matrix"``
        they do nothing)."""
        if path == (*_ROUTER_SETTINGS, "matrix"):
            return _memory_advice("matrix")
        router = self.source(_ROUTER_SETTINGS[:-1])
        use = router.get("use") if isinstance(router, Mapping) else None
        if path == (*_ROUTER_SETTINGS, "groups") and use != "matrix":
            return _memory_advice("groups")
        return []

    @staticmethod
    def _comment(table: Container | Table, lines: Iterable[str]) -> None:
        for line in lines:
            table.add(Comment(Trivia(comment=line)) if line else tomlkit.nl())

    def _leading(self, path: Path) -> tuple[str, ...]:
        return self.comments.leading.get(self.origin(path), ())

    def _trailing(self, path: Path) -> str:
        return self.comments.trailing.get(self.origin(path), "")

    # -- values --------------------------------------------------------------------------

    def _item(self, value: object, path: Path, scalar: _Scalar) -> Item | None:
        """A YAML scalar, list or (inside a list) mapping as a TOML value, read as a key of
        type ``scalar`` reads it in llama-swap; ``None`` (and a remark) for what TOML cannot
        hold."""
        if value is None:
            self.skip(path, "TOML has no null; leave the key out for its default")
            return None
        if scalar == "bool" and isinstance(value, str) and value in _YAML11_BOOLS:
            return tomlkit.item(_YAML11_BOOLS[value])
        if scalar == "str" and isinstance(value, (int, float)):  # bools are ints too
            return _string(_go_text(value))
        if scalar == "free" and isinstance(value, str) and self._typed_there(value):
            self.note(
                path,
                f"llama-swap reads {value} as a number or true/false when its value is one; "
                "llamaswap keeps it as text here: for a number, write the number, or use a "
                '[macros] entry that holds it (n = 0.7) as "${n}"',
            )
        if isinstance(value, (bool, ScalarBoolean)):  # ScalarBoolean: an anchored one
            return tomlkit.item(bool(value))
        if isinstance(value, int):
            return tomlkit.integer(int(value))
        if isinstance(value, float):
            return tomlkit.float_(float(value))
        if isinstance(value, str):
            return _string(str(value))
        if isinstance(value, Mapping):
            table = tomlkit.inline_table()
            for key, item in value.items():
                converted = self._item(item, (*path, str(key)), scalar)
                if converted is not None:
                    table.append(str(key), converted)
            return table
        if isinstance(value, list):
            return self.array(value, path, scalar)
        try:
            return tomlkit.item(value)  # a value of an explicit YAML tag (!!binary, !!set)
        except (TypeError, ValueError):
            self.skip(path, f"TOML has no value like {value!r}")
            return None

    @staticmethod
    def _typed_there(text: str) -> bool:
        """Whether llama-swap reads ``text`` as a number or boolean where llamaswap reads
        text: an unquoted ``${env.NAME}``, which llama-swap fills into the YAML text
        before parsing it (a quoted one is text in both)."""
        match = _MACRO.fullmatch(text)
        return match is not None and match[1].startswith("env.") and type(text) is str

    def array(
        self, values: list[Any], path: Path, scalar: _Scalar, *, dropped: Set[int] = frozenset()
    ) -> Array:
        """``values`` as a TOML array, but the items at the indexes ``dropped``."""
        items = [
            (index, self._item(value, (*path, index), scalar))
            for index, value in enumerate(values)
            if index not in dropped
        ]
        kept = [(index, item) for index, item in items if item is not None]
        array = tomlkit.array()
        commented = any(
            self._leading((*path, index)) or self._trailing((*path, index)) for index, _ in kept
        )
        if not commented and len(", ".join(item.as_string() for _, item in kept)) <= _LONG_ARRAY:
            array.extend(item for _, item in kept)
            return array
        for index, item in kept:
            for line in self._leading((*path, index)):
                if line.lstrip("#").strip():
                    array.add_line(comment=line.lstrip("#").strip())  # it adds its own '# '
            trailing = self._trailing((*path, index)).lstrip("#").strip()
            array.add_line(item, comment=trailing or None)
        array.add_line(indent="")
        return array

    # -- special keys ----------------------------------------------------------------------

    def env(self, value: object, path: Path) -> Iterator[_Entry]:
        """``env: ["A=1", ...]`` as a table; the last value of a repeated name wins, as in
        the process llama-swap starts."""
        if not isinstance(value, list):
            yield from self.copy("env", value, path, "any")
            return
        entries: dict[str, _Value] = {}
        for index, item in enumerate(value):
            at: Path = (*path, index)
            name, sep, text = str(item).partition("=")
            if not isinstance(item, str) or not sep or not name.strip():
                self.skip(at, f'expected "NAME=value", got {item!r}')
                continue
            if name in entries:
                self.note(at, f"{name} is set again here; the last value is kept")
                del entries[name]
            entries[name] = _Value(name, _string(text), at)
        if entries:
            yield _Table("env", path, tuple(entries.values()))

    def matrix(self, value: object, path: Path) -> Iterator[_Entry]:
        """The matrix, with a var for each model its sets or costs name directly (llamaswap's
        sets name vars only); left out unless ``routing.router.use`` is ``matrix``."""
        router = self.source(path[:-2])
        use = router.get("use") if isinstance(router, Mapping) else None
        if use != "matrix":
            self.skip(
                path,
                f"unused: routing.router.use is {use or 'group'!r}, so llama-swap neither "
                "reads nor checks it",
            )
            return
        if not isinstance(value, Mapping):
            yield from self.copy("matrix", value, path, _Kind(schema.MatrixConfig))
            return
        variables = value.get("vars")
        known = dict(variables) if isinstance(variables, Mapping) else {}
        named = list(_named(value.get("sets"))) + list(value.get("evict_costs") or ())
        added = {str(n): str(n) for n in named if n not in known and n in self.model_ids}
        if added:
            listed = ", ".join(sorted(added))
            self.note((*path, "vars"), f"added a var for each model named directly: {listed}")
        src = {**value, "vars": {**known, **added}}
        yield from self.table("matrix", src, path, _Kind(schema.MatrixConfig))


#: What a value is read as: a boolean, a string (or a list of strings), anything (a
#: free-form table's value), or as YAML typed it (numbers, durations, ...).
_Scalar = Literal["bool", "str", "free", "any"]


@attrs.frozen
class _Kind:
    """What a key holds: a table of ``cls`` (``None``: a table of any keys, with values
    of ``scalar``), or (``each``) a table of such tables."""

    cls: type | None
    each: bool = False
    scalar: _Scalar = "free"


def _paragraphs(*blocks: Iterable[str]) -> list[str]:
    """Comment blocks one after another, a blank line between two that are not empty."""
    lines: list[str] = []
    for block in blocks:
        block = list(block)
        if lines and block:
            lines.append("")
        lines.extend(block)
    return lines


#: What the fit rule changes for each router's table (``_memory_advice``).
_ADVICE = {
    "groups": (
        "groups",
        "models in no group run side by side wherever they fit. A group's own rules still "
        "apply first, so keep only the groups you want for another reason (a persistent "
        "one, say).",
    ),
    "matrix": (
        "matrix sets",
        "the sets still choose first, so once every model has its memory the matrix can "
        'go, and use = "matrix" with it.',
    ),
}


def _memory_advice(router: Literal["groups", "matrix"]) -> list[str]:
    """The comment written above the groups, or the matrix, that the router uses: llama-swap
    has no figures, so its users say by hand what fits; llamaswap's fit rule can work it out
    from each model's ``memory`` (docs/resources.md)."""
    what, then = _ADVICE[router]
    text = (
        f"llamaswap: these {what} say by hand which models may run together. Give each "
        'model its memory (memory = "8GiB", or a table by device) and each GPU its budget '
        '([devices.gpu0] memory = "24GiB", unless a GPU probe reads it), and the fit rule '
        f"works out what fits, so that a load stops only what it must: {then} "
        "See docs/resources.md."
    )
    return [f"# {line}" for line in textwrap.wrap(text, width=86)]


@functools.cache
def _fields(cls: type) -> dict[str, _Kind | _Scalar]:
    """The TOML keys of a config class, each with what it holds."""
    hints = typing.get_type_hints(cls)
    result: dict[str, _Kind | _Scalar] = {}
    for field in attrs.fields(cls):
        result[schema.toml_key(field)] = _kind(hints[field.name])
    return result


def _kind(hint: object) -> _Kind | _Scalar:
    """What a field of type ``hint`` holds: a config class (``X`` or ``X | None``), a table
    of them (``Mapping[str, X]``), a table of values, or a value."""
    if isinstance(hint, type) and attrs.has(hint):
        return _Kind(hint)
    origin = typing.get_origin(hint)
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if origin is typing.Union or origin is types.UnionType:
        return _kind(args[0]) if len(args) == 1 else "any"
    if isinstance(origin, type) and issubclass(origin, Mapping):
        inner = _kind(args[-1]) if args else "free"
        if isinstance(inner, _Kind) and inner.cls is not None:
            return _Kind(inner.cls, each=True)
        return _Kind(None, scalar=inner if isinstance(inner, str) else "free")
    if hint is bool:
        return "bool"
    if hint is Any:
        return "free"
    if (isinstance(hint, type) and issubclass(hint, str)) or origin is Literal:
        return "str"  # str, a str enum (LogLevel), a Literal of strings
    return "str" if origin is tuple and args[:1] == [str] else "any"


def _windows_command(command: str) -> bool:
    """Whether ``command`` (no comment lines) was written for Windows: it names a path with
    a drive letter (``C:\\``, ``D:/``), runs ``taskkill`` or a ``.exe``, or has a backslash
    before a letter, digit, ``.``, ``_`` or ``-`` outside quotes, which a POSIX shell drops
    and no one writes for one (``models\\qwen``)."""
    if _WINDOWS_PATH.search(command) or _WINDOWS_PROGRAM.match(command):
        return True
    quote = ""
    index = 0
    while index < len(command):
        char = command[index]
        if char in "'\"" and not quote:
            quote = char
        elif char == quote:
            quote = ""
        elif char == "\\" and quote != "'":
            following = command[index + 1 : index + 2]
            if not quote and following and (following.isalnum() or following in "._-"):
                return True
            index += 1  # the character it escapes
        index += 1
    return False


def _bad_peer_id(name: str) -> bool:
    """Whether llamaswap refuses ``name`` as a peer ID (llama-swap takes any)."""
    return not name or "/" in name or any(char.isspace() for char in name)


def _no_such_key(key: str, known: Iterable[str]) -> str:
    """Why ``key`` is left out, with the key it is likely a typo of (as check-config says
    it): llama-swap ignores a key it does not know, so a misspelt one never applied there."""
    close = did_you_mean(key, known)
    hint = f"; did you mean {close!r}? (if so, llama-swap ignored it too)" if close else ""
    return f"llamaswap has no key {key!r} here{hint}"


def _named(sets: object) -> Iterator[str]:
    """The names used in matrix set expressions (not ``+set`` references)."""
    if not isinstance(sets, Mapping):
        return
    for text in sets.values():
        try:
            stack: list[Node] = [parse_expr(str(text))]
        except MatrixExprError:
            continue  # reported when the output is checked
        while stack:
            node = stack.pop()
            if isinstance(node, Name):
                yield node.name
            elif isinstance(node, (And, Or)):
                stack.extend(node.parts)


def _go_text(value: int | float) -> str:
    """A YAML number or boolean as llama-swap reads it into a string key: as Go's yaml.v3
    writes it (llama-swap parses the file and writes it again before reading it), so
    ``3.50`` is ``"3.5"`` and ``1e6`` is ``"1e+06"``."""
    if isinstance(value, (bool, ScalarBoolean)):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if math.isnan(value) or math.isinf(value):
        return ".nan" if math.isnan(value) else "-.inf" if value < 0 else ".inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    # Go's strconv.FormatFloat(value, 'g', -1, 64): the shortest digits that read back
    # as the same float (Python's repr has them), an exponent below 1e-4 and from 1e6.
    _, numerals, exponent = decimal.Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, numerals))
    point = len(digits) + int(exponent)  # digits before the decimal point
    text = "-" if value < 0 else ""
    if not -4 <= point - 1 < 6:
        mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
        return f"{text}{mantissa}e{'-' if point < 1 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{text}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{text}{digits}{'0' * (point - len(digits))}"
    return f"{text}{digits[:point]}.{digits[point:]}"


def _string(text: str) -> String:
    """A TOML string: multi-line text as a literal ``'''...'''`` block starting on its own
    line (so a ``cmd`` reads as it did in YAML), single-line text as a basic string, or as a
    literal one when it holds backslashes (Windows paths, regular expressions)."""
    plain = all(char >= " " or char in "\t\n" for char in text) and "\x7f" not in text
    if "\n" in text:
        if plain and "'''" not in text:
            return String(StringType.MLL, text, "\n" + text, Trivia())
        return tomlkit.string(text, multiline=True)
    if "\\" in text and plain and "'" not in text:
        return tomlkit.string(text, literal=True)
    return tomlkit.string(text)


# -- the keys that are not a plain copy ------------------------------------------------------


@_hook(schema.Config, "healthCheckTimeout")
def _health_check_timeout(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, int) and not isinstance(value, bool) and value < MIN_HEALTH_CHECK_TIMEOUT:
        t.note(path, f"raised from {value} to {MIN_HEALTH_CHECK_TIMEOUT} s, as llama-swap runs it")
        value = MIN_HEALTH_CHECK_TIMEOUT
    yield from t.copy(key, value, path, "any")


@_hook(schema.Config, "unloadTimeout")
@_hook(schema.ModelConfig, "unloadTimeout", "concurrencyLimit")
def _zero_is_default(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    # concurrencyLimit: llama-swap's queue takes any limit of 0 or less as its default.
    below = key == "concurrencyLimit" and isinstance(value, (int, float)) and value < 0
    if value != 0 and value is not None and not below:
        yield from t.copy(key, value, path, "any")


@_hook(schema.Config, "captureBuffer")
def _capture_buffer(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """llama-swap's is a number of MiB, and captures every request unless it is 0 or less;
    llamaswap's is a size, and captures only where ``capture = true`` says."""
    if not isinstance(value, int) or isinstance(value, bool):
        t.skip(path, "llama-swap takes a whole number of megabytes here")
    elif value > 0:
        t.note(
            path,
            f'written "{value}MiB" (llama-swap counts megabytes); llamaswap captures only '
            "with capture = true, off by default since captures hold prompts and answers: "
            "add it to capture every model's requests, as llama-swap did",
        )
        yield from t.copy(key, f"{value}MiB", path, "str")
    # 0 or less: llama-swap captures nothing, nor does llamaswap without capture = true.


@_hook(schema.Config, "globalTTL")
@_hook(schema.ModelConfig, "ttl")
def _ttl(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if (value == -1 and key == "ttl") or value is None:
        return  # a model's -1: the global TTL, llamaswap's default too
    if isinstance(value, (int, float)) and value > schema.TTL.high:
        # 0 is "never unload" in both: the nearest to an idle time of over a month.
        t.note(
            path,
            f"llamaswap takes {schema.TTL.describe()}; {_go_text(value)} is written as 0 "
            "(never unload), the nearest",
        )
        value = 0
    yield from t.copy(key, value, path, "any")


@_hook(schema.Config, "logLevel", "logTimeFormat")
def _log_setting(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """llama-swap reads both in lower case without surrounding blanks, and an unknown one
    as its default: ``info``, or no timestamp (``""``, which llamaswap has to be told)."""
    if value is None:
        return
    known, fallback = _LOG_SETTINGS[key]
    text = (
        value
        if isinstance(value, str)
        else _go_text(value)
        if isinstance(value, (int, float))
        else None
    )
    if text is not None:
        read = text.strip().lower()
        if read not in known:
            read = fallback
            if text.strip():
                t.note(path, f"llama-swap reads {text!r} as {fallback!r}, an unknown value")
        elif read != text:
            t.note(path, f"written {read!r}: llama-swap reads it in lower case")
        value = read
    yield from t.copy(key, value, path, "str")


@_hook(schema.ModelConfig, "checkEndpoint")
def _check_endpoint(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, str) and value.strip() == schema.CHECK_NONE:
        value = schema.CHECK_NONE  # llama-swap compares it without blanks (and case)
    elif isinstance(value, str) and not value.startswith("/"):
        # llama-swap's proxy joins the path to the proxy URL with a '/'; llamaswap appends.
        t.note(path, f"written '/{value}': llama-swap asks for it with a leading '/'")
        value = f"/{value}"
    yield from t.copy(key, value, path, "str")


@_hook(schema.ModelConfig, "env")
def _env(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    return t.env(value, path)


@_hook(schema.Config, "macros")
@_hook(schema.ModelConfig, "macros")
def _macros(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    # A macro keeps its YAML type: a number used as the whole of a value stays a number. (A
    # model's macros are no field: config/macros.py applies them before the model is read.)
    yield from t.copy(key, value, path, _Kind(None, scalar="any"))


@_hook(schema.ModelConfig, "cmd", "cmdStop")
def _command(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if value is None or value == "":
        return  # not set
    if isinstance(value, str):
        t.check_command(value, path)
        yield _Value(key, _string(value), path)
    else:
        yield from t.copy(key, value, path, "any")


@_hook(schema.FilterConfig, "stripParams", "strip_params")
def _strip_params(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    filters = t.source(path[:-1])
    if key == "strip_params" and isinstance(filters, Mapping) and filters.get("stripParams"):
        t.skip(path, "llama-swap reads the old strip_params only when stripParams is not set")
    elif isinstance(value, str) and "${" in value:
        # Split after its macros are filled in (by the loader), as llama-swap splits it.
        yield _Value("stripParams", _string(value), path)
    elif isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
        kept = list(dict.fromkeys(name for name in names if name and name != "model"))
        if kept:
            yield _Value("stripParams", tomlkit.item(kept), path)
    elif value is not None:
        yield from t.copy("stripParams", value, path, "str")


@_hook(schema.ModelConfig, "aliases")
def _aliases(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """The aliases, but those that are another model's ID: llama-swap looks a name up as
    a model ID first (``RealModelName`` in config.go), so such an alias never applied."""
    if not isinstance(value, list):
        yield from t.copy(key, value, path, "str")
        return
    shadowed = set()
    for index, alias in enumerate(value):
        name = _go_text(alias) if isinstance(alias, (int, float)) else alias
        if not isinstance(name, str):
            continue
        if name in t.model_ids and name != path[1]:
            shadowed.add(index)
            t.skip(
                (*path, index),
                f"{name!r} is the ID of {format_path(('models', name))}, which llama-swap "
                "looks up first, so this alias never applied; llamaswap refuses it",
            )
        else:
            t.check_name(name, (*path, index), "an alias")
    yield _Value(key, t.array(value, path, "str", dropped=shadowed), path)


@_hook(schema.OnStartup, "preload")
def _preload(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """As llama-swap: each name without surrounding blanks, and names of no model left out."""
    if not isinstance(value, list):
        yield from t.copy(key, value, path, "str")
        return
    names = [_go_text(v) if isinstance(v, (int, float)) else v for v in value]
    names = [name.strip() if isinstance(name, str) else name for name in names]
    unknown = {
        index
        for index, name in enumerate(names)
        if isinstance(name, str) and name not in t.names and "${" not in name
    }
    for index in sorted(unknown):
        t.skip((*path, index), f"{names[index]!r} is no model or alias; llama-swap skips it")
    yield _Value(key, t.array(names, path, "str", dropped=unknown), path)


@_hook(schema.PeerConfig, "filters")
def _peer_filters(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, Mapping) and "setParamsByID" in value:
        t.skip(
            (*path, "setParamsByID"),
            "llamaswap takes setParamsByID on models only; use setParams",
        )
        value = {name: item for name, item in value.items() if name != "setParamsByID"}
    yield from t.copy(key, value, path, _fields(schema.PeerConfig)["filters"])


@_hook(schema.RouterSettings, "matrix")
def _matrix(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    return t.matrix(value, path)


@_hook(schema.Config, "profiles")
def _profiles(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """Both of llama-swap's profile forms: a table of pins as it is, and the older form (a
    list of models that run together, each reached as ``NAME:MODEL``) as ``members``."""
    if not isinstance(value, Mapping):
        yield from t.copy(key, value, path, _Kind(schema.ProfileConfig, each=True))
        return
    entries: list[_Entry] = []
    for name, profile in value.items():
        at: Path = (*path, str(name))
        t._check_key(str(name), at)
        if isinstance(profile, list):
            entries.append(_Table(str(name), at, (_members(t, profile, at),)))
        elif isinstance(profile, Mapping):
            entries.extend(
                t.table(str(name), profile, at, _Kind(schema.ProfileConfig), named=True)
            )
        else:
            t.skip(at, "expected a mapping of keys, or a list of models")
    if entries:
        yield _Table(key, path, tuple(entries))


def _members(t: _Translator, models: list[Any], path: Path) -> _Value:
    """An older profile's list as ``members``: model IDs, as llama-swap looks each name
    up (an alias becomes its model's ID; a name of no model is left out, as llama-swap
    leaves it out of the models it starts)."""
    owner = _alias_owners(t)
    names = [_go_text(v) if isinstance(v, (int, float)) else v for v in models]
    dropped: set[int] = set()
    for index, name in enumerate(names):
        if not isinstance(name, str) or name in t.model_ids or "${" in name:
            continue
        if name in owner:
            t.note((*path, index), f"{name!r} is an alias: the profile lists its model's ID")
            names[index] = owner[name]
        else:
            t.skip((*path, index), f"{name!r} is no model or alias; llama-swap skips it")
            dropped.add(index)
    # Its comments are the list items' own: those above the list are the profile's.
    return _Value("members", t.array(names, path, "str", dropped=dropped), (*path, "members"))


def _alias_owners(t: _Translator) -> dict[str, str]:
    """Each alias → the ID of its model (the first model that claims it)."""
    owners: dict[str, str] = {}
    models = t.root.get("models")
    for model_id, model in models.items() if isinstance(models, Mapping) else ():
        aliases = model.get("aliases") if isinstance(model, Mapping) else None
        for alias in aliases if isinstance(aliases, list) else ():
            owners.setdefault(str(alias), str(model_id))
    return owners


@_hook(schema.ProfileConfig, "pins")
def _pins(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    """A pin to ``~`` turns its name off: ``""`` in llamaswap."""
    if isinstance(value, Mapping):
        value = {name: "" if target is None else target for name, target in value.items()}
    yield from t.copy(key, value, path, _Kind(None, scalar="str"))


@_hook(schema.StoreConfig, "path")
def _store_path(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, str) and not value.startswith(("/", "~", "$")):
        t.note(path, "a relative path is now relative to the config file's directory")
    yield from t.copy(key, value, path, "any")
