"""The efficient pick equals a brute-force argmax of the score, whatever the queue holds."""

from __future__ import annotations

from collections.abc import Set
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from llamaswap.config.model import GroupConfig
from llamaswap.process.state import ModelState
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers.base import Decision, Grant, JoinSwap, StartSwap, Ticket
from llamaswap.schedulers.serial import SerialScheduler
from tests.fakes import Driven, FakeWorld

MODELS = ("a", "b", "c", "d")
GROUPS = {
    "pair": GroupConfig(members=("c", "d"), swap=False, exclusive=False),
    "side": GroupConfig(members=("busy",), exclusive=False),  # the blocker evicts nothing
}
NS = 1_000_000_000

priorities = st.one_of(
    st.sampled_from([-100, 0, 100]),
    st.integers(-300, 300),
    st.integers(-(10**30), 10**30),
)
requests = st.lists(
    st.tuples(st.sampled_from(MODELS), priorities, st.integers(0, 10**6)),  # arrival in ms
    min_size=1,
    max_size=40,
)


def needs_eviction(
    model: str, states: dict[str, ModelState], loading: Set[str] = frozenset()
) -> bool:
    """GROUPS by hand: ``c`` and ``d`` run beside anything; ``a`` and ``b`` (no group:
    swap and exclusive) stop every other running model, or model being loaded."""
    running = {m for m, state in states.items() if state is not ModelState.STOPPED} | loading
    return model in ("a", "b") and bool(running - {model})


def brute_force(
    states: dict[str, ModelState],
    waiting: list[Ticket],
    now_ms: int,
    divisor_ms: int,
    bonus: int,
    loading: Set[str] = frozenset(),
) -> Ticket:
    """The best score computed from the inputs alone, in exact arithmetic."""

    def score(t: Ticket) -> tuple[Fraction, int]:
        aging = (
            Fraction(now_ms - round(t.arrival * 1000), divisor_ms) if divisor_ms else Fraction()
        )
        ready = states.get(t.model) is ModelState.READY
        affinity = min(bonus, 99) if ready and not needs_eviction(t.model, states, loading) else 0
        return (t.priority + affinity + aging, -t.seq)

    return max(waiting, key=score)


@settings(max_examples=300, deadline=None)
@given(
    requests=requests,
    cancelled=st.sets(st.integers(0, 39)),
    ready=st.sets(st.sampled_from(MODELS)),
    divisor_ms=st.sampled_from([0, 1, 500, 60_000, 7_777]),
    bonus=st.sampled_from([0, 10, 99, 250]),
)
def test_efficient_pick_equals_brute_force(
    requests: list[tuple[str, int, int]],
    cancelled: set[int],
    ready: set[str],
    divisor_ms: int,
    bonus: int,
) -> None:
    fx = FakeWorld()
    for model in ready:
        fx.states[model] = ModelState.READY
    # Keep the slot busy with a request for another model, so every request queues.
    fx.states["busy"] = ModelState.READY
    scheduler = Driven(
        SerialScheduler(
            fx,
            GroupSwapper(GROUPS),
            limits={},
            aging_divisor=divisor_ms / 1000,
            swap_affinity_bonus=bonus,
        ),
        fx,
    )
    blocker = Ticket("busy", seq=0)
    scheduler.on_request(blocker)
    assert fx.granted == [blocker]
    waiting: list[Ticket] = []
    for seq, (model, priority, arrival_ms) in enumerate(requests, start=1):
        t = Ticket(model, priority=priority, seq=seq, arrival=arrival_ms / 1000)
        scheduler.on_request(t)
        waiting.append(t)
    for index in sorted(cancelled):
        if index < len(waiting):
            scheduler.on_cancel(waiting[index])
    remaining = [t for i, t in enumerate(waiting) if i not in cancelled]
    now_ms = 10**6 + 1
    fx.time = now_ms / 1000
    if not remaining:
        assert scheduler.scheduler.choose() is None
        return
    assert scheduler.scheduler.choose() is brute_force(
        fx.states, remaining, now_ms, divisor_ms, bonus
    )
    # and the order stays right as picks take requests away one by one
    current = blocker
    while remaining:
        expected = brute_force(fx.states, remaining, now_ms, divisor_ms, bonus)
        assert scheduler.scheduler.choose() is expected
        swaps = len(fx.swaps)
        scheduler.on_finish(current)
        if len(fx.swaps) > swaps:
            assert fx.swaps[-1].waiters == [expected]
            fx.complete(scheduler, fx.swaps[-1])
        assert fx.granted[-1] is expected
        current = expected
        remaining.remove(expected)


@settings(max_examples=200, deadline=None)
@given(
    requests=requests,
    ready=st.sets(st.sampled_from(MODELS)),
    divisor_ms=st.sampled_from([0, 500, 7_777]),
    bonus=st.sampled_from([0, 10, 99]),
    slots=st.integers(2, 4),
    model_slots=st.dictionaries(st.sampled_from(MODELS), st.integers(1, 4)),
)
def test_with_slots_every_slot_goes_to_the_brute_force_best(
    requests: list[tuple[str, int, int]],
    ready: set[str],
    divisor_ms: int,
    bonus: int,
    slots: int,
    model_slots: dict[str, int],
) -> None:
    """Each request given a slot is the argmax of what still waits; slots (the model's
    own count, if it has one) stay free only while the argmax wants another model."""
    fx = FakeWorld()
    for model in ready:
        fx.states[model] = ModelState.READY
    fx.states["busy"] = ModelState.READY
    scheduler = Driven(
        SerialScheduler(
            fx,
            GroupSwapper(GROUPS),
            limits={},
            aging_divisor=divisor_ms / 1000,
            swap_affinity_bonus=bonus,
            slots=slots,
            model_slots=model_slots,
        ),
        fx,
    )
    blocker = Ticket("busy", seq=0)
    scheduler.on_request(blocker)
    remaining = [
        Ticket(model, priority=priority, seq=seq, arrival=arrival_ms / 1000)
        for seq, (model, priority, arrival_ms) in enumerate(requests, start=1)
    ]
    for t in remaining:
        scheduler.on_request(t)  # all wait: the slots serve 'busy'
    now_ms = 10**6 + 1
    fx.time = now_ms / 1000
    held = [blocker]
    completed = 0  # fx.swaps[:completed] have been played to their end

    def check(decisions: list[Decision]) -> None:
        loading = {swap.target for swap in fx.swaps[completed:]}  # loads in progress
        for decision in decisions:
            if isinstance(decision, StartSwap):
                loading.add(decision.swap.target)
            if isinstance(decision, (Grant, JoinSwap)) and decision.ticket not in held:
                expected = brute_force(fx.states, remaining, now_ms, divisor_ms, bonus, loading)
                assert decision.ticket is expected
                assert not held or held[0].model == expected.model
                remaining.remove(expected)
                held.append(expected)
        limit = model_slots.get(held[0].model, slots) if held else 0
        assert len(held) <= limit or held[0] is blocker  # never more than the model's slots
        if remaining and held and len(held) < limit:
            best = brute_force(fx.states, remaining, now_ms, divisor_ms, bonus, loading)
            assert best.model != held[0].model  # a free slot waits only for a swap

    for _ in range(4 * len(requests) + 4):
        if not held:
            break
        finished = held.pop(0)
        check(scheduler.on_finish(finished))
        while completed < len(fx.swaps):  # play each load to its end
            before = len(fx.decisions)
            completed += 1
            fx.complete(scheduler, fx.swaps[completed - 1])
            check(fx.decisions[before:])
    assert remaining == []
