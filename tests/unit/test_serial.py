"""``serial`` as a pure state machine against a recording FakeWorld."""

from __future__ import annotations

import sys
import textwrap

import pytest

from llamaswap.config import Config, loads_config
from llamaswap.config.model import GroupConfig
from llamaswap.errors import (
    ConcurrencyLimit,
    ModelStartFailed,
    ModelUnloaded,
    QueueFull,
    ShuttingDown,
)
from llamaswap.process.state import ModelState
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers import make_scheduler
from llamaswap.schedulers.base import (
    BandStatistics,
    Fail,
    Handover,
    RequestState,
    Scheduler,
    SchedulerCounts,
    Ticket,
)
from llamaswap.schedulers.serial import SerialScheduler
from tests.fakes import Driven, FakeWorld, ticket
from tests.unit.ports import every_port_free

READY = ModelState.READY


def make(
    world: FakeWorld,
    *,
    aging: float = 60.0,
    bonus: int = 10,
    limits: dict[str, int] | None = None,
    groups: dict[str, GroupConfig] | None = None,
) -> Driven[SerialScheduler]:
    scheduler = SerialScheduler(
        world,
        GroupSwapper(groups or {}),
        limits=limits or {},
        aging_divisor=aging,
        swap_affinity_bonus=bonus,
    )
    return Driven(scheduler, world)


def hold_slot(fx: FakeWorld, s: Driven[SerialScheduler], model: str = "x") -> Ticket:
    """Put a request for a ready ``model`` in the slot, so later ones queue."""
    fx.states[model] = READY
    blocker = ticket(model, 0, arrival=fx.time)
    s.on_request(blocker)
    assert fx.granted[-1] is blocker
    return blocker


def order_served(fx: FakeWorld, s: Driven[SerialScheduler], blocker: Ticket) -> list[Ticket]:
    """Release the slot repeatedly, completing loads, and return the dispatch order."""
    served: list[Ticket] = []
    current = blocker
    while True:
        before = len(fx.granted), len(fx.swaps)
        s.on_finish(current)
        if len(fx.swaps) > before[1]:
            fx.complete(s, fx.last_swap())
        if len(fx.granted) == before[0]:
            return served
        current = fx.granted[-1]
        served.append(current)


def test_one_request_at_a_time_across_models() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s, "a")
    same_model = ticket("a", 1)
    s.on_request(same_model)
    assert same_model.state is RequestState.QUEUED  # even a ready model waits for the slot
    assert s.statistics().slot_holder == "a"
    assert order_served(fx, s, blocker) == [same_model]


def test_bands_and_offsets_inside_a_band() -> None:
    fx = FakeWorld()
    s = make(fx, bonus=0)
    blocker = hold_slot(fx, s)
    batch = ticket("a", 1, priority=-100)
    normal = ticket("a", 2, priority=0)
    interactive = ticket("a", 3, priority=100)
    interactive_vip = ticket("a", 4, priority=105)
    above = ticket("a", 5, priority=1000)
    for t in (batch, normal, interactive, interactive_vip, above):
        s.on_request(t)
    assert order_served(fx, s, blocker) == [above, interactive_vip, interactive, normal, batch]


def test_ties_go_to_the_earliest_arrival() -> None:
    fx = FakeWorld()
    s = make(fx, aging=0.0, bonus=0)
    blocker = hold_slot(fx, s)
    tickets = [ticket("a", i, arrival=0.0) for i in range(1, 5)]
    for t in reversed(tickets):  # seq, not insertion order, decides
        s.on_request(t)
    assert order_served(fx, s, blocker) == sorted(tickets, key=lambda t: t.seq)


def test_affinity_beats_an_older_equal_priority_request() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s, "a")
    older_b = ticket("b", 1, arrival=1.0)
    newer_a = ticket("a", 2, arrival=2.0)
    s.on_request(older_b)
    s.on_request(newer_a)
    fx.time = 3.0
    s.on_finish(blocker)
    assert fx.granted[-1] is newer_a  # 'a' is loaded: +10 beats one second of aging
    assert newer_a.score == pytest.approx(10 + 1 / 60)
    assert s.statistics().affinity_changed_picks == 1


