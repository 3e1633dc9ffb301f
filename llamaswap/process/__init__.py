"""Model processes: one supervisor per model owns its server process."""

from __future__ import annotations

from .health import HttpProbe as HttpProbe
from .health import Probe as Probe
from .lifeline import Lifeline as Lifeline
from .lifeline import open_lifeline as open_lifeline
from .logring import LogLine as LogLine
from .logring import LogRing as LogRing
from .slots import NoSlots as NoSlots
from .slots import SlotKeeper as SlotKeeper
from .slots import Slots as Slots
from .spawn import ProcessHandle as ProcessHandle
from .spawn import Spawner as Spawner
from .spawn import SubprocessSpawner as SubprocessSpawner
from .state import ModelState as ModelState
from .supervisor import ModelStatistics as ModelStatistics
from .supervisor import ModelSupervisor as ModelSupervisor
from .supervisor import StartFailure as StartFailure
from .supervisor import StateListener as StateListener

__all__ = [
    "HttpProbe",
    "Lifeline",
    "LogLine",
    "LogRing",
    "ModelState",
    "ModelStatistics",
    "ModelSupervisor",
    "NoSlots",
    "Probe",
    "ProcessHandle",
    "SlotKeeper",
    "Slots",
    "Spawner",
    "StartFailure",
    "StateListener",
    "SubprocessSpawner",
    "open_lifeline",
]
