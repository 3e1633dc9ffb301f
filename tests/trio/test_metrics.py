"""The metrics exposition, read from real scheduler and supervisor snapshots."""

from __future__ import annotations

import attrs
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from llamaswap.config.model import Config, ModelConfig, Routing, SchedulerSection
from llamaswap.observability import Metrics
from llamaswap.process import ModelStatistics, ModelSupervisor
from llamaswap.resources import Resources
from llamaswap.router import Router
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers import FifoScheduler, Scheduler, SchedulerCounts
from tests.fakes import FakeProbe, FakeSpawner, FakeWorld


@attrs.frozen
class Source:
    scheduler: Scheduler
    supervisors: dict[str, ModelSupervisor]
    retired_counts: SchedulerCounts = attrs.field(factory=SchedulerCounts)
    resources: Resources = attrs.field(factory=lambda: Resources(Config()))

    def known_models(self) -> list[str]:
        return list(self.supervisors)

    def statistics(self, model: str) -> ModelStatistics:
        return self.supervisors[model].statistics()


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
        assert f'llamaswap_scheduler_preemptions_total{{band="{band}"}} 0.0' in text
        assert f'llamaswap_scheduler_queue_wait_seconds_count{{band="{band}"}} 0.0' in text
    assert "llamaswap_scheduler_aging_changed_pick_total 0.0" in text
    assert "llamaswap_scheduler_affinity_changed_pick_total 0.0" in text
    assert 'llamaswap_model_state{model="m",state="stopped"} 1.0' in text
    assert 'llamaswap_in_flight_requests{model="m"} 0.0' in text
    # A model's series whose labels are known are there before anything happened to it.
    for result in ("ready", "failed", "cancelled"):
        assert f'llamaswap_model_loads_total{{model="m",result="{result}"}} 0.0' in text
    for kind in ("prompt", "completion"):
        assert f'llamaswap_tokens_total{{kind="{kind}",model="m"}} 0.0' in text
    assert 'llamaswap_request_duration_seconds_count{model="m"} 0.0' in text
    assert 'llamaswap_model_load_duration_seconds_count{model="m"} 0.0' in text


def scheduler_counters(metrics: Metrics) -> dict[str, float]:
    """The scheduler's counters in a scrape: ``dispatch_total`` by band, and the picks."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == "llamaswap_scheduler_dispatch_total":
                found[sample.labels["band"]] = sample.value
            elif sample.name.endswith("changed_pick_total"):
                found[sample.name.removeprefix("llamaswap_scheduler_")] = sample.value
    return found


def counters(interactive: int, normal: int, affinity: int) -> dict[str, float]:
    return {
        "above_interactive": 0.0,
        "interactive": float(interactive),
        "normal": float(normal),
        "batch": 0.0,
        "below_batch": 0.0,
        "aging_changed_pick_total": 0.0,
        "affinity_changed_pick_total": float(affinity),
    }


async def test_the_scheduler_counters_never_go_back_when_a_reload_switches_schedulers(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, spawner: FakeSpawner
) -> None:
    models = {
        name: ModelConfig(cmd=("server", str(port)), proxy=f"http://m:{port}")
        for name, port in (("a", 1), ("b", 2))
    }

    def using(scheduler: str) -> Config:  # 'a' and 'b' cannot run together
        return Config(models=models, routing=Routing(scheduler=SchedulerSection(use=scheduler)))  # type: ignore[arg-type]

    router = Router(using("serial"), spawner=spawner, probe=FakeProbe(spawner))
    metrics = Metrics(router)
    await nursery.start(router.run)
    await router.load("a", priority=100)
    served: list[str] = []
    both_served = trio.Event()

    async def request(model: str) -> None:
        async with router.acquire(router.lease(model)):
            served.append(model)
        if len(served) == 2:
            both_served.set()

    async with router.acquire(router.lease("a")):  # holds the slot: 'b', then 'a' queue
        for model in ("b", "a"):
            nursery.start_soon(request, model)
            await trio.testing.wait_all_tasks_blocked()
    with trio.fail_after(60):
        await both_served.wait()
    assert served == ["a", "b"]  # affinity put the later 'a' first
    assert scheduler_counters(metrics) == counters(interactive=1, normal=3, affinity=1)

    # Several switches between two scrapes; each scheduler's counts carry over, once.
    await router.reconfigure(using("fifo"))
    await request("a")
    await router.reconfigure(using("serial"))
    await router.reconfigure(using("fifo"))
    assert router.scheduler.statistics().bands["normal"].dispatched == 0  # a new one
    assert scheduler_counters(metrics) == counters(interactive=1, normal=4, affinity=1)
    await request("b")
    assert scheduler_counters(metrics) == counters(interactive=1, normal=5, affinity=1)