def test_affinity_never_beats_a_full_band_and_is_capped_at_99() -> None:
    fx = FakeWorld()
    s = make(fx, aging=0.0, bonus=5000)  # configured far above the cap
    blocker = hold_slot(fx, s, "a")
    loaded = ticket("a", 1, priority=0)
    band_above = ticket("b", 2, priority=100)
    s.on_request(loaded)
    s.on_request(band_above)
    assert order_served(fx, s, blocker)[0] is band_above


def test_at_99_higher_affinity_ties_and_arrival_decides() -> None:
    fx = FakeWorld()
    s = make(fx, aging=0.0, bonus=99)
    blocker = hold_slot(fx, s, "a")
    loaded = ticket("a", 1, priority=0)  # 0 + 99
    higher = ticket("b", 2, priority=99)  # 99 + 0, arrived later
    s.on_request(higher)
    s.on_request(loaded)
    s.on_finish(blocker)
    assert fx.granted[-1] is loaded


@pytest.mark.parametrize(("interactive_arrival", "first"), [(11999.5, "a"), (12000.5, "b")])
def test_aging_overtakes_exactly_when_the_bands_are_closed(
    interactive_arrival: float, first: str
) -> None:
    # batch (-100) at t=0 versus interactive (+100): 200 points apart, 60 s per point,
    # so an interactive request arriving more than 12 000 s later loses to the old batch.
    fx = FakeWorld()
    s = make(fx, bonus=0)
    blocker = hold_slot(fx, s)
    s.on_request(ticket("b", 1, priority=-100, arrival=0.0))
    s.on_request(ticket("a", 2, priority=100, arrival=interactive_arrival))
    fx.time = 13000.0
    s.on_finish(blocker)
    assert fx.last_swap().target == first
    assert s.statistics().aging_changed_picks == (1 if first == "b" else 0)


def test_aging_zero_restores_strict_priority_then_arrival() -> None:
    fx = FakeWorld()
    s = make(fx, aging=0.0, bonus=0)
    blocker = hold_slot(fx, s)
    old_batch = ticket("a", 1, priority=-100, arrival=0.0)
    new_normal = ticket("a", 2, priority=0, arrival=10**6)
    s.on_request(old_batch)
    s.on_request(new_normal)
    fx.time = 10**7
    assert order_served(fx, s, blocker) == [new_normal, old_batch]


def test_changed_pick_counters_need_two_candidates() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s, "a")
    s.on_request(ticket("b", 1, arrival=0.0))
    fx.time = 1.0
    s.on_finish(blocker)
    stats = s.statistics()
    assert (stats.aging_changed_picks, stats.affinity_changed_picks) == (0, 0)


def test_a_load_holds_the_slot_and_nothing_is_preempted() -> None:
    fx = FakeWorld()
    s = make(fx)
    loading = ticket("a", 1)
    s.on_request(loading)
    swap = fx.last_swap()
    urgent = ticket("b", 2, priority=10**6)
    s.on_request(urgent)
    assert urgent.state is RequestState.QUEUED
    fx.complete(s, swap)
    assert fx.granted == [loading]
    assert urgent.state is RequestState.QUEUED
    s.on_finish(loading)
    assert fx.last_swap().target == "b"


def test_cancel_during_load_with_nobody_else_frees_the_slot_at_once() -> None:
    fx = FakeWorld()
    s = make(fx)
    loading = ticket("a", 1)
    s.on_request(loading)
    swap = fx.last_swap()
    other = ticket("b", 2)
    s.on_request(other)
    s.on_cancel(loading)
    assert fx.cancelled == [(swap, "every request waiting for 'a' has left")]
    assert fx.last_swap().target == "b"
    assert fx.last_swap().waiters == [other]
    assert s.statistics().slot_holder == "b"


