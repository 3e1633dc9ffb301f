"""Macro expansion on the raw TOML data, before it becomes config objects.

Macros are written ``${name}`` in any string value. There are five kinds:

* user macros from ``[macros]``; each may use macros defined above it and ``${env.NAME}``;
* ``${env.NAME}``, an environment variable (unset is an error);
* ``${PYTHON}``, the interpreter running llamaswap (``sys.executable``), so that a ``cmd``
  starts a Python module of llamaswap's own environment (the fake model server) even where
  ``python`` on ``PATH`` is another one, as it is after ``pipx install``;
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

import ipaddress
import re
import socket
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from llamaswap.keypaths import Path, Problem, did_you_mean, format_path

from .model import DEFAULT_PROXY, DEFAULT_START_PORT
from .values import EnvText, MacroValue, describe, scalar, without_comments

__all__ = ["MAX_EXPANDED_LENGTH", "PortProbe", "expand_macros", "port_free"]

#: The most characters a macro, or a value using macros, may expand to.
MAX_EXPANDED_LENGTH = 65_536
_TOO_LONG = "macros may expand to at most that"

_BUILTINS = ("PORT", "MODEL_ID", "PID", "PYTHON")
_REF = re.compile(r"\$\{([^}]*)\}")
_MACRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

Substitute = Callable[[str, Path], str]
#: ``(host, port)`` → whether ``${PORT}`` may hand out ``port``.
PortProbe = Callable[[str, int], bool]
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


def port_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (a probe: bind, then close)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As servers do: a port whose old connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def expand_macros(
    raw: Mapping[str, Any],
    environ: Mapping[str, str],
    port_free: PortProbe = port_free,
    keep: Mapping[str, int] | None = None,
) -> tuple[dict[str, Any], list[Problem]]:
    """Expand every macro in ``raw`` and give the result with every problem found.

    Args:
        raw: the parsed TOML document (not modified).
        environ: where ``${env.NAME}`` looks up ``NAME``.
        port_free: whether ``${PORT}`` may hand out a port (on a host of the model's
            ``proxy``); a port in use is skipped.
        keep: ports models already have (a reload's running configuration): a model that
            still uses ``${PORT}`` keeps its own if it is not below ``startPort``.

    Returns:
        A copy of ``raw`` with macros substituted, ``[macros]`` reduced to its valid entries
        as strings, each model's ``macros`` removed and its default ``proxy`` filled in;
        and the problems.
    """
    problems: list[Problem] = []
    macros = _user_macros(raw.get("macros", {}), ("macros",), environ, problems)
    first_pass = macros.first_pass(environ, problems)
    doc: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "macros":
            doc[key] = dict(macros.text)
        elif key == "models" and isinstance(value, dict):
            doc[key] = {
                model_id: _first_pass_model(model_id, model, macros, environ, problems)
                for model_id, model in value.items()
            }
        else:
            doc[key] = _map_strings(value, (key,), first_pass)
    models = doc.get("models")
    ports: dict[str, int] = {}
    if isinstance(models, dict):
        start = scalar(doc.get("startPort"))  # "${n}" or "${env.N}": its number
        ports = _allocate_ports(models, start, problems, port_free, keep or {})
        for model_id, model in models.items():
            if isinstance(model, dict):
                models[model_id] = _expand_model(model_id, model, ports.get(model_id), problems)
    for key, value in doc.items():
        if key not in ("macros", "models"):
            _map_strings(value, (key,), lambda text, path: _leftovers(text, path, None, problems))
    return doc, problems


@attrs.frozen
class _Scope:
    """The user macros one value may use: ``[macros]``, or a model's own over them."""

    text: Mapping[str, str]  # each valid macro's expansion
    typed: Mapping[str, int | float | bool]  # those whose value is a number or a boolean
    invalid: frozenset[str]  # names reported at their definition, not again at each use
    #: Each definition in order (name → its value as written, where it is written).
    definitions: Mapping[str, tuple[object, Path]] = attrs.field(factory=dict)
    #: Valid names whose definition had a problem all the same (an unknown ``${x}`` in it,
    #: kept as written): a model's scope does not report it again.
    reported: frozenset[str] = frozenset()

    def first_pass(self, environ: Mapping[str, str], problems: list[Problem]) -> Substitute:
        """Substitutes user and environment macros; a value that is one macro of a number
        or a boolean (``"${n}"``) becomes a :class:`MacroValue` of it, and one environment
        variable (``"${env.N}"``) an :class:`EnvText`."""

        def substitute(text: str, path: Path) -> str:
            whole = _REF.fullmatch(text)
            name = whole.group(1) if whole is not None else ""
            if name in self.typed:
                return MacroValue(self.text[name], self.typed[name])
            if name.startswith("env.") and name not in self.text and name[4:] in environ:
                return EnvText(environ[name[4:]])

            def replace(match: re.Match[str]) -> str:
                return _user_or_env(match, path, self.text, environ, problems, self.invalid)

            return _expand_or_report(text, path, replace, problems)

        return substitute


def _first_pass_model(
    model_id: str,
    model: object,
    macros: _Scope,
    environ: Mapping[str, str],
    problems: list[Problem],
) -> object:
    """``[models.ID]`` with user and environment macros substituted, its own ``macros``
    (which override ``[macros]`` within it) applied and removed."""
    base: Path = ("models", model_id)
    if not isinstance(model, dict):
        return _map_strings(model, base, macros.first_pass(environ, problems))
    scope = macros
    if "macros" in model:
        scope = _model_macros(model["macros"], (*base, "macros"), macros, environ, problems)
    substitute = scope.first_pass(environ, problems)
    expanded = {
        key: _map_strings(_uncommented(key, value), (*base, key), substitute)
        for key, value in model.items()
        if key != "macros"
    }
    _map_by_id_keys(expanded, base, substitute, problems)
    return expanded


def _uncommented(key: str, value: object) -> object:
    """A ``cmd``/``cmdStop`` string without its comment lines: a macro in a comment is not
    expanded (a multi-line macro there would turn the rest of the comment into arguments),
    as in llama-swap."""
    if key in ("cmd", "cmdStop") and isinstance(value, str):
        return without_comments(value)
    return value


def _map_by_id_keys(
    model: dict[str, Any], base: Path, substitute: Substitute, problems: list[Problem]
) -> None:
    """Substitute macros in the keys of ``filters.setParamsByID`` (``"${MODEL_ID}:hot"``),
    the one table whose keys take macros: they are names a client sends."""
    filters = model.get("filters")
    table = filters.get("setParamsByID") if isinstance(filters, dict) else None
    if not isinstance(filters, dict) or not isinstance(table, dict):
        return
    path = (*base, "filters", "setParamsByID")
    renamed: dict[str, Any] = {}
    for name, value in table.items():
        new = str(substitute(name, (*path, name)))
        if new in renamed:
            problems.append(Problem((*path, name), f"becomes {new!r}, as another key does"))
        renamed[new] = value
    model["filters"] = {**filters, "setParamsByID": renamed}


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
    table: object, base: Path, environ: Mapping[str, str], problems: list[Problem]
) -> _Scope:
    """``[macros]`` (at ``base``): each macro may use those above it."""
    if not isinstance(table, dict):
        problems.append(Problem(base, f"expected a table of name = value, got {describe(table)}"))
        return _Scope({}, {}, frozenset())
    return _define(
        {name: (value, (*base, name)) for name, value in table.items()}, environ, problems
    )


