"""The cattrs converter that turns a raw TOML dict into :class:`~.model.Config`, and the walk
that turns its exception groups into :class:`~llamaswap.errors.ConfigProblem` s.

The converter is strict where cattrs is lenient by default: a string is never made from a
number, a boolean never counts as an integer, an array is never made from a string. Every
``float`` in the model is a duration in seconds, so ``float`` structures through
:func:`~.values.parse_duration`. Attrs classes read their fields under their TOML keys
(``toml_key``), with unknown keys forbidden, and a field with bounds (``within(...)`` in
``model.py``) is checked against them as it is read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override

from llamaswap.keypaths import Path, Problem, did_you_mean, known_list, suggestion

from .model import FilterConfig, LogLevel, LogToStdout, ModelConfig, toml_key
from .values import (
    Bounds,
    InvalidValue,
    describe,
    json_problems,
    parse_bool,
    parse_command,
    parse_duration,
    parse_duration_in,
    parse_env,
    parse_int,
    parse_int_in,
    parse_int_table,
    parse_names,
    parse_str,
    plain,
)

__all__ = ["make_converter", "walk_error"]

Hook = Callable[[Any, Any], Any]

# Fields whose raw value has a syntax of its own, keyed by (class, attribute name).
_FIELD_HOOKS: dict[tuple[type, str], Hook] = {
    (ModelConfig, "cmd"): lambda value, _: parse_command(value),
    (ModelConfig, "cmd_stop"): lambda value, _: parse_command(value),
    (ModelConfig, "env"): lambda value, _: parse_env(value),
    (FilterConfig, "strip_params"): lambda value, _: parse_names(value),
}


def make_converter() -> cattrs.Converter:
    """A converter from raw TOML data to the frozen config classes."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    # Class hooks (cattrs's singledispatch, consulted before any predicate) match subclasses,
    # so ``bool`` and ``LogLevel`` (a ``str`` subclass) get their own, more specific hooks.
    converter.register_structure_hook(str, _scalar_hook(parse_str))
    converter.register_structure_hook(int, _scalar_hook(parse_int))
    converter.register_structure_hook(bool, _scalar_hook(parse_bool))
    converter.register_structure_hook(float, _scalar_hook(parse_duration))  # every float
    converter.register_structure_hook(LogLevel, _enum_hook(LogLevel))
    converter.register_structure_hook(LogToStdout, _enum_hook(LogToStdout))
    converter.register_structure_hook_factory(_is_literal, _literal_hook)
    converter.register_structure_hook_factory(_is_var_tuple, _tuple_hook)
    converter.register_structure_hook_factory(_is_mapping, _mapping_hook)
    converter.register_structure_hook_factory(attrs.has, _attrs_hook)
    return converter


def _scalar_hook(parse: Callable[[object], object]) -> Hook:
    return lambda value, _: parse(value)


def _is_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal


def _is_var_tuple(tp: Any) -> bool:
    args = get_args(tp)
    return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def _is_mapping(tp: Any) -> bool:
    return get_origin(tp) in (Mapping, dict)


def _choice_error(value: object, choices: tuple[str, ...]) -> InvalidValue:
    message = f"expected one of {', '.join(map(repr, choices))}, got {describe(value)}"
    if isinstance(value, str):
        hint = suggestion(value, choices, noun="values")
        if hint.startswith("did you mean"):
            message += f"; {hint}"
    return InvalidValue(message)


