"""``fifo`` as a pure state machine against a recording FakeWorld."""

from __future__ import annotations

import pytest

from llamaswap.config.model import GroupConfig, MatrixConfig
from llamaswap.errors import ConcurrencyLimit, ModelStartFailed, ModelUnloaded, ShuttingDown
from llamaswap.process.state import ModelState
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.router.swappers.matrix import MatrixSwapper
from llamaswap.schedulers.base import RequestState, Ticket
from llamaswap.schedulers.fifo import FifoScheduler
from tests.fakes import Driven, FakeWorld, ticket

READY = ModelState.READY


def make(
    world: FakeWorld,
    *,
    limits: dict[str, int] | None = None,
    priorities: dict[str, int] | None = None,
    groups: dict[str, GroupConfig] | None = None,
) -> Driven[FifoScheduler]:
    scheduler = FifoScheduler(
        world, GroupSwapper(groups or {}), limits=limits or {}, priorities=priorities
    )
    return Driven(scheduler, world)


def test_ready_model_is_served_at_once_in_parallel() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = make(fx)
    first, second = ticket("a", 1), ticket("a", 2)
    s.on_request(first)
    s.on_request(second)
    assert fx.granted == [first, second]
    assert first.state is RequestState.SERVING
    assert fx.swaps == []


def test_stopped_model_starts_a_swap_that_evicts_the_running_one() -> None:
    fx = FakeWorld()
    fx.states["b"] = READY
    s = make(fx)
    t = ticket("a", 1)
    s.on_request(t)
    swap = fx.last_swap()
    assert (swap.target, swap.evict, swap.waiters) == ("a", frozenset({"b"}), [t])
    assert t.state is RequestState.LOADING
    fx.complete(s, swap)
    assert fx.granted == [t]


def test_requests_join_the_load_in_progress() -> None:
    fx = FakeWorld()
    s = make(fx)
    tickets = [ticket("a", i) for i in range(3)]
    for t in tickets:
        s.on_request(t)
    assert len(fx.swaps) == 1
    assert fx.last_swap().waiters == tickets
    fx.complete(s, fx.last_swap())
    assert fx.granted == tickets


def test_busy_model_is_never_evicted() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = make(fx)
    serving = ticket("a", 1)
    s.on_request(serving)
    waiting = ticket("b", 2)
    s.on_request(waiting)
    assert fx.swaps == []
    assert waiting.state is RequestState.QUEUED
    s.on_finish(serving)
    assert fx.last_swap().target == "b"
    assert fx.last_swap().evict == {"a"}


def test_same_model_requests_collate() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    blocker = ticket("x", 0)
    s.on_request(blocker)
    a1, b1, a2, b2 = ticket("a", 1), ticket("b", 2), ticket("a", 3), ticket("b", 4)
    for t in (a1, b1, a2, b2):
        s.on_request(t)
    assert fx.swaps == []
    assert s.scheduler.queued() == [a1, a2, b1, b2]  # the order they will be served in
    s.on_finish(blocker)
    swap_a = fx.last_swap()
    assert swap_a.waiters == [a1, a2]
    fx.complete(s, swap_a)
    assert fx.granted[1:] == [a1, a2]
    assert b1.state is RequestState.QUEUED  # would evict 'a', which is serving
    s.on_finish(a1)
    assert b1.state is RequestState.QUEUED
    s.on_finish(a2)
    swap_b = fx.last_swap()
    assert swap_b.waiters == [b1, b2]
    fx.complete(s, swap_b)
    assert fx.granted_models() == ["x", "a", "a", "b", "b"]


