"""The estimate of when a waiting request starts (resources/eta.py): pure, with chosen
figures. ``a`` loads in 0.5 s and serves in 4 s, ``b`` 2 s and 3 s, ``c`` 1 s and 1 s."""

from __future__ import annotations

from llamaswap.proxy.loading import about
from llamaswap.resources.eta import (
    MAX_RETRY_AFTER,
    Estimate,
    Figures,
    Serving,
    Waiting,
    estimate,
    retry_after,
)

NOW = 100.0
FIGURES = {"a": Figures(0.5, 4.0), "b": Figures(2.0, 3.0), "c": Figures(1.0, 1.0)}


def test_a_request_being_served_ends_after_its_serve_time_and_an_overdue_one_now() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0), Serving(2, "a", since=NOW - 5.0)],
        ready={"a"},
        figures=FIGURES,
    )
    assert found == {1: Estimate(0.0, 3.0), 2: Estimate(0.0, 0.0)}


def test_a_request_waiting_for_a_load_starts_when_the_load_is_due() -> None:
    found = estimate(
        NOW,
        waiting=[Waiting(1, "b", loading=True), Waiting(2, "c", loading=True)],
        loading={"b": NOW - 0.5},  # c's load has not begun: its evictions still stop
        figures=FIGURES,
    )
    assert found == {1: Estimate(1.5, 4.5), 2: Estimate(1.0, 2.0)}


def test_an_overdue_load_is_due_now() -> None:
    found = estimate(
        NOW, waiting=[Waiting(1, "b", loading=True)], loading={"b": NOW - 9.0}, figures=FIGURES
    )
    assert found == {1: Estimate(0.0, 3.0)}


def test_fifo_serves_a_models_queued_requests_together_after_one_swap() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0)],  # ends in 3 s
        waiting=[Waiting(2, "b"), Waiting(3, "b"), Waiting(4, "c")],
        ready={"a"},
        figures=FIGURES,
        slots=None,
    )
    assert found == {
        1: Estimate(0.0, 3.0),
        2: Estimate(5.0, 8.0),  # a drains (3), b loads (2)
        3: Estimate(5.0, 8.0),  # beside it
        4: Estimate(9.0, 10.0),  # both b's drain (8), c loads (1)
    }


def test_serial_serves_one_at_a_time_and_swaps_in_the_queues_order() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0)],
        waiting=[Waiting(2, "a"), Waiting(3, "b"), Waiting(4, "b"), Waiting(5, "a")],
        ready={"a"},
        figures=FIGURES,
        slots=1,
    )
    assert found == {
        1: Estimate(0.0, 3.0),
        2: Estimate(3.0, 7.0),  # the slot frees at 3
        3: Estimate(9.0, 12.0),  # a drains at 7, b loads in 2
        4: Estimate(12.0, 15.0),
        5: Estimate(15.5, 19.5),  # a loads again
    }


def test_parallel_slots_go_to_the_queue_as_they_free() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 3.0), Serving(2, "a", since=NOW - 1.0)],
        waiting=[Waiting(3, "a"), Waiting(4, "a"), Waiting(5, "a")],
        ready={"a"},
        figures=FIGURES,
        slots=2,
    )
    assert {request: found[request].start for request in (3, 4, 5)} == {3: 1.0, 4: 3.0, 5: 5.0}


def test_a_models_own_slot_count_wins() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 3.0)],
        waiting=[Waiting(2, "a"), Waiting(3, "a")],
        ready={"a"},
        figures=FIGURES,
        slots=1,
        model_slots={"a": 2},
    )
    assert (found[2].start, found[3].start) == (0.0, 1.0)


def test_a_load_holds_a_slot_and_the_queue_waits_for_it() -> None:
    found = estimate(
        NOW,
        waiting=[Waiting(1, "b", loading=True), Waiting(2, "b")],
        loading={"b": NOW},
        figures=FIGURES,
        slots=1,
    )
    assert found == {1: Estimate(2.0, 5.0), 2: Estimate(5.0, 8.0)}


def test_a_page_takes_no_slot_but_waits_for_its_model() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0), Serving(2, "a", since=NOW, slot=False)],
        waiting=[Waiting(3, "b", slot=False), Waiting(4, "b")],
        ready={"a"},
        figures=FIGURES,
        slots=1,
    )
    assert found == {
        1: Estimate(0.0, 3.0),
        2: Estimate(0.0, 0.0),
        3: Estimate(5.0, 5.0),  # a swap all the same
        4: Estimate(5.0, 8.0),  # the slot is free when b is ready
    }


def test_an_unknown_figure_makes_what_depends_on_it_unknown() -> None:
    unknown = {"a": Figures(0.5, None), "b": Figures(None, 3.0)}
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0)],
        waiting=[Waiting(2, "a"), Waiting(3, "b")],
        ready={"a"},
        figures=unknown,
        slots=1,
    )
    assert found == {1: Estimate(0.0, None), 2: Estimate(None, None), 3: Estimate(None, None)}


def test_a_default_stands_in_for_a_missing_figure() -> None:
    found = estimate(
        NOW,
        serving=[Serving(1, "a", since=NOW - 1.0)],
        waiting=[Waiting(2, "new")],
        ready={"a"},
        figures=FIGURES,
        default=Figures(8.0, 0.25),
        slots=1,
    )
    assert found[2] == Estimate(11.0, 11.25)


def test_nothing_waits_nothing_is_estimated() -> None:
    assert estimate(NOW, ready={"a"}, figures=FIGURES) == {}


def test_retry_after_is_whole_seconds_rounded_up_from_1_to_an_hour() -> None:
    assert retry_after(None) is None
    assert [retry_after(s) for s in (0.0, 0.25, 1.0, 3.0, 3.01)] == [1, 1, 1, 3, 4]
    assert retry_after(1e9) == MAX_RETRY_AFTER == 3600


def test_the_loading_streams_estimate_is_whole_seconds_then_minutes() -> None:
    seconds = (0.2, 1.4, 12.5, 89.4, 90.0, 400.0)
    assert [about(s) for s in seconds] == [
        "about 1 s",
        "about 1 s",
        "about 12 s",
        "about 89 s",
        "about 2 min",
        "about 7 min",
    ]
