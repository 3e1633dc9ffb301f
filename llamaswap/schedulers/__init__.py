"""Who goes next: the scheduler protocol, ``fifo``, ``serial``, the wait queue, priorities."""

from __future__ import annotations

from llamaswap.config.model import Config

from .base import CancelSwap as CancelSwap
from .base import Decision as Decision
from .base import Fail as Fail
from .base import Grant as Grant
from .base import Handover as Handover
from .base import JoinSwap as JoinSwap
from .base import Preempt as Preempt
from .base import Recheck as Recheck
from .base import RequestState as RequestState
from .base import Scheduler as Scheduler
from .base import SchedulerCounts as SchedulerCounts
from .base import SchedulerStatistics as SchedulerStatistics
from .base import StartSwap as StartSwap
from .base import Swap as Swap
from .base import Swapper as Swapper
from .base import Ticket as Ticket
from .base import World as World
from .base import needs_slot as needs_slot
from .fifo import FifoScheduler as FifoScheduler
from .priority import BANDS as BANDS
from .priority import band_of as band_of
from .priority import parse_priority as parse_priority
from .serial import SerialScheduler as SerialScheduler
from .settings import fifo_priorities, limits, model_slots
from .waitqueue import PriorityWaitQueue as PriorityWaitQueue

__all__ = [
    "BANDS",
    "CancelSwap",
    "Decision",
    "Fail",
    "FifoScheduler",
    "Grant",
    "Handover",
    "JoinSwap",
    "Preempt",
    "PriorityWaitQueue",
    "Recheck",
    "RequestState",
    "Scheduler",
    "SchedulerCounts",
    "SchedulerStatistics",
    "SerialScheduler",
    "StartSwap",
    "Swap",
    "Swapper",
    "Ticket",
    "World",
    "band_of",
    "make_scheduler",
    "needs_slot",
    "parse_priority",
]


def make_scheduler(config: Config, world: World, swapper: Swapper) -> Scheduler:
    """The scheduler named by ``routing.scheduler.use``."""
    section = config.routing.scheduler
    if section.use == "serial":
        serial = section.settings.serial
        return SerialScheduler(
            world,
            swapper,
            limits=limits(config),
            aging_divisor=serial.aging_divisor,
            swap_affinity_bonus=serial.swap_affinity_bonus,
            max_queued=serial.max_queued,
            slots=serial.slots,
            model_slots=model_slots(config),
            min_residency=config.min_residency,
            preempt=serial.preempt,
            max_preemptions=serial.max_preemptions,
        )
    return FifoScheduler(
        world,
        swapper,
        limits=limits(config),
        priorities=fifo_priorities(config),
        min_residency=config.min_residency,
    )
