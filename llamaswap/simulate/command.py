"""``llamaswap simulate --config FILE --workload W.toml [--compare] [--memory BUDGET]...
[--plot PATH]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from llamaswap.config import load_config
from llamaswap.errors import ConfigError

from . import (
    PLOT_FORMATS,
    Budget,
    budget_problem,
    figures,
    load_workload,
    parse_budget,
    plot,
    plot_problem,
    policies,
    run_policy,
    table,
    unfit,
)

__all__ = ["main"]


def _budget(text: str) -> Budget:
    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
        help="also run arrival order, strict priority and fifo on the same arrivals, and "
        "for a serial config the same config with preempt turned the other way",
    )
    parser.add_argument(
        "--memory",
        action="append",
        type=_budget,
        metavar="DEVICE=SIZE[,...]",
        help="run with these devices' memory (as [devices.NAME] memory), such as "
        "gpu0=24GiB or gpu0=24GiB,gpu1=8GiB; repeat to compare budgets side by side",
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
    budgets: list[Budget | None] = options.memory or [None]
    for budget in budgets:
        if budget is not None and (problem := budget_problem(budget, config)):
            print(problem, file=sys.stderr)
            return 2
    if options.plot is not None and (problem := plot_problem(options.plot)):
        print(problem, file=sys.stderr)  # before the runs, which may take minutes
        return 2
    # A swap is not news here, nor a simulated load that ran out of memory: the table
    # counts those, and a model that can never fit gets its note below it.
    logging.getLogger("llamaswap").setLevel(logging.ERROR)
    # Policy by policy, each under every budget: what more memory buys reads down the
    # policy's rows.
    runs = [
        (policy.name, budget, run_policy(policy, config, workload, budget))
        for policy in policies(config, compare=options.compare)
        for budget in budgets
    ]
    print(table([figures(name, run) for name, _, run in runs]))
    for budget in budgets:
        for line in unfit(config if budget is None else budget.applied(config)):
            print(f"note: {line}" if budget is None else f"note ({budget.label}): {line}")
    if options.plot is not None:
        panels = [
            (name if budget is None else f"{name}, {budget.label}", run)
            for name, budget, run in runs
        ]
        try:
            plot(panels, options.plot)
        except OSError as exc:  # checked above, but a disk can fill or a directory go
            reason = (exc.strerror or str(exc)).lower()
            print(f"--plot {options.plot}: cannot write the file: {reason}", file=sys.stderr)
            return 2
        print(f"plot: {options.plot}")
    return 0
