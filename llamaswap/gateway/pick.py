"""Which node serves a request: a pure function of the nodes' last figures.

**A node the model is loaded on comes first, then one loading it, then one with room for
it, then the least loaded** (whose next load evicts a model). Within a tier, a node whose
figures are fresh beats a stale one, then the shortest queue, then the fewest running,
then the emptiest KV cache. The queue counts the picks sent since the node's last scrape
(``pending``), which its figures cannot show yet: a burst between two scrapes does not
all land on the node that looked shortest.

The band decides placement. Interactive work (and above) goes where the model is
loaded, to the shortest queue, however deep. Other work *spreads*: when the best node's
queue is ``spread_depth`` deep, it goes to a node with a shorter queue that is already
loading the model, else to an idle one with room to load it, if there is one (never to
one it would make evict a model). The priority header itself passes on untouched: each node then
schedules the request as it would alone.

**Stale figures lower a node's rank but never exclude it; a node whose last
``down_after`` scrapes failed is routed around** (a dead node within a few scrape
intervals). A node that has never answered, or does not serve the model, is not a
candidate. A model no node lists goes to the least loaded node, which answers for it (an
alias, or its 404).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from llamaswap.schedulers.priority import band_of

from .nodes import Figures, Node

__all__ = ["Pick", "Policy", "Reason", "pick"]


class Reason(enum.Enum):
    """Why a node was picked (the gateway's ``/metrics`` counts picks by it)."""

    LOADED = "loaded"
    LOADING = "loading"
    ROOM = "room"
    LEAST_LOADED = "least_loaded"


@attrs.frozen
class Policy:
    #: Figures older than this (seconds) rank below fresh ones.
    stale_after: float = 0.25
    #: Failed scrapes in a row after which a node is routed around.
    down_after: int = 3
    #: The queue depth at which work below interactive spreads to an idle node.
    spread_depth: int = 4

    def is_up(self, node: Node) -> bool:
        """Whether ``node`` is picked from: it has answered, and is not down."""
        return node.figures is not None and node.failures < self.down_after


@attrs.frozen
class Pick:
    node: Node
    reason: Reason


def pick(
    nodes: Sequence[Node],
    model: str | None,
    priority: int,
    *,
    now: float,
    policy: Policy,
    pending: Mapping[str, int],
) -> Pick | None:
    """The node to send a request for ``model`` (None: any node) to; None when no node
    is up."""

    def rank(node: Node, figures: Figures, reason: Reason) -> _Rank:
        fresh = now - node.scraped_at <= policy.stale_after
        return _Rank(node, figures, reason, fresh, pending.get(node.name, 0))

    up = [(node, node.figures) for node in nodes if policy.is_up(node)]
    live = [(node, figures) for node, figures in up if figures is not None]
    ranks = [
        rank(node, figures, _tier(figures, model))
        for node, figures in live
        if model is not None and model in (node.models or ())
    ]
    spreads = bool(ranks) and band_of(priority) not in _NEVER_SPREAD
    if not ranks:  # no model, or one no node lists: any node answers for it
        ranks = [rank(node, figures, Reason.LEAST_LOADED) for node, figures in live]
    if not ranks:
        return None
    best = max(ranks, key=_Rank.key)
    if spreads and best.queue >= policy.spread_depth:
        short = [r for r in ranks if r.queue < policy.spread_depth and r.may_take_spread()]
        best = max(short, key=_Rank.key, default=best)
    return Pick(best.node, best.reason)


_NEVER_SPREAD = frozenset({"interactive", "above_interactive"})


_TIERS = {Reason.LOADED: 3, Reason.LOADING: 2, Reason.ROOM: 1, Reason.LEAST_LOADED: 0}


def _tier(figures: Figures, model: str) -> Reason:
    if model in figures.resident:
        return Reason.LOADED
    if model in figures.loading:
        return Reason.LOADING
    return Reason.ROOM if figures.has_room() else Reason.LEAST_LOADED


@attrs.frozen
class _Rank:
    node: Node
    figures: Figures
    reason: Reason
    fresh: bool
    pending: int

    @property
    def queue(self) -> int:
        return self.figures.waiting + self.pending

    def may_take_spread(self) -> bool:
        """Whether work spread from a deep queue may come here: a node already loading
        the model, or an idle one with room for it (never one that would evict)."""
        idle = self.queue == 0 and self.figures.running == 0
        return self.reason is Reason.LOADING or (self.reason is Reason.ROOM and idle)

    def key(self) -> tuple[int, bool, int, int, float]:
        """Higher is better."""
        f = self.figures
        return (_TIERS[self.reason], self.fresh, -self.queue, -f.running, -f.kv_usage)
