"""``serial``: one slot for the whole box, dispatched by score (SPEC §7.5).

The problem
-----------
A GPU that fits one model at a time is a size-1 resource. A batch job can hold it for
minutes; under ``fifo`` every interactive request that arrives meanwhile queues behind it
in arrival order. Callers know how urgent they are, so they say so with the
``X-LlamaSwap-Priority`` header, and this scheduler dispatches one request at a time,
across all models, picking the best score whenever the slot frees::

    score = priority + affinity + wait_seconds / agingDivisor
    affinity = min(swapAffinityBonus, 99) if the request's model is ready and needs no
               eviction, else 0

Ties go to the earliest arrival. A request whose model must load holds the slot through
the load. Nothing running is preempted unless ``preempt`` is on (below). A pick that
would evict a model loaded less than ``minResidency`` ago, while requests of the same
band or a higher one wait for it, passes over that request's model (the ledger's
residency rule), so those requests are served first.

Why these terms
---------------
*Priority* is the caller's word. Bands sit 100 apart (``interactive`` 100, ``normal`` 0,
``batch`` -100) so a caller can add a small offset to order work inside its band.
*Affinity* saves swaps: a request for the model already loaded goes before an equal
request that would evict it, because a swap costs seconds to minutes of GPU time. It is
capped at 99 so that it can reorder work *within* a band but never lift a request over one
a full band (100) above it. *Aging* makes starvation impossible: every waiting request
gains a point per ``agingDivisor`` seconds, without bound, so even ``batch`` work
eventually outscores a steady stream of fresh ``interactive`` requests.

Why a pick is O(models + log n)
-------------------------------
Every waiting request ages at the same rate, so ``wait / agingDivisor`` adds the same
amount to every score: the order between two requests never changes with time. Multiply a
score by ``agingDivisor`` and drop the ``now`` common to all, and the order is that of
the *static key* ``priority * agingDivisor - arrival``, fixed at arrival. Only affinity
changes, and it is a property of the model, not of the request. So requests wait in one
heap per model (a *lane*) ordered by static key, and a pick compares the head of each lane
plus that model's affinity: O(models) peeks and one O(log n) pop. Keys are integers
(times in nanoseconds), so arbitrarily large priorities compare exactly. With
``agingDivisor = 0`` aging is off and the key is the priority alone.

Preemption
----------
With ``preempt`` on, a waiting request that outscores a serving slot holder by a whole
band (``PREEMPT_MARGIN``, 100 points: priority and aging, affinity left out, so that
neither affinity, capped at 99, nor aging, which only narrows the gap to an earlier
arrival, ever preempts alone) and could otherwise not have the slot checkpoints it: the
scheduler decides ``Preempt``, the request's task ends its generation, keeps what was
made, and comes back (``on_preempted``) to wait in its lane with its old static key, so
it goes on aging from its arrival. In the static keys the rule is one subtraction:
``key(waiting) - key(serving) >= 100 * agingDivisor``. Only a request its forwarder marked
resumable (``Ticket.preemptible``) is preempted, at most ``maxPreemptions`` times (then it
runs to its end: no live-lock). A holder whose model is still loading for it, where the
waiting request wants another model, gives the load up at once (``Ledger.take_back``)
rather than finish it only to be checkpointed. For a model of its own the waiting
request needs every slot, so every holder must qualify; for the slot holders' model, the
lowest-ranked one gives its slot.

Rejected alternatives
---------------------
*Preemption by default* would throw away work for servers that cannot resume a prefilled
answer; it is opt-in, per model and per request. *Recomputing every
score at each pick* is O(n) per pick and, at 100 000 waiting requests, too slow to do on
every completion. *Strict priority with no aging* starves batch work under steady load.
*Affinity without a cap* lets a cheap swap-avoidance beat genuinely urgent work.
"""

from __future__ import annotations

import collections
import itertools
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import final

import attrs

from llamaswap.config.model import DEFAULT_MAX_QUEUED, MAX_SWAP_AFFINITY_BONUS, Config
from llamaswap.errors import ModelUnloaded, QueueFull, RequestError
from llamaswap.process.state import ModelState

