"""Eviction policies: which running models must stop for a target to run."""

from __future__ import annotations

from llamaswap.config.model import Config
from llamaswap.resources.fit import Placement
from llamaswap.schedulers.base import Swapper

from .group import GroupSwapper
from .matrix import MatrixSwapper
from .together import TogetherSwapper, mates

__all__ = ["GroupSwapper", "MatrixSwapper", "TogetherSwapper", "make_swapper"]


def make_swapper(config: Config, placement: Placement | None = None) -> Swapper:
    """The swapper named by ``routing.router.use`` (the config is validated); with a
    ``placement``, the fit rule decides with it where memory is known. Profiles with
    ``members`` keep their models together over the other rules, where they fit
    (``together.py``)."""
    router = config.routing.router
    swapper: Swapper
    if router.use == "matrix":
        matrix = router.settings.matrix
        assert matrix is not None, "validation requires the matrix table for use = 'matrix'"
        swapper = MatrixSwapper(matrix, placement)
    else:
        swapper = GroupSwapper(router.settings.groups, placement)
    together = mates(profile.members for profile in config.profiles.values())
    return TogetherSwapper(swapper, together, placement) if together else swapper
