"""Runs one claimed execution: load, each step in turn, the decision and the finish.

The executor is the worker's one object for every job: the adapter registry, the
caches, the protocol writer and the adapter-call threads. Each job is an
ExecutionRun: this module holds its life (the connection it takes only when needed,
the held-back SUCCEEDED checkpoint, the two ways to end: fail and reconcile, and the
finish); `worker/step_runner.py` runs each step, and `worker/step_outcomes.py`
decides what a step's outcome leads to.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Connection, Engine

from orquestador import metrics, tracing
from orquestador.actions import AdapterRegistry
from orquestador.config import Settings
from orquestador.domain.errors import DataValidationError, DomainError, MappingError
from orquestador.domain.flow_definition import (
    FlowDefinition,
    compute_updates,
    decide_destination,
)
from orquestador.domain.mappings import build_context
from orquestador.domain.pointer_updates import apply_updates, validate_request_data
from orquestador.domain.statuses import ExecutionStatus
from orquestador.errors import CancelRequested, ContractMismatch, LeaseLost, RequestChanged
from orquestador.queue import (
    CheckpointOutcome,
    Claim,
    Finish,
    LoadedExecution,
    fail_execution,
    load_execution,
    release_lease,
    require_reconciliation,
)
from orquestador.queue.batches import RidingSuccess
from orquestador.queue.cancel_requests import honour_cancel
from orquestador.queue.continuations import Continuation, finish_and_continue
from orquestador.redaction import error_line
from orquestador.worker.backoff import RetryPolicy
from orquestador.worker.caches import FlowCache, SchemaCache
from orquestador.worker.calls import AdapterCalls
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from orquestador.worker.listener import libpq_conninfo
from orquestador.worker.protocol_writer import ProtocolWriter, WriterStats
from orquestador.worker.step_outcomes import ExecutionEnded, Underway
from orquestador.worker.step_runner import StepRunner

log = logging.getLogger(__name__)

# What run() reports besides the execution statuses it can end in.
ABANDONED = "ABANDONED"  # stop signal between actions: lease given back for recovery

LEASE_LOST = "LEASE_LOST"  # another worker owns it now; nothing of ours was kept

LEFT_RUNNING = "LEFT_RUNNING"  # a write failed; RUNNING and checkpoints wait for lease recovery


# The statuses a run can leave an execution in, as orquestador_executions_total counts them.
_COUNTED = frozenset(
    (
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.RECONCILIATION_REQUIRED,
        ExecutionStatus.RETRY_WAIT,
        ExecutionStatus.WAITING,
    )
)


class Executor:
    """Stateless per execution; one instance serves every job of a worker."""

    def __init__(
        self,
        registry: AdapterRegistry,
        settings: Settings,
        hooks: WorkerHooks = NO_HOOKS,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.lease_seconds = settings.worker_lease_seconds
        self.abandon_grace_seconds = settings.adapter_abandon_grace_seconds
        self.wait_max_seconds = settings.wait_max_seconds
        self.concurrency = settings.worker_concurrency
        self.retry = RetryPolicy.from_settings(settings)
        self.hooks = hooks
        self.flows = FlowCache()
        self.schemas = SchemaCache()
        self.calls = AdapterCalls(keep_idle=settings.worker_concurrency)
        # The hot writes of every job go through one writer, made with the first job's
        # engine (its database); `busy` counts running jobs.
        self._writer: ProtocolWriter | None = None
        self._writer_lock = threading.Lock()
        self._busy = 0

    def writer(self, source: Engine | Connection) -> ProtocolWriter:
        """The protocol writer of this executor's jobs (see worker/protocol_writer.py)."""
        writer = self._writer
        if writer is None:
            with self._writer_lock:
                writer = self._writer
                if writer is None:
                    writer = self._writer = ProtocolWriter(
                        libpq_conninfo(source.engine.url),
                        source.dialect,
                        busy_jobs=lambda: self._busy,
                        max_batch=max(2 * self.concurrency, 16),
                        lock_timeout_ms=self.settings.lock_timeout_ms,
                        statement_timeout_ms=self.settings.statement_timeout_ms,
                        # A job that waited this long stops holding a lease it cannot
                        # write under: it ends, and the heartbeat no longer renews it.
                        answer_seconds=self.lease_seconds / 2,
                        prepare=self.settings.db_prepare,
                    )
        return writer

    def writer_stats(self) -> WriterStats:
        """What the writer did so far (nothing yet when no job wrote)."""
        return self._writer.stats if self._writer is not None else WriterStats()

    def run(
        self, source: Engine | Connection, claim: Claim, stop: threading.Event | None = None
    ) -> str:
        """Run the claim to an outcome; return the status it ended in (or ABANDONED, ...).

        Given an engine, the run takes a connection from its pool only when it needs one
        of its own, and gives it back when it ends.
        """
        with self._writer_lock:
            self._busy += 1
        try:
            # This holder's part of the trace the acceptance began (another process's,
            # maybe long ago): each step's attempt is a child of this span.
            with tracing.span(
                "execution.claim",
                {
                    "orquestador.execution_id": claim.execution_id,
                    "orquestador.token": claim.token,
                    "orquestador.claim_attempt": claim.attempts,
                },
                parent=claim.trace_parent,
                kind="consumer",
            ) as span:
                status = self._run(source, claim, stop or threading.Event())
                span.set_attribute("orquestador.status", status)
        finally:
            with self._writer_lock:
                self._busy -= 1
        if status == LEASE_LOST:
            metrics.LEASE_LOST_TOTAL.inc()
        elif status in _COUNTED:
            metrics.count_move(status)
        return status

    def _run(self, source: Engine | Connection, claim: Claim, stop: threading.Event) -> str:
        run = _ExecutionRun(self, source, claim, stop)
        try:
            try:
                return run.run()
            except ContractMismatch as exc:
                # A checkpoint is not what this run expected (written by someone else,
                # or for something else): never overwrite or reuse it; an operator decides.
                run.settle_riding_success()
                require_reconciliation(
                    run.conn, claim, ContractMismatch.code, detail={"why": exc.message}
                )
                return ExecutionStatus.RECONCILIATION_REQUIRED
        except ExecutionEnded as ended:
            return ended.status
        except LeaseLost:
            return LEASE_LOST
        finally:
            run.close()

    def close(self) -> None:
        """End the idle adapter-call threads (a call still running keeps its own) and the
        writer's thread once what is queued is written (a later write starts it again)."""
        self.calls.close()
        if self._writer is not None:
            self._writer.close()


