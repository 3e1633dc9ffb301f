"""Macro expansion on the raw TOML data, before it becomes config objects.

Macros are written ``${name}`` in any string value. There are four kinds:

* user macros from ``[macros]``; each may use macros defined above it and ``${env.NAME}``;
* ``${env.NAME}``, an environment variable (unset is an error);
* ``${MODEL_ID}`` and ``${PORT}``, only inside ``[models.ID]``; a model gets a port only when
  its ``cmd`` uses ``${PORT}``, counting up from ``startPort`` in sorted model-ID order;
* ``${PID}``, only in ``cmdStop``, left in place for the supervisor to fill at stop time.

Expansion runs in two passes so that a user macro may hold a built-in one
(``fake = "server --port ${PORT}"``): the first pass substitutes user and environment
macros everywhere, the second substitutes ``${MODEL_ID}``/``${PORT}`` per model and reports
whatever ``${...}`` is left. Substituted text is never scanned again.

A value that uses macros may expand to at most :data:`MAX_EXPANDED_LENGTH` characters, and
so may each macro: macros that double each other would otherwise reach gigabytes in thirty
steps. Expansion stops as soon as a value passes the limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .model import DEFAULT_PROXY, DEFAULT_START_PORT
from .paths import Path, Problem, did_you_mean, format_path
from .values import describe

__all__ = ["MAX_EXPANDED_LENGTH", "expand_macros"]

#: The most characters a macro, or a value using macros, may expand to.
MAX_EXPANDED_LENGTH = 65_536
_TOO_LONG = "macros may expand to at most that"

_BUILTINS = ("PORT", "MODEL_ID", "PID")
_REF = re.compile(r"\$\{([^}]*)\}")
_MACRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

Substitute = Callable[[str, Path], str]
Replace = Callable[[re.Match[str]], str]


class _TooLong(Exception):
    """An expansion passed :data:`MAX_EXPANDED_LENGTH`."""


def _expand(text: str, replace: Replace) -> str:
    """``_REF.sub(replace, text)``, but raising :class:`_TooLong` as soon as the result would
    pass :data:`MAX_EXPANDED_LENGTH` (a text without macros is returned as it is)."""
    parts: list[str] = []
    size = pos = 0
    for match in _REF.finditer(text):
        parts += (text[pos : match.start()], replace(match))
        size += len(parts[-2]) + len(parts[-1])
        if size > MAX_EXPANDED_LENGTH:
            raise _TooLong
        pos = match.end()
    if not parts:
        return text
    parts.append(text[pos:])
    if size + len(parts[-1]) > MAX_EXPANDED_LENGTH:
        raise _TooLong
    return "".join(parts)


def _expand_or_report(text: str, path: Path, replace: Replace, problems: list[Problem]) -> str:
    """``text`` expanded, or as it is (with a problem at ``path``) if it grows too long."""
    try:
        return _expand(text, replace)
    except _TooLong:
        message = f"expands to more than {MAX_EXPANDED_LENGTH} characters with its macros"
        problems.append(Problem(path, f"{message}; {_TOO_LONG}"))
        return text


def expand_macros(
    raw: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], list[Problem]]:
    """Expand every macro in ``raw`` and give the result with every problem found.

    Args:
        raw: the parsed TOML document (not modified).
        environ: where ``${env.NAME}`` looks up ``NAME``.

    Returns:
        A copy of ``raw`` with macros substituted, ``[macros]`` reduced to its valid entries
        as strings, and each model's default ``proxy`` filled in; and the problems.
    """
    problems: list[Problem] = []
    table = raw.get("macros", {})
    macros = _user_macros(table, environ, problems)
    # Invalid macros are reported at their definition, not again at each use.
    invalid = set(table) - set(macros) if isinstance(table, dict) else set()

    def first_pass(text: str, path: Path) -> str:
        def replace(match: re.Match[str]) -> str:
            return _user_or_env(match, path, macros, environ, problems, invalid)

        return _expand_or_report(text, path, replace, problems)

    doc = {
        key: value if key == "macros" else _map_strings(value, (key,), first_pass)
        for key, value in raw.items()
    }
    if "macros" in raw:
        doc["macros"] = macros
    models = doc.get("models")
    ports: dict[str, int] = {}
    if isinstance(models, dict):
        ports = _allocate_ports(models, doc.get("startPort"), problems)
        for model_id, model in models.items():
            if isinstance(model, dict):
                models[model_id] = _expand_model(model_id, model, ports.get(model_id), problems)
    for key, value in doc.items():
        if key not in ("macros", "models"):
            _map_strings(value, (key,), lambda text, path: _leftovers(text, path, None, problems))
    return doc, problems


def _map_strings(value: Any, path: Path, substitute: Substitute) -> Any:
    """A copy of ``value`` with ``substitute`` applied to every string (not to table keys)."""
    if isinstance(value, str):
        return substitute(value, path)
    if isinstance(value, dict):
        return {k: _map_strings(v, (*path, k), substitute) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, (*path, i), substitute) for i, v in enumerate(value)]
    return value


def _user_macros(
    table: object, environ: Mapping[str, str], problems: list[Problem]
) -> dict[str, str]:
    if not isinstance(table, dict):
        problems.append(
            Problem(("macros",), f"expected a table of name = value, got {describe(table)}")
        )
        return {}
    defined: dict[str, str] = {}
    position = {name: index for index, name in enumerate(table)}
    for index, (name, value) in enumerate(table.items()):
        path: Path = ("macros", name)
        if not _MACRO_NAME.fullmatch(name):
            problems.append(
                Problem(path, f"invalid macro name {name!r}; use letters, digits, '_' and '-'")
            )
            continue
        if name in _BUILTINS or name == "env":
            problems.append(Problem(path, f"{name!r} is a built-in macro; choose another name"))
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            text = str(value)
        else:
            problems.append(
                Problem(path, f"expected a string, number or boolean, got {describe(value)}")
            )
            continue
        uses_invalid: list[str] = []

        def replace(
            match: re.Match[str],
            path: Path = path,
            index: int = index,
            uses_invalid: list[str] = uses_invalid,
        ) -> str:
            ref = match.group(1)
            if ref == path[-1]:
                problems.append(Problem(path, f"a macro cannot use itself (${{{ref}}})"))
                return match.group(0)
            if position.get(ref, -1) > index:
                problems.append(
                    Problem(
                        path, f"uses ${{{ref}}}, which is defined after it; move {ref} above it"
                    )
                )
                return match.group(0)
            if ref in position and ref not in defined:
                uses_invalid.append(ref)  # reported at its own definition
                return match.group(0)
            return _user_or_env(match, path, defined, environ, problems)

        try:
            expanded = _expand(text, replace)
        except _TooLong:
            message = f"expands to more than {MAX_EXPANDED_LENGTH} characters; {_TOO_LONG}"
            problems.append(Problem(path, message))
            continue
        # A macro built on an invalid one is invalid too (silently: one mistake, one report).
        # Keeping the unexpanded ${...} would let a chain of them still double in size.
        if not uses_invalid:
            defined[name] = expanded
    return defined


def _user_or_env(
    match: re.Match[str],
    path: Path,
    macros: Mapping[str, str],
    environ: Mapping[str, str],
    problems: list[Problem],
    invalid: Collection[str] = (),
) -> str:
    ref = match.group(1)
    if ref in macros:
        return macros[ref]
    if ref in invalid:
        return match.group(0)
    if ref.startswith("env.") and len(ref) > 4:
        variable = ref[4:]
        if variable in environ:
            return environ[variable]
        problems.append(
            Problem(path, f"environment variable {variable!r} is not set (used as ${{{ref}}})")
        )
    elif ref not in _BUILTINS:
        hint = did_you_mean(ref, macros)
        tail = f"did you mean ${{{hint}}}?" if hint else "define it under [macros]"
        problems.append(Problem(path, f"unknown macro ${{{ref}}}; {tail}"))
    return match.group(0)


def _uses_port(cmd: object) -> bool:
    if isinstance(cmd, str):
        return "${PORT}" in cmd
    return isinstance(cmd, list) and any(isinstance(a, str) and "${PORT}" in a for a in cmd)


def _allocate_ports(
    models: dict[str, Any], start: object, problems: list[Problem]
) -> dict[str, int]:
    """Ports for the models whose ``cmd`` uses ``${PORT}``, in sorted model-ID order."""
    port = (
        start
        if isinstance(start, int) and not isinstance(start, bool) and 0 < start < 65536
        else DEFAULT_START_PORT
    )
    ports: dict[str, int] = {}
    for model_id in sorted(models):
        model = models[model_id]
        if isinstance(model, dict) and _uses_port(model.get("cmd")):
            if port > 65535:
                problems.append(
                    Problem(
                        ("models", model_id, "cmd"),
                        "no port left for ${PORT}: counting up from startPort passed 65535",
                    )
                )
                continue
            ports[model_id] = port
            port += 1
    return ports


def _expand_model(
    model_id: str, model: dict[str, Any], port: int | None, problems: list[Problem]
) -> dict[str, Any]:
    cmd = model.get("cmd")
    has_cmd = isinstance(cmd, (str, list))
    # A stray ${PORT} is only this model's mistake when cmd is valid and does not use ${PORT}
    # (a missing cmd or an exhausted port range is reported at cmd already).
    report_port = has_cmd and not _uses_port(cmd)
    if "proxy" not in model and has_cmd:
        model = {**model, "proxy": DEFAULT_PROXY}
    fixed = {"MODEL_ID": model_id}
    if port is not None:
        fixed["PORT"] = str(port)

    def second_pass(text: str, path: Path) -> str:
        def replace(match: re.Match[str]) -> str:
            return fixed.get(match.group(1), match.group(0))

        text = _expand_or_report(text, path, replace, problems)
        return _leftovers(text, path, model_id if report_port else "", problems)

    return {k: _map_strings(v, ("models", model_id, k), second_pass) for k, v in model.items()}


def _leftovers(text: str, path: Path, model_id: str | None, problems: list[Problem]) -> str:
    """Report each built-in ``${...}`` still in ``text``.

    ``model_id`` is ``None`` outside ``[models.ID]``, and ``""`` inside a model whose stray
    ``${PORT}`` is already explained at its ``cmd`` (missing cmd, no port left).
    """
    seen: set[str] = set()
    for match in _REF.finditer(text):
        ref = match.group(1)
        message: str | None = None
        if ref == "PID":
            if len(path) < 3 or path[0] != "models" or path[2] != "cmdStop":
                message = "${PID} is only available in cmdStop"
        elif ref in ("PORT", "MODEL_ID") and model_id is None:
            message = f"${{{ref}}} is only available inside [models.ID]"
        elif ref == "PORT" and model_id:
            where = format_path(("models", model_id))
            fix = (
                "put ${PORT} in cmd or set proxy to the server's address"
                if path[-1] == "proxy"
                else "put ${PORT} in cmd"
            )
            message = f"uses ${{PORT}} but {where}.cmd does not; {fix}"
        # Other names were reported by the first pass (unknown macro or unset variable).
        if message is not None and message not in seen:
            seen.add(message)
            problems.append(Problem(path, message))
    return text
