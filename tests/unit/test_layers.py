"""llamaswap's packages import only the ones below them (docs/design.md, "Layers"), and
none imports inside a function to dodge a cycle. Read from the source with ``ast``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llamaswap"

#: Lowest first; a package may import its own layer's and those below.
LAYERS: list[set[str]] = [
    {"", "keypaths", "_version", "_limits"},  # "": llamaswap/__init__.py
    {"errors"},
    {"config"},
    {"http"},
    {"process", "resources"},
    {"schedulers"},
    {"router"},
    {"observability", "reloader", "simulate", "migrate"},
    {"proxy"},
    # programs (the fake server is a test double; the gateway, the picker in front of nodes)
    {"_serve", "_run", "_systemd", "cli", "__main__", "fake_server", "gateway"},
]
LAYER = {name: index for index, names in enumerate(LAYERS) for name in names}

#: Imports inside a function that are there to start faster, not to dodge a cycle: each
#: command's own code (serving's included), loaded only when that command runs.
LAZY = {("cli", command) for command in ("_run", "config", "gateway", "migrate", "simulate")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[str, bool]]:
    """Each llamaswap module ``path`` imports at run time, and whether the import is
    inside a function. Imports under ``if TYPE_CHECKING:`` are for the type checker only."""
    tree = ast.parse(path.read_text())
    name = module_name(path).split(".")
    package = name if path.name == "__init__.py" else name[:-1]
    checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            checking.update(id(inner) for inner in ast.walk(node))
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local.update(id(inner) for inner in ast.walk(node))
    for node in ast.walk(tree):
        if id(node) in checking:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            targets = [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "llamaswap" or target.startswith("llamaswap."):
                yield target, id(node) in local


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_package_has_a_layer() -> None:
    found = {package_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert found <= set(LAYER), found - set(LAYER)


def test_no_package_imports_one_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = package_of(module_name(path))
        for target, _ in imports(path):
            if LAYER[package_of(target)] > LAYER[source]:
                upward.append(f"{module_name(path)} imports {target}")
    assert upward == []


def test_the_wire_imports_only_errors_config_and_libraries() -> None:
    allowed = {"http", "errors", "keypaths", "config"}
    for path in (PACKAGE / "http").rglob("*.py"):
        assert {package_of(target) for target, _ in imports(path)} <= allowed, path


def test_no_import_inside_a_function_but_the_subcommands() -> None:
    inside = [
        f"{module_name(path)} imports {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for target, local in imports(path)
        if local
        and (package_of(module_name(path)), package_of(target)) not in LAZY
        and package_of(target) != package_of(module_name(path))
    ]
    assert inside == []
