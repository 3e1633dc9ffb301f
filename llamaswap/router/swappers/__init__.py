"""Eviction policies: which running models must stop for a target to run."""

from __future__ import annotations

from llamaswap.config.model import Config
from llamaswap.schedulers.base import Swapper

from .group import GroupSwapper

__all__ = ["GroupSwapper", "make_swapper"]


def make_swapper(config: Config) -> Swapper:
    """The swapper named by ``routing.router.use``.

    Raises:
        NotImplementedError: ``use = "matrix"``, which this version cannot serve yet.
    """
    router = config.routing.router
    if router.use == "matrix":
        raise NotImplementedError(
            "routing.router.use = 'matrix' is not implemented yet; use 'group' "
            "(see docs/configuration.md)"
        )
    return GroupSwapper(router.settings.groups)
