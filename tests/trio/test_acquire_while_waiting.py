"""What ``Router.acquire``'s ``while_waiting`` may end a wait with, on the mock clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llamaswap.errors import BodyTooLarge
from llamaswap.router.lease import Lease
from tests.fakes import FakeSpawner, StateRecorder
from tests.trio.test_router import model, start_router


async def test_a_request_error_from_while_waiting_is_raised_as_it_is(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    """As the forwarder's body read ahead raises it: its caller catches a RequestError,
    not the wait's ExceptionGroup (which was an empty 500 with a traceback)."""
    router = await start_router(nursery, spawner, recorder, a=model(1))

    async def too_large(lease: Lease) -> None:
        await trio.sleep(0.25)  # the model is loading: healthy after 1 s
        raise BodyTooLarge(1000)

    with pytest.raises(BodyTooLarge) as raised:
        async with router.acquire(router.lease("a"), while_waiting=too_large):
            pytest.fail("the block must not run: the request failed")
    assert raised.value.limit == 1000
    assert trio.current_time() == 0.25
    assert router.requests() == []


async def test_a_cancelled_wait_with_while_waiting_is_still_a_cancellation(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    spawner: FakeSpawner,
    recorder: StateRecorder,
) -> None:
    router = await start_router(nursery, spawner, recorder, a=model(1))

    async def waits(lease: Lease) -> None:
        await trio.sleep_forever()

    with trio.move_on_after(0.5) as scope:
        async with router.acquire(router.lease("a"), while_waiting=waits):
            pytest.fail("the block must not run: the request was cancelled")
    assert scope.cancelled_caught
    assert router.requests() == []