def test_cancel_during_load_hands_the_load_to_another_request_for_that_model() -> None:
    fx = FakeWorld()
    s = make(fx)
    loading = ticket("a", 1)
    s.on_request(loading)
    swap = fx.last_swap()
    same = ticket("a", 2)
    other = ticket("b", 3, priority=50)
    s.on_request(same)
    s.on_request(other)
    s.on_cancel(loading)
    assert fx.cancelled == []
    assert swap.waiters == [same]
    assert same.state is RequestState.LOADING
    fx.complete(s, swap)
    assert fx.granted == [same]


def test_cancel_while_queued_never_loads_and_frees_the_reservation() -> None:
    fx = FakeWorld()
    s = make(fx, limits={"a": 1})
    blocker = hold_slot(fx, s)
    gone = ticket("a", 1)
    s.on_request(gone)
    s.on_cancel(gone)
    again = ticket("a", 2)
    s.on_request(again)  # the one place for 'a' is free again
    s.on_cancel(again)
    s.on_finish(blocker)
    assert fx.swaps == []
    assert s.statistics().waiting == 0


def test_failure_fans_out_to_waiters_of_the_same_model() -> None:
    fx = FakeWorld()
    s = make(fx)
    first = ticket("a", 1, priority=10)
    s.on_request(first)
    same = ticket("a", 2)
    other = ticket("b", 3)
    s.on_request(same)
    s.on_request(other)
    error = ModelStartFailed("a", "exited with status 1 while starting")
    fx.complete(s, fx.last_swap(), error)
    assert fx.failed == [(first, error), (same, error)]
    assert fx.last_swap().target == "b"


def test_unload_fails_waiters_of_that_model_and_frees_the_slot() -> None:
    fx = FakeWorld()
    s = make(fx)
    loading = ticket("a", 1)
    s.on_request(loading)
    queued_a, queued_b = ticket("a", 2), ticket("b", 3)
    s.on_request(queued_a)
    s.on_request(queued_b)
    s.on_unload(["a"])
    assert [(t, type(e)) for t, e in fx.failed] == [
        (loading, ModelUnloaded),
        (queued_a, ModelUnloaded),
    ]
    assert fx.last_swap().target == "b"


def test_pages_skip_the_slot_when_their_model_is_ready() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s, "a")
    props = Ticket("a", seq=1, needs_slot=False)
    s.on_request(props)
    assert fx.granted[-1] is props
    cold_props = Ticket("b", seq=2, needs_slot=False)
    s.on_request(cold_props)  # its model must load: it waits for the slot like the rest
    assert cold_props.state is RequestState.QUEUED
    s.on_finish(props)
    s.on_finish(blocker)
    assert fx.last_swap().waiters == [cold_props]


def test_a_swap_waits_for_a_busy_page_to_finish() -> None:
    fx = FakeWorld()
    s = make(fx)
    fx.states["a"] = READY
    props = Ticket("a", seq=1, needs_slot=False)
    s.on_request(props)
    wants_b = ticket("b", 2)
    s.on_request(wants_b)
    assert fx.swaps == []  # it holds the slot, but 'a' is serving a page
    assert s.statistics().slot_holder == "b"
    s.on_finish(props)
    assert fx.last_swap().evict == {"a"}


def test_shutdown_fails_every_waiter() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s)
    queued = ticket("a", 1)
    s.on_request(queued)
    s.on_shutdown(ShuttingDown())
    assert [t for t, _ in fx.failed] == [queued]
    with pytest.raises(ShuttingDown):
        s.on_request(ticket("a", 2))
    s.on_finish(blocker)
    assert fx.swaps == []


