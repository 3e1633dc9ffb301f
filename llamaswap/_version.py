"""llamaswap's version, and the versions of what it runs on (``--version``, ``/api/version``)."""

from __future__ import annotations

import importlib.metadata
import platform

import trio

import llamaswap

__all__ = ["version", "versions"]


def version() -> str:
    """The installed distribution's version; ``llamaswap.__version__`` when run from a
    checkout that is not installed."""
    try:
        return importlib.metadata.version("llamaswap")
    except importlib.metadata.PackageNotFoundError:
        return llamaswap.__version__


def versions() -> dict[str, str]:
    """llamaswap's version, with Python's, Trio's and hypercorn's."""
    try:
        hypercorn = importlib.metadata.version("hypercorn")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (a dependency)
        hypercorn = "unknown"
    return {
        "version": version(),
        "python": platform.python_version(),
        "trio": trio.__version__,
        "hypercorn": hypercorn,
    }
