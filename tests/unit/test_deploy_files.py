"""The container files agree with each other: examples/compose.yaml builds the repository's
Containerfile and mounts the config where the image's command reads it
(tests/e2e/test_container.py builds and runs the image itself)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]


def instruction(name: str) -> str:
    """The arguments of the Containerfile's last ``name`` instruction (one line)."""
    found = re.findall(rf"^{name} (.+)$", (REPO / "Containerfile").read_text(), re.MULTILINE)
    assert found, name
    return str(found[-1])


def compose() -> Any:
    return YAML(typ="safe").load((REPO / "examples" / "compose.yaml").read_text())


def test_compose_builds_the_containerfile() -> None:
    build = compose()["services"]["llamaswap"]["build"]
    context = (REPO / "examples" / build["context"]).resolve()
    assert context / build["dockerfile"] == REPO / "Containerfile"


def test_compose_mounts_the_config_where_the_image_reads_it_and_publishes_its_port() -> None:
    command = json.loads(instruction("CMD"))
    config = command[command.index("--config") + 1]
    listen = command[command.index("--listen") + 1]
    service = compose()["services"]["llamaswap"]
    assert f"./config.toml:{config}:ro" in service["volumes"]
    assert listen == "0.0.0.0:8080"
    assert instruction("EXPOSE") == "8080"
    assert [port.split(":")[-1] for port in service["ports"]] == ["8080"]


def test_the_image_runs_llamaswap_under_tini_as_a_user() -> None:
    assert json.loads(instruction("ENTRYPOINT")) == ["tini", "--", "llamaswap"]
    assert instruction("USER").split(":")[0] not in ("0", "root")
