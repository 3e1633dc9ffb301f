"""``llamaswap simulate``: what-if runs of the real scheduler on a described workload.

The config's own policy, and with ``compare=True`` the policies people weigh it against:

* **arrival order**: ``serial`` with every priority 0 and no affinity, first come first served;
* **strict priority**: ``serial`` with no aging and no affinity;
* **fifo**: llama-swap's scheduler.
"""

from __future__ import annotations

from typing import Literal

import attrs

from llamaswap.config import Config
from llamaswap.config.model import SerialSettings

from .report import Figures, figures, plot, table
from .run import Outcome, Run, simulate
from .workload import Job, Workload, jobs, load_workload, loads_workload

__all__ = [
    "Figures",
    "Job",
    "Outcome",
    "Policy",
    "Run",
    "Workload",
    "figures",
    "jobs",
    "load_workload",
    "loads_workload",
    "plot",
    "policies",
    "run_policy",
    "simulate",
    "table",
]


@attrs.frozen
class Policy:
    name: str
    config: Config
    ignore_priority: bool = False


def _with_scheduler(
    config: Config, use: Literal["fifo", "serial"], serial: SerialSettings | None = None
) -> Config:
    section = config.routing.scheduler
    settings = attrs.evolve(section.settings, serial=serial or section.settings.serial)
    routing = attrs.evolve(
        config.routing, scheduler=attrs.evolve(section, use=use, settings=settings)
    )
    return attrs.evolve(config, routing=routing)


def policies(config: Config, *, compare: bool = False) -> list[Policy]:
    """The config's own policy and, with ``compare``, the reference ones."""
    own = config.routing.scheduler.use
    serial = config.routing.scheduler.settings.serial
    found = [Policy(f"{own} (this config)", config)]
    if compare:
        found += [
            Policy(
                "arrival order",
                _with_scheduler(config, "serial", attrs.evolve(serial, swap_affinity_bonus=0)),
                ignore_priority=True,
            ),
            Policy(
                "strict priority",
                _with_scheduler(
                    config,
                    "serial",
                    attrs.evolve(serial, aging_divisor=0.0, swap_affinity_bonus=0),
                ),
            ),
        ]
        if own != "fifo":
            found.append(Policy("fifo", _with_scheduler(config, "fifo")))
    return found


def run_policy(policy: Policy, workload: Workload) -> Run:
    """``workload`` served under ``policy``, in simulated time."""
    servers = {model: workload.server(model) for model in policy.config.models}
    return simulate(policy.config, jobs(workload), servers, ignore_priority=policy.ignore_priority)
