"""Routing: the router (processes + swaps) and the swappers (who must be evicted)."""

from __future__ import annotations

from .events import Observer as Observer
from .events import RouterEvent as RouterEvent
from .router import Router as Router
from .swappers.group import GroupSwapper as GroupSwapper
from .swappers.matrix import MatrixSwapper as MatrixSwapper

__all__ = ["GroupSwapper", "MatrixSwapper", "Observer", "Router", "RouterEvent"]
