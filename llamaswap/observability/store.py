"""The activity log in a SQLite file (``[store]``): kept across restarts, bounded.

The problem: every finished request adds a record, on the request path, in synchronous
code (``Recorder.finish``), while SQLite is a blocking library whose writes may wait on
the disk or on a lock. The event loop must never wait for it, and memory must stay bounded
when the disk is slow.

The design, in two pieces:

* :class:`ActivityWriter` is the only way in. Its ``put`` is synchronous and never blocks:
  it hands the record to a bounded memory channel, or, when the channel is full, drops it
  and counts (with a warning). Its ``run`` is a service in ``serve()``'s nursery: it takes
  the first record, gathers what else arrives within ``FLUSH_INTERVAL`` (at most
  ``BATCH_SIZE``), and writes the batch in one transaction, in a worker thread. When the
  service is cancelled (shutdown) it writes what is still buffered, shielded and bounded.
* :class:`ActivityStore` owns the file. Its blocking methods (``open``, ``insert``,
  ``query``) run in Trio's worker threads, each call on a connection of its own, opened
  and closed by that call: sqlite3 connections must not move between threads, and
  ``trio.to_thread.run_sync`` gives no thread affinity. Opening a connection costs well
  under a millisecond, next to a batch or a query. WAL mode lets a query read while a batch
  is being written. Pruning happens in each batch's transaction, and is cheap: rows older
  than ``maxAge`` go through the index on ``time``, and rows beyond ``maxRows`` are those
  whose ID is ``maxRows`` or more below the newest (IDs increase by one per request).
  A file deleted while llamaswap runs is noticed by the next call (its connection finds an
  empty database, with no ``activity`` table) and laid out again at the same path, with one
  warning; the records it held are gone, and the next ones are written as before.

Rejected: one long-lived connection with ``check_same_thread=False`` behind a lock (it
works, but each caller would hold a lock across a thread hop, and a hung disk would leave
every reader waiting on it); a dedicated thread with its own queue (a second scheduler to
reason about, next to Trio's); writing one record per transaction (a disk sync per
request under load).

Reads (``GET /api/activity``) combine the file with the in-memory ring: records still
waiting in the buffer are only in the ring, and records from before a restart only in the
file. Both hold the same records under the same IDs, so the merge is a union by ID.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, final

import attrs
import trio

from llamaswap.config.model import StoreConfig
from llamaswap.errors import ConfigError, ConfigProblem

from .activity import ActivityLog, ActivityQuery, ActivityRecord, iso_time

__all__ = [
    "ActivitySink",
    "ActivityStore",
    "ActivityWriter",
    "WriterStatistics",
    "merge_newest",
]

logger = logging.getLogger("llamaswap.activity")

#: The layout of the file (``PRAGMA user_version``); a newer one is refused.
SCHEMA_VERSION = 1
#: Seconds a connection waits for another one's lock (a checkpoint, an abandoned write).
BUSY_TIMEOUT = 5.0
#: Records waiting to be written, at most; more are dropped (and counted).
BUFFER_SIZE = 4096
#: Records written in one transaction, at most.
BATCH_SIZE = 512
#: Seconds a batch may wait for more records after its first.
FLUSH_INTERVAL = 1.0
#: Seconds a write may take before the writer stops waiting for it (also at shutdown).
WRITE_TIMEOUT = 5.0

#: The layout's statements, in order.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY,
    time TEXT NOT NULL,
    model TEXT NOT NULL,
    band TEXT NOT NULL,
    status INTEGER NOT NULL,
    record TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS activity_time ON activity (time)",
    # The memory each model was seen to use, by device (llamaswap/resources/book.py).
    """CREATE TABLE IF NOT EXISTS learned_memory (
    model TEXT NOT NULL,
    device TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    PRIMARY KEY (model, device)
) WITHOUT ROWID""",
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)
_COLUMNS = {"id", "time", "model", "band", "status", "record"}
#: The tables llamaswap lays out.
_OURS = {"activity", "learned_memory"}


class ActivitySink(Protocol):
    """Where :class:`ActivityWriter` puts its batches (an :class:`ActivityStore`)."""

    async def write(self, records: Sequence[ActivityRecord]) -> None:
        """Store ``records``; may raise. *Cancellation*: may stop waiting for the write."""
        ...


@final
class ActivityStore:
    """The activity records in the SQLite file at ``path``, at most ``max_rows`` of them
    and none older than ``max_age`` seconds.

    ``open``, ``insert`` and ``query`` block: call them from a worker thread
    (``write`` and ``select`` do). ``wall_clock`` gives the time that ages are measured
    from (Unix seconds).
    """

    def __init__(
        self,
        path: str,
        *,
        max_rows: int,
        max_age: float,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.max_rows = max_rows
        self.max_age = max_age
        self._wall_clock = wall_clock

    @classmethod
    def from_config(cls, config: StoreConfig) -> ActivityStore:
        return cls(config.path, max_rows=config.max_rows, max_age=config.max_age)

    def __repr__(self) -> str:
        return f"ActivityStore({self.path!r})"

    # --- blocking: in a worker thread ---------------------------------------------------

    def open(self, *, config_file: str = "<config>") -> int:
        """Create the file or check it, turn on WAL; the ID the next record should get.

        Raises:
            ConfigError: the file cannot be opened or written, is not a SQLite database,
                holds another program's tables, or was written by a newer llamaswap (at
                ``store.path`` of ``config_file``).
        """
        if os.path.isdir(self.path):  # SQLite would say only "unable to open database file"
            raise _unusable(config_file, self.path, "it is a directory")
        try:
            with self._connect() as connection:
                # Another program's file is left as it is (llamaswap would add its table
                # and set user_version, which that program may use for itself).
                others = _tables(connection) - _OURS
                if others:
                    reason = f"it holds tables of another program ({', '.join(sorted(others))})"
                    raise _unusable(config_file, self.path, reason)
                version = connection.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise _unusable(
                        config_file,
                        self.path,
                        f"it was written by a newer llamaswap (layout {version})",
                    )
                columns = {row[1] for row in connection.execute("PRAGMA table_info(activity)")}
                if columns and not columns >= _COLUMNS:
                    reason = "it holds an 'activity' table that is not llamaswap's"
                    raise _unusable(config_file, self.path, reason)
                _lay_out(connection)
                newest = connection.execute("SELECT max(id) FROM activity").fetchone()[0]
        except (sqlite3.Error, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            raise _unusable(config_file, self.path, reason) from exc
        return (newest or 0) + 1

    def insert(self, records: Sequence[ActivityRecord]) -> None:
        """Add ``records`` (replacing any with the same ID) and prune, in one transaction."""
        rows = [
            (r.id, r.time, r.model, r.band, r.status, json.dumps(r.to_json(), default=str))
            for r in records
        ]
        with self._connect() as connection:
            try:
                self._insert(connection, rows)
            except sqlite3.OperationalError as exc:
                if not _deleted(exc):
                    raise
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                self._recreate(connection)
                self._insert(connection, rows)

    def _insert(self, connection: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        # On an error the connection is closed without COMMIT: nothing is changed.
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany(
            "INSERT OR REPLACE INTO activity (id, time, model, band, status, record) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
        connection.execute("DELETE FROM activity WHERE time < ?", (self.horizon(),))
        connection.execute(
            "DELETE FROM activity WHERE id <= (SELECT max(id) FROM activity) - ?",
            (self.max_rows,),
        )
        connection.execute("COMMIT")

    def _recreate(self, connection: sqlite3.Connection) -> None:
        """Lay the file out again after it was deleted while llamaswap ran.

        Each call opens its own connection, so a deleted file is noticed by the next one:
        SQLite creates an empty database in its place, and the first statement finds no
        ``activity`` table. A file that holds other tables (put there by someone else) is
        left as it is, as ``open`` leaves it.
        """
        others = _tables(connection) - _OURS
        if others:
            raise sqlite3.OperationalError(
                f"{self.path!r} was replaced by a database with other tables "
                f"({', '.join(sorted(others))}); not storing activity in it"
            )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("BEGIN IMMEDIATE")  # the write lock: one call re-creates, and warns
        if "activity" in _tables(connection):  # another call re-created it meanwhile
            connection.execute("COMMIT")
            return
        for statement in _SCHEMA:
            connection.execute(statement)
        connection.execute("COMMIT")
        logger.warning(
            "the activity store %s was deleted while llamaswap ran; created it again there "
            "(the records it held are gone, the last ones are still in memory)",
            self.path,
        )

    def query(self, query: ActivityQuery) -> list[ActivityRecord]:
        """The records in the file that match ``query`` (and are younger than
        ``max_age``), newest first."""
        query = self.bounded(query)
        where, params = _where(query)
        sql = "SELECT id, record FROM activity"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        with self._connect() as connection:
            try:
                rows = connection.execute(sql, (*params, query.limit)).fetchall()
            except sqlite3.OperationalError as exc:
                if not _deleted(exc):
                    raise
                self._recreate(connection)
                rows = []
        records = []
        for row_id, text in rows:
            try:
                document = json.loads(text)
                if not isinstance(document, dict) or not isinstance(row_id, int):
                    raise ValueError(f"not a record: {text!r:.80}")
                # The row's own ID is the one the file is ordered by.
                records.append(ActivityRecord.from_json({**document, "id": row_id}))
            except (ValueError, TypeError) as exc:  # a row damaged outside llamaswap
                logger.warning("skipping an unreadable activity record in %s: %s", self.path, exc)
        return records

    def count(self) -> int:
        """How many records the file holds (for tests and checks)."""
        with self._connect() as connection:
            return int(connection.execute("SELECT count(*) FROM activity").fetchone()[0])

    # --- non-blocking -------------------------------------------------------------------

    def horizon(self) -> str:
        """The oldest ``time`` kept: ``max_age`` before now, in the records' form."""
        oldest = self._wall_clock() - self.max_age
        return iso_time(datetime.datetime.fromtimestamp(oldest, datetime.timezone.utc))

    def bounded(self, query: ActivityQuery) -> ActivityQuery:
        """``query``, asking for nothing older than the horizon."""
        horizon = self.horizon()
        if query.since is not None and query.since >= horizon:
            return query
        return attrs.evolve(query, since=horizon)

    async def write(self, records: Sequence[ActivityRecord]) -> None:
        """``insert`` in a worker thread.

        *Cancellation*: stops waiting at once; the thread finishes (or rolls back) alone.
        """
        await trio.to_thread.run_sync(self.insert, records, abandon_on_cancel=True)

    async def select(self, query: ActivityQuery, recent: ActivityLog) -> list[ActivityRecord]:
        """The records matching ``query``, newest first: those in the file and those in
        ``recent`` (the ring, which also holds records not written yet).

        *Cancellation*: stops waiting for the file at once.
        """
        query = self.bounded(query)
        try:
            stored = await trio.to_thread.run_sync(self.query, query, abandon_on_cancel=True)
        except sqlite3.Error as exc:  # removed, locked, full disk: what memory holds
            logger.warning(
                "cannot read the activity store %s (%s); answering from memory", self.path, exc
            )
            stored = []
        return merge_newest(stored, recent.select(query), limit=query.limit)

    async def learned(self) -> dict[str, dict[str, int]]:
        """Every model's learned memory, by device (``FigureStore``): {} if unreadable."""

        def read() -> dict[str, dict[str, int]]:
            with self._connect() as connection:
                rows = connection.execute("SELECT model, device, bytes FROM learned_memory")
                figures: dict[str, dict[str, int]] = {}
                for model, device, size in rows:
                    figures.setdefault(model, {})[device] = size
                return figures

        try:
            return await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        except sqlite3.Error as exc:
            logger.warning("cannot read learned memory from %s: %s", self.path, exc)
            return {}

    async def remember(self, model: str, sizes: Mapping[str, int]) -> None:
        """Keep ``model``'s learned memory (``FigureStore``); a failure is logged."""

        def write() -> None:
            with self._connect() as connection:
                connection.execute("BEGIN IMMEDIATE")
                connection.executemany(
                    "INSERT OR REPLACE INTO learned_memory VALUES (?, ?, ?)",
                    [(model, device, size) for device, size in sizes.items()],
                )
                connection.execute("COMMIT")

        try:
            await trio.to_thread.run_sync(write, abandon_on_cancel=True)
        except sqlite3.Error as exc:
            logger.warning("cannot keep learned memory in %s: %s", self.path, exc)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit mode (isolation_level=None): transactions are the explicit BEGINs.
        connection = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            connection.execute("PRAGMA synchronous = NORMAL")  # WAL: safe, no sync per write
            yield connection
        finally:
            connection.close()


