"""``llamaswap simulate --config FILE --workload W.toml [--compare] [--plot PATH]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from llamaswap.config import load_config
from llamaswap.errors import ConfigError

from . import PLOT_FORMATS, figures, load_workload, plot, plot_problem, policies, run_policy, table

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamaswap simulate",
        description=(
            "Serve a described workload with the config's scheduler (the real one) in "
            "simulated time, and print what the requests waited."
        ),
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--workload", required=True, metavar="FILE", help="workload TOML (docs/scheduling.md)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run arrival order, strict priority and fifo on the same arrivals",
    )
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help=f"draw waits over time per band to PATH (ending in {', '.join(PLOT_FORMATS)})",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """Run the command; the exit status (0, or 2 for a bad config or workload)."""
    options = _parser().parse_args(argv)
    try:
        config = load_config(options.config)
        workload = load_workload(options.workload, config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if options.plot is not None and (problem := plot_problem(options.plot)):
        print(problem, file=sys.stderr)  # before the runs, which may take minutes
        return 2
    logging.getLogger("llamaswap").setLevel(logging.WARNING)  # a swap is not news here
    runs = [
        (policy.name, run_policy(policy, config, workload))
        for policy in policies(config, compare=options.compare)
    ]
    print(table([figures(name, run) for name, run in runs]))
    if options.plot is not None:
        try:
            plot(runs, options.plot)
        except OSError as exc:  # checked above, but a disk can fill or a directory go
            reason = (exc.strerror or str(exc)).lower()
            print(f"--plot {options.plot}: cannot write the file: {reason}", file=sys.stderr)
            return 2
        print(f"plot: {options.plot}")
    return 0
