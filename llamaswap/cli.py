"""The ``llamaswap`` command line (SPEC §2)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from functools import partial

import trio

from llamaswap._limits import raise_open_files_limit
from llamaswap._serve import Tls, listen_address, serve
from llamaswap._version import version
from llamaswap.config import Config, load_config
from llamaswap.errors import ConfigError, LlamaSwapError, only_cause
from llamaswap.keypaths import did_you_mean, format_path
from llamaswap.observability.logs import configure_console

__all__ = ["check_config", "main", "missing_programs"]

DEFAULT_LISTEN = "127.0.0.1:8080"
SUBCOMMANDS = ("check-config", "gateway", "import-config", "simulate")
#: Words a llama-swap user may try for import-config.
MIGRATE_WORDS = frozenset({"migrate", "convert", "import"})
IMPORT_CONFIG = "llamaswap import-config"
CHECK_CONFIG_USAGE = "usage: llamaswap check-config PATH"
CHECK_CONFIG_HELP = (
    "Print every problem in the TOML config at PATH, one per line, without starting "
    "anything.\nExit status 0 when it is valid (a program not found on PATH is only a "
    "warning), 2 when not."
)


def check_config(path: str) -> int:
    """Print every problem in the config at ``path``; 0 when valid, 2 when not.

    A program that a command names but this machine lacks is a warning, not a problem: the
    config may be checked on one machine and served on another.
    """
    try:
        config = load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem.render(exc.file), file=sys.stderr)
        count = len(exc.problems)
        print(f"{count} problem{'s' if count != 1 else ''} found", file=sys.stderr)
        return 2
    for warning in missing_programs(config):
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(f"{path}: ok")
    return 0


def missing_programs(config: Config) -> list[str]:
    """``models.ID.cmd: program 'x' not found on PATH`` for each command whose program is
    not here (looked up on the model's own ``env`` PATH if it sets one)."""
    found = []
    for model_id, model in config.models.items():
        search = model.env.get("PATH", os.environ.get("PATH", os.defpath))
        for key, command in (("cmd", model.cmd), ("cmdStop", model.cmd_stop)):
            if command is None or shutil.which(command[0], path=search) is not None:
                continue
            path = format_path(("models", model_id, key))
            if os.sep in command[0] and os.path.isfile(command[0]):
                found.append(f"{path}: program {command[0]!r} is not executable (chmod +x it)")
                continue
            where = "" if os.sep in command[0] else " on PATH"
            found.append(
                f"{path}: program {command[0]!r} not found{where} "
                "(it may exist where llamaswap will run)"
            )
    return found


def _unknown_command(args: Sequence[str]) -> str:
    """The error for ``llamaswap WORD ...`` when ``WORD`` is no subcommand: the likely one
    (``import-config`` for llama-swap users' ``migrate``), and the ones there are."""
    word = args[0]
    if word in MIGRATE_WORDS:
        file = shlex.quote(args[1]) if args[1:2] and not args[1].startswith("-") else "FILE"
        hint = f"; to translate a llama-swap config, run: {IMPORT_CONFIG} {file} -o config.toml"
    else:
        close = did_you_mean(word, SUBCOMMANDS)
        hint = f"; did you mean {close!r}?" if close else ""
    return (
        f"llamaswap: unknown command {word!r}{hint}\n"
        f"llamaswap's commands are {', '.join(SUBCOMMANDS)} (each takes --help); "
        "it serves with: llamaswap --config PATH"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamaswap",
        description="A model-swapping, priority-scheduling proxy for local AI servers.",
        epilog="Validate a config without serving: llamaswap check-config PATH. "
        "Translate a llama-swap config: llamaswap import-config FILE -o config.toml. "
        "Try a scheduler on a workload in simulated time: "
        "llamaswap simulate --config PATH --workload W.toml. "
        "Pick among llamaswap nodes for Envoy: llamaswap gateway --endpoints FILE "
        "(each takes --help).",
    )
    parser.add_argument("--version", action="version", version=f"llamaswap {version()}")
    parser.add_argument(
        "--config",
        required=True,
        metavar="PATH",
        help="TOML config file, or a directory whose *.toml files are merged into one",
    )
    parser.add_argument(
        "--listen",
        action="append",
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; an IPv6 host in brackets: "
        "[::1]:8080; port 0 picks a free port); given several times, every one of them",
    )
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (and its chain)"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    parser.add_argument(
        "--watch-config",
        action="store_true",
        help="reload the config whenever its file changes (as SIGHUP does)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warn", "error"],
        help="overrides logLevel from the config",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check-config"]:
        if args[1:2] in (["-h"], ["--help"]):
            print(f"{CHECK_CONFIG_USAGE}\n\n{CHECK_CONFIG_HELP}")
            sys.exit(0)
        if len(args) != 2:
            print(CHECK_CONFIG_USAGE, file=sys.stderr)
            sys.exit(2)
        sys.exit(check_config(args[1]))
    if args[:1] == ["simulate"]:
        from llamaswap.simulate.command import main as simulate

        sys.exit(simulate(args[1:]))
    if args[:1] == ["gateway"]:
        try:
            from llamaswap.gateway.command import main as gateway
        except ImportError as exc:  # the gateway extra is not installed
            print(f"llamaswap gateway needs pip install 'llamaswap[gateway]' ({exc})",
                  file=sys.stderr)  # fmt: skip
            sys.exit(2)
        sys.exit(gateway(args[1:]))
    if args[:1] == ["import-config"]:
        from llamaswap.migrate.command import import_config

        sys.exit(import_config(args[1:]))
    if args and not args[0].startswith("-"):
        # The server takes options only: a first word is a subcommand llamaswap lacks.
        print(_unknown_command(args), file=sys.stderr)
        sys.exit(2)
    parser = _parser()
    options = parser.parse_args(args)
    options.listen = options.listen or [DEFAULT_LISTEN]
    if (options.tls_cert is None) != (options.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    options.tls = None if options.tls_cert is None else Tls(options.tls_cert, options.tls_key)
    try:
        for address in options.listen:  # a bad --listen before the config is read
            listen_address(address)
        if options.tls is not None:
            options.tls.check()
    except LlamaSwapError as exc:
        print(f"llamaswap: {exc}", file=sys.stderr)
        sys.exit(2)
    try:
        config = load_config(options.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    level = options.log_level or config.log_level.value
    configure_console(level, config.log_to_stdout.value, config.log_time_format)
    # --log-level debug is about llamaswap and its models, not every HTTP/2 header.
    logging.getLogger("hpack").setLevel(logging.WARNING)
    raise_open_files_limit()  # before any socket or model process exists
    try:
        trio.run(_run, config, options)
    except BaseException as exc:
        # The one boundary where a failure to start (an unusable store.path, no lifeline)
        # leaves its ExceptionGroups: say it plainly, as an invalid config is said.
        error = only_cause(exc)
        if not isinstance(error, LlamaSwapError):
            raise
        print(f"llamaswap: {error}", file=sys.stderr)
        sys.exit(2)


async def _run(config: Config, options: argparse.Namespace) -> None:
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(
                serve,
                config,
                listen=options.listen,
                config_path=options.config,
                watch_config=options.watch_config,
                tls=options.tls,
            )
        )
        for url in urls:
            print(f"llamaswap: listening on {url}", flush=True)
