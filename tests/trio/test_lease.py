"""Leases: parking, waking, abandoning, and the one in-flight count."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llamaswap.errors import ModelUnloaded
from llamaswap.router.lease import Lease, Leases
from llamaswap.schedulers import RequestState, Ticket


def admitted(leases: Leases, model: str = "m", seq: int = 0) -> Lease:
    lease = Lease(Ticket(model, seq=seq))
    leases.add(lease)
    return lease


async def test_grant_before_wait_returns_at_once() -> None:
    leases = Leases()
    lease = admitted(leases)
    assert leases.grant(lease.ticket)
    await lease.wait()
    assert lease.state is RequestState.SERVING
    assert leases.in_flight("m") == 1


async def test_grant_after_parking_resumes_the_task(nursery: trio.Nursery) -> None:
    leases = Leases()
    lease = admitted(leases)
    resumed = trio.Event()

    async def park() -> None:
        await lease.wait()
        resumed.set()

    nursery.start_soon(park)
    await trio.testing.wait_all_tasks_blocked()
    assert not resumed.is_set()
    leases.grant(lease.ticket)
    await resumed.wait()


async def test_fail_raises_the_error_and_counts_nothing_in_flight() -> None:
    leases = Leases()
    lease = admitted(leases)
    assert leases.fail(lease.ticket, ModelUnloaded("m"))
    with pytest.raises(ModelUnloaded):
        await lease.wait()
    assert leases.in_flight("m") == 0
    assert not leases.grant(lease.ticket)  # a decision about a request no longer waiting
    assert leases.in_flight("m") == 0


async def test_a_cancelled_lease_is_only_noted_as_abandoned() -> None:
    leases = Leases()
    lease = admitted(leases)
    with trio.CancelScope() as scope:
        scope.deadline = trio.current_time()  # cancels at the first checkpoint
        await lease.wait()
    assert scope.cancelled_caught
    assert lease.state is RequestState.ABANDONED
    assert list(leases.abandoned) == [lease]
    assert list(leases) == [lease]  # still admitted until the scheduler is told


async def test_a_woken_lease_is_not_abandoned_by_a_late_cancel() -> None:
    leases = Leases()
    lease = admitted(leases)
    leases.grant(lease.ticket)
    with trio.CancelScope() as scope:
        scope.cancel()
        await lease.wait()  # returns: what was granted is the caller's to release
    assert not scope.cancelled_caught
    assert lease.state is RequestState.SERVING
    assert not leases.abandoned


async def test_release_counts_out_and_drains(nursery: trio.Nursery) -> None:
    leases = Leases()
    first, second = admitted(leases, "a", 0), admitted(leases, "b", 1)
    leases.grant(first.ticket)
    leases.grant(second.ticket)
    drained = trio.Event()

    async def wait_drained() -> None:
        await leases.drained()
        drained.set()

    nursery.start_soon(wait_drained)
    leases.release(first)
    await trio.testing.wait_all_tasks_blocked()
    assert not drained.is_set()
    assert (leases.in_flight("a"), leases.in_flight("b")) == (0, 1)
    leases.release(second)
    await drained.wait()
    assert list(leases) == []
