"""A load that runs out of memory is retried once, after evicting every idle model
(``Ledger.finish_swap``), under both schedulers: pure code against the FakeWorld."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from llamaswap.config.model import GroupConfig
from llamaswap.errors import ModelStartFailed
from llamaswap.process.state import ModelState
from llamaswap.router.swappers.group import GroupSwapper
from llamaswap.schedulers.base import RequestState
from llamaswap.schedulers.fifo import FifoScheduler
from llamaswap.schedulers.serial import SerialScheduler
from tests.fakes import Driven, FakeWorld, ticket
from tests.unit.test_fit import figures

READY = ModelState.READY
OOM_LINE = "cudaMalloc failed: out of memory"


def oom(model: str) -> ModelStartFailed:
    error = ModelStartFailed(model, "exited with code 1")
    error.out_of_memory = OOM_LINE
    return error


def fifo(world: FakeWorld, swapper: GroupSwapper) -> Driven[Any]:
    return Driven(FifoScheduler(world, swapper, limits={}), world)


def serial(world: FakeWorld, swapper: GroupSwapper) -> Driven[Any]:
    return Driven(SerialScheduler(world, swapper, limits={}, slots=4), world)


MAKERS = pytest.mark.parametrize("make", [fifo, serial], ids=["fifo", "serial"])
Make = Callable[[FakeWorld, GroupSwapper], Driven[Any]]


@MAKERS
def test_an_out_of_memory_load_is_retried_once_after_evicting_the_idle_models(make: Make) -> None:
    fx = FakeWorld()
    for model in ("a", "b", "k"):
        fx.states[model] = READY
    groups = {"keep": GroupConfig(members=("k",), persistent=True)}
    # The figures say t fits beside a, b and k; the GPU says otherwise.
    s = make(fx, GroupSwapper(groups, figures(a=4, b=4, k=4, t=4)))
    fx.serving["b"] = 1  # b serves a request: it is not idle
    t = ticket("t", 2)
    s.on_request(t)
    first = fx.last_swap()
    assert (first.evict, first.retry) == (frozenset(), None)
    fx.complete(s, first, oom("t"))
    retry = fx.last_swap()
    assert retry is not first
    assert (retry.target, retry.evict, retry.waiters) == ("t", frozenset({"a"}), [t])
    assert retry.retry == f"out of memory: {OOM_LINE}"
    assert (t.state, t.metadata["retried"]) == (RequestState.LOADING, retry.retry)
    # A second failure is final.
    fx.complete(s, retry, oom("t"))
    assert [(ticket, type(error)) for ticket, error in fx.failed] == [(t, ModelStartFailed)]


@MAKERS
def test_with_nothing_idle_to_evict_the_waiters_fail_at_once(make: Make) -> None:
    fx = FakeWorld()
    s = make(fx, GroupSwapper({}))
    t = ticket("t", 1)
    s.on_request(t)
    fx.complete(s, fx.last_swap(), oom("t"))
    assert len(fx.swaps) == 1
    assert [ticket for ticket, _ in fx.failed] == [t]


@MAKERS
def test_a_failure_without_the_sign_is_not_retried(make: Make) -> None:
    fx = FakeWorld()
    fx.states["a"] = READY
    s = make(fx, GroupSwapper({}, figures(a=4, t=4)))
    t = ticket("t", 1)
    s.on_request(t)
    fx.complete(s, fx.last_swap(), ModelStartFailed("t", "exited with code 1"))
    assert len(fx.swaps) == 1
    assert [ticket for ticket, _ in fx.failed] == [t]