def test_position_uses_the_pick_order() -> None:
    fx = FakeWorld()
    s = make(fx)
    blocker = hold_slot(fx, s, "a")
    b_high = ticket("b", 1, priority=5)
    a_loaded = ticket("a", 2)
    b_low = ticket("b", 3)
    for t in (b_high, a_loaded, b_low):
        s.on_request(t)
    assert [s.position(t) for t in (a_loaded, b_high, b_low)] == [1, 2, 3]
    assert s.position(blocker) is None
    assert s.scheduler.choose() is a_loaded


def test_statistics_by_band() -> None:
    fx = FakeWorld()
    s = make(fx)
    hold_slot(fx, s)
    s.on_request(ticket("a", 1, priority=100, arrival=0.0))
    s.on_request(ticket("a", 2, priority=-150, arrival=2.0))
    fx.time = 10.0
    stats = s.statistics()
    assert stats.bands["interactive"].depth == 1
    assert stats.bands["interactive"].oldest_wait == 10.0
    assert stats.bands["batch"].depth == 1  # -150 rounds (halves up) to -100
    assert stats.bands["normal"].dispatched == 1
    assert stats.waiting == 2


def test_a_slot_holder_waiting_for_a_model_to_drain_counts_as_waiting() -> None:
    """Picked but not dispatched (its load waits for 'a' to finish a page): it is in the
    queue view, so it is in the depth, the oldest wait and the waiting count too."""
    fx = FakeWorld()
    s = make(fx)
    fx.states["a"] = READY
    s.on_request(props := Ticket("a", seq=1, needs_slot=False))
    s.on_request(wants_b := ticket("b", 2, priority=-100, arrival=1.0))
    s.on_request(later := ticket("b", 3, arrival=2.0))
    assert wants_b.state is RequestState.QUEUED
    assert wants_b.dispatched_at is None
    fx.time = 5.0
    stats = s.statistics()
    assert s.scheduler.queued() == [wants_b, later]
    assert stats.waiting == 2
    assert (stats.bands["batch"].depth, stats.bands["batch"].oldest_wait) == (1, 4.0)
    assert (stats.bands["normal"].depth, stats.bands["normal"].dispatched) == (1, 1)
    s.on_finish(props)  # 'a' drained: the load starts, and the holder is dispatched
    stats = s.statistics()
    assert (stats.waiting, stats.loading) == (1, 1)
    assert stats.bands["batch"] == BandStatistics(depth=0, oldest_wait=0.0, dispatched=1)


def test_max_queued_counts_a_slot_holder_waiting_for_a_model_to_drain() -> None:
    fx = FakeWorld()
    s = Driven(SerialScheduler(fx, GroupSwapper({}), limits={}, max_queued=2), fx)
    fx.states["a"] = READY
    s.on_request(Ticket("a", seq=1, needs_slot=False))
    s.on_request(ticket("b", 2))  # holds the slot, waiting for 'a' to drain
    s.on_request(ticket("b", 3))
    with pytest.raises(QueueFull, match="maxQueued"):
        s.on_request(ticket("c", 4))
    assert s.statistics().waiting == 2


def test_pages_do_not_hold_off_a_swap_waiting_for_their_model() -> None:
    fx = FakeWorld()
    s = make(fx)
    fx.states["a"] = READY
    first_page = Ticket("a", seq=1, needs_slot=False)
    s.on_request(first_page)
    wants_b = ticket("b", 2)
    s.on_request(wants_b)  # holds the slot, waiting for 'a' to drain
    later_page = Ticket("a", seq=3, needs_slot=False)
    s.on_request(later_page)
    assert later_page.state is RequestState.QUEUED  # not let through: 'a' must drain
    s.on_finish(first_page)
    assert fx.last_swap().waiters == [wants_b]


def test_scores_of_huge_priorities_stay_finite() -> None:
    fx = FakeWorld()
    s = make(fx)
    huge = ticket("a", 1, priority=10**400)
    s.on_request(huge)
    assert huge.score == sys.float_info.max
    tiny = ticket("b", 2, priority=-(10**400))
    assert s.scheduler.score(tiny, affinity=False) == -sys.float_info.max


