"""Process limits llamaswap raises when it starts serving.

Every client connection, model server connection and model process pipe is a file
descriptor. Linux distributions give a process a soft limit of 1024 by default (for
``select()``'s sake) and a hard limit far above it; a proxy with a few hundred clients
waiting on a loading model runs into the soft one, and accepting then fails with
``EMFILE``. As Go programs do (since Go 1.19), llamaswap raises the soft limit to the
hard limit once at start: no safeguard is given up, since any process may do that itself.
A model server started afterwards inherits the raised limit (Go gives the programs it
starts the old one back, for the few that still use ``select()``; llamaswap does not: a
model server is a server too).
"""

from __future__ import annotations

import logging

__all__ = ["raise_open_files_limit"]

logger = logging.getLogger(__name__)


def raise_open_files_limit() -> None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, logging at debug what it did.

    A no-op where there is no ``resource`` module (Windows) and where the system refuses
    the hard limit itself (macOS refuses an infinite one): the limit is then as it was.
    """
    try:
        import resource  # here, not at the top: Windows has none
    except ImportError:
        logger.debug("open files limit: not raised (no resource module here)")
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def shown(value: int) -> str:
        return "unlimited" if value == resource.RLIM_INFINITY else str(value)

    if soft == hard:
        logger.debug("open files limit: %s, already the hard limit", shown(soft))
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.debug(
            "open files limit: kept at %s (raising it to the hard limit %s was refused: %s)",
            shown(soft),
            shown(hard),
            exc,
        )
        return
    logger.debug("open files limit: raised from %s to the hard limit %s", soft, shown(hard))
