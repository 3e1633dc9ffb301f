"""The Router with declared memory: the fit rule decides what a load evicts, costs come
from measured load times, and a held load starts when a residency ends (mock clock)."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from llamaswap.config.model import Config, DeviceConfig, ModelConfig
from llamaswap.process import ModelState
from llamaswap.router import Router
from tests.fakes import FakeProbe, FakeSpawner, Script, StateRecorder
from tests.trio.test_router import lease, model

GiB = 2**30


def sized(port: int, gib: int) -> ModelConfig:
    return model(port, memory={"gpu0": gib * GiB})


async def test_models_that_fit_run_together_and_a_load_evicts_the_cheapest_room(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = Config(
        models={"a": sized(1, 10), "b": sized(2, 8), "c": sized(3, 12)},
        devices={"gpu0": DeviceConfig(memory=24 * GiB, headroom=0)},
        min_residency=0,
    )
    probe = FakeProbe(spawner)
    router = Router(config, spawner=spawner, probe=probe, observers=[recorder.observe])
    await nursery.start(router.run)
    spawner.script = Script(healthy_after=4.0)  # a loads slowly: dear to evict
    async with lease(router, "a"):
        pass
    spawner.script = Script(healthy_after=1.0)
    async with lease(router, "b"):
        assert router.running_models() == {"a", "b"}  # 18 of 24 GiB: no eviction
    load_a, load_b = router.resources.load_seconds("a"), router.resources.load_seconds("b")
    assert (load_a or 0) > (load_b or 0) > 0
    caplog.set_level(logging.INFO, "llamaswap.router")
    async with lease(router, "c"):
        # c needs 12 GiB and 6 are free: evicting a or b makes room; b costs less.
        assert router.running_models() == {"a", "c"}
    assert "loading model 'c' (needs 12 GiB on gpu0, declared), evicting ['b']" in caplog.text
    assert ("a", ModelState.STOPPING) not in recorder.history
