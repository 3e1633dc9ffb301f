"""What llamaswap knows of memory and time: budgets, each model's need, learned figures.

``Resources`` is the one record of it. It is told (synchronously, by the router's
events) when a load begins and ends and how long each request was served, and it samples
the GPU probe (``probe.py``) every ``SAMPLE_INTERVAL`` seconds and as each model becomes
ready, in its own task (``run``). From those it answers, synchronously:

* a device's *budget*: its ``[devices]`` ``memory``, else the total the probe (or, for
  ``cpu``, ``/proc/meminfo``) reports, less its headroom;
* a model's *need*: its declared ``memory``, else the most its process tree was seen to
  use on each GPU (*learned*, kept in the ``[store]`` database when there is one), else
  unknown;
* its load and serve times: the median of the last few (``HISTORY``), for the fit
  rule's costs and the estimates of when a waiting request starts (``eta.py``).

**A declared figure always wins over a learned one**, and **a learned figure only grows**
(the largest seen): a model that once needed 9 GiB may need it again.

*Cancellation*: ``run`` is a service; cancelling it ends the sampling (a read in its worker
thread is abandoned; NVML calls are short) and closes the probe.
"""

from __future__ import annotations

import collections
import logging
import statistics
from collections.abc import Callable, Mapping
from typing import Literal, Protocol, final

import attrs
import trio

from llamaswap.config.model import Config

from .fit import Placement, Sizes
from .probe import DeviceReading, GpuProbe, Reading, process_trees, ram

__all__ = ["DeviceView", "FigureStore", "ModelMemory", "Need", "Resources", "format_size"]

logger = logging.getLogger("llamaswap.resources")

#: Seconds between two samples of the GPU probe.
SAMPLE_INTERVAL = 2.0
#: Seconds one sample may take before it is abandoned (a hung driver call).
SAMPLE_TIMEOUT = 10.0
#: How many of its last load (and serve) times a model's figure is the median of.
HISTORY = 5
#: A learned figure is logged again when it grows by more than this fraction.
NOTABLE_GROWTH = 0.05
#: Seconds a load is taken to cost when no model's load was ever measured.
DEFAULT_LOAD_SECONDS = 1.0

Source = Literal["declared", "learned"]


@attrs.frozen
class Need:
    """What a model needs, by device, and where the figure comes from."""

    sizes: Mapping[str, int]
    source: Source

    def describe(self) -> str:
        """``8 GiB on gpu0, declared``."""
        sizes = ", ".join(f"{format_size(s)} on {d}" for d, s in sorted(self.sizes.items()))
        return f"{sizes}, {self.source}"


@attrs.frozen
class ModelMemory:
    """A model's memory for the API: its need (``None``: unknown) and what its processes
    hold now, by device (empty when it is not running or no probe reads it)."""

    need: Need | None
    held: Mapping[str, int]


@attrs.frozen
class DeviceView:
    """A device for the API and the metrics: the last reading, its budget and who holds what."""

    name: str
    label: str
    total: int | None  # bytes; None: neither declared nor reported
    used: int | None  # bytes, as the probe reports (every process); None: not read
    budget: int | None  # what models may use: total less headroom
    headroom: int
    holders: Mapping[str, int]  # bytes by model, measured
    utilization: float | None = None
    temperature: float | None = None
    power: float | None = None
    source: Literal["probe", "declared"] = "probe"


class FigureStore(Protocol):
    """Where learned figures outlive the process (the ``[store]`` database)."""

    async def learned(self) -> dict[str, dict[str, int]]:
        """Every model's learned figure."""

    async def remember(self, model: str, sizes: Mapping[str, int]) -> None:
        """Keep ``model``'s figure (replacing the one kept)."""


