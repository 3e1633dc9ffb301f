"""``llamaswap --config PATH``: serving from the command line, until SIGINT or SIGTERM.

``cli`` reads the arguments and imports this module only to serve, so that ``--version``,
``--help`` and the other commands answer without importing the server.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from functools import partial
from typing import Any

import trio

from llamaswap._limits import raise_open_files_limit
from llamaswap._serve import Tls, listen_address, serve
from llamaswap.config import load_config
from llamaswap.errors import ConfigError, LlamaSwapError, only_cause
from llamaswap.observability.logs import configure_console

__all__ = ["run"]


def run(
    config_path: str,
    *,
    listen: Sequence[str],
    tls_files: tuple[str, str] | None,
    watch_config: bool,
    log_level: str | None,
) -> int:
    """Serve the config at ``config_path`` (a file, or a directory of them) on every
    address of ``listen``, with HTTPS when ``tls_files`` names a certificate and its key;
    the exit status: 0 once stopped, 2 (after one line on stderr) when it cannot start."""
    tls = None if tls_files is None else Tls(*tls_files)
    try:
        for address in listen:  # a bad --listen before the config is read
            listen_address(address)
        if tls is not None:
            tls.check()
    except LlamaSwapError as exc:
        print(f"llamaswap: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    level = log_level or config.log_level.value
    configure_console(level, config.log_to_stdout.value, config.log_time_format)
    # --log-level debug is about llamaswap and its models, not every HTTP/2 header, and
    # --watch-config's own lines ("1 change detected") say less than the reload's.
    logging.getLogger("hpack").setLevel(logging.WARNING)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    raise_open_files_limit()  # before any socket or model process exists
    serving = partial(
        serve, config, listen=listen, config_path=config_path, watch_config=watch_config, tls=tls
    )
    try:
        trio.run(_serve_and_say_where, serving)
    except BaseException as exc:
        # The one boundary where a failure to start (an unusable store.path, no lifeline)
        # leaves its ExceptionGroups: say it plainly, as an invalid config is said.
        error = only_cause(exc)
        if not isinstance(error, LlamaSwapError):
            raise
        print(f"llamaswap: {error}", file=sys.stderr)
        return 2
    return 0


async def _serve_and_say_where(serving: partial[Coroutine[Any, Any, None]]) -> None:
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(serving)
        for url in urls:
            print(f"llamaswap: listening on {url}", flush=True)
        # For `kill -HUP`; /api/version says it too.
        print(f"llamaswap: pid {os.getpid()} (SIGHUP reloads the config)", flush=True)
