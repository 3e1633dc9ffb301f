"""The cattrs converter that turns a raw TOML dict into :class:`~.model.Config`, and the
problems its errors hold.

cattrs structures: attrs classes through ``make_dict_structure_fn``, each field under its
TOML key (``toml_key``), unknown keys forbidden; arrays and tables through its own tuple and
mapping hooks; with detailed validation, so one pass finds every problem, as a tree of
``ClassValidationError`` and ``IterableValidationError`` whose notes name the attribute, key
or index. Added here is what cattrs cannot say:

* strictness: a string is never made from a number, a boolean never counts as an integer,
  and a table or an array must be one (cattrs would make a tuple of a string's letters);
* llamaswap's syntaxes (``values.py``): every ``float`` is a duration in seconds, commands
  and ``env`` have theirs, and a field with bounds (``within(...)`` in ``model.py``) is
  read as ``Annotated[int, bounds]``, each number checked as it is read;
* choices (``Literal`` and the str enums) with a did-you-mean;
* :func:`faults`: the error tree as problems at TOML key paths, a did-you-mean for each
  unknown key, and for each problem the raw key whose removal lets the rest be structured.

``cattrs.transform_error`` walks the same tree, but its paths are strings of Python names
(``$.models['qwen2.5'].health_check_timeout``) and its ``format_exception`` sees an error
without the class it belongs to; a TOML key, the keys a table has and whether a key is
required all need that class, so :func:`faults` walks the tree itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, is_mapping
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn, mapping_structure_factory, override

from llamaswap.keypaths import Path, Problem, did_you_mean, known_list

from .model import Config, DeviceConfig, FilterConfig, LogLevel, LogToStdout, ModelConfig, toml_key
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
    parse_memory,
    parse_names,
    parse_size,
    parse_str,
    plain,
)

__all__ = ["Fault", "faults", "make_converter"]

Hook = Callable[[Any, Any], Any]
HookFactory = Callable[[Any, cattrs.Converter], Hook]

# Fields whose raw value has a syntax of its own, keyed by (class, attribute name).
_FIELD_HOOKS: dict[tuple[type, str], Hook] = {
    (ModelConfig, "cmd"): lambda value, _: parse_command(value),
    (ModelConfig, "cmd_stop"): lambda value, _: parse_command(value),
    (ModelConfig, "env"): lambda value, _: parse_env(value),
    (FilterConfig, "strip_params"): lambda value, _: parse_names(value),
    (ModelConfig, "memory"): lambda value, _: parse_memory(value),
    (DeviceConfig, "memory"): lambda value, _: parse_size(value),
    (DeviceConfig, "headroom"): lambda value, _: parse_size(value),
    (Config, "memory_headroom"): lambda value, _: parse_size(value),
    (Config, "slot_save_limit"): lambda value, _: parse_size(value),
    (Config, "capture_max_bytes"): lambda value, _: parse_size(value),
    (Config, "capture_buffer"): lambda value, _: parse_size(value),
}


def make_converter() -> cattrs.Converter:
    """A converter from raw TOML data to the frozen config classes."""
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    # Class hooks (cattrs's singledispatch, consulted before any predicate) match subclasses,
    # so ``bool`` and the str enums get their own, more specific hooks.
    scalars = ((str, parse_str), (int, parse_int), (bool, parse_bool), (float, parse_duration))
    for scalar, parse in scalars:
        converter.register_structure_hook(scalar, _scalar_hook(parse))
    for choice in (LogLevel, LogToStdout):
        converter.register_structure_hook(choice, _choice_hook(choice))
    converter.register_structure_hook_factory(_is_literal, _choice_hook)
    converter.register_structure_hook_factory(_is_bounded, _bounded_hook)
    converter.register_structure_hook_func(_is_any, _free_form)
    array = _only(list, "an array", homogenous_tuple_structure_factory)
    converter.register_structure_hook_factory(_is_var_tuple, array)
    converter.register_structure_hook_factory(
        is_mapping, _only(dict, "a table", mapping_structure_factory)
    )
    converter.register_structure_hook_factory(attrs.has, _only(dict, "a table", _attrs_hook))
    return converter


def _scalar_hook(parse: Callable[[object], object]) -> Hook:
    return lambda value, _: parse(value)


def _only(kind: type, noun: str, factory: HookFactory) -> HookFactory:
    """cattrs's hook from ``factory``, for a raw value of ``kind`` only."""

    def make(tp: Any, converter: cattrs.Converter) -> Hook:
        structure = factory(tp, converter)

        def checked(value: object, _: Any) -> Any:
            if not isinstance(value, kind):
                raise InvalidValue(f"expected {noun}, got {describe(value)}")
            return structure(value, tp)

        return checked

    return make


