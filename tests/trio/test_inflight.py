"""The router's side of /api/inflight: finding a request by id, what it shows."""

from __future__ import annotations

import trio
import trio.testing

from tests.fakes import FakeSpawner, Script, StateRecorder
from tests.trio.test_router import model, start_router


async def test_lease_by_id_finds_an_admitted_request_until_it_is_released(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    spawner = FakeSpawner(nursery, Script(healthy_after=1.0))
    router = await start_router(nursery, spawner, StateRecorder(), a=model(1))
    pending = router.lease("a", client="10.0.0.2:4000", route="POST /v1/completions")
    other = router.lease("a")
    assert router.lease_by_id(pending.id) is None  # not admitted yet
    async with router.acquire(pending):
        assert router.lease_by_id(pending.id) is pending
        assert router.lease_by_id(other.id) is None
        (shown,) = router.requests()
        assert (shown.id, shown.state) == (pending.id, "serving")
        assert (shown.client, shown.route) == ("10.0.0.2:4000", "POST /v1/completions")
    assert router.lease_by_id(pending.id) is None
    assert (other.info().client, other.info().route) == (None, "")
