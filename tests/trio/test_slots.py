"""Where the router saves and restores slots (``Router._swap``, ``_evict``): an evicted ready
model's before it stops, a loaded model's before its requests are granted, a removed
model's files forgotten once it is; and what a slow save does to a swap that is
cancelled or shut down. On the mock clock, with fake processes and a recording keeper
(the keeper itself: tests/unit/test_slot_files.py, tests/e2e/test_slots.py)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import final

import pytest
import trio
import trio.testing

from llamaswap.config.model import Config, ModelConfig
from llamaswap.process import ModelState
from llamaswap.router import Router
from llamaswap.router.lease import Lease
from tests.fakes import FakeProbe, FakeSpawner, StateRecorder

S = ModelState


@final
class RecordingSlots:
    """A ``Slots`` that records each call, with the model's state and the time; a save
    takes ``save_seconds`` (``inf``: it never ends)."""

    def __init__(self, *, save_seconds: float = 0.0) -> None:
        self.router: Router | None = None
        self.save_seconds = save_seconds
        self.calls: list[tuple[str, str, ModelState | None, float]] = []

    def _record(self, what: str, model: str) -> None:
        assert self.router is not None
        state = self.router.model_state(model) if model in self.router.known_models() else None
        self.calls.append((what, model, state, round(trio.current_time(), 6)))

    async def save(
        self, model: str, definition: ModelConfig, config: Config, *, loading: str
    ) -> None:
        assert definition.slot_save_path == f"/slots/{model}"
        assert loading != model
        self._record("save", model)
        await trio.sleep(self.save_seconds)
        self._record("saved", model)

    async def restore(self, model: str, definition: ModelConfig) -> None:
        self._record("restore", model)

    def forget(self, model: str, definition: ModelConfig) -> None:
        self._record("forget", model)


def model(port: int) -> ModelConfig:
    return ModelConfig(
        cmd=("server", str(port)),
        proxy=f"http://m:{port}",
        slot_save_path=f"/slots/{'ab'[port - 1]}",
    )


async def start(
    nursery: trio.Nursery, spawner: FakeSpawner, recorder: StateRecorder, slots: RecordingSlots
) -> Router:
    config = Config(models={"a": model(1), "b": model(2)})  # one at a time
    router = Router(
        config,
        spawner=spawner,
        probe=FakeProbe(spawner),
        observers=[recorder.observe],
        slots=slots,
    )
    slots.router = router
    await nursery.start(router.run)
    return router


def lease(router: Router, name: str) -> AbstractAsyncContextManager[Lease]:
    return router.acquire(router.lease(name))


async def test_an_evicted_model_is_saved_before_it_stops_and_a_load_restored_before_it_serves(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    slots = RecordingSlots(save_seconds=2.0)
    router = await start(nursery, spawner, recorder, slots)
    async with lease(router, "a"):
        # Ready at 1.0 (the fake's load), restored before the grant.
        assert slots.calls == [("restore", "a", S.READY, 1.0)]
    async with lease(router, "b"):
        assert slots.calls[1:] == [
            ("save", "a", S.READY, 1.0),  # still ready: its server answers
            ("saved", "a", S.READY, 3.0),
            ("restore", "b", S.READY, 4.0),  # b's load: 3.0 + 1.0
        ]
        assert recorder.history[2:] == [
            ("a", S.STOPPING),  # after the save
            ("a", S.STOPPED),
            ("b", S.STARTING),
            ("b", S.READY),
        ]


async def test_a_request_for_the_model_being_saved_waits_for_the_swap(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    slots = RecordingSlots(save_seconds=2.0)
    router = await start(nursery, spawner, recorder, slots)
    async with lease(router, "a"):
        pass
    served: list[tuple[str, float]] = []

    async def request(name: str) -> None:
        async with lease(router, name):
            served.append((name, round(trio.current_time(), 6)))

    async with trio.open_nursery() as requests:
        requests.start_soon(request, "b")
        await trio.testing.wait_all_tasks_blocked()
        assert slots.calls[-1][:2] == ("save", "a")
        # a is ready while it is saved, but it is being evicted: nothing is sent to it.
        requests.start_soon(request, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert served == []
    # a: once b's swap was over (4.0), b saved (2 s) and a loaded again (1 s; a poll).
    assert served == [("b", 4.0), ("a", pytest.approx(7.0, abs=0.05))]


async def test_a_load_cancelled_during_the_save_keeps_the_evicted_model(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    slots = RecordingSlots(save_seconds=float("inf"))
    router = await start(nursery, spawner, recorder, slots)
    async with lease(router, "a"):
        pass
    with trio.move_on_after(5.0):
        async with lease(router, "b"):
            pytest.fail("b's load waits for a save that never ends")
    await trio.testing.wait_all_tasks_blocked()
    # The save was cancelled with the swap; a was never stopped, and serves at once.
    assert [call[:2] for call in slots.calls] == [("restore", "a"), ("save", "a")]
    assert router.running_models() == {"a"}
    async with lease(router, "a"):
        assert trio.current_time() == 6.0
    assert recorder.states("b") == []


async def test_a_shutdown_during_a_save_is_not_held_up(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    slots = RecordingSlots(save_seconds=float("inf"))
    router = await start(nursery, spawner, recorder, slots)
    async with lease(router, "a"):
        pass

    async def request_b() -> None:
        with pytest.raises(Exception, match="shutting down"):
            async with lease(router, "b"):
                pytest.fail("b must not be served")

    nursery.start_soon(request_b)
    await trio.testing.wait_all_tasks_blocked()
    assert slots.calls[-1][:2] == ("save", "a")
    with trio.fail_after(30):
        await router.shutdown(grace=10.0)
    assert router.running_models() == set()


async def test_a_removed_model_is_forgotten_with_its_slots_once_stopped(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    slots = RecordingSlots()
    router = await start(nursery, spawner, recorder, slots)
    async with lease(router, "a"):
        await router.reconfigure(Config(models={"b": model(2)}))
        assert [call[:2] for call in slots.calls] == [("restore", "a")]  # not yet: it serves
    await recorder.wait_for(S.STOPPED, "a")
    await trio.testing.wait_all_tasks_blocked()
    assert slots.calls[-1][:3] == ("forget", "a", None)  # forgotten: no supervisor left
    assert "a" not in router.known_models()
