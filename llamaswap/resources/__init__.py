"""What the GPUs hold and what fits: budgets, each model's memory, load and serve times.

``probe.py`` reads the devices (NVML, or the test double's files); ``book.py`` keeps what
is declared and learned (``Resources``); ``fit.py`` is the placement rule the swappers
apply; ``eta.py`` estimates when a waiting request starts.
"""

from .book import DeviceView, FigureStore, ModelMemory, Need, Resources, format_size
from .fit import Placement, applies, make_room
from .oom import out_of_memory
from .probe import FAKE_GPU_ENV, DeviceReading, FileProbe, GpuProbe, NvmlProbe, Reading, open_probe

__all__ = [
    "FAKE_GPU_ENV",
    "DeviceReading",
    "DeviceView",
    "FigureStore",
    "FileProbe",
    "GpuProbe",
    "ModelMemory",
    "Need",
    "NvmlProbe",
    "Placement",
    "Reading",
    "Resources",
    "applies",
    "format_size",
    "make_room",
    "open_probe",
    "out_of_memory",
]
