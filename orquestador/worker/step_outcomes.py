"""What a step's outcome leads to: reuse, retry, wait, look-up, error exit, failure or a park.

The step runner (`worker/step_runner.py`) calls the adapter; these decisions take
what came back (or the checkpoint a recovery found) and apply the recovery rules and
the write rule: a safe step is retried within its attempts, a write in doubt is
looked up before anyone is asked, a declared failure takes its error exit, and
whatever cannot be settled parks for an operator (docs/ARCHITECTURE.md, *Recovery
rules*). Each decision ends the run by raising ExecutionEnded, or returns the output
the run goes on with.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn, Protocol

from sqlalchemy import Connection, Engine

from orquestador import metrics
from orquestador.actions import (
    ActionContext,
    Adapter,
    Effect,
    Found,
    Identity,
    LookupResult,
    NotFound,
    NotReady,
    PermanentError,
    Unknown,
)
from orquestador.db.schema import ATTEMPT_MESSAGE_MAX
from orquestador.domain import recovery
from orquestador.domain.canonical import canonical_json
from orquestador.domain.flow_definition import ActionSpec
from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.errors import ContractMismatch, RequestChanged
from orquestador.queue import (
    RETRY_APPROVED,
    ActionAttempt,
    Checkpoint,
    CheckpointOutcome,
    Claim,
    LoadedExecution,
    end_attempt,
    exit_on_error,
    record_found_write,
    schedule_retry,
)
from orquestador.queue.earlier_calls import await_earlier_call
from orquestador.queue.fencing import WORKER_ACTOR
from orquestador.queue.waits import NOT_READY, park_waiting
from orquestador.worker.calls import CallTimedOut
from orquestador.worker.messages import attempt_message

if TYPE_CHECKING:
    from orquestador.actions import AdapterRegistry
    from orquestador.config import Settings
    from orquestador.worker.backoff import RetryPolicy
    from orquestador.worker.caches import FlowCache, SchemaCache
    from orquestador.worker.calls import AdapterCalls
    from orquestador.worker.hooks import WorkerHooks
    from orquestador.worker.protocol_writer import ProtocolWriter

log = logging.getLogger(__name__)

# The error code of a wait that outlived WAIT_MAX_SECONDS.
WAIT_LIMIT_EXCEEDED = "WAIT_LIMIT_EXCEEDED"


class ExecutionEnded(Exception):
    """The execution reached an outcome (or was handed back); unwinds the action loop."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def _not_found_message(message: str | None) -> str:
    # The lookup's word first: a cut for length takes the end of the call's own message.
    note = "lookup: the provider has no write under the external key"
    text = f"{note}; {message}" if message else note
    return text if len(text) <= ATTEMPT_MESSAGE_MAX else text[: ATTEMPT_MESSAGE_MAX - 1] + "…"


@dataclass(frozen=True)
class Step:
    """One action as its adapter call and its lookup see it: same inputs, same external key."""

    action_id: str
    adapter: Adapter
    inputs: dict[str, Any]
    external_key: str
    log_extra: dict[str, Any]
    # What is called: the adapter's invoke, or its simulate in a dry run.
    call: Callable[[ActionContext], Any]
    # A dry run calls the adapter's simulate (or, for a writer without one, nothing).
    simulated: bool = False
    first_started_at: datetime | None = None

    @property
    def risk(self) -> Effect:
        """The effect a failure is judged by: a simulated call wrote nothing."""
        return Effect.READ_ONLY if self.simulated else self.adapter.effect


class Underway(NamedTuple):
    """A safe step's call under way that wrote no RUNNING checkpoint before it began.

    Its attempt is written when it ends: whole with its success (riding in the run's
    next write), or as RUNNING from `started_at` just before a failure, a retry or a
    wait records how it ended. A crash meanwhile leaves no row of its own; the claim
    that takes the execution over records the interrupted attempt on the execution.
    """

    attempt: ActionAttempt
    started_at: datetime  # database time, as the run measures it (database_now)


def _interrupted(
    action_id: str,
    ends_as: CheckpointStatus | None,
    code: str = "INTERRUPTED",
    message: str | None = None,
) -> CheckpointOutcome | None:
    # How a RUNNING attempt a decision ends is recorded; None: it had ended already.
    return None if ends_as is None else CheckpointOutcome(action_id, ends_as, code, message)


