"""Reading a configuration file: TOML → macros → inherited defaults → cattrs → checks.

Every stage collects problems instead of stopping at the first, and :class:`ConfigError`
lists them all. cattrs finds every structuring problem in one pass; the rest of the document
(without the keys at fault) is then structured once more, so the whole-config checks
(aliases, groups, references) still run on it and their problems are reported too.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shlex
import sys
from collections.abc import Collection, Mapping
from typing import Any

import attrs
import cattrs
import tomli
from cattrs.errors import ClassValidationError

from llamaswap.keypaths import Path, Problem, format_path, known_list

from ..errors import ConfigError, ConfigProblem
from .convert import Fault, faults, make_converter
from .macros import PortProbe, expand_macros, port_free
from .merge import Origins, merge_documents
from .model import Config
from .validate import validate

__all__ = ["load_config", "loads_config", "parse_toml", "read_text"]

# Top-level keys whose value is each model's default for the model key.
_INHERITED = (
    ("globalTTL", "ttl"),
    ("unloadTimeout", "unloadTimeout"),
    ("sendLoadingState", "sendLoadingState"),
    ("capture", "capture"),
)

#: How deep tables and arrays may nest (a real config needs a dozen levels at most).
MAX_NESTING = 100
_TOO_DEEP = (
    f"nested more than {MAX_NESTING} levels deep (tables, arrays and dotted keys all count); "
    "flatten it"
)
_NONE_KEPT: Mapping[str, int] = {}
_SHOWN_PARTS = 3  # a path thousands of parts long is no help: show where it starts
_YAML_KEY = re.compile(r"[\w.-]+:(\s|$)")  # "key:" opening a YAML mapping; never TOML


def load_config(
    path: str | os.PathLike[str],
    *,
    free: PortProbe = port_free,
    keep: Mapping[str, int] = _NONE_KEPT,
    replacing: Collection[str] = (),
) -> Config:
    """Read, expand and validate a TOML configuration file.

    Args:
        path: the file to read (UTF-8 TOML).
        free: whether ``${PORT}`` may hand out a port; the default,
            :func:`~.macros.port_free`, binds a socket to find out (tests inject their own).
        keep: the ports of a running configuration's models (a reload's): a model that
            still uses ``${PORT}`` keeps its port.
        replacing: the models of the configuration this one replaces (a reload's): while
            there are any, a file that defines no model must say so with an empty
            ``[models]`` table (an empty or half-written file would remove them all).

    Returns:
        The validated configuration.

    Raises:
        ConfigError: the file cannot be read or is invalid; ``problems`` lists every problem.
    """
    file = os.fspath(path)
    if os.path.isdir(file):
        files = sorted(
            os.path.join(file, name)
            for name in os.listdir(file)
            if name.endswith(".toml") and os.path.isfile(os.path.join(file, name))
        )
        if not files:
            raise ConfigError(file, [ConfigProblem("", "the directory holds no *.toml file")])
        texts = {name: read_text(name) for name in files}
        directory = os.path.abspath(file)
    else:
        texts = {file: read_text(file)}
        directory = os.path.dirname(os.path.abspath(file))
    return _loads(texts, name=file, directory=directory, free=free, keep=keep, replacing=replacing)


def read_text(file: str) -> str:
    """The UTF-8 text of ``file`` (a config or a workload).

    Raises:
        ConfigError: it cannot be read, or is not UTF-8, said as a problem of ``file``.
    """
    try:
        with open(file, encoding="utf-8") as stream:
            return stream.read()
    except OSError as exc:
        reason = (exc.strerror or str(exc)).lower()
        raise ConfigError(file, [ConfigProblem("", f"cannot read the file: {reason}")]) from exc
    except UnicodeDecodeError as exc:
        problem = ConfigProblem("", f"the file is not UTF-8 text (byte {exc.start})")
        raise ConfigError(file, [problem]) from exc


def loads_config(
    text: str,
    *,
    file: str = "<config>",
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
    free: PortProbe = port_free,
    keep: Mapping[str, int] = _NONE_KEPT,
    replacing: Collection[str] = (),
) -> Config:
    """Parse, expand and validate configuration text.

    Args:
        text: the TOML document.
        file: the name used in error messages.
        environ: the variables ``${env.NAME}`` reads; defaults to ``os.environ``.
        directory: what a relative ``store.path`` or ``slotSavePath`` is relative to
            (``load_config`` passes the file's directory); ``None`` leaves it relative to
            the working directory.
        free, keep, replacing: as for :func:`load_config`.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: the text is invalid; ``problems`` lists every problem found.
    """
    return _loads(
        {file: text}, name=file, environ=environ, directory=directory, free=free, keep=keep,
        replacing=replacing,
    )  # fmt: skip


def _loads(
    texts: Mapping[str, str],
    *,
    name: str,
    environ: Mapping[str, str] | None = None,
    directory: str | None = None,
    free: PortProbe = port_free,
    keep: Mapping[str, int] = _NONE_KEPT,
    replacing: Collection[str] = (),
) -> Config:
    """:func:`loads_config` of several files (``texts``, by file name, in order) merged
    into one (``merge.py``), its problems each naming the file its key came from; ``name``:
    what the error names when a problem has no one file."""
    documents = {file: parse_toml(text, file) for file, text in texts.items()}
    raw, origins, merging = merge_documents(documents)
    if merging:
        raise ConfigError(name, merging)
    file = name if len(texts) > 1 else next(iter(texts))
    if deep := _too_deep(raw):
        # Like a syntax error, reported alone: every later stage walks the document.
        problems = [ConfigProblem(format_path(path), _TOO_DEEP) for path in deep]
        raise ConfigError(file, _placed(problems, deep, origins, several=len(texts) > 1))
    emptying = _emptying(raw, replacing)
    doc, expanding = expand_macros(raw, os.environ if environ is None else environ, free, keep)
    inherited = _inherit_defaults(doc)
    config, found, dropped = _structure(doc)
    structuring = [fault.problem for fault in found if fault.problem.path not in inherited]
    checking: list[Problem] = []
    if config is not None:
        config, checking = validate(config, dropped=dropped)
    stages = (emptying, expanding, structuring, checking)
    problems = _merge(*stages)
    if problems or config is None:
        paths = {format_path(p.path): p.path for stage in stages for p in stage}
        placed = _placed(problems, [paths.get(p.path, ()) for p in problems], origins,
                         several=len(texts) > 1)  # fmt: skip
        raise ConfigError(file, placed)
    return _resolve_paths(config, directory)


def _placed(
    problems: list[ConfigProblem], paths: list[Path], origins: Origins, *, several: bool
) -> list[ConfigProblem]:
    """``problems`` (at ``paths``), each naming the file its key came from when the
    configuration is several files."""
    if not several:
        return problems
    return [
        attrs.evolve(problem, file=origins.file_of(path))
        for problem, path in zip(problems, paths, strict=True)
    ]


def _emptying(raw: dict[str, Any], replacing: Collection[str]) -> list[Problem]:
    """The problem of a document that would remove every model of ``replacing`` without
    saying so: it has no ``models`` table (an empty ``[models]`` says so)."""
    if not replacing or "models" in raw:
        return []
    message = (
        "the file defines no model and has no [models] table, so it would remove every "
        f"model ({known_list(replacing)}); if it was saved half-written, save it again; "
        "to remove every model, write [models] with nothing under it"
    )
    return [Problem(("models",), message)]


def _resolve_paths(config: Config, directory: str | None) -> Config:
    """``store.path`` and each model's ``slotSavePath`` with ``~`` expanded and, given a
    ``directory``, made absolute."""
    if config.store is not None:
        store = attrs.evolve(config.store, path=_resolved(config.store.path, directory))
        config = attrs.evolve(config, store=store)
    if any(model.slot_save_path is not None for model in config.models.values()):
        models = {
            model_id: model
            if model.slot_save_path is None
            else attrs.evolve(model, slot_save_path=_resolved(model.slot_save_path, directory))
            for model_id, model in config.models.items()
        }
        config = attrs.evolve(config, models=models)
    return config


def _resolved(path: str, directory: str | None) -> str:
    path = os.path.expanduser(path)
    if directory is not None:
        path = os.path.normpath(os.path.join(directory, path))  # an absolute path stays
    return path


def parse_toml(text: str, file: str) -> dict[str, Any]:
    """The TOML document ``text``.

    Raises:
        ConfigError: a syntax error (at its line and column), or what Python cannot read.
    """
    try:
        # A byte-order mark, as some Windows editors save UTF-8, is no part of the TOML.
        return tomli.loads(text.removeprefix("\ufeff"))
    except tomli.TOMLDecodeError as exc:
        message = exc.msg[:1].lower() + exc.msg[1:]
        problem = ConfigProblem("", f"invalid TOML: {message}", exc.lineno, exc.colno)
        if _is_yaml(text, file):
            problem = ConfigProblem("", _yaml_hint(file))
    except RecursionError:
        message = f"arrays or inline tables nest too deeply; at most {MAX_NESTING} levels"
        problem = ConfigProblem("", f"invalid TOML: {message} are allowed")
    except ValueError as exc:
        # Python refuses to read an integer over 4300 digits (int_max_str_digits).
        if "integer string conversion" in str(exc):
            digits = sys.get_int_max_str_digits()
            line, column = _long_integer(text, digits)
            message = f"invalid TOML: an integer has more than {digits} digits"
            problem = ConfigProblem("", message, line, column)
        else:
            problem = ConfigProblem("", f"invalid TOML: {exc}")
    raise ConfigError(file, [problem]) from None


def _is_yaml(text: str, file: str) -> bool:
    """Whether ``text`` (that is not TOML) is YAML: by its name, or by its first line."""
    if file.lower().endswith((".yaml", ".yml")):
        return True
    lines = (line.strip() for line in text.splitlines())
    first = next((line for line in lines if line and not line.startswith("#")), "")
    return first == "---" or _YAML_KEY.match(first) is not None


def _yaml_hint(file: str) -> str:
    command = f"llamaswap import-config {shlex.quote(file)} -o config.toml"
    return f"this is YAML (llama-swap's format), not TOML; translate it with: {command}"


def _long_integer(text: str, digits: int) -> tuple[int | None, int | None]:
    """Where the first integer too long for Python starts (it may be in a string: a guess)."""
    for match in re.finditer(r"[0-9][0-9_]*", text):
        if len(match.group().replace("_", "")) > digits:
            line = text.count("\n", 0, match.start()) + 1
            return line, match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
    return None, None


def _too_deep(doc: dict[str, Any]) -> list[Path]:
    """Where ``doc`` nests more than :data:`MAX_NESTING` levels, one path per deep value.

    Iterative: a recursive walk would itself fail on what it is looking for.
    """
    found: list[Path] = []
    stack: list[tuple[Path, object]] = [((key,), value) for key, value in doc.items()]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            children: list[tuple[Path, object]] = [((*path, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            children = [((*path, i), v) for i, v in enumerate(value)]
        else:
            continue
        if len(path) >= MAX_NESTING and children:
            shown = path[:_SHOWN_PARTS]
            if shown not in found:
                found.append(shown)
            continue
        stack.extend(reversed(children))
    return found


def _inherit_defaults(doc: dict[str, Any]) -> set[Path]:
    """Copy the top-level defaults into the models that do not set the key themselves.

    Returns:
        Where they were copied to: a bad default is reported once, at its own key.
    """
    inherited: set[Path] = set()
    models = doc.get("models")
    if not isinstance(models, dict):
        return inherited
    for model_id, model in models.items():
        for top_key, key in _INHERITED:
            if top_key in doc and isinstance(model, dict) and key not in model:
                model[key] = doc[top_key]
                inherited.add(("models", model_id, key))
    return inherited


@functools.cache
def _converter() -> cattrs.Converter:
    return make_converter()


def _structure(
    doc: dict[str, Any],
) -> tuple[Config | None, list[Fault], dict[str, tuple[str, ...]]]:
    """Structure ``doc`` in one pass; with problems, also the rest of it, without the keys at
    fault, for the whole-config checks to run on.

    Returns:
        The config (of the rest when there are problems; ``None`` if nothing can be kept),
        the problems, and the models removed as invalid (ID → aliases).
    """
    converter = _converter()
    try:
        return converter.structure(doc, Config), [], {}
    except ClassValidationError as exc:
        found = faults(exc)
    removing = [fault.remove for fault in found]
    if () in removing:
        return None, found, {}
    rest = copy.deepcopy(doc)
    dropped: dict[str, tuple[str, ...]] = {}
    for *parents, last in removing:
        table: Any = rest
        for part in parents:
            table = table.get(part) if isinstance(table, dict) else None
        if not isinstance(table, dict) or last not in table:
            continue  # it went with a table removed before
        if parents == ["models"] and isinstance(last, str):
            aliases = table[last].get("aliases") if isinstance(table[last], dict) else None
            listed = aliases if isinstance(aliases, list) else []
            dropped[last] = tuple(alias for alias in listed if isinstance(alias, str))
        del table[last]
    try:
        return converter.structure(rest, Config), found, dropped
    except ClassValidationError:  # a removal not foreseen: the problems above still stand
        return None, found, dropped


def _merge(*stages: list[Problem]) -> list[ConfigProblem]:
    """Problems of successive stages as :class:`ConfigProblem`, each reported once.

    A later stage's problem at a key path an earlier stage already reported is dropped: it is
    the same mistake seen again (``ttl = "${typo}"`` is an unknown macro, not a bad duration).
    """
    reported: set[str] = set()
    result: list[ConfigProblem] = []
    for stage in stages:
        paths = [format_path(problem.path) for problem in stage]
        for path, problem in zip(paths, stage, strict=True):
            item = ConfigProblem(path, problem.message)
            if path not in reported and item not in result:
                result.append(item)
        reported.update(paths)
    return result