def _is_var_tuple(tp: Any) -> bool:
    args = get_args(tp)
    return get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def _choice_hook(tp: Any) -> Hook:
    """A ``Literal`` of strings, or a str enum: one of its values, as written."""
    members = list(tp) if isinstance(tp, enum.EnumMeta) else get_args(tp)
    by_value = {str(getattr(member, "value", member)): member for member in members}
    choices = tuple(by_value)

    def structure(value: object, _: Any) -> Any:
        if isinstance(value, str) and value in by_value:
            return by_value[value]
        message = f"expected one of {', '.join(map(repr, choices))}, got {describe(value)}"
        if isinstance(value, str) and (close := did_you_mean(value, choices)) is not None:
            message += f"; did you mean {close!r}?"
        raise InvalidValue(message)

    return structure


def _is_bounded(tp: Any) -> bool:
    return get_origin(tp) is Annotated and isinstance(tp.__metadata__[0], Bounds)


def _bounded_hook(tp: Any) -> Hook:
    number, bounds = get_args(tp)
    parse = {float: parse_duration_in, int: parse_int_in}[number]  # bounds are for numbers
    return lambda value, _: parse(value, bounds)


def _bounded(field: attrs.Attribute[Any]) -> Any:
    """The field's type with its bounds, if it has any, on each number in it:
    ``Annotated[float, TTL]``, ``Mapping[str, Annotated[int, EVICT_COST]]``."""
    bounds: Bounds | None = field.metadata.get("bounds")
    if bounds is None:
        return None
    if is_mapping(field.type):
        key, value = get_args(field.type)
        return Mapping[key, Annotated[value, bounds]]  # type: ignore[valid-type]
    args = get_args(field.type)
    if args in ((int, type(None)), (float, type(None))):  # TOML has no null: the number
        return Annotated[args[0], bounds]
    return Annotated[field.type, bounds]


def _is_any(tp: object) -> bool:
    return tp is Any


def _is_literal(tp: object) -> bool:
    return get_origin(tp) is Literal


def _free_form(value: object, _: Any) -> object:
    """A value in a free-form table (``metadata``, ``setParams``): numbers and booleans from
    macros as such, and only what JSON can hold (the table is sent as JSON)."""
    document = plain(value)
    if problems := list(json_problems(document)):
        raise InvalidValue.many(problems)
    return document


def _attrs_hook(cl: type, converter: cattrs.Converter) -> Hook:
    attrs.resolve_types(cl)
    overrides: dict[str, Any] = {}
    for field in attrs.fields(cl):
        hook = _FIELD_HOOKS.get((cl, field.name))
        if hook is None and (bounded := _bounded(field)) is not None:
            hook = converter.get_structure_hook(bounded)
        overrides[field.name] = override(rename=toml_key(field), struct_hook=hook)
    structure: Hook = make_dict_structure_fn(cl, converter, **overrides)
    return structure


@attrs.frozen
class Fault:
    """A problem the converter found, and what to remove for the rest to structure.

    Attributes:
        problem: the problem, at its raw TOML key path.
        remove: the raw key to delete from the document: the key at fault, or the table it
            is required in, or the array it is an item of; ``()`` when nothing can be.
    """

    problem: Problem
    remove: Path


def faults(exc: BaseException, path: Path = (), spoils: Path = ()) -> list[Fault]:
    """Every problem in what the converter raised (usually a ``ClassValidationError``).

    Args:
        exc: the error, or one below it in the tree.
        path: the key path of the value that was being structured.
        spoils: what has to go for that value to go: ``path`` itself, or an enclosing table
            or array.
    """
    found: list[Fault] = []
    if isinstance(exc, ClassValidationError):
        fields = {field.name: field for field in attrs.fields(exc.cl)}
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            field = fields[note.name]
            at = (*path, toml_key(field))
            gone = spoils if field.default is attrs.NOTHING else at  # a required key: its table
            if isinstance(sub, KeyError):
                found.append(Fault(Problem(at, "required key is missing"), gone))
            else:
                found.extend(faults(sub, at, gone))
        for sub in without:
            if isinstance(sub, ForbiddenExtraKeysError):
                known = sorted(toml_key(field) for field in fields.values())
                found.extend(_unknown_keys(sub, path, known))
            else:
                found.extend(faults(sub, path, spoils))
    elif isinstance(exc, IterableValidationError):
        with_index, others = exc.group_exceptions()
        for sub, index_note in with_index:
            at = (*path, index_note.index)
            # A table's entry goes alone (a key is a str); an array's item takes the array.
            found.extend(faults(sub, at, at if isinstance(index_note.index, str) else spoils))
        for sub in others:
            found.extend(faults(sub, path, spoils))
    elif isinstance(exc, InvalidValue):
        found = [Fault(Problem((*path, *at), message), spoils) for at, message in exc.problems]
    else:
        found = [Fault(Problem(path, f"invalid value ({exc})"), spoils)]
    return found


def _unknown_keys(exc: ForbiddenExtraKeysError, path: Path, known: list[str]) -> list[Fault]:
    found = []
    for name in sorted(exc.extra_fields):
        # The likely key first, then all of them: a near miss may still be the wrong guess.
        hint = f"this table's keys are {known_list(known)}"
        close = did_you_mean(name, known)
        if close is not None:
            hint = f"did you mean {close!r}? {hint}"
        at = (*path, name)
        found.append(Fault(Problem(at, f"unknown key {name!r}; {hint}"), at))
    return found