def _model_macros(
    table: object, base: Path, top: _Scope, environ: Mapping[str, str], problems: list[Problem]
) -> _Scope:
    """A model's ``macros`` (at ``base``) over ``top``, as llama-swap resolves them: each
    takes the place of the top-level macro of its name (so top-level macros that use it
    see the model's value), the others come after the top-level ones."""
    if not isinstance(table, dict):
        problems.append(Problem(base, f"expected a table of name = value, got {describe(table)}"))
        return top
    definitions = {
        name: (value, (*base, name))
        for name, (value, _) in top.definitions.items()
        if name not in top.invalid  # reported at its definition already
    }
    definitions.update((name, (value, (*base, name))) for name, value in table.items())
    # A top-level macro keeps its place even when invalid: those after it that use it are
    # invalid too, silently (reported once, at its definition).
    order = [*top.definitions, *(name for name in table if name not in top.definitions)]
    ordered = {name: definitions.get(name, _INVALID) for name in order}
    return _define(ordered, environ, problems, quiet=top.reported - table.keys())


#: A definition already reported (``_define`` neither defines nor reports it again).
_INVALID: tuple[object, Path] = (None, ())


def _define(
    definitions: Mapping[str, tuple[object, Path]],
    environ: Mapping[str, str],
    reports: list[Problem],
    quiet: Collection[str] = (),
) -> _Scope:
    """Each macro of ``definitions`` expanded with those above it (and ``${env.NAME}``);
    the problems of those in ``quiet`` were reported already, and are not again."""
    defined: dict[str, str] = {}
    typed: dict[str, int | float | bool] = {}
    reported: set[str] = set()
    position = {name: index for index, name in enumerate(definitions)}
    for index, (name, (value, path)) in enumerate(definitions.items()):
        if (value, path) == _INVALID:
            continue
        problems = [] if name in quiet else reports  # where this definition's go
        count = len(problems)
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
            problems: list[Problem] = problems,
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
            if len(problems) > count:
                reported.add(name)
            whole = _REF.fullmatch(text) if isinstance(value, str) else None
            if not isinstance(value, str):
                typed[name] = value
            elif whole is not None and whole.group(1) in typed:  # "${n}": n's number
                typed[name] = typed[whole.group(1)]
    invalid = frozenset(definitions) - defined.keys()
    return _Scope(defined, typed, invalid, definitions, frozenset(reported))


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
    if ref == "PYTHON":
        return sys.executable
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


