"""The reference docs cover the code: every config key is in docs/configuration.md, and
every route in docs/api.md."""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from llamaswap.config.model import Config, toml_key
from llamaswap.proxy import UpstreamPool, create_app
from llamaswap.proxy.routes import INFERENCE
from llamaswap.router import Router
from tests.fakes import FakeProbe, FakeSpawner

DOCS = Path(__file__).parents[2] / "docs"


def code_in(markdown: str) -> str:
    """The text of ``markdown``'s code: its fenced blocks and its `spans`."""
    blocks = re.findall(r"^```.*?^```", markdown, re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S))
    return "\n".join([*blocks, *spans])


def toml_keys(cl: type) -> dict[str, str]:
    """Every key of the config file under ``cl`` (an attrs class): key → a path to it."""
    found: dict[str, str] = {}
    seen: set[type] = set()

    def walk(tp: object, path: str) -> None:
        if typing.get_origin(tp) is not None:  # Mapping[str, X] (X under NAME), X | None
            for arg in typing.get_args(tp):
                walk(arg, f"{path}.NAME" if typing.get_origin(tp) is Mapping else path)
        elif isinstance(tp, type) and attrs.has(tp) and tp not in seen:
            seen.add(tp)
            for field in attrs.fields(attrs.resolve_types(tp)):
                key = toml_key(field)
                found.setdefault(key, f"{path}.{key}".lstrip("."))
                walk(field.type, f"{path}.{key}")

    walk(cl, "")
    return found


def test_every_config_key_is_in_the_configuration_docs() -> None:
    code = code_in((DOCS / "configuration.md").read_text())
    keys = toml_keys(Config)
    assert keys["swapAffinityBonus"] == "routing.scheduler.settings.serial.swapAffinityBonus"
    missing = [path for key, path in keys.items() if not re.search(rf"\b{key}\b", code)]
    assert missing == [], "not in docs/configuration.md"


async def test_every_route_is_in_the_api_docs(nursery: trio.Nursery) -> None:
    spawner = FakeSpawner(nursery)
    router = Router(Config(), spawner=spawner, probe=FakeProbe(spawner))
    async with UpstreamPool() as pool:
        app = create_app(router, pool)
    routes = {
        (method, re.sub(r"<(?:\w+:)?\w+>", "{}", rule.rule))
        for rule in app.quart.url_map.iter_rules()
        for method in rule.methods or ()
        if method not in {"HEAD", "OPTIONS"} and rule.endpoint != "static"
    }
    routes |= set(INFERENCE)
    assert {("POST", "/api/models/load/{}"), ("POST", "/v1/chat/completions")} <= routes
    code = code_in((DOCS / "api.md").read_text())
    # A parameter is written {name} in the docs.
    documented = {
        (method, re.sub(r"\{\w+\}", "{}", path))
        for method, path in re.findall(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`?|,]*)", code)
    }
    paths = {path for _, path in documented} | {
        re.sub(r"\{\w+\}", "{}", path) for path in re.findall(r"(?<![\w.])(/[\w/{}.-]+)", code)
    }
    missing = sorted(
        (method, path)
        for method, path in routes
        if (method, path) not in documented and path not in paths
    )
    assert missing == [], "not in docs/api.md"
