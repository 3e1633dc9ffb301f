"""The nodes the gateway picks from: llm-d's ``endpoints.yaml`` file format.

::

    endpoints:
      - name: gpu-1
        address: 10.0.0.1     # an IP address: Envoy connects to ip:port as given
        port: "8080"
        metricsPort: "9090"   # optional: where /gateway/metrics is, when not on port

The file is read at start and again whenever it changes; a file that is not valid
leaves the running list as it was and says why, every problem with its key path.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from llamaswap.errors import ConfigError, ConfigProblem
from llamaswap.keypaths import format_path, suggestion

from .nodes import Endpoint

__all__ = ["load_endpoints", "parse_endpoints"]

_KEYS = ("name", "address", "port", "metricsPort")


def load_endpoints(path: Path) -> tuple[Endpoint, ...]:
    """The endpoints listed in ``path``.

    Raises:
        ConfigError: it cannot be read, or it is not a valid list (every problem).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), [ConfigProblem("", f"cannot be read: {exc}")]) from None
    return parse_endpoints(text, str(path))


def parse_endpoints(text: str, file: str) -> tuple[Endpoint, ...]:
    """The endpoints listed in ``text`` (the contents of ``file``).

    Raises:
        ConfigError: every problem, with its key path.
    """
    try:
        document = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise ConfigError(file, [ConfigProblem("", f"is not YAML: {exc}")]) from None
    problems: list[ConfigProblem] = []
    entries = document.get("endpoints") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        problems.append(ConfigProblem("endpoints", "must be a list of endpoints"))
        raise ConfigError(file, problems)
    endpoints = []
    for index, entry in enumerate(entries):
        endpoint = _endpoint(entry, ("endpoints", index), problems)
        if endpoint is not None:
            endpoints.append(endpoint)
    _check_unique(endpoints, problems)
    if problems:
        raise ConfigError(file, problems)
    return tuple(endpoints)


def _endpoint(
    entry: object, path: tuple[str | int, ...], problems: list[ConfigProblem]
) -> Endpoint | None:
    if not isinstance(entry, dict):
        problems.append(ConfigProblem(format_path(path), "must be a table of name, address, port"))
        return None
    for key in entry:
        if key not in _KEYS:
            where = format_path((*path, str(key)))
            problems.append(ConfigProblem(where, f"unknown key; {suggestion(str(key), _KEYS)}"))
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        problems.append(ConfigProblem(format_path((*path, "name")), "must be a non-empty string"))
        name = None
    address = entry.get("address")
    if not isinstance(address, str) or not _is_ip(address):
        # Envoy's original-destination cluster connects to an ip:port; it resolves nothing.
        message = f"must be an IP address (Envoy routes to ip:port), got {address!r}"
        problems.append(ConfigProblem(format_path((*path, "address")), message))
        address = None
    port = _port(entry, "port", path, problems, required=True)
    metrics_port = _port(entry, "metricsPort", path, problems, required=False)
    if name is None or address is None or port is None:
        return None
    return Endpoint(name, address, port, metrics_port)


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _port(
    entry: dict[object, object],
    key: str,
    path: tuple[str | int, ...],
    problems: list[ConfigProblem],
    *,
    required: bool,
) -> int | None:
    """A port, written as a number or as a string of digits (llm-d quotes them)."""
    value = entry.get(key)
    if value is None and not required:
        return None
    text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
    if text.isdigit() and 0 < int(text) < 65536:
        return int(text)
    problems.append(ConfigProblem(format_path((*path, key)), "must be a port (1-65535)"))
    return None


def _check_unique(endpoints: Sequence[Endpoint], problems: list[ConfigProblem]) -> None:
    seen: set[str] = set()
    for index, endpoint in enumerate(endpoints):
        if endpoint.name in seen:
            where = format_path(("endpoints", index, "name"))
            problems.append(ConfigProblem(where, f"{endpoint.name!r} names two endpoints"))
        seen.add(endpoint.name)