def test_a_burst_for_one_model_is_queued_not_refused() -> None:
    fx = FakeWorld()
    s = make(fx)  # no concurrencyLimit set: serial has none
    blocker = hold_slot(fx, s, "x")
    burst = [ticket("a", seq) for seq in range(1, 1001)]
    for t in burst:
        s.on_request(t)
    assert s.statistics().waiting == 1000
    assert fx.failed == []
    served = order_served(fx, s, blocker)
    assert served == burst  # every one, in arrival order (equal scores)


def test_max_queued_bounds_the_queue_across_models() -> None:
    fx = FakeWorld()
    s = Driven(SerialScheduler(fx, GroupSwapper({}), limits={}, max_queued=3), fx)
    hold_slot(fx, s, "x")
    for seq, model in enumerate(("a", "b", "a"), start=1):
        s.on_request(ticket(model, seq))
    with pytest.raises(QueueFull, match="maxQueued"):
        s.on_request(ticket("c", 4))
    assert s.statistics().waiting == 3


def test_an_explicit_concurrency_limit_still_applies() -> None:
    fx = FakeWorld()
    s = make(fx, limits={"a": 2})
    hold_slot(fx, s, "x")
    s.on_request(ticket("a", 1))
    s.on_request(ticket("a", 2))
    with pytest.raises(ConcurrencyLimit):
        s.on_request(ticket("a", 3))


def with_slots(fx: FakeWorld, slots: int, **groups: GroupConfig) -> Driven[SerialScheduler]:
    scheduler = SerialScheduler(
        fx, GroupSwapper(groups), limits={}, swap_affinity_bonus=0, slots=slots
    )
    return Driven(scheduler, fx)


def test_slots_serve_that_many_requests_for_the_loaded_model_at_once() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = with_slots(fx, 3)
    tickets = [ticket("a", seq) for seq in range(1, 5)]
    for t in tickets:
        s.on_request(t)
    assert fx.granted == tickets[:3]
    assert s.statistics().waiting == 1
    s.on_finish(tickets[1])
    assert fx.granted == tickets  # the freed slot goes to the next one


def test_a_better_request_for_another_model_stops_new_grants_until_the_slots_free() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = with_slots(fx, 2)
    first = ticket("a", 1)
    s.on_request(first)
    urgent = ticket("b", 2, priority=100)  # must evict 'a', which is serving
    later_a = ticket("a", 3)
    s.on_request(urgent)
    s.on_request(later_a)
    assert fx.granted == [first]  # a slot is free, but the best waiting request wants 'b'
    assert fx.swaps == []
    s.on_finish(first)
    swap = fx.last_swap()
    assert (swap.target, swap.evict, swap.waiters) == ("b", frozenset({"a"}), [urgent])
    assert later_a.state is RequestState.QUEUED


def test_requests_for_a_model_being_loaded_share_its_load_up_to_the_slots() -> None:
    fx = FakeWorld()
    s = with_slots(fx, 2)
    lead, second, third = ticket("a", 1), ticket("a", 2), ticket("a", 3)
    for t in (lead, second, third):
        s.on_request(t)
    assert len(fx.swaps) == 1
    assert fx.last_swap().waiters == [lead, second]
    assert third.state is RequestState.QUEUED
    s.on_cancel(lead)  # the load goes on: another holder waits for it
    assert fx.cancelled == []
    fx.complete(s, fx.last_swap())
    assert fx.granted == [second, third]  # the freed slot went to the third one


def test_one_slot_is_the_default_and_keeps_serial_serial() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = make(fx)
    first, second = ticket("a", 1), ticket("a", 2)
    s.on_request(first)
    s.on_request(second)
    assert fx.granted == [first]


