"""The fake server's GPU memory: ``--memory`` "allocated" in the GPU probe's test double.

The test double (``llamaswap.resources.probe.FileProbe``) is a directory holding
``devices.json`` (``{"gpu0": {"total": bytes, "name": "Fake GPU"}}``, written by the test)
and one ``PID.json`` (``{"gpu0": bytes}``) per fake server that holds memory. A fake
server started with ``--memory`` allocates once its load is over: it adds its own sizes
to those of the other live processes' files, and if that exceeds a device's ``total`` it
fails as llama.cpp does (``OutOfMemory.lines``); otherwise it writes its own file, which
it removes when it exits. A process killed outright leaves its file behind, and the files
of dead processes count for nothing, as the memory of a dead process is freed.

The check and the write happen under an exclusive lock on ``.lock`` in the directory, so
two servers loading at once cannot both take the last free bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["OutOfMemory", "allocate", "allocate_cuda", "release"]

_MIB = 2**20
_GPU = re.compile(r"gpu(\d+)")


class OutOfMemory(Exception):
    """The allocation does not fit on ``device``: ``held`` bytes are taken of ``total``."""

    def __init__(self, device: str, size: int, held: int, total: int) -> None:
        self.device, self.size, self.held, self.total = device, size, held, total
        super().__init__(f"{device}: {size} bytes asked, {held} of {total} taken")

    def lines(self) -> list[str]:
        """What llama.cpp prints to stderr when a CUDA buffer cannot be allocated."""
        match = _GPU.fullmatch(self.device)
        index = match[1] if match else self.device
        return [
            f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {self.size / _MIB:.2f} MiB "
            f"on device {index}: cudaMalloc failed: out of memory",
            f"alloc_tensor_range: failed to allocate CUDA{index} buffer of size {self.size}",
            f"llama_model_load: error loading model: unable to allocate CUDA{index} buffer",
            "llama_model_load_from_file_impl: failed to load model",
        ]


def allocate(directory: Path, sizes: Mapping[str, int], pid: int | None = None) -> Path:
    """Take ``sizes`` for process ``pid`` (this one by default): returns the file written.

    A device that ``devices.json`` does not list (or a missing ``devices.json``) is not
    checked. Raises OutOfMemory, for the first device in name order that overflows.
    """
    pid = os.getpid() if pid is None else pid
    own = directory / f"{pid}.json"
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        devices = _read(directory / "devices.json")
        held: dict[str, int] = {}
        for path in directory.glob("[0-9]*.json"):
            other = _pid(path)
            if other is None or other == pid or not _alive(other):
                continue
            for device, size in _read(path).items():
                if isinstance(size, int):
                    held[device] = held.get(device, 0) + size
        for device, size in sorted(sizes.items()):
            listed = devices.get(device)
            total = listed.get("total") if isinstance(listed, dict) else None
            if isinstance(total, int) and held.get(device, 0) + size > total:
                raise OutOfMemory(device, size, held.get(device, 0), total)
        # Atomically: a probe reading meanwhile sees no file or the whole of it. The
        # temporary name does not end in .json, so no reader takes it for a process's.
        temporary = directory / f".{pid}.json.tmp"
        temporary.write_text(json.dumps(dict(sizes)))
        temporary.replace(own)
    return own


def release(path: Path) -> None:
    """Give the memory back: remove the file ``allocate`` wrote."""
    with contextlib.suppress(OSError):
        path.unlink()


def _read(path: Path) -> dict[str, object]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):  # gone meanwhile, or not ours to judge
        return {}
    return document if isinstance(document, dict) else {}


def _pid(path: Path) -> int | None:
    try:
        return int(path.stem)
    except ValueError:
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, and not a zombie (its memory is freed)."""
    if not os.path.isdir("/proc"):  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's, and alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def allocate_cuda(sizes: Mapping[str, int]) -> list[object]:
    """Allocate ``sizes`` for real (``--cuda``): ``gpuN`` on PyTorch's ``cuda:N``, every
    byte written so that the driver backs it. The caller keeps the tensors for as long as
    the memory is to be held. Raises PyTorch's error (``torch.OutOfMemoryError``)."""
    import torch  # only on a machine with a GPU and PyTorch: not a dependency

    tensors: list[object] = []
    for device, size in sizes.items():
        match = _GPU.fullmatch(device)
        if match is None:
            raise ValueError(f"--cuda allocates on gpuN devices only, not {device!r}")
        tensor = torch.empty(size, dtype=torch.uint8, device=f"cuda:{match[1]}")
        tensor.fill_(1)
        torch.cuda.synchronize(tensor.device)
        tensors.append(tensor)
    return tensors
