"""``llamaswap --config PATH``: serving from the command line, until SIGINT or SIGTERM.

``cli`` reads the arguments and imports this module only to serve, so that ``--version``,
``--help`` and the other commands answer without importing the server.
"""

from __future__ import annotations

import logging
import os
import sys
from functools import partial

import trio

from llamaswap._limits import raise_open_files_limit
from llamaswap._serve import listen_address, serve
from llamaswap.config import Config, load_config
from llamaswap.errors import ConfigError, LlamaSwapError, only_cause
from llamaswap.observability.logs import configure_console

__all__ = ["run"]


def run(config_path: str, *, listen: str, watch_config: bool, log_level: str | None) -> int:
    """Serve the config at ``config_path`` on ``listen``; the exit status: 0 once stopped,
    2 (after one line on stderr) when it cannot start."""
    try:
        listen_address(listen)  # a bad --listen before the config is read
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
    try:
        trio.run(_serve, config, listen, config_path, watch_config)
    except BaseException as exc:
        # The one boundary where a failure to start (an unusable store.path, no lifeline)
        # leaves its ExceptionGroups: say it plainly, as an invalid config is said.
        error = only_cause(exc)
        if not isinstance(error, LlamaSwapError):
            raise
        print(f"llamaswap: {error}", file=sys.stderr)
        return 2
    return 0


async def _serve(config: Config, listen: str, config_path: str, watch_config: bool) -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            partial(
                serve, config, listen=listen, config_path=config_path, watch_config=watch_config
            )
        )
        print(f"llamaswap: listening on {url}", flush=True)
        # For `kill -HUP`; /api/version says it too.
        print(f"llamaswap: pid {os.getpid()} (SIGHUP reloads the config)", flush=True)
