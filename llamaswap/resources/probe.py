"""What the GPUs report: each device's memory, load and sensors, and each process's memory.

A ``GpuProbe`` answers one blocking call, ``read()``, run in a worker thread by the
sampler (``Resources.run``). Two probes:

* :class:`NvmlProbe`, NVIDIA's management library through ``nvidia-ml-py`` (the optional
  ``gpu`` extra: ``pip install 'llamaswap[gpu]'``). Devices are named ``gpu0``, ``gpu1``…
  by NVML's index; a process's memory is NVML's per-process figure for compute processes.
* :class:`FileProbe`, the test double: a directory (``LLAMASWAP_FAKE_GPU``) holding
  ``devices.json`` (``{"gpu0": {"total": bytes, "name": ...}}``) and one ``PID.json`` per
  fake model server started with ``--memory`` (``{"gpu0": bytes}``), which it writes while
  it runs (``llamaswap.fake_server``). A file whose process has gone counts for nothing.

``open_probe`` picks one, or says why there is none: without a probe the GPU series are
absent, not zero, and ``/api/resources`` carries the reason.

The machine's RAM is the ``cpu`` device, read from ``/proc/meminfo`` (``ram()``), with or
without a GPU probe; a model's ``memory`` may name it for the part it offloads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol, final

import attrs

__all__ = [
    "FAKE_GPU_ENV",
    "DeviceReading",
    "FileProbe",
    "GpuProbe",
    "NvmlProbe",
    "Reading",
    "open_probe",
    "process_trees",
    "ram",
]

#: The environment variable naming a ``FileProbe``'s directory (tests, demos).
FAKE_GPU_ENV = "LLAMASWAP_FAKE_GPU"
NVML_MISSING = "nvidia-ml-py is not installed (pip install 'llamaswap[gpu]')"


@attrs.frozen
class DeviceReading:
    """One device at one moment. A sensor the device lacks is ``None``."""

    name: str  # "gpu0"
    label: str  # "NVIDIA H200"
    total: int  # bytes
    used: int  # bytes
    utilization: float | None = None  # percent of the last sample period, 0..100
    temperature: float | None = None  # degrees Celsius
    power: float | None = None  # watts


@attrs.frozen
class Reading:
    """What one ``read()`` saw: every device, and the memory of each GPU process."""

    devices: tuple[DeviceReading, ...]
    #: Bytes by device, by PID, for every process using a GPU.
    processes: Mapping[int, Mapping[str, int]] = attrs.field(factory=dict)


class GpuProbe(Protocol):
    name: str  # "nvml", "file"

    def read(self) -> Reading:
        """Every device and GPU process now. Blocking: run it in a worker thread."""

    def close(self) -> None: ...


@final
class NvmlProbe:
    """NVML through ``nvidia-ml-py`` (``import pynvml``); ``open()`` initialises it."""

    name = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(index) for index in range(nvml.nvmlDeviceGetCount())
        ]

    @classmethod
    def open(cls) -> NvmlProbe:
        """Raises ImportError without nvidia-ml-py, or NVML's error (no driver)."""
        import pynvml

        pynvml.nvmlInit()
        return cls(pynvml)

    def read(self) -> Reading:
        nvml = self._nvml
        devices: list[DeviceReading] = []
        processes: dict[int, dict[str, int]] = {}
        for index, handle in enumerate(self._handles):
            name = f"gpu{index}"
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            label = nvml.nvmlDeviceGetName(handle)
            devices.append(
                DeviceReading(
                    name,
                    label.decode() if isinstance(label, bytes) else str(label),
                    int(memory.total),
                    int(memory.used),
                    _sensor(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),  # noqa: B023
                    _sensor(lambda: nvml.nvmlDeviceGetTemperature(handle, 0)),  # noqa: B023
                    _sensor(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000),  # noqa: B023
                )
            )
            for process in _sensor_list(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)):  # noqa: B023
                used = getattr(process, "usedGpuMemory", None)
                if used is not None:
                    processes.setdefault(int(process.pid), {})[name] = int(used)
        return Reading(tuple(devices), processes)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def _sensor(read: Any) -> float | None:
    try:
        return float(read())
    except Exception:  # the device has no such sensor (NVML_ERROR_NOT_SUPPORTED and kin)
        return None


def _sensor_list(read: Any) -> list[Any]:
    try:
        return list(read())
    except Exception:
        return []


@final
class FileProbe:
    """The test double: devices and process figures from files in ``directory``."""

    name = "file"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def read(self) -> Reading:
        listed = _read_json(self.directory / "devices.json") or {}
        processes: dict[int, dict[str, int]] = {}
        for path in self.directory.glob("[0-9]*.json"):
            if not path.stem.isdigit():
                continue
            pid = int(path.stem)
            sizes = _read_json(path)
            if sizes and _alive(pid):
                processes[pid] = {str(k): int(v) for k, v in sizes.items()}
        devices = []
        for name, device in listed.items():
            used = sum(sizes.get(name, 0) for sizes in processes.values())
            devices.append(
                DeviceReading(
                    name,
                    str(device.get("name", "Fake GPU")),
                    int(device["total"]),
                    used,
                    device.get("utilization"),
                    device.get("temperature"),
                    device.get("power"),
                )
            )
        return Reading(tuple(devices), processes)

    def close(self) -> None:
        pass


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # gone, or half written: the next sample sees it
        return None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}") if os.path.isdir("/proc") else True


def open_probe(environ: Mapping[str, str] = os.environ) -> tuple[GpuProbe | None, str]:
    """The probe to use, or ``None`` and why there is none."""
    directory = environ.get(FAKE_GPU_ENV)
    if directory:
        return FileProbe(directory), ""
    try:
        probe = NvmlProbe.open()
    except ImportError:
        return None, NVML_MISSING
    except Exception as exc:  # pynvml.NVMLError: no driver, no permission
        return None, f"NVML could not start: {exc}"
    if not probe.read().devices:
        probe.close()
        return None, "NVML found no GPU"
    return probe, ""


def ram() -> DeviceReading | None:
    """The machine's RAM as the ``cpu`` device (Linux's ``/proc/meminfo``); None elsewhere."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * 1024  # kB
    total = fields.get("MemTotal")
    if total is None:
        return None
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return DeviceReading("cpu", "RAM", total, total - available)


def process_trees(roots: Collection[int]) -> dict[int, set[int]]:
    """Each root PID with every process descended from it (Linux ``/proc``), the root
    included: a model's ``cmd`` may be a wrapper (a shell, ``docker run``) whose child
    holds the GPU memory."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {root: {root} for root in roots}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            continue  # exited meanwhile
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    trees = {}
    for root in roots:
        tree, todo = {root}, [root]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    todo.append(child)
        trees[root] = tree
    return trees
