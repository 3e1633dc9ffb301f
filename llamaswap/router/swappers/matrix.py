"""The matrix swapper (SPEC §3.3, §6): which running models must stop for a target to run.

The problem. Groups say "one of these at a time" or "these never unload"; they cannot say
"chat fits beside embed or beside the small coder, but the big model needs the whole GPU".
``[routing.router.settings.matrix]`` says exactly that: its sets list the combinations of
models that fit together (``config/matrix_expr.py`` expands the set expressions into
combinations of model IDs), and any subset of a combination may run too.

The rule. To load a target:

* the candidates are the combinations that contain it, in definition order;
* a candidate evicts the running models outside it; its cost is the sum of their
  ``evict_costs`` (by var; 1 where none is given);
* candidates that evict no *busy* model (one with requests in flight, or being loaded) win
  over those that do: a busy model cannot stop before it drains (SPEC §6) or its load ends,
  so a dearer set needing no wait beats a cheaper one that would hold the request up. Only
  when every candidate evicts a busy model is the cheapest of them chosen, and the
  scheduler waits for it;
* among those, the lowest cost wins; ties go to the first defined.

A model in no combination runs alone: everything else running is evicted.

Prior art. llama-swap's matrix solver applies the same cost rule to (target, running), blind
to which models are serving; the preference for sets that evict nothing busy is ours.

Design. The candidates are listed per model when the config is read (duplicates across sets
dropped, the first definition kept), so a decision costs O(combinations containing the target
times their size) and never enumerates subsets. A pure function of (target, running, busy): no
state, no logging.

Rejected: counting a busy model as a very high cost (the order would then depend on how high,
and on the costs beside it), and minimising the number of models evicted instead of their
cost (``evict_costs`` exists so that one slow-to-load model can outweigh two quick ones).
"""

from __future__ import annotations

from collections.abc import Set
from typing import final

from llamaswap.config.matrix_expr import Combination, expand_sets
from llamaswap.config.model import MatrixConfig
from llamaswap.resources.fit import Placement, fits_beside, make_room

__all__ = ["MatrixSwapper"]

_DEFAULT_COST = 1
_IDEAL = (False, 0)  # evicts nothing busy, costs nothing: no later candidate can win


@final
class MatrixSwapper:
    def __init__(self, matrix: MatrixConfig, placement: Placement | None = None) -> None:
        """Expand ``matrix``, which validation has checked (its sets expand without error).
        With a ``placement``, the fit rule evicts more where the chosen set's models do not
        leave the target room (``resources/fit.py``)."""
        self._placement = placement
        self.persistent: frozenset[str] = frozenset()  # sets say what fits, nothing more
        self._costs: dict[str, int] = {}
        for var, model in matrix.vars.items():
            cost = matrix.evict_costs.get(var, _DEFAULT_COST)
            # Two vars for one model: the dearer cost counts, whatever their order.
            self._costs[model] = max(cost, self._costs.get(model, cost))
        self._candidates: dict[str, list[Combination]] = {}
        seen: set[Combination] = set()
        for combinations in expand_sets(matrix.sets, matrix.vars).values():
            for combination in combinations:
                if combination in seen:
                    continue  # an earlier set offers it already, and wins the tie
                seen.add(combination)
                for model in combination:
                    self._candidates.setdefault(model, []).append(combination)

    def cost(self, model: str) -> int:
        """What evicting ``model`` costs."""
        return self._costs.get(model, _DEFAULT_COST)

    def candidates(self, model: str) -> list[Combination]:
        """The combinations ``model`` may run in, first defined first (none: it runs alone)."""
        return self._candidates.get(model, [])

    def eviction_for(
        self, target: str, running: Set[str], busy: Set[str] = frozenset()
    ) -> frozenset[str]:
        by_sets = self._by_sets(target, running, busy)
        if self._placement is None:
            return by_sets
        room = make_room(self._placement, target, running - by_sets, busy=busy)
        return by_sets | (room or frozenset())

    def runs_beside(self, target: str, running: Set[str]) -> bool:
        if self._by_sets(target, running, frozenset()):
            return False
        placement = self._placement
        return placement is None or fits_beside(placement, target, running) is not False

    def _by_sets(self, target: str, running: Set[str], busy: Set[str]) -> frozenset[str]:
        others = set(running)
        others.discard(target)
        if not others:
            return frozenset()
        total = sum(self.cost(model) for model in others)
        busy_total = sum(1 for model in others if model in busy)
        best: Combination | None = None
        best_key = _IDEAL
        for combination in self.candidates(target):
            kept = busy_kept = 0
            for model in combination:
                if model in others:
                    kept += self.cost(model)
                    if model in busy:
                        busy_kept += 1
            key = (busy_kept < busy_total, total - kept)  # (evicts a busy model, cost)
            if best is None or key < best_key:
                best, best_key = combination, key
                if key == _IDEAL:
                    break
        if best is None:
            return frozenset(others)  # in no set: it runs alone
        return frozenset(others - best)