def between_wait_rounds(checkpoint: Checkpoint) -> bool:
    # Parked by NotReady between two rounds of the same attempt.
    return checkpoint.status == CheckpointStatus.FAILED and checkpoint.error_code == NOT_READY


@dataclass(frozen=True)
class _Answer:
    """What a lookup settled: Found, NotFound, or Unknown with why (for logs and the park)."""

    result: LookupResult
    # FOUND, NOT_FOUND, UNKNOWN, ERROR, TIMEOUT, OUTPUT_INVALID, NO_LOOKUP, or IN_FLIGHT
    # (not asked: the abandoned call under the key still ran past the grace).
    why: str

    @property
    def said(self) -> recovery.LookUp:
        """The answer as recovery decides by it."""
        if isinstance(self.result, Found):
            return recovery.LookUp.FOUND
        if isinstance(self.result, NotFound):
            return recovery.LookUp.NOT_FOUND
        return recovery.LookUp.UNKNOWN


def _lookup_detail(answer: _Answer | None) -> dict[str, str]:
    # What the lookup said, for the operator who now decides; nothing when none was asked.
    if answer is None or answer.why == "NO_LOOKUP":
        return {}
    return {"lookup": answer.why}


# The escape RFC 8785 writes for U+0000 (not itself escaped: an even run of
# backslashes before it), a character no jsonb column takes.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _is_json_object(output: Any) -> bool:
    # What the checkpoint can store and later inputs can hash: a JSON object with no
    # NaN, no infinity, nothing JSON cannot say (sets, dates, bytes), nothing jsonb
    # refuses (U+0000, lone surrogates) and no nesting deeper than Python can walk.
    # Anything else is rejected here, on the first attempt, as OUTPUT_INVALID.
    if not isinstance(output, dict):
        return False
    try:
        text = canonical_json(output)
    except (TypeError, ValueError, RecursionError):
        return False
    return _NUL_ESCAPE.search(text) is None


def output_problems(schemas: SchemaCache, adapter: Adapter, output: Any) -> list[str]:
    """Where an adapter's output (or a lookup's finding) cannot be kept, as JSON Pointers:
    `/` when it is no JSON object a checkpoint can store, else where it breaks the schema."""
    if not _is_json_object(output):
        return ["/"]
    return schemas.problems(adapter, "output", output)


class RunServices(Protocol):
    """What a run uses of the worker's executor (`worker/executor.py`)."""

    registry: AdapterRegistry
    flows: FlowCache
    schemas: SchemaCache
    calls: AdapterCalls
    hooks: WorkerHooks
    retry: RetryPolicy
    settings: Settings
    lease_seconds: int
    abandon_grace_seconds: float
    wait_max_seconds: int

    def writer(self, source: Engine | Connection) -> ProtocolWriter: ...


