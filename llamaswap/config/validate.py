"""Checks that need the whole config: URLs, API keys, cross references, matrix sets.

(Numeric ranges are checked as values are read: see ``within(...)`` in ``model.py``.)

Runs after structuring, so every value already has its type. Each check appends to one list
so a user sees every problem in a single run of ``check-config``.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import urllib.parse
from collections.abc import Collection, Mapping, Sequence

import attrs

from llamaswap.keypaths import Path, Problem, format_path, suggestion

from .matrix_expr import check_sets
from .model import (
    CHECK_NONE,
    MAX_SWAP_AFFINITY_BONUS,
    PROFILE_SEPARATOR,
    Config,
    ModelConfig,
)
from .values import number_text

__all__ = ["DETECTED_DEVICE", "NAME_RULE", "bad_name", "validate"]

_GROUPS: Path = ("routing", "router", "settings", "groups")
_MATRIX: Path = ("routing", "router", "settings", "matrix")
_SERIAL: Path = ("routing", "scheduler", "settings", "serial")

logger = logging.getLogger("llamaswap.config")


def validate(
    config: Config, *, dropped: Mapping[str, Sequence[str]] | None = None
) -> tuple[Config, list[Problem]]:
    """Check what the types alone cannot; add each ``setParamsByID`` key to its model's
    aliases, and cap ``swapAffinityBonus``.

    Args:
        config: the structured config.
        dropped: models missing from ``config`` because they were invalid (and already
            reported), by ID, with their aliases; references to them are not reported again.

    Returns:
        The config (with those aliases, and the bonus capped) and every problem found.
    """
    problems: list[Problem] = []
    _check_top_level(config, problems)
    lost: Mapping[str, Sequence[str]] = dropped or {}
    _check_models(config, lost, problems)
    config = _with_by_id_aliases(config)
    model_ids = {*config.models, *lost}
    names = set(model_ids)
    for aliases in [*(model.aliases for model in config.models.values()), *lost.values()]:
        names.update(aliases)
    _check_groups(config, model_ids, names, problems)
    _check_matrix(config, model_ids, problems)
    _check_fifo_priority(config, names, problems)
    for index, name in enumerate(config.hooks.on_startup.preload):
        _check_reference(name, ("hooks", "on_startup", "preload", index), names, problems)
    if config.default_model is not None:
        _check_reference(config.default_model, ("defaultModel",), names, problems)
    _check_selectors(config, names, problems)
    _check_profiles(config, names, problems)
    _check_profile_members(config, model_ids, names, problems)
    _check_peers(config, problems)
    _check_store(config, problems)
    _check_tracing(config, problems)
    _check_slot_save_paths(config, problems)
    _check_devices(config, problems)
    _check_node_name(config, problems)
    _check_ignore_paths(config, problems)
    return _cap_bonus(config, problems), problems


def _check_fifo_priority(config: Config, names: Collection[str], problems: list[Problem]) -> None:
    """Each key names a model (by ID or alias), and no model is named twice: which of two
    priorities would count is nowhere written."""
    path: Path = ("routing", "scheduler", "settings", "fifo", "priority")
    owners = {model_id: model_id for model_id in config.models}
    owners.update((alias, id_) for id_, model in config.models.items() for alias in model.aliases)
    named: dict[str, str] = {}
    for name in config.routing.scheduler.settings.fifo.priority:
        _check_reference(name, (*path, name), names, problems)
        model_id = owners.get(name)
        if model_id is None:
            continue
        if model_id in named:
            first = named[model_id]
            message = f"names model {model_id!r}, as {first!r} does; keep one of them"
            problems.append(Problem((*path, name), message))
        named.setdefault(model_id, name)


def _check_top_level(config: Config, problems: list[Problem]) -> None:
    for index, api_key in enumerate(config.api_keys):
        _check_api_key(api_key, ("apiKeys", index), problems)
    for index, origin in enumerate(config.cors_origins):
        _check_origin(origin, ("corsOrigins", index), problems)
    for index, host in enumerate(config.allowed_hosts):
        _check_host(host, ("allowedHosts", index), problems)


#: A host name as a Host header carries it (letters, digits, ``-``, ``_``, dots), or an
#: IPv6 address in brackets; ``*.`` before a name stands for any name under it.
_HOST = re.compile(r"(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|\[[0-9A-Fa-f:.]+\]")


def _check_host(host: str, path: Path, problems: list[Problem]) -> None:
    """``"*"``, a host name (no scheme, port or path), or ``"*.name"``."""
    if host == "*" or _HOST.fullmatch(host):
        return
    problems.append(
        Problem(
            path,
            'expected a host name like "gpu-box.lan" (no scheme, port or path), '
            f'"*.example.org" for the names under it, or "*", got {host!r}',
        )
    )


def _check_origin(origin: str, path: Path, problems: list[Problem]) -> None:
    """``"*"`` or an origin as browsers send it: scheme and host, maybe a port, no path."""
    if origin == "*":
        return
    try:
        parts = urllib.parse.urlsplit(origin)
        valid = bool(parts.scheme and parts.hostname) and parts.port != 0
    except ValueError:
        valid = False
    if not valid or origin.rstrip("/") != f"{parts.scheme}://{parts.netloc}":
        problems.append(
            Problem(
                path,
                'expected "*" or an origin like "http://localhost:3000" (no path), '
                f"got {origin!r}",
            )
        )


def _check_api_key(api_key: str, path: Path, problems: list[Problem]) -> None:
    """A key that no client could present. The key itself is a secret: never shown."""
    if not api_key:
        problems.append(Problem(path, "an empty API key can never be sent; remove it"))
    elif not all("!" <= char <= "~" for char in api_key):
        problems.append(
            Problem(
                path,
                "an API key must be printable ASCII without spaces: it travels in an HTTP header",
            )
        )


def _check_url(url: str, path: Path, problems: list[Problem]) -> None:
    """An http(s) URL with a host, and a usable port if it names one."""
    if "${" in url:
        return  # a macro left unexpanded: reported where expanding it failed
    try:
        parts = urllib.parse.urlsplit(url)
        hostname = parts.hostname
    except ValueError:  # e.g. an unclosed "[" of an IPv6 address
        hostname = None
    if hostname is None or parts.scheme not in ("http", "https"):
        problems.append(Problem(path, f"expected an http:// or https:// URL, got {url!r}"))
        return
    try:
        port = parts.port
    except ValueError:  # not a number, or above 65535
        port = 0
    if port == 0:
        problems.append(Problem(path, f"expected a port from 1 to 65535 in the URL, got {url!r}"))


NAME_RULE = "must not be empty, start or end with a space, or hold whitespace but spaces"


def bad_name(name: str) -> bool:
    """Whether a model ID or alias breaks :data:`NAME_RULE`: a name travels in JSON and
    in URL paths, where spaces are fine (llama-swap users have ``"Qwen3 30B A3B"``), but
    a tab or a line break would not survive a header or a log line."""
    return name.strip(" ") != name or not name or any(c.isspace() and c != " " for c in name)


def _check_models(config: Config, dropped: Collection[str], problems: list[Problem]) -> None:
    owners: dict[str, str] = {}  # alias -> model ID that claimed it first
    for model_id, model in config.models.items():
        base: Path = ("models", model_id)
        if bad_name(model_id):
            problems.append(Problem(base, f"model ID {model_id!r} {NAME_RULE}"))
        _check_url(model.proxy, (*base, "proxy"), problems)
        if model.check_endpoint != CHECK_NONE and not model.check_endpoint.startswith("/"):
            problems.append(
                Problem(
                    (*base, "checkEndpoint"),
                    f"expected a path starting with '/' or \"none\", got {model.check_endpoint!r}",
                )
            )
        by_id: list[tuple[Path, str]] = [
            ((*base, "filters", "setParamsByID", name), name)
            for name in _by_id_aliases(model_id, model)
        ]
        for path, alias in [*_indexed((*base, "aliases"), model.aliases), *by_id]:
            if bad_name(alias):
                problems.append(Problem(path, f"alias {alias!r} {NAME_RULE}"))
            elif (alias in config.models or alias in dropped) and alias != model_id:
                problems.append(
                    Problem(
                        path,
                        f"alias {alias!r} is already the ID of {format_path(('models', alias))}",
                    )
                )
            elif alias in owners:
                owner = format_path(("models", owners[alias]))
                problems.append(Problem(path, f"alias {alias!r} is already used by {owner}"))
            else:
                owners[alias] = model_id


def _indexed(path: Path, items: Sequence[str]) -> list[tuple[Path, str]]:
    return [((*path, index), item) for index, item in enumerate(items)]


def _by_id_aliases(model_id: str, model: ModelConfig) -> list[str]:
    """The ``setParamsByID`` keys that are not yet names of the model."""
    names = model.filters.set_params_by_id
    return [name for name in names if name != model_id and name not in model.aliases]


def _with_by_id_aliases(config: Config) -> Config:
    """Each ``setParamsByID`` key (but the model's ID) made an alias of its model, as in
    llama-swap: the name a client sends to get those parameters."""
    models = dict(config.models)
    for model_id, model in config.models.items():
        if extra := _by_id_aliases(model_id, model):
            models[model_id] = attrs.evolve(model, aliases=(*model.aliases, *extra))
    return attrs.evolve(config, models=models)


def _check_reference(
    name: str, path: Path, names: Collection[str], problems: list[Problem]
) -> None:
    if name not in names:
        hint = suggestion(name, names, noun="models and aliases")
        problems.append(Problem(path, f"unknown model or alias {name!r}; {hint}"))


def _check_groups(
    config: Config, model_ids: Collection[str], names: Collection[str], problems: list[Problem]
) -> None:
    member_of: dict[str, str] = {}
    for group_name, group in config.routing.router.settings.groups.items():
        for index, member in enumerate(group.members):
            path = (*_GROUPS, group_name, "members", index)
            if member not in model_ids:
                if member not in names:
                    hint = suggestion(member, model_ids, noun="models")
                    problems.append(Problem(path, f"unknown model {member!r}; {hint}"))
                elif (owner := config.resolve(member)) is not None:
                    problems.append(
                        Problem(path, f"{member!r} is an alias; list the model ID {owner!r}")
                    )
            elif member_of.get(member) == group_name:
                problems.append(Problem(path, f"model {member!r} is listed twice"))
            elif member in member_of:
                problems.append(
                    Problem(
                        path,
                        f"model {member!r} is already in group {member_of[member]!r}; "
                        "a model may be in one group only",
                    )
                )
            else:
                member_of[member] = group_name


def _check_matrix(config: Config, model_ids: Collection[str], problems: list[Problem]) -> None:
    router = config.routing.router
    matrix = router.settings.matrix
    if matrix is None:
        if router.use == "matrix":
            problems.append(
                Problem(
                    _MATRIX,
                    'required when routing.router.use = "matrix"; define vars and sets there',
                )
            )
        return
    for var, model_id in matrix.vars.items():
        if model_id not in model_ids:
            hint = suggestion(model_id, model_ids, noun="models")
            problems.append(
                Problem((*_MATRIX, "vars", var), f"unknown model {model_id!r}; {hint}")
            )
    for var in matrix.evict_costs:
        if var not in matrix.vars:
            problems.append(
                Problem(
                    (*_MATRIX, "evict_costs", var),
                    f"unknown var {var!r}; {suggestion(var, matrix.vars, noun='vars')}",
                )
            )
    _, errors = check_sets(matrix.sets, matrix.vars)
    for error in errors:
        problems.append(Problem((*_MATRIX, "sets", error.set_name), error.message))


def _peer_names(config: Config, local: Collection[str]) -> set[str]:
    """Every name a peer's model answers to: ``peer/model``, and its bare name where no
    other peer nor a local model has it (as ``Names`` resolves them)."""
    qualified = {
        f"{peer_id}/{name}" for peer_id, peer in config.peers.items() for name in peer.models
    }
    bare = [name for peer in config.peers.values() for name in set(peer.models)]
    return qualified | {name for name in bare if bare.count(name) == 1 and name not in local}


def _check_selectors(config: Config, local: Collection[str], problems: list[Problem]) -> None:
    """A selector's name is no other name; its targets are models (local ones for the
    strategies that read a model's state), none twice, and no selector."""
    peers = _peer_names(config, local)
    for selector_id, selector in config.selectors.items():
        base: Path = ("selectors", selector_id)
        if bad_name(selector_id):
            problems.append(Problem(base, f"selector name {selector_id!r} {NAME_RULE}"))
        elif selector_id in local or selector_id in peers:
            what = "a peer's model" if selector_id in peers else "a model ID or alias"
            problems.append(Problem(base, f"{selector_id!r} is already the name of {what}"))
        if not selector.targets:
            problems.append(Problem((*base, "targets"), "expected at least one target"))
        reads_state = selector.strategy != "pin"
        seen: set[str] = set()
        for index, target in enumerate(selector.targets):
            path: Path = (*base, "targets", index)
            model = config.resolve(target)
            if target in config.selectors:
                problems.append(
                    Problem(path, f"{target!r} is a selector; a selector's targets are models")
                )
            elif target not in local and target not in peers:
                hint = suggestion(target, [*local, *peers], noun="models and aliases")
                problems.append(Problem(path, f"unknown model or alias {target!r}; {hint}"))
            elif reads_state and model is None:
                problems.append(
                    Problem(
                        path,
                        f"{target!r} is a peer's model; strategy {selector.strategy!r} reads "
                        'the state of local models only ("pin" takes any model)',
                    )
                )
            elif (model or target) in seen:
                problems.append(Problem(path, f"model {model or target!r} is already a target"))
            else:
                seen.add(model or target)


def _check_profiles(config: Config, local: Collection[str], problems: list[Problem]) -> None:
    """Each pin's target is a name (a model, alias, peer model or selector) or ""."""
    known = {*local, *_peer_names(config, local), *config.selectors, *_member_names(config)}
    for profile_name, profile in config.profiles.items():
        base: Path = ("profiles", profile_name)
        if bad_name(profile_name):
            problems.append(Problem(base, f"profile name {profile_name!r} {NAME_RULE}"))
        for name, target in profile.pins.items():
            path: Path = (*base, "pins", name)
            if bad_name(name):
                problems.append(Problem(path, f"pinned name {name!r} {NAME_RULE}"))
            elif target and target not in known:
                hint = suggestion(target, known, noun="models, aliases and selectors")
                problems.append(
                    Problem(path, f"unknown model, alias or selector {target!r}; {hint}")
                )


def _member_names(config: Config) -> set[str]:
    """Every ``PROFILE:MODEL`` name the profiles with ``members`` make (aliases too)."""
    return {
        name
        for profile_name, profile in config.profiles.items()
        for member in profile.members
        for name in _qualified(config, profile_name, member)
    }


def _qualified(config: Config, profile_name: str, member: str) -> list[str]:
    """The ``PROFILE:NAME`` names that reach ``member``: by its ID and by each alias."""
    model = config.models.get(member)
    names = (member, *(model.aliases if model is not None else ()))
    return [f"{profile_name}{PROFILE_SEPARATOR}{name}" for name in names]


def _check_profile_members(
    config: Config, model_ids: Collection[str], names: Collection[str], problems: list[Problem]
) -> None:
    """A profile with ``members`` (llama-swap's older form) lists model IDs, each once; its
    name has no ``:``, and no ``NAME:MODEL`` it makes is a name something else has."""
    taken = {*names, *_peer_names(config, names), *config.selectors}
    for profile in config.profiles.values():
        taken.update(profile.pins)
    for profile_name, profile in config.profiles.items():
        base: Path = ("profiles", profile_name, "members")
        if profile.members and PROFILE_SEPARATOR in profile_name:
            problems.append(
                Problem(
                    ("profiles", profile_name),
                    f"a profile with members is reached as NAME{PROFILE_SEPARATOR}MODEL: "
                    f"its name {profile_name!r} must not contain {PROFILE_SEPARATOR!r}",
                )
            )
        seen: set[str] = set()
        for index, member in enumerate(profile.members):
            path: Path = (*base, index)
            if member not in model_ids:
                if (owner := config.resolve(member)) is not None:
                    problems.append(
                        Problem(path, f"{member!r} is an alias; list the model ID {owner!r}")
                    )
                else:
                    hint = suggestion(member, model_ids, noun="models")
                    problems.append(Problem(path, f"unknown model {member!r}; {hint}"))
                continue
            if member in seen:
                problems.append(Problem(path, f"model {member!r} is listed twice"))
                continue
            seen.add(member)
            for qualified in _qualified(config, profile_name, member):
                if qualified in taken:
                    problems.append(
                        Problem(
                            path,
                            f"{qualified!r} is already a name (a model, alias, selector, "
                            "peer model or pin); rename the profile or that name",
                        )
                    )


def _check_peers(config: Config, problems: list[Problem]) -> None:
    for peer_id, peer in config.peers.items():
        base: Path = ("peers", peer_id)
        if "/" in peer_id or not peer_id or any(char.isspace() for char in peer_id):
            problems.append(
                Problem(
                    base, f"peer ID {peer_id!r} must not be empty or contain '/' or whitespace"
                )
            )
        _check_url(peer.proxy, (*base, "proxy"), problems)
        if peer.api_key is not None:
            _check_api_key(peer.api_key, (*base, "apiKey"), problems)
        if peer.filters.set_params_by_id:
            problems.append(
                Problem(
                    (*base, "filters", "setParamsByID"),
                    "only models take setParamsByID (a peer's models have no aliases here); "
                    "use setParams",
                )
            )
        if not peer.models:
            problems.append(Problem((*base, "models"), "expected at least one model name"))
        for index, name in enumerate(peer.models):
            if not name:
                problems.append(Problem((*base, "models", index), "expected a model name, got ''"))


#: What ``[tracing]`` needs installed, and how to install it.
OTEL_MISSING = (
    "traces need the OpenTelemetry SDK and its OTLP exporter, which are not installed: "
    "pip install 'llamaswap[otel]' (or remove the [tracing] table, or set enabled = false)"
)


def _check_tracing(config: Config, problems: list[Problem]) -> None:
    """The collector's URL, and the optional extra that sends traces there: a config that
    asks for traces is refused where they could not be sent (not found at the first request)."""
    tracing = config.tracing
    if tracing is None or not tracing.enabled:
        return
    if tracing.endpoint is not None:
        _check_url(tracing.endpoint, ("tracing", "endpoint"), problems)
    if not otel_installed():
        problems.append(Problem(("tracing",), OTEL_MISSING))


def otel_installed() -> bool:
    """Whether ``llamaswap[otel]`` is installed: looked up, not imported (which takes time
    and is only done once traces are on: observability/tracing.py)."""
    try:
        found = importlib.util.find_spec("opentelemetry.sdk") is not None
        return found and importlib.util.find_spec("opentelemetry.exporter.otlp") is not None
    except ModuleNotFoundError:  # no ``opentelemetry`` package at all
        return False


def _check_store(config: Config, problems: list[Problem]) -> None:
    if config.store is None or "${" in config.store.path:
        return  # no store, or a macro left unexpanded (reported where expanding it failed)
    path = config.store.path
    if not path.strip():
        problems.append(Problem(("store", "path"), "expected the path of a SQLite file, got ''"))
    elif "\0" in path:
        problems.append(Problem(("store", "path"), "a file path cannot contain a NUL character"))


def _check_slot_save_paths(config: Config, problems: list[Problem]) -> None:
    for model_id, model in config.models.items():
        path = model.slot_save_path
        if path is None or "${" in path:
            continue  # not set, or a macro left unexpanded (reported where expanding it failed)
        where: Path = ("models", model_id, "slotSavePath")
        if not path.strip():
            problems.append(Problem(where, "expected the directory of the slot files, got ''"))
        elif "\0" in path:
            problems.append(Problem(where, "a directory path cannot contain a NUL character"))


#: A node's name goes into a header of every answer: letters, digits, ``.``, ``-``, ``_``.
NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _check_ignore_paths(config: Config, problems: list[Problem]) -> None:
    for index, pattern in enumerate(config.upstream.ignore_paths):
        try:
            re.compile(pattern)
        except re.error as exc:
            where: Path = ("upstream", "ignorePaths", index)
            problems.append(Problem(where, f"not a regular expression: {exc}"))


def _check_node_name(config: Config, problems: list[Problem]) -> None:
    name = config.gateway.name
    if "${" not in name and not NODE_NAME.fullmatch(name):
        message = f"expected 1 to 64 letters, digits, '.', '-' or '_', got {name!r}"
        problems.append(Problem(("gateway", "name"), message))


#: Device names a probe can find: ``gpuN`` (NVML's index N) and ``cpu`` (the machine's RAM).
DETECTED_DEVICE = re.compile(r"gpu[0-9]+|cpu")


def _check_devices(config: Config, problems: list[Problem]) -> None:
    """A device a probe cannot find needs its budget; a model's memory names a device."""
    for name, device in config.devices.items():
        if device.memory is None and not DETECTED_DEVICE.fullmatch(name):
            message = "a device other than gpuN or cpu needs its budget: set memory"
            problems.append(Problem(("devices", name), message))
    for model_id, model in config.models.items():
        for used in model.memory:
            if used not in config.devices and not DETECTED_DEVICE.fullmatch(used):
                hint = suggestion(used, ["gpu0", "cpu", *config.devices], noun="devices")
                message = f"unknown device {used!r} (gpuN, cpu or a [devices] table): {hint}"
                problems.append(Problem(("models", model_id, "memory", used), message))


def _cap_bonus(config: Config, problems: list[Problem]) -> Config:
    serial = config.routing.scheduler.settings.serial
    bonus = serial.swap_affinity_bonus
    path = format_path((*_SERIAL, "swapAffinityBonus"))
    if bonus < 0:
        problems.append(
            Problem(
                (*_SERIAL, "swapAffinityBonus"), f"expected 0 or more, got {number_text(bonus)}"
            )
        )
    if bonus <= MAX_SWAP_AFFINITY_BONUS:
        return config
    cap = MAX_SWAP_AFFINITY_BONUS
    if bonus < 1_000_000:
        logger.warning("%s = %d is above %d; using %d", path, bonus, cap, cap)
    else:  # not thousands of digits in a log line
        logger.warning("%s is far above %d; using %d", path, cap, cap)
    capped = attrs.evolve(serial, swap_affinity_bonus=MAX_SWAP_AFFINITY_BONUS)
    settings = attrs.evolve(config.routing.scheduler.settings, serial=capped)
    scheduler = attrs.evolve(config.routing.scheduler, settings=settings)
    return attrs.evolve(config, routing=attrs.evolve(config.routing, scheduler=scheduler))
