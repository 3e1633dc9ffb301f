"""``serial`` with ``preempt``: who is checkpointed for whom, as pure decisions."""

from __future__ import annotations

from llamaswap.errors import ModelUnloaded
from llamaswap.process.state import ModelState
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers import FifoScheduler, SchedulerCounts
from llamaswap.schedulers.base import Preempt, RequestState, Ticket
from llamaswap.schedulers.serial import SerialScheduler
from tests.fakes import Driven, FakeWorld

READY = ModelState.READY
INTERACTIVE, NORMAL, BATCH = 100, 0, -100


def make(
    world: FakeWorld,
    *,
    preempt: bool = True,
    aging: float = 60.0,
    slots: int = 1,
    max_preemptions: int = 3,
) -> Driven[SerialScheduler]:
    scheduler = SerialScheduler(
        world,
        GroupSwapper({}),
        limits={},
        aging_divisor=aging,
        slots=slots,
        preempt=preempt,
        max_preemptions=max_preemptions,
    )
    return Driven(scheduler, world)


def request(
    model: str, seq: int, priority: int, *, arrival: float | None = None, preemptible: bool = True
) -> Ticket:
    return Ticket(
        model,
        priority=priority,
        seq=seq,
        arrival=float(seq) if arrival is None else arrival,
        preemptible=preemptible,
    )


def serving(fx: FakeWorld, s: Driven[SerialScheduler], t: Ticket) -> Ticket:
    """Admit ``t`` for its ready model and check it is granted at once."""
    fx.states[t.model] = READY
    s.on_request(t)
    assert fx.granted[-1] is t
    return t


def test_an_interactive_request_checkpoints_a_batch_one_for_the_same_model() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    interactive = request("a", 2, INTERACTIVE)
    decisions = s.on_request(interactive)
    assert decisions == [Preempt(batch)]
    assert (batch.preempting, batch.state) == (True, RequestState.SERVING)
    assert interactive.state is RequestState.QUEUED  # the slot frees when batch comes back

    s.on_preempted(batch)
    assert fx.granted[-1] is interactive
    assert batch.state is RequestState.QUEUED
    assert (batch.preemptions, batch.preempting, batch.score) == (1, False, None)
    assert batch.dispatched_at == 0.0  # its first dispatch is kept: its queue wait
    assert s.scheduler.admitted("a") == 2  # its reservation is kept while it is paused

    s.on_finish(interactive)
    assert fx.granted[-1] is batch  # resumed


def test_for_another_model_the_checkpoint_frees_the_model_for_the_swap() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    interactive = request("b", 2, INTERACTIVE)
    assert s.on_request(interactive) == [Preempt(batch)]
    assert fx.swaps == []  # "a" is busy until batch comes back
    s.on_preempted(batch)
    swap = fx.last_swap()
    assert (swap.target, swap.evict) == ("b", frozenset({"a"}))
    fx.complete(s, swap)
    assert fx.granted[-1] is interactive
    s.on_finish(interactive)
    back = fx.last_swap()
    assert (back.target, back.evict) == ("a", frozenset({"b"}))
    fx.complete(s, back)
    assert fx.granted[-1] is batch


def test_nothing_is_preempted_unless_preempt_is_on() -> None:
    fx = FakeWorld()
    s = make(fx, preempt=False)
    serving(fx, s, request("a", 1, BATCH))
    assert s.on_request(request("a", 2, INTERACTIVE)) == []
    assert fx.preempted == []


def test_the_margin_is_a_whole_band_of_score_so_aging_alone_never_preempts() -> None:
    fx = FakeWorld()
    s = make(fx, aging=60.0)
    # normal, 1 s after batch: 100 - 1/60 points above it, short of a band.
    batch = serving(fx, s, request("a", 1, BATCH, arrival=0.0))
    assert s.on_request(request("a", 2, NORMAL, arrival=1.0)) == []
    # interactive, 100 minutes after it: 200 - 100 = exactly a band.
    fx.time = 6000.0
    late = request("a", 3, INTERACTIVE, arrival=6000.0)
    assert s.on_request(late) == [Preempt(batch)]


def test_a_request_that_arrived_with_it_a_band_above_preempts() -> None:
    fx = FakeWorld()
    s = make(fx, aging=60.0)
    batch = serving(fx, s, request("a", 1, BATCH, arrival=5.0))
    assert s.on_request(request("a", 2, NORMAL, arrival=5.0)) == [Preempt(batch)]


def test_without_aging_the_priorities_decide() -> None:
    fx = FakeWorld()
    s = make(fx, aging=0.0)
    normal = serving(fx, s, request("a", 1, NORMAL))
    assert s.on_request(request("a", 2, 99)) == []  # less than a band: affinity's cap
    assert s.on_request(request("a", 3, INTERACTIVE)) == [Preempt(normal)]


def test_only_a_resumable_request_under_its_limit_is_preempted() -> None:
    fx = FakeWorld()
    s = make(fx, max_preemptions=1)
    pinned = serving(fx, s, request("a", 1, BATCH, preemptible=False))
    assert s.on_request(request("a", 2, INTERACTIVE)) == []

    fx2 = FakeWorld()
    s2 = make(fx2, max_preemptions=1)
    batch = serving(fx2, s2, request("a", 1, BATCH))
    first = request("a", 2, INTERACTIVE)
    s2.on_request(first)
    s2.on_preempted(batch)
    s2.on_finish(first)
    assert fx2.granted[-1] is batch
    assert s2.on_request(request("a", 3, INTERACTIVE)) == []  # preempted once: runs to its end
    assert pinned.preemptions == 0


