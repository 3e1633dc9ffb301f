"""The ``llamaswap`` command line (SPEC §2): the arguments, then the command they name.

Each command's module is imported only when it runs, so ``--version``, ``--help`` and a
mistyped command answer at once instead of after importing the server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from llamaswap._version import version
from llamaswap.keypaths import did_you_mean

__all__ = ["main"]

DEFAULT_LISTEN = "127.0.0.1:8080"
SUBCOMMANDS = ("quickstart", "check-config", "import-config", "simulate", "gateway")
#: The example config that ``llamaswap quickstart`` serves, installed with the package
#: (``examples/quickstart.toml`` in a checkout links to it).
QUICKSTART_CONFIG = os.path.join(os.path.dirname(__file__), "quickstart.toml")
#: Words a llama-swap user may try for import-config.
MIGRATE_WORDS = frozenset({"migrate", "convert", "import"})
IMPORT_CONFIG = "llamaswap import-config"


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
        epilog="Try it with fake model servers: llamaswap quickstart. "
        "Validate a config without serving: llamaswap check-config PATH. "
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
    _serving_options(parser)
    # argparse's usage of the options above, then the subcommands it does not know of.
    serving = parser.format_usage().removeprefix("usage: ").strip()
    commands = " | ".join(SUBCOMMANDS)
    parser.usage = f"{serving}\n       llamaswap {commands} ... (each takes --help)"
    return parser


def _quickstart_parser() -> argparse.ArgumentParser:
    """``llamaswap quickstart``: the server's options, with the bundled example as config."""
    parser = argparse.ArgumentParser(
        prog="llamaswap quickstart",
        description="Serve the bundled example config: three fake model servers (no GPU, "
        "no model files), the dashboard at /ui/.",
        epilog="The fake servers run with the Python that runs llamaswap. "
        "Start your own config from the example: "
        "llamaswap quickstart --print-config > config.toml",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the example config and exit instead of serving it",
    )
    _serving_options(parser)
    return parser


def _serving_options(parser: argparse.ArgumentParser) -> None:
    """The options of serving, shared by ``llamaswap --config`` and ``llamaswap quickstart``."""
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
        metavar="LEVEL",
        help="debug, info, warn or error; overrides logLevel from the config",
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["quickstart"]:
        parser = _quickstart_parser()
        options = parser.parse_args(args[1:])
        if options.print_config:
            with open(QUICKSTART_CONFIG, encoding="utf-8") as example:
                sys.stdout.write(example.read())
            sys.exit(0)
        sys.exit(_serve(parser, options, QUICKSTART_CONFIG))
    if args[:1] == ["check-config"]:
        from llamaswap.config.command import main as check_config

        sys.exit(check_config(args[1:]))
    if args[:1] == ["import-config"]:
        from llamaswap.migrate.command import import_config

        sys.exit(import_config(args[1:]))
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
    if args and not args[0].startswith("-"):
        # The server takes options only: a first word is a subcommand llamaswap lacks.
        print(_unknown_command(args), file=sys.stderr)
        sys.exit(2)
    parser = _parser()
    options = parser.parse_args(args)  # --version and --help end here
    sys.exit(_serve(parser, options, options.config))


def _serve(parser: argparse.ArgumentParser, options: argparse.Namespace, config: str) -> int:
    """Serve ``config`` with the serving options; the exit status."""
    if (options.tls_cert is None) != (options.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    from llamaswap._run import run

    return run(
        config,
        listen=options.listen or [DEFAULT_LISTEN],
        tls_files=None if options.tls_cert is None else (options.tls_cert, options.tls_key),
        watch_config=options.watch_config,
        log_level=options.log_level,
    )
