"""The protocol writer: one thread that writes the hot rows of many jobs in one transaction.

Jobs do not write their RUNNING checkpoints, SUCCEEDED checkpoints and finishes
themselves. Each hands its row to the writer and waits for that row's own answer:
the writer takes everything queued, writes it with `queue.batches` (one statement,
one transaction, one round trip) and answers each row. What
arrives while a batch is being written forms the next one, so the busier the
worker, the larger the batches, and the fewer statements and commits per execution.

- **Latency**: a row is written as soon as the writer is free. Only when it found a
  single row while other jobs are running does it wait, at most `gather_seconds`
  (0.3 ms), for a second one; a lone job never waits at all.
- **One row, one answer**: a fenced-out row is LeaseLost for its job only, a finish
  whose request changed is RequestChanged for its job only; the others commit.
- **A failed batch is split**: a database error rolls the transaction back (nothing
  of it kept); the writer writes each half again, down to single rows, so a row
  that fails alone gets the error it would have had on its own and every other row
  commits. A lone row that hit a deadlock or a serialization failure is tried once
  more. A lost connection fails every row of the batch with the same error, as each
  job's own statement would have failed: each job leaves RUNNING and its
  checkpoints for lease recovery, as before.
- **Durable before answered**: a row is answered only after COMMIT returned, so
  a job calls its adapter only once its RUNNING checkpoint is committed, and runs
  its next action only once the SUCCEEDED one is.
- **Nothing waits on a stranger's lock**: a row whose request or execution another
  session holds locked is skipped by the batch and answered busy; the writer tries
  it again alone a moment later, while the next batches go on, and after
  `busy_seconds` answers its job with RowBusy (the job ends, its lease is no longer
  renewed, and lease recovery takes over). Every statement runs under
  `lock_timeout` and `statement_timeout`, so no wait of the writer is unbounded, and
  a job waits at most `answer_seconds` for its answer.

The writer has its own connection (not one of the pool's: every pooled connection
may be held by a job waiting for the writer), opened when the first row arrives and
closed by the same thread when it ends after `idle_seconds` without rows: each writer
thread owns the connection it opened, and no other thread ever closes it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError, StatementError

from orquestador.db.engine import FAILOVER_SQLSTATES
from orquestador.db.schema import LEASE_RAN_OUT_SQLSTATE
from orquestador.queue import ActionAttempt, Claim, Finish
from orquestador.queue.batches import (
    BatchFailed,
    FinishRow,
    RidingSuccess,
    Row,
    RowBusy,
    RowFailed,
    StartRow,
    write_rows,
)
from orquestador.queue.fencing import refuse_stale

log = logging.getLogger(__name__)

# SQLSTATEs of a transaction that lost a race rather than did something wrong.
_RACES = frozenset(("40001", "40P01"))
# A busy row is tried again after this long, doubling up to the cap.
_BUSY_FIRST_RETRY_SECONDS = 0.02
_BUSY_RETRY_CAP_SECONDS = 0.25


class WriterStalled(Exception):
    """The writer gave no answer in time; the row may still be written, or not."""


@dataclass
class WriterStats:
    """What the writer did, for tests and benchmarks: rows, transactions, waits."""

    rows: int = 0
    batches: int = 0  # transactions that committed
    gather_waits: int = 0  # times it waited (bounded) for a second row
    splits: int = 0  # failed batches written again in halves
    busy_retries: int = 0  # rows skipped for another session's lock and tried again


class _Pending:
    """One row and its answer; set once, by the writer thread, and waited for by its job.

    A bare lock is the cheapest wake-up there is (a Future's condition variable costs
    several times as much, and the writer answers thousands of rows a second).
    """

    __slots__ = ("_done", "_error", "_value", "answered", "busy_since", "retried", "row")

    def __init__(self, row: Row) -> None:
        self.row = row
        self.retried = False  # a lone row that lost a race is tried once more
        self.busy_since: float | None = None  # when the row was first found locked
        self.answered = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def answer(self, value: Any = None, error: BaseException | None = None) -> None:
        if self.answered:
            return
        self.answered = True
        self._value, self._error = value, error
        self._done.release()

    def wait(self, timeout: float) -> Any:
        if not self._done.acquire(timeout=timeout):
            raise WriterStalled(f"the protocol writer gave no answer within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self._value


_STOP = object()


class ProtocolWriter:
    """Gathers rows from job threads and writes them in shared transactions."""

    def __init__(
        self,
        conninfo: str,
        dialect: Dialect,
        *,
        busy_jobs: Callable[[], int] = lambda: 1,
        gather_seconds: float = 0.0003,
        max_batch: int = 64,
        idle_seconds: float = 5.0,
        application_name: str = "orquestador-writer",
        lock_timeout_ms: int = 2000,
        statement_timeout_ms: int = 10000,
        busy_seconds: float | None = None,
        answer_seconds: float = 30.0,
        prepare: bool = True,
    ) -> None:
        self._conninfo = conninfo
        self._prepare = prepare
        # As the engine's connections (db/engine.py): JIT off, every wait bounded.
        self._options = (
            f"-c jit=off -c lock_timeout={lock_timeout_ms}"
            f" -c statement_timeout={statement_timeout_ms}"
        )
        self._busy_seconds = lock_timeout_ms / 1000 if busy_seconds is None else busy_seconds
        self._answer_seconds = answer_seconds
        self._dialect = dialect
        self._busy_jobs = busy_jobs
        self._gather_seconds = gather_seconds
        self._max_batch = max_batch
        self._idle_seconds = idle_seconds
        self._application_name = application_name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.stats = WriterStats()
        # The database's clock after the last batch, and when its answer came.
        self._clock: tuple[datetime, float] | None = None
        # Test seams, called on the writer thread: with each batch's rows before writing,
        # and when a thread that decided to end is about to close its connection.
        self.before_batch: Callable[[list[Row]], None] | None = None
        self.before_disconnect: Callable[[], None] | None = None

    # --- what jobs call -------------------------------------------------------

    def database_now(self) -> datetime | None:
        """The database's time now, as its clock after the last batch plus the time since
        (None before any batch). Never later than the database's own clock: a floor for
        the times a run measures itself, so none is before a time a batch wrote."""
        clock = self._clock
        if clock is None:
            return None
        at, received = clock
        return at + timedelta(seconds=time.monotonic() - received)

    def _observe_clock(self, at: datetime) -> None:
        self._clock = (at, time.monotonic())

    def start(
        self,
        claim: Claim,
        attempt: ActionAttempt,
        succeed: tuple[RidingSuccess, ...] = (),
        started_at: datetime | None = None,
    ) -> datetime:
        """RUNNING, committed; the step's first start. As `queue.start_checkpoint`.

        With `succeed`, the earlier steps' SUCCEEDED checkpoints are written in the same
        transaction (see StartRow); errors mean what they mean for `finish`. With
        `started_at`, it records a read's call that already ran (see StartRow).
        """
        answer = self._write(StartRow(claim, attempt, succeed, started_at))
        assert isinstance(answer, datetime)
        return answer

    def succeed(
        self,
        claim: Claim,
        action_id: str,
        output: Any,
        observed: dict[str, Any] | None,
        asks_cancel: bool = False,
    ) -> None:
        """SUCCEEDED, committed. As `queue.succeed_checkpoint` without a simulated audit.

        With `asks_cancel`, CancelRequested once written if a person asked to cancel.
        """
        self._write(
            RidingSuccess(claim, action_id, output, observed or None, asks_cancel=asks_cancel)
        )

    def settle(self, row: RidingSuccess) -> None:
        """A held-back success, committed alone (with a read's whole attempt, if it has one)."""
        self._write(row)

    def finish(
        self,
        claim: Claim,
        finish: Finish,
        before_commit: Callable[[], None] | None = None,
        succeed: tuple[RidingSuccess, ...] = (),
    ) -> None:
        """The transition, committed atomically. As `queue.finish_execution`.

        With `succeed`, the steps' held-back SUCCEEDED checkpoints are written first in
        the same transaction (see FinishRow). RequestChanged or ContractMismatch raised
        here come after a commit that wrote them; any other error means nothing was
        written.
        """
        self._write(FinishRow(claim, finish, before_commit, succeed))

    def _write(self, row: Row) -> Any:
        pending = _Pending(row)
        with self._lock:
            self._queue.put(pending)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="orquestador-writer", daemon=True
                )
                self._thread.start()
        return pending.wait(self._answer_seconds)

    def queued(self) -> int:
        """Rows waiting for the writer (approximate while jobs come and go)."""
        return self._queue.qsize()

    def close(self) -> None:
        """End the thread once the rows queued so far are written; a later row restarts it."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(_STOP)

    # --- the writer thread ----------------------------------------------------

    def _loop(self) -> None:
        own = _ThreadState(
            _Link(self._conninfo, self._options, self._application_name, self._prepare)
        )
        try:
            while True:
                batch = self._gather(own)
                if batch is None:
                    return
                if batch:
                    try:
                        self._write_batch(own, batch)
                    except BaseException as exc:  # never leave a job waiting forever
                        self._fail_all(batch, exc)
        finally:
            if self.before_disconnect is not None:
                self.before_disconnect()
            own.link.close()  # this thread's own connection: no other thread uses it

    def _gather(self, own: _ThreadState) -> list[_Pending] | None:
        """The next batch; None when the thread should end (idle long enough, or closed)."""
        batch: list[Any] = own.due(self._max_batch)
        if not batch:
            first: Any = None
            try:
                first = self._queue.get(timeout=own.wait_seconds(self._idle_seconds))
            except queue.Empty:
                own.closing = own.closing or not own.deferred  # idle long enough
            if first is _STOP:
                own.closing = True
            elif first is not None:
                batch.append(first)
            if not batch:
                if own.closing and not own.deferred:
                    with self._lock:  # a row put under the lock is never left behind
                        if self._queue.empty():
                            self._thread = None
                            return None
                    own.closing = False  # rows came in meanwhile: keep going
                return []
        self._drain(batch)
        if len(batch) == 1 and self._busy_jobs() > 1:
            # Other jobs are running and one of them may be a moment from writing:
            # a bounded wait for it costs a lone row at most gather_seconds.
            self.stats.gather_waits += 1
            try:
                batch.append(self._queue.get(timeout=self._gather_seconds))
            except queue.Empty:
                pass
            else:
                self._drain(batch)
        if any(item is _STOP for item in batch):
            own.closing = True  # after this batch, end if nothing else came
            batch = [item for item in batch if item is not _STOP]
        return batch

    def _drain(self, batch: list[Any]) -> None:
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _write_batch(self, own: _ThreadState, batch: list[_Pending]) -> None:
        """Write `batch`, answering every row or deferring a busy one; never raises."""
        try:
            if self.before_batch is not None:
                self.before_batch([item.row for item in batch])
            answers = write_rows(
                own.link.connection(), [item.row for item in batch], self._observe_clock
            )
        except RowFailed as failed:
            batch[failed.index].answer(error=failed.error)
            rest = batch[: failed.index] + batch[failed.index + 1 :]
            if rest:
                self._write_batch(own, rest)
            return
        except BatchFailed as failed:
            self._failed(own, batch, failed)
            return
        except psycopg.Error as exc:  # no connection could be made
            self._fail_all(batch, self._translated(own.link, exc, "(connect)"))
            return
        except BaseException as exc:  # a defect: every job hears it, none waits forever
            self._fail_all(batch, exc)
            return
        self.stats.batches += 1
        self.stats.rows += len(batch)
        for item, answer in zip(batch, answers, strict=True):
            if isinstance(answer, RowBusy):
                self._busy(own, item, answer)
            elif isinstance(answer, BaseException):
                item.answer(error=answer)
            else:
                item.answer(answer)

    def _busy(self, own: _ThreadState, item: _Pending, answer: RowBusy) -> None:
        """Try a row skipped for a stranger's lock again soon, or give it up to recovery."""
        now = time.monotonic()
        if item.busy_since is None:
            item.busy_since = now
        waited = now - item.busy_since
        if waited >= self._busy_seconds:
            log.warning(
                "row still locked by another session after %.1f s; left for lease recovery",
                waited,
                extra=item.row.claim.log_extra,
            )
            item.answer(error=answer)
            return
        self.stats.busy_retries += 1
        own.defer(item, min(_BUSY_RETRY_CAP_SECONDS, max(_BUSY_FIRST_RETRY_SECONDS, waited)))

    def _failed(self, own: _ThreadState, batch: list[_Pending], failed: BatchFailed) -> None:
        error = self._translated(own.link, failed.error, failed.sql)
        if own.link.broken or failed.error.sqlstate in FAILOVER_SQLSTATES:
            # The connection is gone (the database restarted, the network broke) or its
            # server no longer takes writes (a demoted primary): each job's own statement
            # would have failed the same way, and the next connection finds the primary.
            own.link.close()
            self._fail_all(batch, error)
            return
        if len(batch) > 1:
            self.stats.splits += 1
            log.info(
                "batch of %d rows failed (%s); writing it again in halves",
                len(batch),
                failed.error.sqlstate or type(failed.error).__name__,
            )
            middle = len(batch) // 2
            self._write_batch(own, batch[:middle])
            self._write_batch(own, batch[middle:])
            return
        if failed.error.sqlstate == LEASE_RAN_OUT_SQLSTATE:
            # Alone, the row whose lease ran out before COMMIT: it was not written.
            batch[0].answer(error=refuse_stale(batch[0].row.claim, "write (lease ran out)"))
            return
        if failed.error.sqlstate in _RACES and not batch[0].retried:
            batch[0].retried = True
            self._write_batch(own, batch)
            return
        self._fail_all(batch, error)

    @staticmethod
    def _fail_all(batch: Sequence[_Pending], error: BaseException) -> None:
        for item in batch:
            item.answer(error=error)

    def _translated(self, link: _Link, exc: psycopg.Error, sql: str) -> StatementError:
        # As queue/prepared.py raises them: SQLAlchemy's classes, never the parameters.
        return DBAPIError.instance(
            sql,
            None,
            exc,
            psycopg.Error,
            hide_parameters=True,
            connection_invalidated=link.broken or exc.sqlstate in FAILOVER_SQLSTATES,
            dialect=self._dialect,
        )


