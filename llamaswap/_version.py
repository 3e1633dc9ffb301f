"""llamaswap's version, and the versions of what it runs on (``--version``, ``/api/version``)."""

from __future__ import annotations

import importlib.metadata
import platform

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
    return {
        "version": version(),
        "python": platform.python_version(),
        "trio": _installed("trio"),
        "hypercorn": _installed("hypercorn"),
    }


def _installed(distribution: str) -> str:
    """A dependency's version, read without importing it (``--version`` imports nothing)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (a dependency)
        return "unknown"