def _local_host(model: dict[str, Any]) -> str | None:
    """The address to probe a port on: the host of the model's ``proxy`` when it is this
    machine, else ``None`` (a port elsewhere cannot be probed from here)."""
    proxy = model.get("proxy", DEFAULT_PROXY)
    try:
        host = urlsplit(proxy).hostname if isinstance(proxy, str) else None
        address = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host or "")
    except ValueError:
        return None
    return str(address) if address.is_loopback else None


def _allocate_ports(
    models: dict[str, Any],
    start: object,
    problems: list[Problem],
    free: PortProbe,
    keep: Mapping[str, int],
) -> dict[str, int]:
    """Ports for the models whose ``cmd`` uses ``${PORT}``: the port in ``keep`` for a model
    that has one (from ``startPort`` up), then for the others, in sorted model-ID order,
    the next ports from ``startPort``, skipping those kept and those in use on the model's
    (local) ``proxy`` host."""
    port = (
        start
        if isinstance(start, int) and not isinstance(start, bool) and 0 < start < 65536
        else DEFAULT_START_PORT
    )
    wanted = [
        m
        for m in sorted(models)
        if isinstance(models[m], dict) and _uses_port(models[m].get("cmd"))
    ]
    ports: dict[str, int] = {}
    for model_id in wanted:  # a port two models had (one by its own proxy): the first's
        kept = keep.get(model_id)
        if kept is not None and port <= kept <= 65535 and kept not in ports.values():
            ports[model_id] = kept
    taken = set(ports.values())
    for model_id in wanted:
        if model_id in ports:
            continue
        host = _local_host(models[model_id])
        while port <= 65535 and (port in taken or (host is not None and not free(host, port))):
            port += 1
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
    return dict(sorted(ports.items()))


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
        if port is not None and text == "${PORT}":
            return MacroValue(fixed["PORT"], port)  # a number where the key takes one

        def replace(match: re.Match[str]) -> str:
            return fixed.get(match.group(1), match.group(0))

        text = _expand_or_report(text, path, replace, problems)
        return _leftovers(text, path, model_id if report_port else "", problems)

    base: Path = ("models", model_id)
    expanded = {k: _map_strings(v, (*base, k), second_pass) for k, v in model.items()}
    _map_by_id_keys(expanded, base, second_pass, problems)
    return expanded


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
