"""The HTTP side: the ASGI application, the forwarder, errors, auth, model extraction."""

from __future__ import annotations

from .app import Application as Application
from .app import create_app as create_app
from .upstream import UpstreamPool as UpstreamPool

__all__ = ["Application", "UpstreamPool", "create_app"]