def format_size(size: int) -> str:
    """``8 GiB``, ``23.5 GiB``, ``512 MiB``: a size for people, to a tenth of its unit."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size} B"


@final
class Resources:
    """See the module docstring.

    Args:
        config: the configuration (``configure`` takes a reload's).
        probe: the GPU probe, or ``None``; ``absent`` then says why there is none.
        store: keeps learned figures across restarts.
    """

    def __init__(
        self,
        config: Config,
        probe: GpuProbe | None = None,
        *,
        absent: str = "",
        store: FigureStore | None = None,
    ) -> None:
        self.probe = probe
        self.absent = absent if probe is None else ""
        self._store = store
        self._config = config
        self._reading: Reading | None = None
        self._ram: DeviceReading | None = ram()
        self._learned: dict[str, dict[str, int]] = {}
        #: Bytes by device that each running model's processes hold, at the last sample.
        self._held: dict[str, dict[str, int]] = {}
        self._loads: dict[str, collections.deque[float]] = {}
        self._serves: dict[str, collections.deque[float]] = {}
        self._load_began: dict[str, float] = {}
        self._wake = trio.Event()

    def configure(self, config: Config) -> None:
        self._config = config

    # ------------------------------------------------------------- figures

    def need(self, model: str) -> Need | None:
        definition = self._config.models.get(model)
        if definition is not None and definition.memory:
            return Need(definition.memory, "declared")
        learned = self._learned.get(model)
        return Need(learned, "learned") if learned else None

    def held(self, model: str) -> Mapping[str, int]:
        return self._held.get(model, {})

    def memory(self, model: str) -> ModelMemory:
        return ModelMemory(self.need(model), self.held(model))

    def budget(self, device: str) -> int | None:
        total = self._total(device)
        return None if total is None else max(0, total - self._headroom(device))

    def _total(self, device: str) -> int | None:
        declared = self._config.devices.get(device)
        if declared is not None and declared.memory is not None:
            return declared.memory
        reading = self._reading_of(device)
        return None if reading is None else reading.total

    def _headroom(self, device: str) -> int:
        declared = self._config.devices.get(device)
        if declared is not None and declared.headroom is not None:
            return declared.headroom
        return self._config.memory_headroom

    def _reading_of(self, device: str) -> DeviceReading | None:
        if device == "cpu":
            return self._ram
        devices = self._reading.devices if self._reading is not None else ()
        return next((d for d in devices if d.name == device), None)

    def load_seconds(self, model: str) -> float | None:
        """The median of ``model``'s last loads (start to ready); None before the first."""
        loads = self._loads.get(model)
        return statistics.median(loads) if loads else None

    def serve_seconds(self, model: str) -> float | None:
        """The median of its last requests' times from grant to end; None before one."""
        serves = self._serves.get(model)
        return statistics.median(serves) if serves else None

    def placement(self, waiting: Callable[[str], int]) -> Placement:
        """The fit rule's view, with ``waiting(model)`` requests weighting each cost."""
        return _Placement(self, waiting)

    def devices(self) -> list[DeviceView]:
        """Every device known: reported by the probe, declared, or named by a model."""
        read = [d.name for d in self._reading.devices] if self._reading is not None else []
        named = (d for m in self._config.models.values() for d in m.memory)
        holders: dict[str, dict[str, int]] = {}
        for model, sizes in self._held.items():
            for device, size in sizes.items():
                holders.setdefault(device, {})[model] = size
        views = []
        for name in dict.fromkeys([*read, *self._config.devices, *named]):
            reading = self._reading_of(name)
            declared = self._config.devices.get(name)
            view = DeviceView(
                name,
                name,
                self._total(name),
                None,
                self.budget(name),
                self._headroom(name),
                holders.get(name, {}),
                source="declared" if declared and declared.memory is not None else "probe",
            )
            if reading is not None:  # what the probe (or /proc/meminfo) says of it
                view = attrs.evolve(
                    view,
                    label=reading.label,
                    used=reading.used,
                    utilization=reading.utilization,
                    temperature=reading.temperature,
                    power=reading.power,
                )
            views.append(view)
        return views

    # ------------------------------------------------------------ learning

    def loading(self, model: str, now: float) -> None:
        """``model``'s server was started."""
        self._load_began[model] = now

    def ready(self, model: str, now: float) -> None:
        """``model`` became ready: its load time is one more figure; sample it now."""
        began = self._load_began.pop(model, None)
        if began is not None:
            self._loads.setdefault(model, collections.deque(maxlen=HISTORY)).append(now - began)
        self._wake.set()

    def stopped(self, model: str) -> None:
        self._load_began.pop(model, None)
        self._held.pop(model, None)

    def served(self, model: str, seconds: float) -> None:
        """A request of ``model`` was served for ``seconds`` (from its grant to its end)."""
        self._serves.setdefault(model, collections.deque(maxlen=HISTORY)).append(seconds)

    def learn(self, reading: Reading, trees: Mapping[str, set[int]]) -> list[str]:
        """Take one sample: ``trees`` are the running models' process trees. Returns the
        models whose learned figure grew (to be kept in the store)."""
        self._reading = reading
        self._ram = ram()
        grown = []
        self._held = {}
        for model, pids in trees.items():
            held: dict[str, int] = {}
            for pid in pids:
                for device, size in reading.processes.get(pid, {}).items():
                    held[device] = held.get(device, 0) + size
            if not held:
                continue
            self._held[model] = held
            definition = self._config.models.get(model)
            if definition is not None and definition.memory:
                continue  # declared: what it holds is shown, not learned
            learned = self._learned.setdefault(model, {})
            before = sum(learned.values())
            for device, size in held.items():
                learned[device] = max(learned.get(device, 0), size)
            after = sum(learned.values())
            if after > before:
                grown.append(model)
                if after > before * (1 + NOTABLE_GROWTH):
                    sizes = ", ".join(
                        f"{format_size(s)} on {d}" for d, s in sorted(learned.items())
                    )
                    logger.info(
                        "model %r uses %s (learned); its loads use it from now on", model, sizes
                    )
        return grown

    async def run(
        self,
        pids: Callable[[], Mapping[str, int]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample the probe until cancelled: at once (the devices' budgets are known
        before the first request), then every ``SAMPLE_INTERVAL`` s and at each ready.
        ``pids()`` gives each running model's server PID."""
        if self._store is not None:
            with trio.move_on_after(SAMPLE_TIMEOUT):
                for model, sizes in (await self._store.learned()).items():
                    self._learned.setdefault(model, dict(sizes))
        try:
            if self.probe is not None:
                await self._sample(pids)
            task_status.started()
            while self.probe is not None:
                with trio.move_on_after(SAMPLE_INTERVAL):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self._sample(pids)
        finally:
            if self.probe is not None:
                self.probe.close()

    async def _sample(self, pids: Callable[[], Mapping[str, int]]) -> None:
        probe = self.probe
        assert probe is not None
        roots = dict(pids())

        def read() -> tuple[Reading, dict[int, set[int]]]:
            return probe.read(), process_trees(roots.values())

        try:
            with trio.fail_after(SAMPLE_TIMEOUT):
                reading, trees = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        except Exception as exc:  # a driver error, a hung call: the next sample tries again
            logger.warning("the GPU probe (%s) failed: %s", probe.name, exc)
            return
        grown = self.learn(reading, {model: trees[pid] for model, pid in roots.items()})
        if self._store is not None:
            for model in grown:
                with trio.move_on_after(SAMPLE_TIMEOUT):
                    await self._store.remember(model, dict(self._learned[model]))


@final
class _Placement:
    """``Resources`` as the fit rule reads it."""

    def __init__(self, resources: Resources, waiting: Callable[[str], int]) -> None:
        self._resources = resources
        self._waiting = waiting

    def need(self, model: str) -> Sizes | None:
        need = self._resources.need(model)
        return None if need is None else need.sizes

    def budget(self, device: str) -> int | None:
        return self._resources.budget(device)

    def cost(self, model: str) -> float:
        seconds = self._resources.load_seconds(model)
        if seconds is None:
            seconds = DEFAULT_LOAD_SECONDS
        return seconds * (1 + self._waiting(model))