def test_a_model_s_own_slots_override_the_global_count() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    scheduler = SerialScheduler(
        fx, GroupSwapper({}), limits={}, swap_affinity_bonus=0, slots=1, model_slots={"b": 3}
    )
    s = Driven(scheduler, fx)
    a1, a2 = ticket("a", 1), ticket("a", 2)
    bs = [ticket("b", seq) for seq in range(3, 8)]
    for t in (a1, a2, *bs):
        s.on_request(t)
    assert fx.granted == [a1]  # 'a' has the global single slot
    s.on_finish(a1)
    assert fx.granted == [a1, a2]
    s.on_finish(a2)
    swap = fx.last_swap()  # 'b' loads for as many requests as it has slots
    assert (swap.target, swap.waiters) == ("b", bs[:3])
    fx.complete(s, swap)
    assert fx.granted == [a1, a2, *bs[:3]]
    s.on_finish(bs[0])
    assert fx.granted == [a1, a2, *bs[:4]]


def test_model_slots_come_from_the_config_and_change_on_reload() -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    config = load_config_text(
        """
        [models.a]
        cmd = "a ${PORT}"
        slots = 2
        [models.b]
        cmd = "b ${PORT}"
        [routing.scheduler]
        use = "serial"
        """
    )
    scheduler = make_scheduler(config, fx, GroupSwapper({}))
    assert isinstance(scheduler, SerialScheduler)
    assert (scheduler.slots("a"), scheduler.slots("b")) == (2, 1)
    reloaded = load_config_text(
        """
        [models.a]
        cmd = "a ${PORT}"
        [models.b]
        cmd = "b ${PORT}"
        slots = 4
        [routing.scheduler]
        use = "serial"
        [routing.scheduler.settings.serial]
        slots = 3
        """
    )
    scheduler.on_reconfigure(reloaded, GroupSwapper({}))
    assert (scheduler.slots("a"), scheduler.slots("b")) == (3, 4)


def load_config_text(text: str) -> Config:
    return loads_config(textwrap.dedent(text), file="test.toml", environ={}, free=every_port_free)


# ------------------------------------------------------- a reload switches schedulers


def driven(fx: FakeWorld, use: str) -> Driven[Scheduler]:
    """A ``use`` scheduler (``fifo`` or ``serial``) on ``fx``, as a reload would make it."""
    settings = loads_config(f'[routing.scheduler]\nuse = "{use}"', free=every_port_free)
    return Driven(make_scheduler(settings, fx, GroupSwapper({})), fx)


@pytest.mark.parametrize("before", ["fifo", "serial"])
@pytest.mark.parametrize("after", ["fifo", "serial"])
def test_a_switched_in_scheduler_takes_over_the_old_ones_load(before: str, after: str) -> None:
    """The load the old scheduler started, and its waiters, become the new one's: it
    neither evicts that model mid-load nor loads it again, and grants the waiters when
    the load is done."""
    fx = FakeWorld()
    old = driven(fx, before)
    old.on_request(loading := ticket("a", 1))
    a_load = fx.last_swap()
    new = driven(fx, after)
    new.adopt(old.scheduler.surrender())
    assert old.scheduler.statistics().swaps == ()  # it keeps nothing
    new.on_request(other := ticket("b", 2))  # would evict 'a' mid-load: waits
    new.on_request(same := ticket("a", 3))  # joins the load (fifo), or waits for the slot
    assert fx.swaps == [a_load]
    assert other.state is RequestState.QUEUED
    fx.complete(new, a_load)
    assert fx.granted[0] is loading
    assert fx.swaps == [a_load]  # 'a' serves: nothing evicts it yet
    new.on_finish(loading)
    # 'a' has drained of the old request: the new scheduler goes on, by its own order
    # ('b' is older; 'a', ready, is served in parallel by fifo, or has serial's affinity).
    assert same in fx.granted or fx.last_swap().waiters == [other]


