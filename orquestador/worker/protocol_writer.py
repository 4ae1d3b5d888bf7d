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

The writer has its own connection (not one of the pool's: every pooled connection
may be held by a job waiting for the writer), opened when the first row arrives and
closed with the thread after `idle_seconds` without rows.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError

from orquestador.queue import ActionAttempt, Claim, Finish
from orquestador.queue.batches import (
    BatchFailed,
    FinishRow,
    Row,
    RowFailed,
    StartRow,
    SucceedRow,
    write_rows,
)

log = logging.getLogger(__name__)

# SQLSTATEs of a transaction that lost a race rather than did something wrong.
_RACES = frozenset(("40001", "40P01"))


@dataclass
class WriterStats:
    """What the writer did, for tests and benchmarks: rows, transactions, waits."""

    rows: int = 0
    batches: int = 0  # transactions that committed
    gather_waits: int = 0  # times it waited (bounded) for a second row
    splits: int = 0  # failed batches written again in halves


class _Pending:
    """One row and its answer; set once, by the writer thread, and waited for by its job.

    A bare lock is the cheapest wake-up there is (a Future's condition variable costs
    several times as much, and the writer answers thousands of rows a second).
    """

    __slots__ = ("_done", "_error", "_value", "answered", "retried", "row")

    def __init__(self, row: Row) -> None:
        self.row = row
        self.retried = False  # a lone row that lost a race is tried once more
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

    def wait(self) -> Any:
        self._done.acquire()
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
    ) -> None:
        self._conninfo = conninfo
        self._dialect = dialect
        self._busy_jobs = busy_jobs
        self._gather_seconds = gather_seconds
        self._max_batch = max_batch
        self._idle_seconds = idle_seconds
        self._application_name = application_name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self.stats = WriterStats()
        # Test seam: called on the writer thread with each batch's rows before writing.
        self.before_batch: Callable[[list[Row]], None] | None = None

    # --- what jobs call -------------------------------------------------------

    def start(
        self, claim: Claim, attempt: ActionAttempt, succeed: SucceedRow | None = None
    ) -> datetime:
        """RUNNING, committed; the step's first start. As `queue.start_checkpoint`.

        With `succeed`, the previous step's SUCCEEDED checkpoint is written in the same
        transaction (see StartRow); errors mean what they mean for `finish`.
        """
        answer = self._write(StartRow(claim, attempt, succeed))
        assert isinstance(answer, datetime)
        return answer

    def succeed(
        self, claim: Claim, action_id: str, output: Any, observed: dict[str, Any] | None
    ) -> None:
        """SUCCEEDED, committed. As `queue.succeed_checkpoint` without a simulated audit."""
        self._write(SucceedRow(claim, action_id, output, observed or None))

    def finish(
        self,
        claim: Claim,
        finish: Finish,
        before_commit: Callable[[], None] | None = None,
        succeed: SucceedRow | None = None,
    ) -> None:
        """The transition, committed atomically. As `queue.finish_execution`.

        With `succeed`, the last step's SUCCEEDED checkpoint is written first in the
        same transaction (see FinishRow). RequestChanged or ContractMismatch raised here
        come after a commit that wrote it; any other error means nothing was written.
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
        return pending.wait()

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
        try:
            while True:
                batch = self._gather()
                if batch is None:
                    return
                if batch:
                    try:
                        self._write_batch(batch)
                    except BaseException as exc:  # never leave a job waiting forever
                        self._fail_all(batch, exc)
        finally:
            self._disconnect()

    def _gather(self) -> list[_Pending] | None:
        """The next batch; None when the thread should end (idle long enough, or closed)."""
        try:
            first = self._queue.get(timeout=self._idle_seconds)
        except queue.Empty:
            first = _STOP
        if first is _STOP:
            with self._lock:  # a row put under the lock is never left behind
                if self._queue.empty():
                    self._thread = None
                    return None
            return []
        batch: list[Any] = [first]
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
            self._queue.put(_STOP)  # after this batch, end if nothing else came
            batch = [item for item in batch if item is not _STOP]
        return batch

    def _drain(self, batch: list[Any]) -> None:
        while len(batch) < self._max_batch:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                return

    def _write_batch(self, batch: list[_Pending]) -> None:
        """Write `batch`, answering every row; never raises."""
        try:
            if self.before_batch is not None:
                self.before_batch([item.row for item in batch])
            answers = write_rows(self._connection(), [item.row for item in batch])
        except RowFailed as failed:
            batch[failed.index].answer(error=failed.error)
            rest = batch[: failed.index] + batch[failed.index + 1 :]
            if rest:
                self._write_batch(rest)
            return
        except BatchFailed as failed:
            self._failed(batch, failed)
            return
        except psycopg.Error as exc:  # no connection could be made
            self._fail_all(batch, self._translated(exc, "(connect)"))
            return
        except BaseException as exc:  # a defect: every job hears it, none waits forever
            self._fail_all(batch, exc)
            return
        self.stats.batches += 1
        self.stats.rows += len(batch)
        for item, answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                item.answer(error=answer)
            else:
                item.answer(answer)

    def _failed(self, batch: list[_Pending], failed: BatchFailed) -> None:
        error = self._translated(failed.error, failed.sql)
        if self._conn is None or self._conn.closed or self._conn.broken:
            # The connection is gone (the database restarted, the network broke): each
            # job's own statement would have failed the same way.
            self._disconnect()
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
            self._write_batch(batch[:middle])
            self._write_batch(batch[middle:])
            return
        if failed.error.sqlstate in _RACES and not batch[0].retried:
            batch[0].retried = True
            self._write_batch(batch)
            return
        self._fail_all(batch, error)

    @staticmethod
    def _fail_all(batch: Sequence[_Pending], error: BaseException) -> None:
        for item in batch:
            item.answer(error=error)

    def _translated(self, exc: psycopg.Error, sql: str) -> DBAPIError:
        # As queue/prepared.py raises them: SQLAlchemy's classes, never the parameters.
        broken = self._conn is None or self._conn.closed or self._conn.broken
        return DBAPIError.instance(
            sql,
            None,
            exc,
            psycopg.Error,
            hide_parameters=True,
            connection_invalidated=bool(broken),
            dialect=self._dialect,
        )

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._disconnect()
            self._conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                application_name=self._application_name,
                connect_timeout=10,
            )
        return self._conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