class _ThreadState:
    """What one writer thread owns: its connection, its busy rows, whether it is ending."""

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.closing = False
        # Busy rows by when to try them again; ties go by arrival, never by row.
        self.deferred: list[tuple[float, int, _Pending]] = []
        self._order = itertools.count()

    def defer(self, item: _Pending, seconds: float) -> None:
        heapq.heappush(self.deferred, (time.monotonic() + seconds, next(self._order), item))

    def due(self, limit: int) -> list[_Pending]:
        now = time.monotonic()
        due: list[_Pending] = []
        while self.deferred and self.deferred[0][0] <= now and len(due) < limit:
            due.append(heapq.heappop(self.deferred)[2])
        return due

    def wait_seconds(self, idle_seconds: float) -> float:
        """How long to wait for a new row: until the next busy row is due, or idle time."""
        if not self.deferred:
            return idle_seconds
        return max(0.0, self.deferred[0][0] - time.monotonic())


class _Link:
    """One writer thread's connection: opened by that thread, closed by that thread."""

    def __init__(
        self, conninfo: str, options: str, application_name: str, prepare: bool = True
    ) -> None:
        self._conninfo = conninfo
        self._prepare = prepare
        self._options = options
        self._application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def broken(self) -> bool:
        return self._conn is None or self._conn.closed or self._conn.broken

    def connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self.broken:
            self.close()
            self._conn = conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                application_name=self._application_name,
                connect_timeout=10,
                # Every wait of the writer is bounded (lock_timeout, statement_timeout),
                # and a peer that vanished is noticed (keepalives).
                options=self._options,
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
            )
            if not self._prepare:
                conn.prepare_threshold = None  # PgBouncer: prepare nothing
            return conn
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