@pytest.mark.parametrize("before", ["fifo", "serial"])
def test_the_switched_to_serial_slot_is_never_shared_with_the_old_ones_requests(
    before: str,
) -> None:
    """Requests the old scheduler serves hold serial's one slot: a request that fifo
    would have served beside them waits until every one of them is done."""
    fx = FakeWorld()
    old = driven(fx, before)
    old.on_request(first := ticket("a", 1))
    fx.complete(old, fx.last_swap())
    old.on_request(second := ticket("a", 2))  # fifo serves it beside the first
    serving = [t for t in (first, second) if t in fx.granted]
    new = driven(fx, "serial")
    new.adopt(old.scheduler.surrender())
    new.on_request(later := ticket("a", 3))
    for ticket_ in serving:
        assert later not in fx.granted  # the slot is the old requests'
        new.on_finish(ticket_)
    if second not in serving:  # serial kept it waiting: it was handed over, and goes first
        assert fx.granted[-1] is second
        assert later not in fx.granted
        new.on_finish(second)
    assert fx.granted[-1] is later


@pytest.mark.parametrize("before", ["fifo", "serial"])
@pytest.mark.parametrize("after", ["fifo", "serial"])
def test_a_switched_in_scheduler_picks_among_all_it_takes_over(before: str, after: str) -> None:
    """The waiting requests reach the new scheduler together: the most urgent goes first,
    not the oldest, which would have found the new scheduler idle."""
    fx = FakeWorld()
    old = driven(fx, before)
    old.on_request(serving := ticket("a", 1))
    fx.complete(old, fx.last_swap())
    assert fx.granted == [serving]
    batch = ticket("b", 2, priority=-100)
    urgent = ticket("b", 3, priority=100)
    for waiting in (batch, ticket("c", 4, priority=-100), urgent):
        old.on_request(waiting)  # each would evict 'a', which serves: all wait
    new = driven(fx, after)
    new.adopt(old.scheduler.surrender())
    assert new.position(batch) != 1
    new.on_finish(serving)  # 'a' drains: the new scheduler goes on
    fx.complete(new, fx.last_swap())
    assert fx.granted[1] is urgent


@pytest.mark.parametrize("use", ["fifo", "serial"])
def test_a_scheduler_taking_over_refuses_what_it_would_not_admit(use: str) -> None:
    fx = FakeWorld()
    config = load_config_text(
        f"""
        [routing.scheduler]
        use = "{use}"
        [models.a]
        cmd = "server"
        proxy = "http://127.0.0.1:9"
        concurrencyLimit = 1
        """
    )
    new = Driven(make_scheduler(config, fx, GroupSwapper({})), fx)
    first, second = ticket("a", 1), ticket("a", 2)
    failed = [d for d in new.adopt(Handover(waiting=(first, second))) if isinstance(d, Fail)]
    assert [(d.ticket, type(d.error)) for d in failed] == [(second, ConcurrencyLimit)]
    assert first.state is not RequestState.DONE


@pytest.mark.parametrize("use", ["fifo", "serial"])
def test_a_surrendered_scheduler_hands_over_everything_and_its_counts_are_final(
    use: str,
) -> None:
    """What the router relies on for one scheduler at a time, and to keep the counters in
    /metrics going up across a switch: the old scheduler keeps nothing."""
    fx = FakeWorld()
    config = load_config_text(f'[routing.scheduler]\nuse = "{use}"')
    old = Driven(make_scheduler(config, fx, GroupSwapper({})), fx)
    old.on_request(loading := ticket("a", 1))
    a_load = fx.last_swap()
    old.on_request(ticket("b", 2))  # waits: it would evict 'a' mid-load
    old.on_request(ticket("a", 3))  # joins the load (fifo) or waits for the slot (serial)
    handover = old.scheduler.surrender()
    counts = SchedulerCounts.of(old.statistics())
    assert [t.seq for t in handover.waiting] == ([2] if use == "fifo" else [2, 3])
    assert [t.seq for t in handover.dispatched] == ([1, 3] if use == "fifo" else [1])
    assert handover.swaps == (a_load,)
    assert loading in a_load.waiters
    stats = old.statistics()
    assert (stats.waiting, stats.loading, stats.swaps) == (0, 0, ())
    assert all(t.state is RequestState.QUEUED for t in handover.waiting)
    assert SchedulerCounts.of(old.statistics()) == counts


