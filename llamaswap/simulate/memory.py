"""Memory in a simulation: the budgets to try (``--memory``) and the simulated devices.

Where the config declares a model's ``memory``, its simulated server holds that much on
each device from the moment it is started until it stops, and the fit rule
(``resources/fit.py``, the real one, through the router's own ``Resources``) decides what
a load evicts wherever the device has a budget: ``[devices.NAME] memory``, or one given
with ``--memory`` for the run. Nothing is learned in a simulation (no GPU is read), so a
model without ``memory`` holds nothing here, and the fit rule counts it as holding the
whole device, as the server does before it has learned a figure.

A simulated device's capacity is its budget, ``memory`` less ``headroom``: the headroom
stands for what the CUDA context and fragmentation take beside the declared figures. A
server started where its need does not fit beside what the others hold fails at once,
as a real one does, with a line that ``resources.out_of_memory`` recognises; the router
then retries the load once after evicting every idle model (``Ledger.finish_swap``), and
a model whose need exceeds the budget even alone fails its load, and its requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import final

import attrs

from llamaswap.config import Config
from llamaswap.config.model import DeviceConfig
from llamaswap.config.values import parse_sizes_option
from llamaswap.resources import Resources, format_size

__all__ = [
    "Budget",
    "DeviceMemory",
    "MemoryFigures",
    "budget_problem",
    "budgets_label",
    "needs",
    "parse_budget",
    "unfit",
]


@attrs.frozen
class Budget:
    """Memory by device to try (``--memory gpu0=24GiB,gpu1=8GiB``): each device's
    ``[devices.NAME] memory`` for the run; its ``headroom`` stays the config's."""

    memory: Mapping[str, int]

    @property
    def label(self) -> str:
        """``gpu0=24 GiB, gpu1=8 GiB``."""
        return ", ".join(f"{device}={format_size(s)}" for device, s in sorted(self.memory.items()))

    def applied(self, config: Config) -> Config:
        """``config`` with these devices' ``memory`` set."""
        devices = dict(config.devices)
        for device, size in self.memory.items():
            devices[device] = attrs.evolve(devices.get(device, DeviceConfig()), memory=size)
        return attrs.evolve(config, devices=devices)


def parse_budget(text: str) -> Budget:
    """One ``--memory`` value: ``DEVICE=SIZE`` pairs, comma separated, or a bare size
    (on ``gpu0``, as a model's ``memory`` is).

    Raises:
        ValueError: what is wrong with ``text``, said for the command line.
    """
    return Budget(parse_sizes_option(text))


def needs(config: Config) -> dict[str, Mapping[str, int]]:
    """Each model's declared ``memory``, by model (those that declare one)."""
    return {model: m.memory for model, m in config.models.items() if m.memory}


def _devices(config: Config) -> list[str]:
    return sorted({device for sizes in needs(config).values() for device in sizes})


def budget_problem(budget: Budget, config: Config) -> str | None:
    """Why ``budget`` could change nothing for ``config``, as a line to print; or None."""
    devices = _devices(config)
    where = f"--memory {budget.label}"
    if not devices:
        return (
            f"{where}: no model in the config declares memory, so no budget changes what "
            'it does; give the models memory = "22GiB" (models.NAME.memory)'
        )
    unused = sorted(set(budget.memory) - set(devices))
    if unused:
        return (
            f"{where}: no model's memory is on {', '.join(unused)}; "
            f"the models' devices: {', '.join(devices)}"
        )
    return None


def budgets_label(config: Config) -> str:
    """The declared ``memory`` of the devices the models need: ``gpu0=24 GiB``, or ``-``."""
    declared = {
        device: size
        for device in _devices(config)
        if (size := getattr(config.devices.get(device), "memory", None)) is not None
    }
    return Budget(declared).label or "-"


def unfit(config: Config) -> list[str]:
    """A line for each model whose need on a device exceeds that device's budget even
    with nothing else loaded: each of its loads fails out of memory."""
    resources = Resources(config)
    found = []
    for model, sizes in sorted(needs(config).items()):
        for device, size in sorted(sizes.items()):
            budget = resources.budget(device)
            if budget is not None and size > budget:
                found.append(
                    f"model {model!r} needs {format_size(size)} on {device}, more than the "
                    f"{format_size(budget)} of its budget even alone: its loads fail out of memory"
                )
    return found


@attrs.frozen
class MemoryFigures:
    """What a run's simulated devices saw."""

    #: The devices' declared memory (``budgets_label``).
    budgets: str
    #: The most the simulated servers held at once, by device.
    peaks: Mapping[str, int]
    #: Models stopped to make room for a load (by the fit rule or the groups' rules).
    evictions: int
    #: The model of each load that failed for memory, in order.
    out_of_memory: tuple[str, ...]


@final
class DeviceMemory:
    """The simulated devices: what each running server holds, against each budget.

    Args:
        needs: each model's declared memory, by device.
        budget: a device's budget, or None where it has none (nothing then limits it).
    """

    def __init__(
        self, needs: Mapping[str, Mapping[str, int]], budget: Callable[[str], int | None]
    ) -> None:
        self._needs = needs
        self._budget = budget
        self._held: dict[str, Mapping[str, int]] = {}
        self.peaks = {device: 0 for sizes in needs.values() for device in sizes}
        self.out_of_memory: list[str] = []

    def _used(self, device: str) -> int:
        return sum(sizes.get(device, 0) for sizes in self._held.values())

    def take(self, model: str) -> str | None:
        """``model``'s server starts: it holds its need from now on; or, where that does
        not fit, the line its failing start prints (and it holds nothing)."""
        sizes = self._needs.get(model, {})
        for device, size in sorted(sizes.items()):
            budget = self._budget(device)
            used = self._used(device)
            if budget is not None and used + size > budget:
                self.out_of_memory.append(model)
                free = format_size(max(0, budget - used))
                return (
                    f"simulated: {device}: out of memory allocating {format_size(size)} "
                    f"({free} free of a {format_size(budget)} budget)"
                )
        self._held[model] = sizes
        for device in sizes:
            self.peaks[device] = max(self.peaks[device], self._used(device))
        return None

    def release(self, model: str) -> None:
        """``model``'s server has exited."""
        self._held.pop(model, None)