def test_a_load_for_another_model_is_given_up_at_once() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = request("a", 1, BATCH)
    s.on_request(batch)
    load_a = fx.last_swap()
    assert batch.state is RequestState.LOADING
    interactive = request("b", 2, INTERACTIVE)
    s.on_request(interactive)
    # The load of a is cancelled, batch waits again, and b's load starts in the same event.
    assert fx.cancelled == [(load_a, "every request waiting for 'a' has left")]
    assert fx.preempted == [batch]
    assert (batch.state, batch.preemptions) == (RequestState.QUEUED, 1)
    assert fx.last_swap().target == "b"
    assert interactive.state is RequestState.LOADING
    assert s.scheduler.queued() == [batch]
    assert s.scheduler.admitted("a") == 1  # its reservation is kept


def test_a_load_for_the_same_model_or_less_urgent_work_goes_on() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = request("a", 1, BATCH)
    s.on_request(batch)
    s.on_request(request("a", 2, INTERACTIVE))  # it will be served by the same load
    s.on_request(request("b", 3, NORMAL))  # not a band above, by the wait between them
    assert (fx.cancelled, fx.preempted) == ([], [])
    assert batch.state is RequestState.LOADING


def test_one_preemption_at_a_time() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    first, second = request("a", 2, INTERACTIVE), request("b", 3, INTERACTIVE)
    s.on_request(first)
    assert s.on_request(second) == []
    assert fx.preempted == [batch]
    s.on_preempted(batch)
    assert fx.granted[-1] is first
    # interactive work is not preempted by interactive work
    s.on_finish(first)
    assert fx.last_swap().target == "b"


def test_with_two_slots_the_lowest_ranked_holder_gives_its_slot() -> None:
    fx = FakeWorld()
    s = make(fx, slots=2)
    fx.states["a"] = READY
    older, newer = request("a", 1, BATCH), request("a", 2, BATCH)
    s.on_request(older)
    s.on_request(newer)
    assert fx.granted == [older, newer]
    interactive = request("a", 3, INTERACTIVE)
    assert s.on_request(interactive) == [Preempt(newer)]  # older outscores it by its wait
    s.on_preempted(newer)
    assert fx.granted[-1] is interactive


def test_another_model_needs_every_holder_to_qualify() -> None:
    fx = FakeWorld()
    s = make(fx, slots=2)
    fx.states["a"] = READY
    batch, pinned = request("a", 1, BATCH), request("a", 2, BATCH, preemptible=False)
    s.on_request(batch)
    s.on_request(pinned)
    assert s.on_request(request("b", 3, INTERACTIVE)) == []  # pinned keeps "a" busy anyway


def test_a_request_that_ends_before_it_comes_back_just_finishes() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    interactive = request("a", 2, INTERACTIVE)
    s.on_request(interactive)
    s.on_finish(batch)  # its last token was on its way as it was preempted
    assert fx.granted[-1] is interactive
    assert batch.preemptions == 0


def test_a_paused_request_keeps_its_place_by_arrival_and_can_leave() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    later_batch = request("a", 2, BATCH)
    s.on_request(later_batch)
    interactive = request("a", 3, INTERACTIVE)
    s.on_request(interactive)
    s.on_preempted(batch)
    assert s.scheduler.queued() == [batch, later_batch]  # it arrived first
    batch.state = RequestState.ABANDONED  # its client left while it was paused
    s.on_cancel(batch)
    assert s.scheduler.queued() == [later_batch]
    assert s.scheduler.admitted("a") == 2


def test_an_unload_fails_a_paused_request() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    interactive = request("b", 2, INTERACTIVE)
    s.on_request(interactive)
    s.on_preempted(batch)
    s.on_unload(["a"])
    assert [(t, type(e)) for t, e in fx.failed] == [(batch, ModelUnloaded)]


def test_fifo_takes_back_a_request_a_serial_scheduler_preempted() -> None:
    fx = FakeWorld()
    fifo = Driven(FifoScheduler(fx, GroupSwapper({}), limits={}), fx)
    fx.states["a"] = READY
    t = request("a", 1, BATCH)
    fifo.on_request(t)
    fifo.on_preempted(t)
    assert fx.granted == [t, t]
    assert t.preemptions == 1


def test_preemptions_are_counted_by_the_band_of_the_request_preempted() -> None:
    fx = FakeWorld()
    s = make(fx)
    batch = serving(fx, s, request("a", 1, BATCH))
    fx.time = 4.0
    s.on_request(request("a", 2, INTERACTIVE))
    assert fx.preempted == [batch]
    bands = s.scheduler.statistics().bands
    assert {band: numbers.preempted for band, numbers in bands.items()} == {
        "above_interactive": 0,
        "interactive": 0,
        "normal": 0,
        "batch": 1,
        "below_batch": 0,
    }
    assert SchedulerCounts.of(s.scheduler.statistics()).preempted["batch"] == 1
    fx.time = 4.5
    s.on_preempted(batch)
    assert batch.paused_at == 4.5  # it waits again from its checkpoint


def test_retired_preemption_counts_add_up() -> None:
    old = SchedulerCounts(preempted={"batch": 2}, dispatched={"batch": 3})
    new = SchedulerCounts(preempted={"batch": 1, "normal": 1})
    total = old + new
    assert (total.preempted, total.dispatched) == ({"batch": 3, "normal": 1}, {"batch": 3})
