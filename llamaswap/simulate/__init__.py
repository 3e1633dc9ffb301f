"""``llamaswap simulate``: what-if runs of the real scheduler on a described workload.

The config's own policy, and with ``compare=True`` the policies people weigh it against:

* **arrival order**: ``serial`` with every priority 0, no affinity and no ``minResidency``,
  first come first served;
* **strict priority**: ``serial`` with no aging, no affinity and no ``minResidency``
  (neither preempts);
* **fifo**: llama-swap's scheduler;
* for a ``serial`` config, the config itself with ``preempt`` turned the other way
  (**serial + preempt**, or **serial, no preempt** for a config that has it on), so that
  what preemption would do to the workload reads beside what it does without.

Each may run under one or more memory budgets (``Budget``, ``--memory gpu0=24GiB``) that
set the devices' ``memory`` for the run, so that the same config and workload compare
across GPUs (``memory.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from llamaswap.config import Config
from llamaswap.config.model import SerialSettings, toml_key

from .memory import Budget, MemoryFigures, budget_problem, parse_budget, unfit
from .report import PLOT_FORMATS, Figures, figures, plot, plot_problem, table
from .run import Outcome, PreemptionFigures, Run, simulate
from .workload import Job, Workload, jobs, load_workload, loads_workload

__all__ = [
    "PLOT_FORMATS",
    "Budget",
    "Figures",
    "Job",
    "MemoryFigures",
    "Outcome",
    "Policy",
    "PreemptionFigures",
    "Run",
    "Workload",
    "budget_problem",
    "figures",
    "jobs",
    "load_workload",
    "loads_workload",
    "parse_budget",
    "plot",
    "plot_problem",
    "policies",
    "run_policy",
    "simulate",
    "table",
    "unfit",
]


@attrs.frozen
class Policy:
    """A scheduling policy: the config's own, or the config with its scheduler changed.

    ``use``, ``serial`` (``routing.scheduler.settings.serial`` keys, as TOML names them)
    and ``min_residency`` (``minResidency``) are what a config file would change, so a
    benchmark can write the same policy to TOML.
    """

    name: str
    use: Literal["fifo", "serial"] | None = None
    serial: Mapping[str, Any] = attrs.field(factory=dict)
    ignore_priority: bool = False
    min_residency: float | None = None  # None: the config's

    def applied(self, config: Config) -> Config:
        """``config`` under this policy."""
        section = config.routing.scheduler
        fields = {toml_key(f): f.name for f in attrs.fields(SerialSettings)}
        serial = attrs.evolve(
            section.settings.serial, **{fields[k]: v for k, v in self.serial.items()}
        )
        scheduler = attrs.evolve(
            section,
            use=self.use or section.use,
            settings=attrs.evolve(section.settings, serial=serial),
        )
        routing = attrs.evolve(config.routing, scheduler=scheduler)
        if self.min_residency is None:
            return attrs.evolve(config, routing=routing)
        return attrs.evolve(config, routing=routing, min_residency=self.min_residency)


# The references keep no model for its waiting requests (minResidency) either: that would
# be a kind of affinity, and they would no longer be what their names say; nor do they
# preempt, whatever the config says.
ARRIVAL_ORDER = Policy(
    "arrival order",
    "serial",
    {"swapAffinityBonus": 0, "preempt": False},
    ignore_priority=True,
    min_residency=0.0,
)
STRICT_PRIORITY = Policy(
    "strict priority",
    "serial",
    {"agingDivisor": 0, "swapAffinityBonus": 0, "preempt": False},
    min_residency=0.0,
)
FIFO = Policy("fifo", "fifo")


def toggled_preemption(config: Config) -> Policy:
    """The config's own ``serial`` policy with ``preempt`` turned the other way."""
    if config.routing.scheduler.settings.serial.preempt:
        return Policy("serial, no preempt", "serial", {"preempt": False})
    return Policy("serial + preempt", "serial", {"preempt": True})


def policies(config: Config, *, compare: bool = False) -> list[Policy]:
    """The config's own policy and, with ``compare``, the reference ones, and for a
    ``serial`` config the same with ``preempt`` turned the other way."""
    own = config.routing.scheduler.use
    found = [Policy(f"{own} (this config)")]
    if compare:
        found += [ARRIVAL_ORDER, STRICT_PRIORITY]
        if own != "fifo":
            found += [FIFO, toggled_preemption(config)]
    return found


def run_policy(
    policy: Policy, config: Config, workload: Workload, budget: Budget | None = None
) -> Run:
    """``workload`` served under ``policy`` applied to ``config`` (with ``budget``'s
    devices' memory, if given), in simulated time."""
    servers = {model: workload.server(model) for model in config.models}
    applied = policy.applied(config if budget is None else budget.applied(config))
    return simulate(applied, jobs(workload), servers, ignore_priority=policy.ignore_priority)