def test_queue_order_is_effective_priority_then_arrival() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx, priorities={"b": 10})
    blocker = ticket("x", 0)
    s.on_request(blocker)
    a_old, b_low, a_high, c_same = (
        ticket("a", 1),
        ticket("b", 2, priority=-5),  # 10 - 5 = 5
        ticket("a", 3, priority=100),
        ticket("c", 4, priority=5),
    )
    for t in (a_old, b_low, a_high, c_same):
        s.on_request(t)
    assert [t.effective_priority for t in (a_old, b_low, a_high, c_same)] == [0, 5, 100, 5]
    # The queue is a_high, b_low, c_same, a_old; a_old is listed (and served) with a_high.
    assert [s.position(t) for t in (a_high, a_old, b_low, c_same)] == [1, 2, 3, 4]
    s.on_finish(blocker)
    # 'a' goes first (a_high), and a_old collates with it; then b before c.
    assert fx.last_swap().waiters == [a_high, a_old]
    assert s.position(a_high) is None
    assert (s.position(b_low), s.position(c_same)) == (1, 2)


def test_concurrency_limit_counts_waiting_and_serving() -> None:
    fx = FakeWorld()
    s = make(fx, limits={"a": 2})
    first, second = ticket("a", 1), ticket("a", 2)
    s.on_request(first)
    s.on_request(second)
    with pytest.raises(ConcurrencyLimit) as caught:
        s.on_request(ticket("a", 3))
    assert "concurrencyLimit" in str(caught.value)
    s.on_cancel(first)
    s.on_request(ticket("a", 4))  # a place freed
    fx.complete(s, fx.last_swap())
    with pytest.raises(ConcurrencyLimit):
        s.on_request(ticket("a", 5))
    s.on_finish(second)
    s.on_request(ticket("a", 6))
    assert fx.serving["a"] == 2


def test_cancel_while_queued_never_loads() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    blocker = ticket("x", 0)
    s.on_request(blocker)
    gone = ticket("a", 1)
    s.on_request(gone)
    s.on_cancel(gone)
    s.on_finish(blocker)
    assert fx.swaps == []
    assert gone.state is RequestState.DONE
    assert s.statistics().waiting == 0


def test_cancelling_the_last_waiter_cancels_the_load() -> None:
    fx = FakeWorld()
    s = make(fx)
    first, second = ticket("a", 1), ticket("a", 2)
    s.on_request(first)
    s.on_request(second)
    swap = fx.last_swap()
    s.on_cancel(first)
    assert fx.cancelled == []
    s.on_cancel(second)
    assert fx.cancelled == [(swap, "every request waiting for 'a' has left")]
    s.on_swap_done(swap, ModelUnloaded("a", "cancelled"))  # its task reports late: ignored
    assert (fx.granted, fx.failed) == ([], [])
    s.on_request(third := ticket("a", 3))
    assert fx.last_swap() is not swap
    assert fx.last_swap().waiters == [third]


def test_cancelled_load_unblocks_colliding_requests() -> None:
    fx = FakeWorld()
    s = make(fx)
    a, b = ticket("a", 1), ticket("b", 2)
    s.on_request(a)
    s.on_request(b)
    assert b.state is RequestState.QUEUED  # b would evict a, the target of a swap
    s.on_cancel(a)
    assert fx.last_swap().target == "b"


def test_parallel_swaps_when_they_do_not_collide() -> None:
    fx = FakeWorld()
    groups = {
        "g1": GroupConfig(members=("a", "b"), exclusive=False),
        "g2": GroupConfig(members=("c", "d"), exclusive=False),
    }
    s = make(fx, groups=groups)
    s.on_request(ticket("a", 1))
    s.on_request(ticket("c", 2))
    assert [(w.target, w.evict) for w in fx.swaps] == [("a", frozenset()), ("c", frozenset())]
    s.on_request(ticket("b", 3))  # would evict 'a', a swap target: waits
    assert len(fx.swaps) == 2


def test_failed_load_fails_every_waiter_and_the_next_request_retries() -> None:
    fx = FakeWorld()
    s = make(fx)
    waiters = [ticket("a", 1), ticket("a", 2)]
    for t in waiters:
        s.on_request(t)
    error = ModelStartFailed("a", "exited with status 1 while starting")
    fx.complete(s, fx.last_swap(), error)
    assert fx.failed == [(waiters[0], error), (waiters[1], error)]
    assert s.statistics().loading == 0
    s.on_request(ticket("a", 3))
    assert len(fx.swaps) == 2


