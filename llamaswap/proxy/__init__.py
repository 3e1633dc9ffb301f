"""The HTTP side: the ASGI application, the forwarder, errors, auth, model extraction."""

from __future__ import annotations

from llamaswap.http.client import UpstreamPool as UpstreamPool

from .app import Application as Application
from .app import create_app as create_app

__all__ = ["Application", "UpstreamPool", "create_app"]
