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
from tests.trio.test_router import lease, model, start_router

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


async def test_a_request_queued_behind_a_busy_model_has_its_model_prefetched(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    # Its admission decides nothing (b would evict a, which is busy): the prefetcher is
    # told all the same, and b is what the queue loads next.
    b = model(2, files=("/nonexistent/b.gguf",))
    router = await start_router(nursery, spawner, recorder, a=model(1), b=b)
    async with lease(router, "a"), trio.open_nursery() as waiting:
        await trio.sleep(1)  # past the prefetcher's throttle: it saw a's grant
        planned = [router.prefetcher.current]
        waiting.start_soon(router.load, "b")
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(1)
        planned.append(router.prefetcher.current)
        assert planned == [None, "b"]
        waiting.cancel_scope.cancel()