class _ExecutionRun(StepRunner):
    """The state of one attempt at one execution."""

    def __init__(
        self,
        executor: Executor,
        source: Engine | Connection,
        claim: Claim,
        stop: threading.Event,
    ) -> None:
        self.services = executor
        self.source = source
        self._conn: Connection | None = source if isinstance(source, Connection) else None
        self.claim = claim
        self.stop = stop
        self.outputs: dict[str, Any] = {}
        self.loaded: LoadedExecution | None = None
        # Safe steps' SUCCEEDED checkpoints, held back to ride in the transaction of
        # the next write through the writer (the next step's RUNNING, or the finish):
        # a read writes none before its call, so the successes of consecutive reads
        # ride together. Anything else the run writes comes after they are settled.
        self.riding_success: list[RidingSuccess] = []
        # A read's call under way, which wrote no RUNNING checkpoint (see Underway).
        self.underway: Underway | None = None
        self.measured: datetime | None = None
        # A dry run's outcomes, read when its first step is about to be simulated.
        self.rehearsal: dict[str, Any] | None = None

    @property
    def conn(self) -> Connection:
        """The job's own connection, taken from the pool when first needed: a first
        holder's run that succeeds needs none (its writes go through the writer).

        Reading it writes nothing: a write on it that must come after the riding success
        calls `settle_riding_success()` first.
        """
        if self._conn is None:
            assert isinstance(self.source, Engine)
            self._conn = self.source.connect()
        return self._conn

    def close(self) -> None:
        """Give back the connection this run took (one it was handed stays its owner's)."""
        if self._conn is not None and self._conn is not self.source:
            self._conn.close()
        self._conn = None

    def settle_riding_success(self) -> None:
        """Write the riding successes, now, and the RUNNING checkpoint of a read's call that
        ran and did not succeed. Every way out but the finish (a failure, a retry, a wait,
        a lookup's finding, a lease given back) calls it first, so that it is judged with
        the steps' successes durable and ends the attempt it is about."""
        riders, self.riding_success = tuple(self.riding_success), []
        underway, self.underway = self.underway, None
        writer = self.services.writer(self.source)
        if underway is not None:
            # One write: the successes, then the read's attempt as it began.
            writer.start(self.claim, underway.attempt, riders, started_at=underway.started_at)
            return
        for row in riders:
            writer.settle(row)

    def take_riding_success(self) -> tuple[RidingSuccess, ...]:
        """The riding successes, handed to the write they now ride in."""
        riders, self.riding_success = tuple(self.riding_success), []
        return riders

    def settle_after_failed_ride(
        self, success: tuple[RidingSuccess, ...], error: Exception
    ) -> None:
        """After a write they rode in failed as a transaction, write the successes alone."""
        if not success:
            return
        self.riding_success = list(success)
        try:
            self.settle_riding_success()
        except Exception as again:
            log.warning(
                "SUCCEEDED checkpoint not written after %s: %s",
                error_line(error),
                error_line(again),
                extra=self.claim.log_extra,
            )

    def fail(
        self, code: str, *, outcome: CheckpointOutcome | None = None, **detail: Any
    ) -> NoReturn:
        self.settle_riding_success()
        status = fail_execution(self.conn, self.claim, code, attempt_outcome=outcome, detail=detail)
        raise ExecutionEnded(status)

    def reconcile(
        self, reason: str, *, outcome: CheckpointOutcome | None = None, **detail: Any
    ) -> NoReturn:
        self.settle_riding_success()
        require_reconciliation(
            self.conn, self.claim, reason, attempt_outcome=outcome, detail=detail
        )
        raise ExecutionEnded(ExecutionStatus.RECONCILIATION_REQUIRED)

    def honour_cancel(self) -> NoReturn:
        """Apply the cancel a person asked for while the step's call ran, instead of going
        on: CANCELLED, or parked CANCELLED_AFTER_WRITES by the write rule (under the fence:
        LeaseLost for a stale holder, which applies nothing)."""
        self.settle_riding_success()
        status = honour_cancel(self.conn, self.claim)
        if status is None:  # cannot happen: nothing takes a request back while RUNNING
            raise LeaseLost("no cancel was requested of this execution")
        raise ExecutionEnded(status)

    def run(self) -> str:
        claim = self.claim
        # A first holder's claim read the execution already (it committed a moment ago,
        # and every write from here on is fenced); any later holder loads under the fence.
        loaded = self.loaded = claim.snapshot or load_execution(self.conn, claim)
        if claim.reclaimed:
            # Before anything is decided: the stopped holder's step as it would have left it.
            self.recall_interrupted()
        if loaded.cancel_requested:
            # Asked while an earlier round's call ran (it then waited, or retries): applied
            # before anything is called again.
            self.honour_cancel()
        if claim.attempts > loaded.max_attempts:
            self.fail("ATTEMPTS_EXHAUSTED", attempts=claim.attempts)
        change = loaded.request_changed()
        if change:
            # Checked before any adapter runs. Nothing but this execution may write a busy
            # request, so a change means an operator or a bug did; the accepted snapshot
            # no longer describes the request and acting on it would be wrong.
            log.warning("request changed since acceptance", extra=claim.log_extra)
            self.fail("REQUEST_CHANGED")
        flow = self.services.flows.get(loaded.flow_id, loaded.definition)
        transition = flow.transitions.get(loaded.transition_id)
        if transition is None:
            self.fail("TRANSITION_UNKNOWN", transitionId=loaded.transition_id)
        action_ids = [a.id for a in transition.actions]
        for spec in transition.actions:
            if self.stop.is_set():
                self.settle_riding_success()
                release_lease(self.conn, claim)
                log.info("stopping between actions; lease released", extra=claim.log_extra)
                return ABANDONED
            self.outputs[spec.id] = self.run_action(spec, action_ids)

        context = build_context(loaded.data, self.outputs, loaded.request_id, loaded.accepted_state)
        try:
            decided = decide_destination(transition, context)
            if decided.to not in flow.states:
                self.fail("UNKNOWN_STATE", toState=decided.to)
            updates = compute_updates(transition, context, decided)
            # Data no update touches is the data as it was checked against this pinned
            # schema when it was written (created, updated by a finish, corrected).
            data = loaded.data
            if updates:
                data = apply_updates(loaded.data, updates)
                validate_request_data(data, loaded.data_schema)
        except DataValidationError as exc:
            self.fail(exc.code, problems=[p.path for p in exc.problems])
        except MappingError as exc:
            self.fail(exc.code, **exc.location)
        except DomainError as exc:
            self.fail(exc.code)
        finish = Finish(
            to_state=decided.to,
            outcome=decided.outcome,
            hit_policy=decided.hit_policy,
            rule_ids=list(decided.rule_ids),
            action_ids=action_ids,
            data=data,
        )
        hook = self.services.hooks.before_finish_commit
        continuing = flow.continuations.get(decided.to)
        if continuing is not None:
            return self._finish_and_continue(finish, continuing, flow)
        riding = self.take_riding_success()
        try:
            self.services.writer(self.source).finish(
                claim, finish, before_commit=(lambda: hook(claim)) if hook else None, succeed=riding
            )
        except RequestChanged:
            self.fail("REQUEST_CHANGED")
        except ContractMismatch:
            self.reconcile("CONTRACT_MISMATCH")
        except CancelRequested:
            # Asked while the last call ran: the riding checkpoint is written, nothing else.
            self.honour_cancel()
        except LeaseLost:
            raise
        except Exception as exc:
            # Everything of the finish rolled back, the riding checkpoint too: it is
            # written on its own now. The checkpoints and RUNNING stay, and the next
            # holder of the lease finishes from them without re-invoking.
            self.settle_after_failed_ride(riding, exc)
            log.warning(
                "finish failed, left for lease recovery: %s", error_line(exc), extra=claim.log_extra
            )
            return LEFT_RUNNING
        log.info("execution succeeded", extra=claim.log_extra)
        return ExecutionStatus.SUCCEEDED

    def _finish_and_continue(self, finish: Finish, transition_id: str, flow: FlowDefinition) -> str:
        """The finish into a state the flow continues from, with its continuation in the same
        transaction, on the job's own connection (the held-back checkpoint is written
        first): continuations are few, and the protocol writer's batch only finishes."""
        claim, hook = self.claim, self.services.hooks.before_finish_commit
        continuation = Continuation(
            definition=flow,
            transition_id=transition_id,
            max_continuations=self.services.settings.max_continuations,
            max_attempts=self.services.settings.execution_max_attempts,
        )
        try:
            self.settle_riding_success()
            conn = self.conn
            continued = finish_and_continue(
                conn,
                claim,
                finish,
                continuation,
                before_commit=(lambda: hook(claim)) if hook else None,
            )
        except RequestChanged:
            self.fail("REQUEST_CHANGED")
        except ContractMismatch:
            self.reconcile("CONTRACT_MISMATCH")
        except CancelRequested:
            self.honour_cancel()
        except LeaseLost:
            raise
        except Exception as exc:
            # Nothing of the finish nor of its continuation was kept: the next holder of
            # the lease finishes and continues from the checkpoints.
            log.warning(
                "finish failed, left for lease recovery: %s", error_line(exc), extra=claim.log_extra
            )
            return LEFT_RUNNING
        log.info(
            "execution succeeded and continued",
            extra={
                **claim.log_extra,
                "continued_as": str(continued.execution_id) if continued.execution_id else None,
            },
        )
        return ExecutionStatus.SUCCEEDED