def _lay_out(connection: sqlite3.Connection) -> None:
    """WAL mode, then the table, its index and the layout version, in one transaction."""
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("BEGIN IMMEDIATE")
    for statement in _SCHEMA:
        connection.execute(statement)
    connection.execute("COMMIT")


def _tables(connection: sqlite3.Connection) -> set[str]:
    """The file's tables, SQLite's own left out."""
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
    return {name for (name,) in rows if not name.startswith("sqlite_")}


def _deleted(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` says the file has no ``activity`` table: it was deleted, and the
    connection that raised it created an empty one."""
    return str(exc).startswith("no such table: activity")


def _unusable(config_file: str, path: str, reason: str) -> ConfigError:
    message = (
        f"cannot use {path!r} as the activity store: {reason}; "
        "give llamaswap a SQLite file of its own, in a directory it can write, or remove "
        "[store]"
    )
    return ConfigError(config_file, [ConfigProblem("store.path", message)])


def _where(query: ActivityQuery) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if query.model is not None:
        where.append("model = ?")
        params.append(query.model)
    if query.band is not None:
        where.append("band = ?")
        params.append(query.band)
    if query.status is not None:
        where.append("status BETWEEN ? AND ?")
        params.extend(query.status)
    if query.since is not None:
        where.append("time >= ?")
        params.append(query.since)
    if query.until is not None:
        where.append("time < ?")
        params.append(query.until)
    return where, params


def merge_newest(*sources: Sequence[ActivityRecord], limit: int) -> list[ActivityRecord]:
    """The newest ``limit`` records of ``sources`` (each newest first), one per ID.

    Correct as long as each source holds its own newest matches: the newest ``limit`` of
    a union are among the newest ``limit`` of its parts.
    """
    by_id: dict[int, ActivityRecord] = {}
    for source in sources:
        for record in source:
            by_id.setdefault(record.id, record)
    return sorted(by_id.values(), key=lambda record: record.id, reverse=True)[:limit]


@attrs.frozen
class WriterStatistics:
    buffered: int  # waiting in the buffer
    written: int  # written to the store
    dropped: int  # not buffered: the buffer was full, or the writer had stopped
    failed: int  # in batches whose write failed or took too long
    batches: int  # successful writes


@final
class ActivityWriter:
    """Writes activity records to ``sink`` in batches, off the request path.

    Add ``put`` as an :class:`~.activity.ActivityLog` listener and run ``run`` as a
    service; see the module docstring.
    """

    def __init__(
        self,
        sink: ActivitySink,
        *,
        capacity: int = BUFFER_SIZE,
        batch_size: int = BATCH_SIZE,
        interval: float = FLUSH_INTERVAL,
        timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self._sink = sink
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval = interval
        self._timeout = timeout
        self._send, self._receive = trio.open_memory_channel[ActivityRecord](capacity)
        self._written = self._dropped = self._failed = self._batches = 0
        self._unreported = 0  # dropped since the last warning about it

    def put(self, record: ActivityRecord) -> None:
        """Buffer ``record`` for the next batch, or drop it. Never blocks, never raises."""
        try:
            self._send.send_nowait(record)
        except trio.WouldBlock:
            self._dropped += 1
            self._unreported += 1
            if self._unreported == 1:
                logger.warning(
                    "the activity store %r is not keeping up: %d records wait to be written; "
                    "dropping new ones until it catches up",
                    self._sink,
                    self._capacity,
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._dropped += 1
            logger.warning(
                "activity record %d finished after the store was closed; not stored", record.id
            )

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            buffered=self._receive.statistics().current_buffer_used,
            written=self._written,
            dropped=self._dropped,
            failed=self._failed,
            batches=self._batches,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches until cancelled, then what is still buffered.

        *Cancellation*: a batch being written is finished first (bounded by ``timeout``);
        then the rest of the buffer is written, shielded and bounded by ``timeout``, and
        later ``put`` calls drop their record.
        """
        batch: list[ActivityRecord] = []
        task_status.started()
        try:
            while True:
                batch.append(await self._receive.receive())
                with trio.move_on_after(self._interval):
                    while len(batch) < self._batch_size:
                        batch.append(await self._receive.receive())
                pending, batch = batch, []
                await self._write(pending)
        finally:
            with trio.CancelScope(shield=True):
                # No checkpoint between draining and closing: nothing is put in between.
                with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                    while True:
                        batch.append(self._receive.receive_nowait())
                self._receive.close()  # from now on, put() drops
                if batch:
                    await self._write(batch)

    async def _write(self, records: list[ActivityRecord]) -> None:
        """One batch, shielded (a shutdown lets it finish) and bounded by ``timeout``."""
        with trio.CancelScope(shield=True), trio.move_on_after(self._timeout):
            try:
                await self._sink.write(records)
            except Exception as exc:
                self._failed += len(records)
                logger.error(
                    "%d activity records were not stored in %r: %s",
                    len(records),
                    self._sink,
                    exc,
                    exc_info=exc,
                )
                return
            self._written += len(records)
            self._batches += 1
            if self._unreported:
                logger.warning(
                    "dropped %d activity records while the store was behind (%d in all)",
                    self._unreported,
                    self._dropped,
                )
                self._unreported = 0
            return
        self._failed += len(records)
        logger.error(
            "writing %d activity records to %r took more than %g s; "
            "stopped waiting (the write may still finish)",
            len(records),
            self._sink,
            self._timeout,
        )
