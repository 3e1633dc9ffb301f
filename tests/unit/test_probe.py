"""The GPU probes (resources/probe.py) and what Resources learns from their readings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from llamaswap.config.model import Config, DeviceConfig, ModelConfig
from llamaswap.resources import FileProbe, NvmlProbe, Reading, Resources, open_probe
from llamaswap.resources.probe import FAKE_GPU_ENV, DeviceReading, process_trees, ram

GiB = 2**30


class FakeNvml:
    """The parts of pynvml that NvmlProbe calls, for two GPUs; the second has no sensors."""

    def __init__(self) -> None:
        self.shut = False

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=(80 + handle) * GiB, used=(handle + 1) * GiB)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def _sensor(self, handle: int, value: float) -> float:
        if handle == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return value

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=self._sensor(handle, 37))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> float:
        return self._sensor(handle, 41)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> float:
        return self._sensor(handle, 212_500)  # milliwatts

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        if handle == 1:
            return [SimpleNamespace(pid=7, usedGpuMemory=None)]  # no figure: left out
        return [SimpleNamespace(pid=7, usedGpuMemory=3 * GiB)]

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_nvml_readings_name_devices_by_index_and_convert_units() -> None:
    nvml = FakeNvml()
    probe = NvmlProbe(nvml)
    reading = probe.read()
    assert reading.devices == (
        DeviceReading("gpu0", "NVIDIA H200", 80 * GiB, GiB, 37.0, 41.0, 212.5),
        DeviceReading("gpu1", "NVIDIA H200", 81 * GiB, 2 * GiB, None, None, None),
    )
    assert reading.processes == {7: {"gpu0": 3 * GiB}}
    probe.close()
    assert nvml.shut


def test_the_file_probe_counts_live_processes_only(tmp_path: Path) -> None:
    (tmp_path / "devices.json").write_text(json.dumps({"gpu0": {"total": 24 * GiB}}))
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps({"gpu0": 8 * GiB}))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its PID names no process
    (tmp_path / f"{gone.pid}.json").write_text(json.dumps({"gpu0": 4 * GiB}))
    reading = FileProbe(tmp_path).read()
    assert reading.devices == (DeviceReading("gpu0", "Fake GPU", 24 * GiB, 8 * GiB),)
    assert reading.processes == {os.getpid(): {"gpu0": 8 * GiB}}


def test_open_probe_picks_the_file_probe_or_says_why_there_is_none(tmp_path: Path) -> None:
    probe, absent = open_probe({FAKE_GPU_ENV: str(tmp_path)})
    assert (probe is not None and probe.name, absent) == ("file", "")
    probe, absent = open_probe({})
    # This machine has no NVIDIA driver; with nvidia-ml-py missing, it says so instead.
    assert probe is None
    assert absent.startswith(
        ("nvidia-ml-py is not installed", "NVML could not start", "NVML found")
    )


def test_a_process_tree_holds_the_children_of_a_wrapper() -> None:
    wrapper = subprocess.Popen(
        ["/bin/sh", "-c", f"{sys.executable} -c 'import sys; sys.stdin.read()'; :"],
        stdin=subprocess.PIPE,
    )
    try:
        trees: dict[int, set[int]] = {}
        for _ in range(200):  # the shell forks its child at once; look until it has
            trees = process_trees([wrapper.pid])
            if len(trees[wrapper.pid]) == 2:
                break
        assert len(trees[wrapper.pid]) == 2
        assert wrapper.pid in trees[wrapper.pid]
    finally:
        assert wrapper.stdin is not None
        wrapper.stdin.close()
        wrapper.wait(timeout=10)


def test_ram_is_the_cpu_device() -> None:
    device = ram()
    assert device is not None
    assert (device.name, device.total > device.used >= 0) == ("cpu", True)


def config(**memory: int) -> Config:
    models = {
        m: ModelConfig(cmd=("x",), memory={"gpu0": n} if n else {}) for m, n in memory.items()
    }
    return Config(models=models, devices={"cpu": DeviceConfig(memory=64 * GiB)})


def reading(**processes: int) -> Reading:
    pids = {int(pid[1:]): {"gpu0": size} for pid, size in processes.items()}
    return Reading((DeviceReading("gpu0", "GPU", 24 * GiB, 0),), pids)


def test_a_learned_figure_is_the_largest_seen_and_a_declared_one_wins() -> None:
    resources = Resources(config(a=0, d=5 * GiB))
    assert resources.need("a") is None
    assert resources.learn(reading(p1=3 * GiB, p2=2 * GiB), {"a": {1, 2}}) == ["a"]
    need = resources.need("a")
    assert need is not None
    assert (need.sizes, need.source) == ({"gpu0": 5 * GiB}, "learned")
    resources.learn(reading(p1=GiB), {"a": {1}})  # it holds less now: the figure stays
    assert resources.held("a") == {"gpu0": GiB}
    need = resources.need("a")
    assert need is not None
    assert need.sizes == {"gpu0": 5 * GiB}
    # Declared: what it holds is shown, and nothing is learned.
    assert resources.learn(reading(p3=9 * GiB), {"d": {3}}) == []
    need = resources.need("d")
    assert need is not None
    assert (need.sizes, need.source) == ({"gpu0": 5 * GiB}, "declared")
    assert resources.held("d") == {"gpu0": 9 * GiB}


def test_budgets_are_the_total_less_headroom_and_known_once_read() -> None:
    resources = Resources(config(a=0))
    assert resources.budget("gpu0") is None  # nothing declared, nothing read yet
    resources.learn(reading(), {})
    assert resources.budget("gpu0") == 24 * GiB - 512 * 2**20  # memoryHeadroom's default
    assert resources.budget("cpu") == 64 * GiB - 512 * 2**20  # declared
    assert resources.budget("gpu7") is None


def test_load_and_serve_times_are_medians_of_the_last_few() -> None:
    resources = Resources(config(a=0))
    for began, ready in ((0.0, 3.0), (10.0, 11.0), (20.0, 22.0)):
        resources.loading("a", began)
        resources.ready("a", ready)
    assert resources.load_seconds("a") == 2.0
    for seconds in (1.0, 9.0, 2.0):
        resources.served("a", seconds)
    assert resources.serve_seconds("a") == 2.0
    assert resources.load_seconds("b") is None
