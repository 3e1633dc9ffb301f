"""The live streams' buffers, synchronously: what a slow reader loses, and is told."""

from __future__ import annotations

import json

import pytest
import trio

from llamaswap.observability.events import EventHub, encode_sse
from llamaswap.observability.feed import Dropped, Feed, Feeds


def drain(feed: Feed[int]) -> list[int | Dropped]:
    """Everything the reader would get now, without waiting."""
    items: list[int | Dropped] = []
    while True:
        try:
            items.append(feed.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return items


def test_a_reader_that_keeps_up_loses_nothing() -> None:
    feed = Feed[int](3)
    for round_ in range(4):
        for i in range(3):
            feed.put(round_ * 3 + i)
        assert drain(feed) == [round_ * 3, round_ * 3 + 1, round_ * 3 + 2]
    assert feed.dropped == 0


def test_a_full_feed_drops_and_counts_and_says_so_where_the_items_were_lost() -> None:
    feed = Feed[int](3)
    for i in range(10):
        feed.put(i)
    assert feed.dropped == 7
    # The buffer keeps the first three; the notice comes once the reader has caught up.
    assert drain(feed) == [0, 1, 2, Dropped(7)]
    feed.put(10)
    assert drain(feed) == [10]


def test_the_notice_goes_in_before_the_next_item_that_fits() -> None:
    feed = Feed[int](2)
    for i in range(5):  # 0, 1 kept; 2, 3, 4 lost
        feed.put(i)
    assert feed.receive_nowait() == 0  # one slot frees
    feed.put(5)  # the notice takes the slot: 5 is lost too
    feed.put(6)
    assert drain(feed) == [1, Dropped(3), Dropped(2)]
    feed.put(7)
    assert drain(feed) == [7]
    assert feed.dropped == 5


def test_memory_stays_bounded_however_much_is_published() -> None:
    feed = Feed[int](4)
    for i in range(100_000):
        feed.put(i)
    assert feed._receive.statistics().current_buffer_used == 4
    assert drain(feed) == [0, 1, 2, 3, Dropped(99_996)]


def test_a_closed_feed_ends_after_what_it_holds_and_ignores_later_items() -> None:
    feed = Feed[int](2)
    for i in range(3):
        feed.put(i)
    feed.close()
    feed.put(99)
    assert feed.dropped == 1
    assert drain(feed) == [0, 1, Dropped(1)]
    with pytest.raises(trio.EndOfChannel):
        feed.receive_nowait()


def test_feeds_close_every_reader_and_start_later_ones_closed() -> None:
    feeds: Feeds[int] = Feeds(8)
    with feeds.open() as first, feeds.open() as second:
        assert len(feeds) == 2
        feeds.publish(1)
        feeds.close()
        feeds.publish(2)
        assert drain(first) == [1]
        assert drain(second) == [1]
        with feeds.open() as late:
            assert len(feeds) == 2
            with pytest.raises(trio.EndOfChannel):
                late.receive_nowait()
    assert len(feeds) == 0


def test_a_reader_that_leaves_is_forgotten_and_its_buffer_freed() -> None:
    feeds: Feeds[int] = Feeds(8)
    with feeds.open() as feed:
        feeds.publish(1)
    assert len(feeds) == 0
    feeds.publish(2)  # nobody to give it to
    with pytest.raises(trio.ClosedResourceError):
        feed.receive_nowait()


def test_the_hub_builds_the_first_event_in_the_same_step_as_the_subscription() -> None:
    hub = EventHub(buffer=4)
    assert hub.statistics().subscribers == 0
    built: list[int] = []

    def snapshot() -> dict[str, object]:
        built.append(len(built))
        return {"type": "snapshot", "n": len(built)}

    with hub.subscribe(first=snapshot) as feed:
        assert hub.statistics().subscribers == 1
        hub.publish({"type": "model", "model": "a"})
        assert feed.receive_nowait() == encode_sse({"type": "snapshot", "n": 1})
        assert feed.receive_nowait() == encode_sse({"type": "model", "model": "a"})
    assert hub.statistics().subscribers == 0
    assert built == [0]


def test_a_slow_subscriber_loses_events_the_others_get() -> None:
    hub = EventHub(buffer=2)
    with hub.subscribe() as slow, hub.subscribe() as fast:
        for i in range(5):
            hub.publish({"type": "tick", "i": i})
            assert fast.receive_nowait() == encode_sse({"type": "tick", "i": i})
        assert hub.statistics().dropped == 3
        assert [slow.receive_nowait() for _ in range(3)] == [
            encode_sse({"type": "tick", "i": 0}),
            encode_sse({"type": "tick", "i": 1}),
            Dropped(3),
        ]
    assert hub.statistics().published == 5


def test_reload_events_carry_the_result() -> None:
    hub = EventHub()
    with hub.subscribe() as feed:
        hub.publish_reload({"ok": False, "changed": {}, "problems": ["models.a.cmd: missing"]})
        assert feed.receive_nowait() == encode_sse(
            {"type": "reload", "ok": False, "changed": {}, "problems": ["models.a.cmd: missing"]}
        )


def test_sse_encoding_is_one_event_per_blank_line_with_json_on_one_line() -> None:
    event = {"type": "log", "model": None, "text": "two\nlines"}
    encoded = encode_sse(event)
    assert encoded.endswith(b"\n\n")
    name, data = encoded.decode().removesuffix("\n\n").split("\n")
    assert name == "event: log"
    assert json.loads(data.removeprefix("data: ")) == event