def _literal_hook(tp: Any) -> Hook:
    choices = tuple(str(choice) for choice in get_args(tp))

    def structure(value: object, _: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise _choice_error(value, choices)

    return structure


def _enum_hook(tp: type[enum.Enum]) -> Hook:
    choices = tuple(str(member.value) for member in tp)

    def structure(value: object, _: Any) -> enum.Enum:
        if isinstance(value, str) and value in choices:
            return tp(value)
        raise _choice_error(value, choices)

    return structure


def _noted(exc: Exception, index: int | str, tp: Any) -> Exception:
    note = IterableValidationNote(f"structuring item {index!r}", index, tp)
    # Set directly: typeshed only knows ``__notes__`` from Python 3.11 on.
    setattr(exc, "__notes__", [*getattr(exc, "__notes__", []), note])  # noqa: B010
    return exc


def _tuple_hook(tp: Any, converter: cattrs.Converter) -> Hook:
    item_type = get_args(tp)[0]
    item_hook = converter.get_structure_hook(item_type)

    def structure(value: object, _: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise InvalidValue(f"expected an array, got {describe(value)}")
        items: list[Any] = []
        errors: list[Exception] = []
        for index, item in enumerate(value):
            try:
                items.append(item_hook(item, item_type))
            except Exception as exc:
                errors.append(_noted(exc, index, item_type))
        if errors:
            raise IterableValidationError("invalid array items", errors, tp)
        return tuple(items)

    return structure


def _mapping_hook(tp: Any, converter: cattrs.Converter) -> Hook:
    value_type = get_args(tp)[1]
    value_hook = None if value_type is Any else converter.get_structure_hook(value_type)

    def structure(value: object, _: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise InvalidValue(f"expected a table, got {describe(value)}")
        if value_hook is None:  # free-form: numbers and booleans from macros as such
            document = {name: plain(item) for name, item in value.items()}
            if problems := list(json_problems(document)):  # it is sent as JSON
                raise InvalidValue.many(problems)
            return document
        result: dict[str, Any] = {}
        errors: list[Exception] = []
        for name, item in value.items():
            try:
                result[name] = value_hook(item, value_type)
            except Exception as exc:
                errors.append(_noted(exc, name, value_type))
        if errors:
            raise IterableValidationError("invalid table entries", errors, tp)
        return result

    return structure


def _bounded_hook(field: attrs.Attribute[Any]) -> Hook | None:
    """The hook for a numeric field with bounds: a duration, an integer or a table of them."""
    bounds: Bounds | None = field.metadata.get("bounds")
    if bounds is None:
        return None
    if field.type is float:
        return lambda value, _: parse_duration_in(value, bounds)
    if field.type is int or get_args(field.type) == (int, type(None)):  # TOML has no null
        return lambda value, _: parse_int_in(value, bounds)
    if get_args(field.type) == (str, int):
        return lambda value, _: parse_int_table(value, bounds)
    raise TypeError(f"no bounded hook for {field.name}: {field.type!r}")


def _attrs_hook(cl: type, converter: cattrs.Converter) -> Hook:
    attrs.resolve_types(cl)
    overrides: dict[str, Any] = {
        field.name: override(
            rename=toml_key(field),
            struct_hook=_FIELD_HOOKS.get((cl, field.name)) or _bounded_hook(field),
        )
        for field in attrs.fields(cl)
    }
    structure_dict: Hook = make_dict_structure_fn(cl, converter, **overrides)

    def structure(value: object, _: Any) -> Any:
        if not isinstance(value, dict):
            raise InvalidValue(f"expected a table, got {describe(value)}")
        return structure_dict(value, cl)

    return structure


def walk_error(exc: BaseException, path: Path = ()) -> list[Problem]:
    """Every leaf problem in a cattrs exception group, at its raw TOML key path.

    Args:
        exc: what the converter raised (usually a ``ClassValidationError``).
        path: the key path of the value that was being structured.
    """
    if isinstance(exc, ClassValidationError):
        keys = {field.name: toml_key(field) for field in attrs.fields(exc.cl)}
        found: list[Problem] = []
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            sub_path = (*path, keys.get(note.name, note.name))
            if isinstance(sub, KeyError):
                found.append(Problem(sub_path, "required key is missing", "missing"))
            else:
                found.extend(walk_error(sub, sub_path))
        for sub in without:
            if isinstance(sub, ForbiddenExtraKeysError):
                found.extend(_unknown_keys(sub, path, sorted(keys.values())))
            else:
                found.extend(walk_error(sub, path))
        return found
    if isinstance(exc, IterableValidationError):
        found = []
        with_index, others = exc.group_exceptions()
        for sub, index_note in with_index:
            found.extend(walk_error(sub, (*path, index_note.index)))
        for sub in others:
            found.extend(walk_error(sub, path))
        return found
    if isinstance(exc, InvalidValue):
        return [Problem((*path, *at), message) for at, message in exc.problems]
    return [Problem(path, f"invalid value ({exc})")]


def _unknown_keys(exc: ForbiddenExtraKeysError, path: Path, known: list[str]) -> list[Problem]:
    found = []
    for name in sorted(exc.extra_fields):
        # The likely key first, then all of them: a near miss may still be the wrong guess.
        hint = f"this table's keys are {known_list(known)}"
        close = did_you_mean(name, known)
        if close is not None:
            hint = f"did you mean {close!r}? {hint}"
        found.append(Problem((*path, name), f"unknown key {name!r}; {hint}", "unknown"))
    return found