from .base import (
    Decision,
    Handover,
    RequestState,
    SchedulerStatistics,
    Swap,
    Swapper,
    Ticket,
    World,
)
from .ledger import Ledger
from .settings import limits, model_slots
from .waitqueue import PriorityWaitQueue

__all__ = ["SerialScheduler"]

_NS = 1_000_000_000
#: Points by which a waiting request must outscore a serving one to preempt it: a band.
PREEMPT_MARGIN = 100


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


@attrs.define(eq=False)
class _Lane:
    """The waiting requests for one model, in two orders."""

    by_score: PriorityWaitQueue[Ticket] = attrs.field(factory=PriorityWaitQueue)
    by_priority: PriorityWaitQueue[Ticket] = attrs.field(factory=PriorityWaitQueue)


@final
class _Lanes:
    """Every waiting request, one lane per model (a ledger ``Queue``)."""

    def __init__(self) -> None:
        self.lanes: dict[str, _Lane] = collections.defaultdict(_Lane)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Ticket]:
        for lane in list(self.lanes.values()):
            yield from lane.by_score

    def push(self, ticket: Ticket, static_key: int) -> None:
        lane = self.lanes[ticket.model]
        lane.by_score.push(ticket, (-static_key, ticket.seq))
        lane.by_priority.push(ticket, (-ticket.priority, ticket.seq))
        self._count += 1

    def remove(self, ticket: Ticket) -> bool:
        lane = self.lanes.get(ticket.model)
        if lane is None or not lane.by_score.remove(ticket):
            return False
        lane.by_priority.remove(ticket)
        self._count -= 1
        return True

    def pop_best(self, model: str) -> Ticket | None:
        """The best-scored request for ``model``, taken out; None if none waits."""
        lane = self.lanes.get(model)
        head = None if lane is None else lane.by_score.peek()
        if head is not None:
            self.remove(head)
        return head


