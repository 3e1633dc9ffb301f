"""Eviction policies: which running models must stop for a target to run."""

from __future__ import annotations

from llamaswap.config.model import Config
from llamaswap.schedulers.base import Swapper

from .group import GroupSwapper
from .matrix import MatrixSwapper

__all__ = ["GroupSwapper", "MatrixSwapper", "make_swapper"]


def make_swapper(config: Config) -> Swapper:
    """The swapper named by ``routing.router.use`` (the config is validated)."""
    router = config.routing.router
    if router.use == "matrix":
        matrix = router.settings.matrix
        assert matrix is not None, "validation requires the matrix table for use = 'matrix'"
        return MatrixSwapper(matrix)
    return GroupSwapper(router.settings.groups)