def residency_case(
    *, now: float, b_priority: int = 0, a_waits: bool = True
) -> tuple[FakeWorld, Driven[SerialScheduler], Ticket]:
    """``a`` became ready at 0 and serves the slot's request; one for ``b`` arrives, then
    (if ``a_waits``) another for ``a``. With no affinity, ``b``'s is the better pick. At
    ``now`` the slot frees: does ``b``'s load evict ``a``? (``minResidency`` 5 s.)"""
    fx = FakeWorld()
    scheduler = SerialScheduler(
        fx, GroupSwapper({}), limits={}, swap_affinity_bonus=0, min_residency=5.0
    )
    s = Driven(scheduler, fx)
    fx.states["a"] = READY
    fx.ready["a"] = 0.0
    s.on_request(serving := ticket("a", 0, arrival=0.0))
    s.on_request(on_b := ticket("b", 1, priority=b_priority, arrival=0.5))
    if a_waits:
        s.on_request(ticket("a", 2, arrival=0.5))
    fx.time = now
    s.on_finish(serving)
    return fx, s, on_b


@pytest.mark.parametrize("b_priority", [0, 49])  # 49: higher, but in the same band
def test_a_model_in_its_residency_serves_its_waiting_requests_first(b_priority: int) -> None:
    fx, s, on_b = residency_case(now=1.0, b_priority=b_priority)
    assert fx.swaps == []
    assert fx.granted_models() == ["a", "a"]  # the waiting 'a' took the slot, not 'b'
    assert on_b.state is RequestState.QUEUED
    assert fx.rechecks == [5.0]
    fx.time = 2.0
    s.on_finish(fx.granted[-1])  # nothing waits for 'a' now: it goes at once
    assert [(x.target, x.evict) for x in fx.swaps] == [("b", frozenset({"a"}))]


def test_a_higher_band_evicts_a_model_in_its_residency() -> None:
    fx, _, on_b = residency_case(now=1.0, b_priority=100)
    assert [(x.target, x.evict) for x in fx.swaps] == [("b", frozenset({"a"}))]
    assert on_b.state is RequestState.LOADING
    assert fx.rechecks == []


def test_a_model_is_evicted_once_its_residency_is_over() -> None:
    fx, _, _ = residency_case(now=5.0)
    assert [swap.target for swap in fx.swaps] == ["b"]
    assert fx.granted_models() == ["a"]


def test_a_model_with_no_waiting_request_is_evicted_at_once() -> None:
    fx, _, _ = residency_case(now=1.0, a_waits=False)
    assert [swap.target for swap in fx.swaps] == ["b"]
    assert fx.rechecks == []


def test_a_lead_waiting_for_a_drain_gives_the_slot_back_to_a_model_in_residency() -> None:
    fx = FakeWorld()
    s = Driven(SerialScheduler(fx, GroupSwapper({}), limits={}, min_residency=5.0), fx)
    fx.states["a"] = READY
    fx.ready["a"] = 0.0
    s.on_request(page := Ticket("a", seq=0, needs_slot=False))
    s.on_request(on_b := ticket("b", 1, arrival=0.0))  # the lead: waits for 'a' to drain
    s.on_request(on_a := ticket("a", 2, arrival=0.0))
    assert s.scheduler.statistics().slot_holder == "b"
    fx.time = 1.0
    s.on_finish(page)  # 'a' drained, but its residency keeps it for on_a
    assert fx.granted == [page, on_a]
    assert on_b.state is RequestState.QUEUED
    assert fx.rechecks == [5.0]
    fx.time = 5.0
    s.on_recheck()  # the slot is on_a's: nothing is preempted
    assert fx.swaps == []
    s.on_finish(on_a)
    assert [(x.target, x.evict, x.waiters) for x in fx.swaps] == [("b", frozenset({"a"}), [on_b])]