class StepOutcomes:
    """The outcome decisions of one execution run (mixed into the run, which owns the
    state below and the two ways to end: `fail` and `reconcile`)."""

    services: RunServices
    claim: Claim
    loaded: LoadedExecution | None

    @property
    def conn(self) -> Connection:
        raise NotImplementedError

    def settle_riding_success(self) -> None:
        """Write the riding success alone, now: before any other write of the run."""
        raise NotImplementedError

    @property
    def execution(self) -> LoadedExecution:
        """The execution as the run loaded it: every step runs after `run()` loaded it."""
        if self.loaded is None:
            raise RuntimeError("a step ran before its execution was loaded")
        return self.loaded

    def fail(
        self, code: str, *, outcome: CheckpointOutcome | None = None, **detail: Any
    ) -> NoReturn:
        raise NotImplementedError

    def reconcile(
        self, reason: str, *, outcome: CheckpointOutcome | None = None, **detail: Any
    ) -> NoReturn:
        raise NotImplementedError

    def recover(
        self, checkpoint: Checkpoint, action_attempt: ActionAttempt, step: Step
    ) -> tuple[Any] | None:
        """Carry out `domain.recovery.recover` for a checkpoint found on claiming: (output,)
        to reuse, None to run the step."""
        mismatched = tuple(
            name
            for name, mine, theirs in (
                ("inputHash", action_attempt.input_hash, checkpoint.input_hash),
                ("externalKey", action_attempt.external_key, checkpoint.external_key),
                ("effect", action_attempt.effect, checkpoint.effect),
                ("capability", action_attempt.capability, checkpoint.capability),
                ("adapterVersion", action_attempt.adapter_version, checkpoint.adapter_version),
            )
            if mine != theirs
        )
        begun = recovery.Begun(
            status=CheckpointStatus(checkpoint.status),
            effect=step.adapter.effect,
            attempts_in_budget=checkpoint.attempts_in_budget,
            max_attempts=step.adapter.max_attempts,
            mismatched=mismatched,
            retry_approved=checkpoint.status == CheckpointStatus.FAILED
            and checkpoint.error_code == RETRY_APPROVED,
            waiting=between_wait_rounds(checkpoint),
        )
        answer = None
        decision = recovery.recover(begun)
        if isinstance(decision, recovery.LookUpFirst):
            answer = self.look_up(step, checkpoint.attempt)
            decision = recovery.recover(begun, answer.said)
        match decision:
            case recovery.Reuse():
                return (checkpoint.output,)
            case recovery.TakeFound():
                assert isinstance(answer, _Answer) and isinstance(answer.result, Found)
                return (self.use_found_write(step, answer.result),)
            case recovery.SettleNotFound(exhausted=exhausted):
                self.await_earlier_call(step, checkpoint)
                # The attempt left RUNNING did not happen: it ends FAILED, and the next one
                # is as safe as after a TransientError, within the budget.
                ended = CheckpointOutcome(
                    checkpoint.action_id,
                    CheckpointStatus.FAILED,
                    "INTERRUPTED",
                    _not_found_message(None),
                    settles_earlier=exhausted,
                )
                if exhausted:
                    self.fail(
                        recovery.RETRIES_EXHAUSTED, outcome=ended, actionId=checkpoint.action_id
                    )
                self.settle_riding_success()
                end_attempt(self.conn, self.claim, ended)
                return None
            case recovery.Park(reason=recovery.CONTRACT_MISMATCH):
                self.reconcile(
                    ContractMismatch.code,
                    actionId=checkpoint.action_id,
                    mismatched=list(mismatched),
                )
            case recovery.Park(reason=reason, ends_as=ends_as):
                self.reconcile(
                    reason,
                    outcome=_interrupted(checkpoint.action_id, ends_as),
                    actionId=checkpoint.action_id,
                    **_lookup_detail(answer),
                )
            case recovery.Fail(code=code, ends_as=ends_as):
                self.fail(
                    code,
                    outcome=_interrupted(checkpoint.action_id, ends_as),
                    actionId=checkpoint.action_id,
                )
        return None

    def await_earlier_call(self, step: Step, checkpoint: Checkpoint) -> None:
        """Wait in RETRY_WAIT, no attempt spent, until the earlier holder's attempt can no
        longer send: its start + the adapter's timeout + ADAPTER_ABANDON_GRACE_SECONDS, by
        the database's clock (its adapter refuses to send past the deadline)."""
        self.settle_riding_success()
        due = await_earlier_call(
            self.conn,
            self.claim,
            action_id=checkpoint.action_id,
            attempt=checkpoint.attempt,
            settle_seconds=step.adapter.timeout_seconds + self.services.abandon_grace_seconds,
        )
        if due is None:
            return
        log.info(
            "an earlier holder's call may still send; asking again at %s",
            due.isoformat(),
            extra={**step.log_extra, "attempt": checkpoint.attempt},
        )
        raise ExecutionEnded(ExecutionStatus.RETRY_WAIT)

    def retry_or_fail(
        self,
        step: Step,
        *,
        attempt_number: int,
        attempts_in_budget: int,
        status: str,
        code: str,
        retry_after: float | None = None,
        message: str | None = None,
        not_found: bool = False,
    ) -> Any:
        """Carry out `domain.recovery.retry_or_fail`: schedule the next attempt, or fail the
        execution; the output if a look-up found the write.

        `attempt_number` is the attempt as numbered in the history; `attempts_in_budget`
        counts this one within the action's budget. `not_found`: a look-up already
        answered NotFound.
        """
        adapter, action_id = step.adapter, step.action_id
        failed = recovery.Failed(
            status=CheckpointStatus(status),
            writes=step.risk.writes,
            attempts_in_budget=attempts_in_budget,
            max_attempts=adapter.max_attempts,
            execution_attempts=self.claim.attempts,
            execution_max_attempts=self.claim.max_attempts,
            not_found=not_found,
        )
        decision = recovery.retry_or_fail(failed)
        if isinstance(decision, recovery.LookUpFirst):
            answer = self.look_up(step, attempt_number)
            if isinstance(answer.result, Found):
                return self.use_found_write(step, answer.result)
            decision = recovery.retry_or_fail(failed, answer.said)
        match decision:
            case recovery.Retry():
                outcome = CheckpointOutcome(action_id, status, code, message)
                delay = self.services.retry.delay(attempts_in_budget, retry_after)
                self.settle_riding_success()
                schedule_retry(self.conn, self.claim, outcome, delay, attempts_in_budget)
                metrics.RETRIES_TOTAL.labels(capability=adapter.key).inc()
                log.info(
                    "retry scheduled in %.3fs",
                    delay,
                    extra={**self.claim.log_extra, "action_id": action_id},
                )
                raise ExecutionEnded(ExecutionStatus.RETRY_WAIT)
            case recovery.Fail(code=failed_code, ends_as=ends_as, settles_earlier=settles):
                if settles and not not_found:
                    message = _not_found_message(message)  # this look-up's NotFound
                outcome = CheckpointOutcome(
                    action_id, ends_as or status, code, message, settles_earlier=settles
                )
                self.fail(failed_code, outcome=outcome, actionId=action_id)
        raise AssertionError(f"retry_or_fail decided {decision!r}")

    def uncertain(
        self,
        step: Step,
        *,
        attempt_number: int,
        attempts_in_budget: int,
        code: str,
        message: str,
    ) -> Any:
        """Carry out `domain.recovery.after_uncertain_call`: the call may have written; look
        it up, retry, or park. The output if the look-up found it."""
        answer = None
        decision = recovery.after_uncertain_call(step.risk)
        if isinstance(decision, recovery.LookUpFirst):
            answer = self.look_up(step, attempt_number)
            decision = recovery.after_uncertain_call(step.risk, answer.said)
        match decision:
            case recovery.TakeFound():
                assert isinstance(answer, _Answer) and isinstance(answer.result, Found)
                return self.use_found_write(step, answer.result)
            case recovery.Retry(status=status, not_found=not_found):
                return self.retry_or_fail(
                    step,
                    attempt_number=attempt_number,
                    attempts_in_budget=attempts_in_budget,
                    status=status,
                    code=code,
                    message=_not_found_message(message) if not_found else message,
                    not_found=not_found,
                )
            case recovery.Park(reason=reason, ends_as=ends_as):
                self.reconcile(
                    reason,
                    outcome=_interrupted(step.action_id, ends_as, code, message),
                    actionId=step.action_id,
                    **_lookup_detail(answer),
                )
        raise AssertionError(f"after_uncertain_call decided {decision!r}")

    def wait_outlived(self, step: Step) -> bool:
        """Whether a wait has gone on longer than any wait may (WAIT_MAX_SECONDS), counted
        from the step's first start: a wait without a deadline of its own ends too."""
        started = step.first_started_at
        if started is None:
            return False
        return datetime.now(UTC) - started >= timedelta(seconds=self.services.wait_max_seconds)

    def wait(self, step: Step, exc: NotReady, observed: dict[str, Any]) -> NoReturn:
        """Park the execution WAITING: lease given up, thread freed, no attempt spent."""
        self.settle_riding_success()
        due = park_waiting(
            self.conn,
            self.claim,
            step.action_id,
            exc.check_again_in,
            exc.wait_key,
            observed or None,
        )
        log.info(
            "not ready; waiting until %s",
            due.isoformat(),
            extra={**step.log_extra, "wait_key": exc.wait_key},
        )
        raise ExecutionEnded(ExecutionStatus.WAITING)

    def identity(self) -> Identity:
        loaded = self.execution
        return Identity(
            loaded.org_id, str(loaded.request_id), str(loaded.execution_id), loaded.actor
        )

    def look_up(self, step: Step, attempt_number: int) -> _Answer:
        """Ask the adapter's lookup whether the write keyed by the step's key exists.

        Anything but a valid Found or a NotFound is Unknown: an error, no answer by the
        lookup's own timeout (the call is abandoned like an invocation), something
        that is not a lookup result, or a Found whose output breaks the schema.
        """
        adapter = step.adapter
        if adapter.lookup is None or adapter.lookup_timeout_seconds is None or step.simulated:
            # A dry run's writer wrote nothing, and its provider is not asked anything.
            return _Answer(Unknown(), "NO_LOOKUP")
        loaded = self.execution
        if not self.abandoned_call_ended(step):
            return _Answer(Unknown(), "IN_FLIGHT")
        timeout = adapter.lookup_timeout_seconds
        # Its own stop signal: after a timed-out call the job's is set already.
        stop = threading.Event()
        ctx = ActionContext(
            inputs=step.inputs,
            external_key=step.external_key,
            attempt=attempt_number,
            deadline=time.monotonic() + timeout,
            identity=self.identity(),
            simulation=loaded.simulation,
            stop_event=stop,
            first_started_at=step.first_started_at,
        )
        extra = {**step.log_extra, "attempt": attempt_number}
        try:
            result = self.services.calls.call(adapter.lookup, ctx, ctx.deadline, extra)
        except CallTimedOut:
            stop.set()
            log.warning("lookup gave no answer within %g s; still in doubt", timeout, extra=extra)
            return _Answer(Unknown(), "TIMEOUT")
        except Exception as exc:
            log.warning(
                "lookup failed, still in doubt: %s",
                attempt_message(exc, step.inputs),
                extra={**extra, "error": type(exc).__name__},
            )
            return _Answer(Unknown(), "ERROR")
        if isinstance(result, Found):
            output = result.output
            problems = output_problems(self.services.schemas, adapter, output)
            if problems:
                log.warning(
                    "lookup found an output that breaks the schema at %s; still in doubt",
                    ", ".join(problems),
                    extra=extra,
                )
                return _Answer(Unknown(), "OUTPUT_INVALID")
            log.info("lookup found the write", extra=extra)
            return _Answer(result, recovery.LookUp.FOUND)
        if isinstance(result, NotFound):
            log.info("lookup found no write", extra=extra)
            return _Answer(result, recovery.LookUp.NOT_FOUND)
        if not isinstance(result, Unknown):
            log.warning(
                "lookup returned %s, not Found, NotFound or Unknown; still in doubt",
                type(result).__name__,
                extra=extra,
            )
            return _Answer(Unknown(), "ERROR")
        log.info("lookup cannot tell; still in doubt", extra=extra)
        return _Answer(result, recovery.LookUp.UNKNOWN)

    def abandoned_call_ended(self, step: Step) -> bool:
        """Whether no call abandoned under the step's key still runs in this process,
        waiting for it until ADAPTER_ABANDON_GRACE_SECONDS after it was abandoned.

        While it runs, its request may not have left the process: the provider would
        truthfully say NotFound, and the write would land a moment later.
        """
        lingering = self.services.calls.lingering(step.external_key)
        if lingering is None:
            return True
        grace = self.services.abandon_grace_seconds
        log.info(
            "waiting up to %g s for the abandoned call to end before asking the provider",
            grace,
            extra=step.log_extra,
        )
        if lingering.ended(lingering.abandoned_at + grace - time.monotonic()):
            return True
        log.warning(
            "abandoned call still running %g s after its deadline; the write stays in doubt",
            grace,
            extra=step.log_extra,
        )
        return False

    def use_found_write(self, step: Step, result: Found) -> Any:
        """Record the write the lookup found as the step's success; the run goes on with it."""
        self.settle_riding_success()
        attempt_number = record_found_write(
            self.conn,
            self.claim,
            action_id=step.action_id,
            external_key=step.external_key,
            output=result.output,
            actor=WORKER_ACTOR,
        )
        log.info(
            "write in doubt reconciled by lookup",
            extra={**step.log_extra, "attempt": attempt_number},
        )
        return result.output

    def permanent(
        self,
        spec: ActionSpec,
        exc: PermanentError,
        action_ids: list[str],
        message: str,
        observed: dict[str, Any],
    ) -> NoReturn:
        outcome = CheckpointOutcome(
            spec.id, CheckpointStatus.FAILED, exc.code, message, observed=observed or None
        )
        if spec.on_error:
            self.settle_riding_success()
            try:
                status = exit_on_error(self.conn, self.claim, outcome, spec.on_error, action_ids)
            except RequestChanged:
                self.fail("REQUEST_CHANGED", outcome=outcome, actionId=spec.id)
            raise ExecutionEnded(status)
        self.fail(exc.code, outcome=outcome, actionId=spec.id)
