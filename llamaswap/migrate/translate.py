"""llama-swap YAML → llamaswap TOML, keeping the user's comments.

llamaswap spells its keys as llama-swap does, so most of a llama-swap file carries over
as it is: the translator walks the YAML beside llamaswap's own config classes
(``config/model.py``) and copies every key those classes have, one TOML table per YAML
mapping. That makes the rule for what is *not* translated mechanical: a key llamaswap's
classes do not have is reported with its YAML path and the reason, never written, so the
output never holds a key llamaswap would refuse. The exceptions are the places where the
two formats differ, each handled by name:

* llama-swap's "unset" spellings (``ttl: -1``, ``concurrencyLimit: 0``, a model's
  ``unloadTimeout: 0``, an empty string) are left out, so llamaswap's defaults apply;
* ``env`` lists become tables, and ``filters.stripParams`` (a comma-separated string)
  an array;
* top-level ``groups`` and ``matrix`` (llama-swap's older spelling) move under
  ``[routing.router]``, and matrix sets that name models directly get a var each;
* ``healthCheckTimeout`` below 15 s becomes 15, as llama-swap would run it.

Comments (``comments.py``) are placed before the key, table or array item they were
above, and end-of-line comments stay at the end of their line. A TOML table's values must
come before its sub-tables, so within each table the values are written first; a comment
above a sub-table is written as the last line before that sub-table's header.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import tomlkit
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean
from tomlkit.container import Container
from tomlkit.items import Array, Comment, Item, String, StringType, Table, Trivia

from ..config import model as schema
from ..config.matrix_expr import And, MatrixExprError, Name, Node, Or, parse_expr
from ..config.paths import Path, format_path
from .comments import Comments, find_comments

__all__ = ["ImportResult", "Remark", "YamlError", "import_yaml"]

#: llama-swap raises a smaller ``healthCheckTimeout`` to this many seconds.
MIN_HEALTH_CHECK_TIMEOUT = 15
_LONG_ARRAY = 80  # characters: a longer array is written one item per line

#: Keys whose empty string is a setting, not "not set": ``logTimeFormat: ""`` is llama-swap's
#: "no timestamp", while leaving the key out keeps llamaswap's.
_EMPTY_IS_A_VALUE = {"logTimeFormat"}

#: Why a llama-swap key has no place in llamaswap (keys not listed: "no such key").
_REASONS = {
    "logRequests": "an old llama-swap switch; llamaswap has no such key",
    "metricsMaxInMemory": "llamaswap keeps the last 1000 requests in memory; "
    "a [store] table keeps more, on disk",
    "captureBuffer": "llamaswap does not capture request and response bodies",
    "ui": "llamaswap's dashboard has no settings",
    "performance": "llamaswap does not collect system statistics",
    "upstream": "llamaswap's /upstream/ routes have no settings",
    "profiles": "llamaswap has no profiles (model names pinned at run time)",
    "selectors": "llamaswap has no selectors (virtual model names); aliases cover a name "
    "that always means one model",
    "compat": "llamaswap has no compat settings",
    "capabilities": "llamaswap does not report capabilities; a key under metadata is "
    "shown in /v1/models if a client needs it",
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
        path: the YAML key path, e.g. ``models.qwen.timeouts.tlsHandshake``.
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

    The result is not validated: ``loads_config(result.toml)`` does that.

    Raises:
        YamlError: ``text`` is not valid YAML, or its top level is not a mapping.
    """
    try:
        root = YAML(typ="rt").load(text)
    except YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise YamlError(f"invalid YAML: {problem}", line, column) from None
    if root is None:
        root = {}
    if not isinstance(root, Mapping):
        raise YamlError("expected a mapping of keys (healthCheckTimeout, models, ...)")
    return _Translator(root, find_comments(root, text)).run()


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

    def run(self) -> ImportResult:
        self._write(self.doc, list(self.entries(self.root, (), schema.Config)))
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

    def origin(self, path: Path) -> Path:
        """Where ``path`` of the translated tree is in the YAML file."""
        for moved_to, moved_from in self.moved:
            if path[: len(moved_to)] == moved_to:
                return (*moved_from, *path[len(moved_to) :])
        return path

    # -- the tree ------------------------------------------------------------------------

    def _normalise(self, root: Mapping[Any, Any]) -> dict[str, Any]:
        """``root`` with llama-swap's top-level ``groups``/``matrix`` under ``routing``."""
        legacy = [key for key in ("groups", "matrix") if root.get(key) is not None]
        routing = root.get("routing")
        router = routing.get("router") if isinstance(routing, Mapping) else None
        if not legacy:
            return {str(k): v for k, v in root.items()}
        if router:
            for key in legacy:
                self.skip((key,), "llama-swap refuses it beside routing.router; move it there")
            return {str(k): v for k, v in root.items() if k not in legacy}
        settings = {key: root[key] for key in legacy}
        new_router: dict[str, Any] = {"settings": settings}
        if "matrix" in legacy:
            new_router["use"] = "matrix"
        new_routing = {**(routing if isinstance(routing, Mapping) else {}), "router": new_router}
        for key in legacy:
            self.moved.append((("routing", "router", "settings", key), (key,)))
        result: dict[str, Any] = {}
        for key, value in root.items():
            if key in legacy or key == "routing":
                result.setdefault("routing", new_routing)
            else:
                result[str(key)] = value
        return result

    def entries(self, src: Mapping[Any, Any], path: Path, cls: type | None) -> Iterator[_Entry]:
        """The TOML entries for the YAML mapping ``src`` at ``path``, read as ``cls`` (a
        config class; ``None`` for a free-form table such as ``metadata``)."""
        for raw_key, value in src.items():
            key = str(raw_key)
            at: Path = (*path, key)
            if cls is None:
                yield from self.copy(key, value, at, None)
                continue
            hook = _HOOKS.get((cls, key))
            if hook is not None:
                yield from hook(self, key, value, at)
            elif key not in _fields(cls):
                self.skip(at, _REASONS.get(key, f"llamaswap has no key {key!r} here"))
            elif value is None or (value == "" and key not in _EMPTY_IS_A_VALUE):
                continue  # llama-swap's "not set": llamaswap's default applies
            else:
                yield from self.copy(key, value, at, _fields(cls)[key])

    def copy(self, key: str, value: object, path: Path, kind: _Kind | None) -> Iterator[_Entry]:
        """``key`` copied as it is; a mapping becomes a table of ``kind``."""
        if isinstance(value, Mapping):
            yield from self.table(key, value, path, kind)
        else:
            item = self._item(value, path)
            if item is not None:
                yield _Value(key, item, path)

    def table(
        self,
        key: str,
        value: Mapping[Any, Any],
        path: Path,
        kind: _Kind | None,
        *,
        named: bool = False,
    ) -> Iterator[_Table]:
        """``[key]`` from the mapping ``value``; nothing when nothing in it is kept, unless
        it is ``named`` (one of ``models``, ``peers``, ...: left out, it would go unnoticed)."""
        entries: list[_Entry] = []
        if kind is not None and kind.each:
            for name, item in value.items():
                at: Path = (*path, str(name))
                if isinstance(item, Mapping):
                    entries.extend(self.table(str(name), item, at, _Kind(kind.cls), named=True))
                else:
                    self.skip(at, "expected a mapping of keys")
        else:
            entries.extend(self.entries(value, path, kind.cls if kind is not None else None))
        if entries or named:
            yield _Table(key, path, tuple(entries))

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
        above = [*above, *self._leading(entry.path)]
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

    @staticmethod
    def _comment(table: Container | Table, lines: Iterable[str]) -> None:
        for line in lines:
            table.add(Comment(Trivia(comment=line)) if line else tomlkit.nl())

    def _leading(self, path: Path) -> tuple[str, ...]:
        return self.comments.leading.get(self.origin(path), ())

    def _trailing(self, path: Path) -> str:
        return self.comments.trailing.get(self.origin(path), "")

    # -- values --------------------------------------------------------------------------

    def _item(self, value: object, path: Path) -> Item | None:
        """A YAML scalar, list or (inside a list) mapping as a TOML value; ``None`` (and a
        remark) for what TOML cannot hold."""
        if value is None:
            self.skip(path, "TOML has no null; leave the key out for its default")
            return None
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
                converted = self._item(item, (*path, str(key)))
                if converted is not None:
                    table.append(str(key), converted)
            return table
        if isinstance(value, list):
            return self._array(value, path)
        try:
            return tomlkit.item(value)  # a YAML date or timestamp
        except (TypeError, ValueError):
            self.skip(path, f"TOML has no value like {value!r}")
            return None

    def _array(self, values: list[Any], path: Path) -> Array:
        items = [(index, self._item(value, (*path, index))) for index, value in enumerate(values)]
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
            yield from self.copy("env", value, path, None)
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
        sets name vars only)."""
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


@attrs.frozen
class _Kind:
    """What a key holds: a table of ``cls``, or (``each``) a table of such tables."""

    cls: type | None
    each: bool = False


@functools.cache
def _fields(cls: type) -> dict[str, _Kind | None]:
    """The TOML keys of a config class, each with what it holds (``None``: a value)."""
    hints = typing.get_type_hints(cls)
    result: dict[str, _Kind | None] = {}
    for field in attrs.fields(cls):
        result[schema.toml_key(field)] = _kind(hints[field.name])
    return result


def _kind(hint: object) -> _Kind | None:
    """What a field of type ``hint`` holds: a config class (``X`` or ``X | None``), a table
    of them (``Mapping[str, X]``), a free-form table, or (``None``) a value."""
    if isinstance(hint, type) and attrs.has(hint):
        return _Kind(hint)
    origin = typing.get_origin(hint)
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if origin is typing.Union or origin is types.UnionType:
        return _kind(args[0]) if len(args) == 1 else None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        inner = args[-1] if args else None
        if isinstance(inner, type) and attrs.has(inner):
            return _Kind(inner, each=True)
        return _Kind(None)
    return None


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
    yield from t.copy(key, value, path, None)


@_hook(schema.Config, "unloadTimeout")
@_hook(schema.ModelConfig, "unloadTimeout", "concurrencyLimit")
def _zero_is_default(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if value != 0 and value is not None:
        yield from t.copy(key, value, path, None)


@_hook(schema.ModelConfig, "ttl")
def _ttl(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if value != -1 and value is not None:  # -1: the global TTL, llamaswap's default too
        yield from t.copy(key, value, path, None)


@_hook(schema.ModelConfig, "env")
def _env(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    return t.env(value, path)


@_hook(schema.ModelConfig, "macros")
def _model_macros(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    # Not a field: config/macros.py applies a model's macros before the model is read.
    yield from t.copy(key, value, path, _Kind(None))


@_hook(schema.ModelConfig, "cmd", "cmdStop")
def _command(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if value is None or value == "":
        return  # not set
    if isinstance(value, str):
        yield _Value(key, _string(value), path)
    else:
        yield from t.copy(key, value, path, None)


@_hook(schema.FilterConfig, "stripParams", "strip_params")
def _strip_params(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, str):
        names = [part.strip() for part in value.split(",")]
        kept = list(dict.fromkeys(name for name in names if name and name != "model"))
        if kept:
            yield _Value("stripParams", tomlkit.item(kept), path)
    elif value is not None:
        yield from t.copy("stripParams", value, path, None)


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


@_hook(schema.StoreConfig, "path")
def _store_path(t: _Translator, key: str, value: object, path: Path) -> Iterator[_Entry]:
    if isinstance(value, str) and not value.startswith(("/", "~", "$")):
        t.note(path, "a relative path is now relative to the config file's directory")
    yield from t.copy(key, value, path, None)