@final
class SerialScheduler:
    """See the module docstring.

    Args:
        world: what the scheduler may ask (the router).
        swapper: the eviction policy.
        limits: ``concurrencyLimit`` per model ID.
        aging_divisor: seconds per aging point; 0 disables aging.
        swap_affinity_bonus: points for a request whose model is ready; capped at 99.
        max_queued: requests that may wait at once, across every model; beyond, 429.
        slots: requests in service at once, all for the loaded model...
        model_slots: ...or as many as this says for that model (``[models.X] slots``).
        min_residency: ``minResidency``, seconds; 0 turns the rule off.
        preempt: checkpoint a serving request for one a band above it (docstring above).
        max_preemptions: how often one request may be preempted.

    A model has no ``concurrencyLimit`` unless it sets one: serial exists to queue a burst
    and serve it by score, not to refuse it.
    """

    name = "serial"

    def __init__(
        self,
        world: World,
        swapper: Swapper,
        *,
        limits: Mapping[str, int],
        aging_divisor: float = 60.0,
        swap_affinity_bonus: int = 10,
        max_queued: int = DEFAULT_MAX_QUEUED,
        slots: int = 1,
        model_slots: Mapping[str, int] | None = None,
        min_residency: float = 0.0,
        preempt: bool = False,
        max_preemptions: int = 3,
    ) -> None:
        self._ledger = Ledger(world, swapper, limits, min_residency=min_residency)
        self._world = world
        self._configure(aging_divisor, swap_affinity_bonus, max_queued, slots, model_slots or {})
        self._preempt = preempt
        self._max_preemptions = max_preemptions
        self._lanes = _Lanes()
        #: The requests holding a slot (in service, loading, or waiting for a busy model
        #: to drain), all for one model; the first one leads (it started the load).
        self._holders: list[Ticket] = []
        self.aging_changed_picks = 0
        self.affinity_changed_picks = 0

    def _configure(
        self,
        aging_divisor: float,
        swap_affinity_bonus: int,
        max_queued: int,
        slots: int,
        model_slots: Mapping[str, int],
    ) -> None:
        self._max_queued = max_queued
        self._slots = slots
        self._model_slots = dict(model_slots)
        self._divisor = aging_divisor
        self._divisor_ns = _ns(aging_divisor)
        self._bonus = min(swap_affinity_bonus, MAX_SWAP_AFFINITY_BONUS)

    # ------------------------------------------------------------------ keys

    def static_key(self, ticket: Ticket) -> int:
        """The score times ``agingDivisor``, minus the ``now`` common to all requests."""
        if self._divisor_ns:
            return ticket.priority * self._divisor_ns - _ns(ticket.arrival)
        return ticket.priority

    def _bonus_units(self) -> int:
        return self._bonus * (self._divisor_ns or 1)

    def affinity(self, model: str, running: set[str] | None = None) -> bool:
        """Whether requests for ``model`` get the affinity bonus now: it is ready and
        running it needs no eviction. ``running`` saves recomputing the running set."""
        if not self._bonus or self._world.model_state(model) is not ModelState.READY:
            return False
        return not self._ledger.evictions(model, running)

    def _affinities(self) -> dict[str, bool]:
        """Affinity of every model that has requests waiting, computed once per pick."""
        running = self._ledger.running() if self._bonus else set()
        return {
            model: self.affinity(model, running)
            for model, lane in self._lanes.lanes.items()
            if lane.by_score
        }

    def score(self, ticket: Ticket, *, affinity: bool) -> float:
        """The score as the docs write it, in points (for logs and the activity log)."""
        aging = 0.0
        if self._divisor:
            aging = (self._world.now() - ticket.arrival) / self._divisor
        bonus = self._bonus if affinity else 0
        try:
            return float(ticket.priority + bonus) + aging
        except OverflowError:  # beyond a float's range: the largest finite one (valid JSON)
            return sys.float_info.max if ticket.priority > 0 else -sys.float_info.max

    # ----------------------------------------------------------------- events

    def on_request(self, ticket: Ticket) -> list[Decision]:
        if self._enter(ticket):
            self._fill_slots()
        return self._ledger.take()

    def admitted(self, model: str) -> int:
        return len(self._ledger.admitted.get(model, ()))

    def adopt(self, handover: Handover) -> list[Decision]:
        # What the old scheduler dispatched holds the slots: nothing more is granted
        # beside it than the slots allow, and another model waits for it to drain.
        self._ledger.take_over(handover)
        self._holders.extend(handover.dispatched)
        for ticket in handover.waiting:
            try:
                self._enter(ticket)
            except RequestError as exc:  # over a lowered concurrencyLimit or maxQueued
                self._ledger.fail(ticket, exc)
        self._fill_slots()
        return self._ledger.take()

    def on_cancel(self, ticket: Ticket) -> list[Decision]:
        ledger = self._ledger
        if ticket not in self._holders:
            ledger.cancel(self._lanes, ticket)  # it was queued
            return ledger.take()
        self._holders.remove(ticket)
        loading = [t for t in self._holders if t.state is RequestState.LOADING]
        if ledger.joined(ticket) and not loading:
            successor = self._lanes.pop_best(ticket.model)
            if successor is not None:
                # Another request wants this model: the load goes on, for it.
                self._holders.append(successor)
                successor.score = self.score(successor, affinity=self.affinity(ticket.model))
                ledger.join(successor, ledger.swaps[ticket.model])
        ledger.cancel(self._lanes, ticket)
        self._fill_slots()
        return ledger.take()

    def on_finish(self, ticket: Ticket) -> list[Decision]:
        self._ledger.release(ticket)
        holders = self._holders
        if ticket in holders:
            holders.remove(ticket)
            self._fill_slots()
        else:
            self._dispatch_waiting_lead()  # its swap may have waited for this model to drain
        return self._ledger.take()

    def on_preempted(self, ticket: Ticket) -> list[Decision]:
        if ticket in self._holders:
            self._holders.remove(ticket)
        self._ledger.requeue(ticket)
        self._lanes.push(ticket, self.static_key(ticket))
        self._fill_slots()
        return self._ledger.take()

    def on_recheck(self) -> list[Decision]:
        self._dispatch_waiting_lead()
        self._fill_slots()
        return self._ledger.take()

    def on_swap_done(self, swap: Swap, error: RequestError | None) -> list[Decision]:
        if self._ledger.finish_swap(swap, error) and error is not None:
            self._ledger.fail_queued(self._lanes, {swap.target}, error)
            self._holders = [t for t in self._holders if t.state is RequestState.SERVING]
        # More of the slots, for the model now ready; or, after a load that failed or was
        # cancelled (which held requests back), whatever may go now.
        self._fill_slots()
        return self._ledger.take()

    def on_model_state(self, model: str, state: ModelState) -> list[Decision]:
        lane = self._lanes.lanes.get(model)
        if state is ModelState.READY and lane is not None and self._may_skip_slot(model):
            for ticket in lane.by_score.ordered():
                if not ticket.needs_slot:
                    self._lanes.remove(ticket)
                    self._ledger.grant(ticket)
        return self._ledger.take()

    def on_unload(self, models: Collection[str], reason: str = "unloaded") -> list[Decision]:
        self._release_slots(models, lambda model: ModelUnloaded(model, reason))
        self._ledger.unload(self._lanes, models, reason)
        self._fill_slots()
        return self._ledger.take()

    def on_reconfigure(self, config: Config, swapper: Swapper) -> list[Decision]:
        settings = config.routing.scheduler.settings.serial
        self._ledger.configure(swapper, limits(config), config.min_residency)
        self._configure(
            settings.aging_divisor,
            settings.swap_affinity_bonus,
            settings.max_queued,
            settings.slots,
            model_slots(config),
        )
        self._preempt = settings.preempt
        self._max_preemptions = settings.max_preemptions
        queued = sorted(self._lanes, key=lambda t: t.seq)
        self._lanes = _Lanes()  # static keys depend on agingDivisor: computed again
        for ticket in queued:
            self._lanes.push(ticket, self.static_key(ticket))
        self._fill_slots()
        return self._ledger.take()

    def surrender(self) -> Handover:
        waiting = self._holding()
        self._holders = []
        return self._ledger.surrender(self._lanes, waiting)

    def on_shutdown(self, error: RequestError) -> list[Decision]:
        self._release_slots(None, lambda _: error)
        self._ledger.shut_down(self._lanes, error)
        return self._ledger.take()

    # ------------------------------------------------------------------ views

    def queued(self) -> list[Ticket]:
        # A slot holder waiting for a busy model to drain goes first; then the pick order.
        first = self._holding()
        affinity = self._affinities()
        ranked = sorted(self._lanes, key=lambda t: self._rank(t, affinity[t.model]), reverse=True)
        return first + ranked

    def scores(self, tickets: list[Ticket]) -> list[float | None]:
        # A slot holder waiting for a model to drain keeps its score at the pick.
        affinity: dict[str, bool] = {}
        scores: list[float | None] = []
        for ticket in tickets:
            if ticket.score is not None:
                scores.append(ticket.score)
                continue
            if ticket.model not in affinity:
                affinity[ticket.model] = self.affinity(ticket.model)
            scores.append(self.score(ticket, affinity=affinity[ticket.model]))
        return scores

    def statistics(self) -> SchedulerStatistics:
        ledger = self._ledger
        holding = self._holding()  # not yet dispatched: waiting, as queued() says
        return SchedulerStatistics(
            name=self.name,
            waiting=len(holding) + len(self._lanes),
            loading=ledger.loading_count(),
            swaps=tuple(sorted(ledger.swaps)),
            bands=ledger.band_statistics(itertools.chain(holding, self._lanes)),
            aging_changed_picks=self.aging_changed_picks,
            affinity_changed_picks=self.affinity_changed_picks,
            slot_holder=self._holders[0].model if self._holders else None,
        )

    # --------------------------------------------------------------- the slot

    def _holding(self) -> list[Ticket]:
        """The slot holders not yet dispatched: picked, but waiting for a busy model to
        drain before their load can start. They wait, as the lanes do."""
        return [t for t in self._holders if t.state is RequestState.QUEUED]

    def slots(self, model: str) -> int:
        """How many requests for ``model`` may be in service at once."""
        return self._model_slots.get(model, self._slots)

    def _may_skip_slot(self, model: str) -> bool:
        """A page may skip the slot if its model is ready, unless the slot holder waits for
        that model to drain (pages arriving one after another would hold off its swap)."""
        lead = self._holders[0] if self._holders else None
        if (
            lead is not None
            and lead.state is RequestState.QUEUED
            and model in self._ledger.evictions(lead.model)
        ):
            return False
        return self._ledger.plan(model).immediate

    def _release_slots(
        self, models: Collection[str] | None, error: Callable[[str], RequestError]
    ) -> None:
        """Give up the slots of holders not served yet that want one of ``models`` (any,
        for ``None``): one waiting for a model to drain fails here; a load they wait for
        is abandoned by the ledger, which fails them."""
        kept = []
        for holder in self._holders:
            if holder.state is RequestState.SERVING or (
                models is not None and holder.model not in models
            ):
                kept.append(holder)
            elif holder.state is RequestState.QUEUED:
                self._ledger.fail(holder, error(holder.model))
        self._holders = kept

    def _dispatch_waiting_lead(self) -> None:
        """Start the lead's load if it waited for a model to drain and may go now. If the
        model it evicts is in its residency, the lead gives the slot back and waits in its
        lane: the slot goes to the requests that keep that model."""
        holders = self._holders
        if not holders or holders[0].state is not RequestState.QUEUED:
            return
        lead = holders[0]
        plan = self._ledger.plan(lead.model)
        if plan.blocked or not self._ledger.held(lead, plan.evict):
            self._ledger.dispatch(lead)
            return
        holders.remove(lead)
        lead.score = None
        self._lanes.push(lead, self.static_key(lead))
        self._fill_slots()

    def _rank(self, ticket: Ticket, affinity: bool) -> tuple[int, int]:
        """Bigger is better: the static key plus affinity, then earlier arrival."""
        return (self.static_key(ticket) + (self._bonus_units() if affinity else 0), -ticket.seq)

    def choose(self) -> Ticket | None:
        """The request the next pick takes (without taking it); counts nothing."""
        return self._choose(self._affinities())[0]

    def _choose(
        self, affinity: dict[str, bool]
    ) -> tuple[Ticket | None, Ticket | None, Ticket | None]:
        """The pick, the pick without aging, and the pick without affinity."""
        best = no_aging = no_affinity = None
        best_rank = no_aging_rank = no_affinity_rank = (0, 0)
        for model, bonus in affinity.items():
            lane = self._lanes.lanes[model]
            head = lane.by_score.peek()
            eldest = lane.by_priority.peek()
            assert head is not None
            assert eldest is not None
            rank = self._rank(head, bonus)
            if best is None or rank > best_rank:
                best, best_rank = head, rank
            plain = self._rank(head, False)
            if no_affinity is None or plain > no_affinity_rank:
                no_affinity, no_affinity_rank = head, plain
            unaged = (eldest.priority + (self._bonus if bonus else 0), -eldest.seq)
            if no_aging is None or unaged > no_aging_rank:
                no_aging, no_aging_rank = eldest, unaged
        return best, no_aging, no_affinity

    def _held(self, ticket: Ticket) -> bool:
        """Whether ``minResidency`` keeps a model the pick of ``ticket`` would evict (a
        ``Recheck`` is then decided for its end)."""
        if not self._ledger.min_residency or self._ledger.swaps.get(ticket.model):
            return False
        return self._ledger.held(ticket, self._ledger.evictions(ticket.model))

    def _enter(self, ticket: Ticket) -> bool:
        """Admit ``ticket`` (or raise ``QueueFull``, ``ConcurrencyLimit``): a page like GET
        /props is granted at once, without the slot; anything else is queued (True)."""
        page = not ticket.needs_slot and self._may_skip_slot(ticket.model)
        if not page and len(self._lanes) + len(self._holding()) >= self._max_queued:
            raise QueueFull(self._max_queued)
        self._ledger.admit(ticket)
        ticket.effective_priority = ticket.priority
        if page:
            self._ledger.grant(ticket)
            return False
        self._lanes.push(ticket, self.static_key(ticket))
        return True

    def _fill_slots(self) -> None:
        """Give free slots to the best-scored requests. All slots serve one model: when the
        best waiting request wants another, nothing more is granted for this one, and the
        swap happens as soon as the slots are free."""
        holders = self._holders
        while self._lanes:
            full = bool(holders) and len(holders) >= self.slots(holders[0].model)
            if full and not self._preempt:
                return
            candidates = len(self._lanes)
            affinity = self._affinities()
            ticket, no_aging, no_affinity = self._choose(affinity)
            while ticket is not None and not affinity[ticket.model] and self._held(ticket):
                del affinity[ticket.model]  # its load would evict a model still in residency
                ticket, no_aging, no_affinity = self._choose(affinity)
            if ticket is None:
                return  # every candidate is held: a Recheck wakes the scheduler
            if holders and (
                full or ticket.model != holders[0].model or holders[0].state is RequestState.QUEUED
            ):
                if self._preempt_for(ticket):
                    continue  # a load given up for it: the slots are free
                return
            if candidates >= 2:
                self.aging_changed_picks += no_aging is not ticket
                self.affinity_changed_picks += no_affinity is not ticket
            ticket.score = self.score(ticket, affinity=affinity[ticket.model])
            ticket.metadata["affinity"] = affinity[ticket.model]
            self._lanes.remove(ticket)
            holders.append(ticket)
            swap = self._ledger.swaps.get(ticket.model)
            if swap is not None:
                self._ledger.join(ticket, swap)  # the lead's load serves it too
            else:
                # Served, or its load started; if a model it evicts is busy, it keeps the
                # slot, QUEUED, until that model drains (on_finish).
                self._ledger.dispatch(ticket)

    def _preempt_for(self, ticket: Ticket) -> bool:
        """Checkpoint the slot holders ``ticket`` outranks by a band, if that gives it the
        slot: the lowest-ranked holder, for the holders' own model (its slots are full);
        every holder, for another model. None if any of them may not be preempted.

        Holders whose model is still loading give it up at once (the ledger's
        ``take_back``: the load is cancelled, they wait again): True, the slots are free
        for ``ticket`` now. Serving ones are told to checkpoint, and free them when they
        come back (``on_preempted``)."""
        holders = self._holders
        if not self._preempt or any(holder.preempting for holder in holders):
            return False  # one preemption at a time: the pick runs again when it comes back
        if ticket.model == holders[0].model and holders[0].state is not RequestState.QUEUED:
            victims = [min(holders, key=lambda t: (self.static_key(t), -t.seq))]
        else:
            victims = list(holders)
        if not all(self._outranks(ticket, victim) for victim in victims):
            return False
        for victim in victims:
            if victim.state is RequestState.LOADING:
                holders.remove(victim)
                self._ledger.take_back(victim)
                self._lanes.push(victim, self.static_key(victim))
            else:
                self._ledger.preempt(victim)
        return not holders

    def _outranks(self, ticket: Ticket, holder: Ticket) -> bool:
        """Whether ``ticket``, waiting, may preempt ``holder``: it is serving, or waiting
        for the load of another model than ``ticket``'s; resumable; preempted fewer than
        ``maxPreemptions`` times; and a band below ``ticket``."""
        margin = PREEMPT_MARGIN * (self._divisor_ns or 1)
        loading = holder.state is RequestState.LOADING and holder.model != ticket.model
        return (
            (holder.state is RequestState.SERVING or loading)
            and holder.preemptible
            and holder.preemptions < self._max_preemptions
            and self.static_key(ticket) - self.static_key(holder) >= margin
        )
