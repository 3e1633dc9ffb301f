"""The metrics exposition, read from real scheduler and supervisor snapshots."""

from __future__ import annotations

import attrs
import trio

from llamaswap.config.model import Config, ModelConfig
from llamaswap.observability import Metrics
from llamaswap.process import ModelSupervisor
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers import FifoScheduler, Scheduler
from tests.fakes import FakeProbe, FakeSpawner, FakeWorld


@attrs.frozen
class Source:
    scheduler: Scheduler
    supervisors: dict[str, ModelSupervisor]


async def test_metrics_has_every_band_from_the_start(nursery: trio.Nursery) -> None:
    world = FakeWorld()
    spawner = FakeSpawner(nursery)
    scheduler = FifoScheduler(world, GroupSwapper({}), limits={})
    config = Config(models={"m": ModelConfig(cmd=("x",), proxy="http://m")})
    supervisors = {
        "m": ModelSupervisor(
            "m",
            config.models["m"],
            spawner=spawner,
            probe=FakeProbe(spawner),
            health_check_timeout=1.0,
        )
    }
    text = Metrics(Source(scheduler, supervisors)).exposition().decode()
    for band in ("above_interactive", "interactive", "normal", "batch", "below_batch"):
        assert f'llamaswap_scheduler_queue_depth{{band="{band}"}} 0.0' in text
        assert f'llamaswap_scheduler_queue_oldest_wait_seconds{{band="{band}"}} 0.0' in text
        assert f'llamaswap_scheduler_dispatch_total{{band="{band}"}} 0.0' in text
        assert f'llamaswap_scheduler_queue_wait_seconds_count{{band="{band}"}} 0.0' in text
    assert "llamaswap_scheduler_aging_changed_pick_total 0.0" in text
    assert "llamaswap_scheduler_affinity_changed_pick_total 0.0" in text
    assert 'llamaswap_model_state{model="m",state="stopped"} 1.0' in text
    assert 'llamaswap_in_flight_requests{model="m"} 0.0' in text
