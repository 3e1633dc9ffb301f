"""The activity writer on Trio's mock clock: batching, shutdown flush, dropping when full.

A fake sink stands in for the SQLite store (whose writes run in a worker thread, which the
autojump clock cannot see); the last test runs the real store on the real clock.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import final

import pytest
import trio
import trio.testing

from llamaswap.observability import ActivityLog, ActivityRecord, ActivityStore, ActivityWriter
from llamaswap.observability.activity import iso_time
from llamaswap.observability.store import WriterStatistics
from tests.unit.test_activity_query import make, query


@final
class FakeSink:
    """Records each batch with the time it was written; can be slow, stuck or failing."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []
        self.delay = 0.0
        self.gate: trio.Event | None = None  # when set: each write waits for it
        self.failures: list[Exception] = []  # raised by the next writes, in order

    async def write(self, records: Sequence[ActivityRecord]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        if self.gate is not None:
            await self.gate.wait()
        await trio.sleep(self.delay)
        self.batches.append((trio.current_time(), [record.id for record in records]))

    def __repr__(self) -> str:
        return "FakeSink()"


def stats(writer: ActivityWriter) -> tuple[int, int, int, int, int]:
    s = writer.statistics()
    return (s.buffered, s.written, s.dropped, s.failed, s.batches)


async def test_records_are_written_in_batches_a_second_after_the_first(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    sink = FakeSink()
    writer = ActivityWriter(sink, interval=1.0)
    await nursery.start(writer.run)
    for id in (1, 2, 3):
        writer.put(make(id))
    await trio.sleep(0.5)
    writer.put(make(4))
    await trio.sleep(0.75)  # t = 1.25
    assert sink.batches == [(1.0, [1, 2, 3, 4])]
    writer.put(make(5))
    await trio.sleep(1.5)  # t = 2.75
    assert sink.batches == [(1.0, [1, 2, 3, 4]), (2.25, [5])]
    assert writer.statistics() == WriterStatistics(
        buffered=0, written=5, dropped=0, failed=0, batches=2
    )


async def test_a_full_batch_is_written_at_once(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    sink = FakeSink()
    writer = ActivityWriter(sink, batch_size=2, interval=1.0)
    await nursery.start(writer.run)
    for id in range(1, 6):
        writer.put(make(id))
    await trio.sleep(1.5)
    assert sink.batches == [(0.0, [1, 2]), (0.0, [3, 4]), (1.0, [5])]


async def test_cancelling_the_writer_writes_what_is_buffered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = FakeSink()
    writer = ActivityWriter(sink, capacity=10, batch_size=2, interval=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for id in range(1, 6):
            writer.put(make(id))
        await trio.sleep(0.25)  # [1, 2] and [3, 4] are written; 5 waits for more
        nursery.cancel_scope.cancel()
    assert sink.batches == [(0.0, [1, 2]), (0.0, [3, 4]), (0.25, [5])]
    writer.put(make(6))  # after the writer stopped: dropped, not buffered
    assert stats(writer) == (0, 5, 1, 0, 3)


async def test_a_batch_being_written_at_shutdown_is_finished_then_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = FakeSink()
    sink.delay = 2.0
    writer = ActivityWriter(sink, interval=1.0, timeout=5.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.put(make(1))
        await trio.sleep(1.5)  # [1] is being written, from t = 1.0 to 3.0
        writer.put(make(2))
        nursery.cancel_scope.cancel()
    assert sink.batches == [(3.0, [1]), (5.0, [2])]
    assert trio.current_time() == 5.0


async def test_a_stuck_write_is_given_up_after_the_timeout(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = FakeSink()
    sink.gate = trio.Event()  # never set: every write hangs
    writer = ActivityWriter(sink, interval=1.0, timeout=5.0)
    writer.put(make(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await trio.sleep(7.0)  # [1] was written from t = 1, and given up at 6
        assert stats(writer) == (0, 0, 0, 1, 0)
        assert "writing 1 activity records to FakeSink() took more than 5 s" in caplog.text
        writer.put(make(2))
        nursery.cancel_scope.cancel()  # the shutdown gives [2] five seconds too
    assert trio.current_time() == 12.0
    assert sink.batches == []
    assert stats(writer) == (0, 0, 0, 2, 0)


async def test_when_the_buffer_is_full_records_are_dropped_counted_and_reported(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llamaswap.activity")
    sink = FakeSink()
    sink.delay = 3.0  # a slow disk
    writer = ActivityWriter(sink, capacity=2, interval=1.0)
    await nursery.start(writer.run)
    writer.put(make(1))
    await trio.sleep(1.5)  # [1] is being written, until t = 4
    for id in range(2, 7):
        writer.put(make(id))  # 2 and 3 fit; 4, 5 and 6 are dropped
    assert stats(writer) == (2, 0, 3, 0, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "the activity store FakeSink() is not keeping up: 2 records wait to be written; "
        "dropping new ones until it catches up"
    ]  # once, not per record
    await trio.sleep(10.0)
    assert sink.batches == [(4.0, [1]), (8.0, [2, 3])]
    assert stats(writer) == (0, 3, 3, 0, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[1:] == ["dropped 3 activity records while the store was behind (3 in all)"]


async def test_a_failed_write_is_counted_and_the_writer_goes_on(
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = FakeSink()
    sink.failures = [OSError(28, "No space left on device")]
    writer = ActivityWriter(sink, interval=1.0)
    await nursery.start(writer.run)
    writer.put(make(1))
    writer.put(make(2))
    await trio.sleep(1.5)
    writer.put(make(3))
    await trio.sleep(1.5)
    assert sink.batches == [(2.5, [3])]
    assert stats(writer) == (0, 1, 0, 2, 1)
    assert "2 activity records were not stored in FakeSink(): [Errno 28] No space left" in (
        caplog.text
    )


async def test_the_real_store_behind_the_writer_and_the_ring(tmp_path: Path) -> None:
    # The real clock: the store's work runs in worker threads.
    store = ActivityStore(str(tmp_path / "activity.db"), max_rows=100, max_age=86_400.0)
    log = ActivityLog(first_id=await trio.to_thread.run_sync(store.open))
    writer = ActivityWriter(store, interval=60.0)  # nothing is written before shutdown
    log.add_listener(writer.put)
    now = datetime.datetime.now(datetime.timezone.utc)
    old = make(log.next_id(), model="old", time=iso_time(now - datetime.timedelta(seconds=10)))
    new = make(log.next_id(), model="new", time=iso_time(now - datetime.timedelta(seconds=5)))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            log.add(old)
            log.add(new)
            # Not written yet: the ring answers for them.
            assert await trio.to_thread.run_sync(store.count) == 0
            assert await store.select(query(), log) == [new, old]
            nursery.cancel_scope.cancel()
        assert await trio.to_thread.run_sync(store.count) == 2
        # After a "restart": an empty ring, the file has them, IDs go on.
        restarted = ActivityLog(first_id=await trio.to_thread.run_sync(store.open))
        assert restarted.next_id() == 3
        assert await store.select(query(), restarted) == [new, old]
        assert await store.select(query(model="old"), restarted) == [old]


async def test_a_store_that_cannot_be_read_answers_from_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file removed (or locked, or on a full disk) while llamaswap runs: the records
    still in memory are listed, and the failure is logged, not a 500."""
    path = tmp_path / "activity.db"
    store = ActivityStore(str(path), max_rows=100, max_age=86_400.0)
    log = ActivityLog(first_id=await trio.to_thread.run_sync(store.open))
    now = iso_time(datetime.datetime.now(datetime.timezone.utc))
    record = make(log.next_id(), time=now)
    log.add(record)
    path.unlink()
    path.mkdir()  # sqlite cannot open a directory
    with trio.fail_after(10):
        assert await store.select(query(), log) == [record]
    assert "cannot read the activity store" in caplog.text


async def test_the_writer_goes_on_after_the_store_file_is_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The real clock: the store's work runs in worker threads.
    path = tmp_path / "activity.db"
    store = ActivityStore(str(path), max_rows=100, max_age=86_400.0)
    log = ActivityLog(first_id=await trio.to_thread.run_sync(store.open))
    path.unlink()  # rm activity.db while llamaswap runs
    writer = ActivityWriter(store, interval=60.0)  # nothing is written before shutdown
    log.add_listener(writer.put)
    now = iso_time(datetime.datetime.now(datetime.timezone.utc))
    records = [make(log.next_id(), time=now) for _ in range(2)]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for record in records:
                log.add(record)
            nursery.cancel_scope.cancel()
        assert writer.statistics() == WriterStatistics(
            buffered=0, written=2, dropped=0, failed=0, batches=1
        )
        assert await store.select(query(), ActivityLog()) == records[::-1]
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelno for r in problems] == [logging.WARNING]
    assert "was deleted while llamaswap ran; created it again" in problems[0].getMessage()
