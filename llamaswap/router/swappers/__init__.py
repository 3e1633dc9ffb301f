"""Eviction policies: which running models must stop for a target to run."""

from __future__ import annotations

from llamaswap.config.model import Config
from llamaswap.resources.fit import Placement
from llamaswap.schedulers.base import Swapper

from .group import GroupSwapper
from .matrix import MatrixSwapper

__all__ = ["GroupSwapper", "MatrixSwapper", "make_swapper"]


def make_swapper(config: Config, placement: Placement | None = None) -> Swapper:
    """The swapper named by ``routing.router.use`` (the config is validated); with a
    ``placement``, the fit rule decides with it where memory is known."""
    router = config.routing.router
    if router.use == "matrix":
        matrix = router.settings.matrix
        assert matrix is not None, "validation requires the matrix table for use = 'matrix'"
        return MatrixSwapper(matrix, placement)
    return GroupSwapper(router.settings.groups, placement)