def test_unload_fails_waiters_of_that_model_only() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    blocker = ticket("x", 0)
    s.on_request(blocker)
    queued_a, queued_b = ticket("a", 1), ticket("b", 2)
    s.on_request(queued_a)
    s.on_request(queued_b)
    s.on_unload(["a"])
    assert [(t.model, type(e)) for t, e in fx.failed] == [("a", ModelUnloaded)]
    assert "unloaded" in str(fx.failed[0][1])
    assert queued_b.state is RequestState.QUEUED


def test_unload_of_a_loading_model_cancels_its_swap() -> None:
    fx = FakeWorld()
    s = make(fx)
    loading = ticket("a", 1)
    s.on_request(loading)
    swap = fx.last_swap()
    s.on_unload(["a"])
    assert fx.cancelled == [(swap, "unloaded")]
    assert [t for t, _ in fx.failed] == [loading]


def test_shutdown_fails_everything_and_refuses_new_requests() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    serving = ticket("x", 0)
    s.on_request(serving)
    queued, loading = ticket("a", 1), ticket("x", 2)
    s.on_request(queued)
    s.on_shutdown(ShuttingDown())
    assert [t for t, _ in fx.failed] == [queued]
    with pytest.raises(ShuttingDown):
        s.on_request(loading)
    s.on_finish(serving)
    assert fx.swaps == []


def test_crash_of_a_busy_blocker_rechecks_the_queue() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    blocker = ticket("x", 0)
    s.on_request(blocker)
    s.on_request(ticket("a", 1))
    s.on_finish(blocker)
    assert fx.last_swap().evict == {"x"}


def test_statistics_by_band() -> None:
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    s.on_request(ticket("x", 0, priority=100))
    s.on_request(ticket("a", 1, priority=-100, arrival=1.0))
    s.on_request(ticket("a", 2, priority=-100, arrival=3.0))
    fx.time = 5.0
    stats = s.statistics()
    assert stats.bands["batch"].depth == 2
    assert stats.bands["batch"].oldest_wait == 4.0
    assert stats.bands["interactive"].dispatched == 1
    assert stats.bands["normal"].depth == 0
    assert set(stats.bands) == {
        "above_interactive",
        "interactive",
        "normal",
        "batch",
        "below_batch",
    }


def test_statistics_count_what_the_queue_view_lists() -> None:
    """Every request not yet dispatched is in the queue (blocked behind a busy model, or
    colliding with a load), so the depth and the waiting count match ``queued()``."""
    fx = FakeWorld()
    fx.states["x"] = READY
    s = make(fx)
    s.on_request(ticket("x", 0))  # serving: 'x' is busy
    s.on_request(ticket("a", 1, priority=-100))  # would evict busy 'x'
    s.on_request(ticket("b", 2))
    stats = s.statistics()
    assert [t.seq for t in s.scheduler.queued()] == [2, 1]
    assert stats.waiting == sum(band.depth for band in stats.bands.values()) == 2


# b and c run together; a runs beside one of them; evicting c costs more.
B_C_OR_A_WITH_ONE = MatrixConfig(
    vars={"a": "a", "b": "b", "c": "c"},
    evict_costs={"c": 5},
    sets={"pair": "b & c", "with_b": "a & b", "with_c": "a & c"},
)


def test_matrix_keeps_a_busy_model_when_another_set_fits() -> None:
    fx = FakeWorld()
    fx.states.update(b=READY, c=READY)
    s = Driven(FifoScheduler(fx, MatrixSwapper(B_C_OR_A_WITH_ONE), limits={}), fx)
    s.on_request(serving := ticket("b", 1))
    s.on_request(loading := ticket("a", 2))
    # Evicting b would be cheaper, but b is serving: a loads at once beside it instead.
    assert fx.last_swap().evict == {"c"}
    assert loading.state is RequestState.LOADING
    assert fx.granted == [serving]


def test_matrix_waits_when_every_set_evicts_a_busy_model_then_picks_again() -> None:
    fx = FakeWorld()
    fx.states.update(b=READY, c=READY)
    s = Driven(FifoScheduler(fx, MatrixSwapper(B_C_OR_A_WITH_ONE), limits={}), fx)
    s.on_request(on_b := ticket("b", 1))
    s.on_request(on_c := ticket("c", 2))
    s.on_request(waiting := ticket("a", 3))
    assert fx.swaps == []
    assert waiting.state is RequestState.QUEUED
    s.on_finish(on_c)  # c drained: evicting it is dearer than b, but needs no wait
    assert fx.last_swap().evict == {"c"}
    fx.complete(s, fx.last_swap())
    assert fx.granted == [on_b, on_c, waiting]


def test_matrix_loads_beside_a_model_being_loaded_when_another_set_fits() -> None:
    fx = FakeWorld()
    fx.states.update(b=READY)
    costly_b = MatrixConfig(
        vars=B_C_OR_A_WITH_ONE.vars, evict_costs={"b": 5}, sets=B_C_OR_A_WITH_ONE.sets
    )
    s = Driven(FifoScheduler(fx, MatrixSwapper(costly_b), limits={}), fx)
    s.on_request(on_c := ticket("c", 1))
    c_load = fx.last_swap()
    assert (c_load.target, c_load.evict) == ("c", frozenset())  # b and c fit together
    s.on_request(on_a := ticket("a", 2))
    # Evicting c would be cheaper, but c is loading: a swap that stopped it would wait for
    # that load. Evicting idle b instead, a loads at once, beside c's load.
    a_load = fx.last_swap()
    assert (a_load.target, a_load.evict) == ("a", frozenset({"b"}))
    assert on_a.state is RequestState.LOADING
    fx.complete(s, c_load)
    fx.complete(s, a_load)
    assert fx.granted == [on_c, on_a]


def residency_case(
    *, now: float, b_priority: int = 0, a_waits: bool = True
) -> tuple[FakeWorld, Driven[FifoScheduler], Ticket]:
    """``a`` became ready at 0 and is idle; ``c`` beside it serves one request, which
    ``a``'s own waiting request (if ``a_waits``) and one for ``b`` wait behind. At ``now``
    the request for ``c`` finishes: does ``b``'s load evict ``a``? (``minResidency`` 5 s.)"""
    fx = FakeWorld()
    s = Driven(FifoScheduler(fx, GroupSwapper({}), limits={}, min_residency=5.0), fx)
    fx.states["c"] = READY
    s.on_request(on_c := ticket("c", 0))
    # 'a' beside 'c', though neither may run with the other: a state the router never
    # makes (under fifo a ready model's requests run at once), but the ledger's rule holds.
    fx.states["a"] = READY
    fx.ready["a"] = 0.0
    s.on_request(on_b := ticket("b", 1, priority=b_priority))
    if a_waits:
        s.on_request(ticket("a", 2))  # waits for c, which a evicts
    assert fx.swaps == []
    fx.time = now
    s.on_finish(on_c)
    return fx, s, on_b


@pytest.mark.parametrize("b_priority", [0, 49])  # 49: higher, but in the same band
def test_a_model_in_its_residency_is_kept_for_its_waiting_requests(b_priority: int) -> None:
    fx, _, on_b = residency_case(now=1.0, b_priority=b_priority)
    assert [swap.target for swap in fx.swaps] == ["a"]  # a's own request goes, not b's
    assert on_b.state is RequestState.QUEUED
    assert fx.rechecks == [5.0]  # when a may go


def test_a_higher_band_evicts_a_model_in_its_residency() -> None:
    fx, _, on_b = residency_case(now=1.0, b_priority=100)
    assert [(s.target, s.evict) for s in fx.swaps] == [("b", frozenset({"a", "c"}))]
    assert on_b.state is RequestState.LOADING
    assert fx.rechecks == []


def test_a_model_is_evicted_once_its_residency_is_over() -> None:
    fx, _, on_b = residency_case(now=5.0)
    assert [swap.target for swap in fx.swaps] == ["b"]
    assert on_b.state is RequestState.LOADING


def test_a_model_with_no_waiting_request_is_evicted_at_once() -> None:
    fx, _, _ = residency_case(now=1.0, a_waits=False)
    assert [swap.target for swap in fx.swaps] == ["b"]
    assert fx.rechecks == []
