"""Runs one claimed execution: load, the recovery rules per action, the adapter call, finish."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from jsonschema import Draft202012Validator
from sqlalchemy import Connection, Engine

from orquestador import metrics
from orquestador.actions import (
    ActionContext,
    Adapter,
    AdapterRegistry,
    Effect,
    Found,
    Identity,
    LookupResult,
    NotFound,
    NotReady,
    PermanentError,
    TransientError,
    Unknown,
)
from orquestador.actions.registry import timeouts_of
from orquestador.config import Settings
from orquestador.db.schema import ATTEMPT_MESSAGE_MAX
from orquestador.domain.canonical import canonical_json, input_hash
from orquestador.domain.errors import DataValidationError, DomainError, MappingError
from orquestador.domain.flow_definition import (
    ActionSpec,
    FlowDefinition,
    compute_updates,
    decide_destination,
)
from orquestador.domain.mappings import build_context, resolve_inputs
from orquestador.domain.pointer_updates import apply_updates, validate_request_data
from orquestador.errors import ContractMismatch, IntegrationUnavailable, LeaseLost, RequestChanged
from orquestador.queue import (
    RETRY_APPROVED,
    ActionAttempt,
    Checkpoint,
    CheckpointOutcome,
    Claim,
    Finish,
    LoadedExecution,
    end_attempt,
    exit_on_error,
    fail_execution,
    load_execution,
    record_found_write,
    release_lease,
    require_reconciliation,
    schedule_retry,
    succeed_checkpoint,
)
from orquestador.queue.batches import SucceedRow
from orquestador.queue.outcomes import WORKER_ACTOR
from orquestador.queue.waits import NOT_READY, park_waiting
from orquestador.worker.backoff import RetryPolicy
from orquestador.worker.calls import AdapterCalls, CallTimedOut
from orquestador.worker.hooks import NO_HOOKS, WorkerHooks
from orquestador.worker.listener import libpq_conninfo
from orquestador.worker.messages import attempt_message, error_line
from orquestador.worker.protocol_writer import ProtocolWriter, WriterStats

log = logging.getLogger(__name__)

# The error code of a wait that outlived WAIT_MAX_SECONDS.
WAIT_LIMIT_EXCEEDED = "WAIT_LIMIT_EXCEEDED"

# What run() reports besides the execution statuses it can end in.
ABANDONED = "ABANDONED"  # stop signal between actions: lease given back for recovery
LEASE_LOST = "LEASE_LOST"  # another worker owns it now; nothing of ours was kept
LEFT_RUNNING = "LEFT_RUNNING"  # a write failed; RUNNING and checkpoints wait for lease recovery


class ExecutionEnded(Exception):
    """The execution reached an outcome (or was handed back); unwinds the action loop."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def external_key(execution_id: uuid.UUID, action_id: str) -> str:
    return f"{execution_id}:{action_id}"


def _interrupted_status(effect: Effect) -> str:
    # An attempt whose outcome we never saw: a read cannot have changed anything,
    # a write may have.
    return "FAILED" if effect is Effect.READ_ONLY else "UNKNOWN"


def _not_found_message(message: str | None) -> str:
    # The lookup's word first: a cut for length takes the end of the call's own message.
    note = "lookup: the provider has no write under the external key"
    text = f"{note}; {message}" if message else note
    return text if len(text) <= ATTEMPT_MESSAGE_MAX else text[: ATTEMPT_MESSAGE_MAX - 1] + "…"


@dataclass(frozen=True)
class _Step:
    """One action as its adapter call and its lookup see it: same inputs, same external key."""

    action_id: str
    adapter: Adapter
    inputs: dict[str, Any]
    external_key: str
    log_extra: dict[str, Any]
    # A dry run calls the adapter's simulate (or, for a writer without one, nothing).
    simulated: bool = False
    first_started_at: datetime | None = None

    @property
    def risk(self) -> Effect:
        """The effect a failure is judged by: a simulated call wrote nothing."""
        return Effect.READ_ONLY if self.simulated else self.adapter.effect


def _is_waiting(found: Checkpoint) -> bool:
    # Parked by NotReady between two rounds of the same attempt.
    return found.status == "FAILED" and found.error_code == NOT_READY


# The statuses a run can leave an execution in, as orquestador_executions_total counts them.
_COUNTED = frozenset(("SUCCEEDED", "FAILED", "RECONCILIATION_REQUIRED", "RETRY_WAIT", "WAITING"))


def _timed(adapter: Adapter, outcome: str, began: float) -> None:
    metrics.ACTION_DURATION_SECONDS.labels(capability=adapter.key, outcome=outcome).observe(
        time.monotonic() - began
    )


def _simulation_unsupported(ctx: ActionContext) -> dict[str, Any]:
    raise PermanentError(
        "SIMULATION_UNSUPPORTED",
        "the adapter writes and declares no simulate; a dry run never calls its invoke",
    )


@dataclass(frozen=True)
class _Answer:
    """What a lookup settled: Found, NotFound, or Unknown with why (for logs and the park)."""

    result: LookupResult
    # FOUND, NOT_FOUND, UNKNOWN, ERROR, TIMEOUT, OUTPUT_INVALID, NO_LOOKUP, or IN_FLIGHT
    # (not asked: the abandoned call under the key still ran past the grace).
    why: str


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


class FlowCache:
    """Parsed flow definitions by id; safe because a published flow row never changes."""

    def __init__(self, size: int = 256) -> None:
        self._flows: OrderedDict[uuid.UUID, FlowDefinition] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, flow_id: uuid.UUID, definition: dict[str, Any]) -> FlowDefinition:
        with self._lock:
            flow = self._flows.get(flow_id)
            if flow is not None:
                self._flows.move_to_end(flow_id)
                return flow
        flow = FlowDefinition.from_json(definition)
        with self._lock:
            self._flows[flow_id] = flow
            while len(self._flows) > self._size:
                self._flows.popitem(last=False)
        return flow


class SchemaCache:
    """Compiled input/output validators per adapter."""

    def __init__(self) -> None:
        self._validators: dict[tuple[str, int, str], Draft202012Validator] = {}
        self._lock = threading.Lock()

    def validator(self, adapter: Adapter, which: str) -> Draft202012Validator:
        key = (adapter.capability, adapter.version, which)
        with self._lock:
            found = self._validators.get(key)
        if found is None:
            # The one way validators are built: no reference reaches the network or a
            # file, patterns run in RE2, formats are asserted.
            from orquestador.domain.schemas import validator_for

            schema = adapter.input_schema if which == "input" else adapter.output_schema
            found = validator_for(schema)
            with self._lock:
                self._validators[key] = found
        return found

    def problems(self, adapter: Adapter, which: str, value: Any) -> list[str]:
        """Where `value` breaks the schema, as JSON Pointers only: values may be secret."""
        errors = self.validator(adapter, which).iter_errors(value)
        return sorted({"/" + "/".join(str(p) for p in error.absolute_path) for error in errors})


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
            status = self._run(source, claim, stop or threading.Event())
        finally:
            with self._writer_lock:
                self._busy -= 1
        if status == LEASE_LOST:
            metrics.LEASE_LOST_TOTAL.inc()
        elif status in _COUNTED:
            metrics.EXECUTIONS_TOTAL.labels(status=status).inc()
        return status

    def _run(self, source: Engine | Connection, claim: Claim, stop: threading.Event) -> str:
        run = _ExecutionRun(self, source, claim, stop)
        try:
            try:
                return run.run()
            except ContractMismatch as exc:
                # A checkpoint is not what this run expected (written by someone else,
                # or for something else): never overwrite or reuse it; an operator decides.
                require_reconciliation(
                    run.conn, claim, ContractMismatch.code, detail={"why": exc.message}
                )
                return "RECONCILIATION_REQUIRED"
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


class _ExecutionRun:
    """The state of one attempt at one execution."""

    def __init__(
        self,
        executor: Executor,
        source: Engine | Connection,
        claim: Claim,
        stop: threading.Event,
    ) -> None:
        self.x = executor
        self.source = source
        self._conn: Connection | None = source if isinstance(source, Connection) else None
        self.claim = claim
        self.stop = stop
        self.outputs: dict[str, Any] = {}
        self.loaded: LoadedExecution | None = None
        # A safe step's SUCCEEDED checkpoint, held back to ride in the transaction of
        # the next write through the writer (the next step's RUNNING, or the finish).
        self.held_back: SucceedRow | None = None

    @property
    def conn(self) -> Connection:
        """The job's own connection, taken from the pool when first needed: a first
        holder's run that succeeds needs none (its writes go through the writer).

        Whatever the run does on it comes after the held-back checkpoint is written:
        every way out but the finish (a failure, a retry, a wait, a lookup's finding, a
        lease given back) is judged with the step's success durable.
        """
        self.write_held_back()
        if self._conn is None:
            assert isinstance(self.source, Engine)
            self._conn = self.source.connect()
        return self._conn

    def close(self) -> None:
        """Give back the connection this run took (one it was handed stays its owner's)."""
        if self._conn is not None and self._conn is not self.source:
            self._conn.close()
        self._conn = None

    # --- outcomes -----------------------------------------------------------

    def write_held_back(self) -> None:
        if self.held_back is not None:
            row, self.held_back = self.held_back, None
            self.x.writer(self.source).succeed(row.claim, row.action_id, row.output, row.observed)

    def riding(self) -> SucceedRow | None:
        """The held-back checkpoint, handed to the write it now rides in."""
        row, self.held_back = self.held_back, None
        return row

    def write_alone(self, riding: SucceedRow | None, error: Exception) -> None:
        """After a write it rode in failed as a transaction, write the checkpoint alone."""
        if riding is None:
            return
        self.held_back = riding
        try:
            self.write_held_back()
        except Exception as again:
            log.warning(
                "SUCCEEDED checkpoint not written after %s: %s",
                error_line(error),
                error_line(again),
                extra=self.claim.log_extra,
            )

    def fail(self, code: str, outcome: CheckpointOutcome | None = None, **detail: Any) -> None:
        status = fail_execution(self.conn, self.claim, code, attempt_outcome=outcome, detail=detail)
        raise ExecutionEnded(status)

    def reconcile(
        self, reason: str, outcome: CheckpointOutcome | None = None, **detail: Any
    ) -> None:
        require_reconciliation(
            self.conn, self.claim, reason, attempt_outcome=outcome, detail=detail
        )
        raise ExecutionEnded("RECONCILIATION_REQUIRED")

    # --- the run ------------------------------------------------------------

    def run(self) -> str:
        claim = self.claim
        # A first holder's claim read the execution already (it committed a moment ago,
        # and every write from here on is fenced); any later holder loads under the fence.
        loaded = self.loaded = claim.snapshot or load_execution(self.conn, claim)
        if claim.attempts > loaded.max_attempts:
            self.fail("ATTEMPTS_EXHAUSTED", attempts=claim.attempts)
        change = loaded.request_changed()
        if change:
            # Checked before any adapter runs. Nothing but this execution may write a busy
            # request, so a change means an operator or a bug did; the accepted snapshot
            # no longer describes the request and acting on it would be wrong.
            log.warning("request changed since acceptance", extra=claim.log_extra)
            self.fail("REQUEST_CHANGED")
        flow = self.x.flows.get(loaded.flow_id, loaded.definition)
        transition = flow.transitions.get(loaded.transition_id)
        if transition is None:
            self.fail("TRANSITION_UNKNOWN", transitionId=loaded.transition_id)
        assert transition is not None
        action_ids = [a.id for a in transition.actions]
        for spec in transition.actions:
            if self.stop.is_set():
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
        hook = self.x.hooks.before_finish_commit
        riding = self.riding()
        try:
            self.x.writer(self.source).finish(
                claim, finish, before_commit=(lambda: hook(claim)) if hook else None, succeed=riding
            )
        except RequestChanged:
            self.fail("REQUEST_CHANGED")
        except ContractMismatch:
            self.reconcile("CONTRACT_MISMATCH")
        except LeaseLost:
            raise
        except Exception as exc:
            # Everything of the finish rolled back, the riding checkpoint too: it is
            # written on its own now. The checkpoints and RUNNING stay, and the next
            # holder of the lease finishes from them without re-invoking.
            self.write_alone(riding, exc)
            log.warning(
                "finish failed, left for lease recovery: %s", error_line(exc), extra=claim.log_extra
            )
            return LEFT_RUNNING
        log.info("execution succeeded", extra=claim.log_extra)
        return "SUCCEEDED"

    def run_action(self, spec: ActionSpec, action_ids: list[str]) -> Any:
        """Run one step to its output. A safe-to-repeat step's SUCCEEDED checkpoint is
        held back for the next write through the writer instead of written now."""
        loaded = self.loaded
        assert loaded is not None
        claim = self.claim
        extra = {
            **claim.log_extra,
            "action_id": spec.id,
            "capability": f"{spec.capability}@{spec.version}",
        }
        try:
            adapter = self.x.registry.get(spec.capability, spec.version)
        except IntegrationUnavailable:
            self.fail(
                IntegrationUnavailable.code,
                actionId=spec.id,
                capability=spec.capability,
                version=spec.version,
            )
        if not all(seconds < self.x.lease_seconds for _, seconds in timeouts_of(adapter)):
            self.fail(
                IntegrationUnavailable.code, actionId=spec.id, reason="timeout not below lease"
            )
        if adapter.simulation_only and not loaded.simulation:
            self.fail("SIMULATION_ONLY", actionId=spec.id, capability=spec.capability)

        context = build_context(loaded.data, self.outputs, loaded.request_id, loaded.accepted_state)
        try:
            inputs = resolve_inputs(spec.input, context)
        except MappingError as exc:
            self.fail(exc.code, actionId=spec.id, **exc.location)
        problems = self.x.schemas.problems(adapter, "input", inputs)
        if problems:
            self.fail("INPUT_INVALID", actionId=spec.id, paths=problems)

        key = external_key(loaded.execution_id, spec.id)
        attempt = ActionAttempt(
            action_id=spec.id,
            attempt=1,
            input_hash=input_hash(inputs),
            external_key=key,
            effect=adapter.effect.value,
            capability=adapter.capability,
            adapter_version=adapter.version,
        )
        # The simulation guarantee lives here, not in each adapter: a dry run never calls
        # a writer's invoke. It calls simulate when the adapter has one (a read's too);
        # a writer without it fails the step SIMULATION_UNSUPPORTED, a declared failure.
        call: Callable[[ActionContext], Any] = adapter.invoke
        simulated = False
        if loaded.simulation and adapter.simulate is not None:
            call, simulated = adapter.simulate, True
        elif loaded.simulation and adapter.effect.writes:
            call, simulated = _simulation_unsupported, True
        found = loaded.checkpoints.get(spec.id)
        step = _Step(
            spec.id,
            adapter,
            inputs,
            key,
            extra,
            simulated=simulated,
            first_started_at=found.first_started_at if found is not None else None,
        )
        base = 0  # attempts before the budget: an operator's approved retry moves it
        if found is not None:
            recovered = self.recover(found, attempt, step)
            if recovered is not None:
                return recovered[0]
            # A wait's next round goes on with the same attempt; anything else is a new one.
            number = found.attempt if _is_waiting(found) else found.attempt + 1
            attempt = ActionAttempt(**{**attempt.__dict__, "attempt": number})
            base = found.attempt_base

        riding = self.riding()  # the previous step's success, durable before this call
        try:
            first_started_at = self.x.writer(self.source).start(claim, attempt, riding)
        except ContractMismatch as exc:
            self.reconcile(ContractMismatch.code, actionId=spec.id, why=exc.message)
        except LeaseLost:
            raise
        except Exception as exc:
            self.write_alone(riding, exc)
            raise
        step = replace(step, first_started_at=first_started_at)
        if self.x.hooks.before_adapter:
            self.x.hooks.before_adapter(claim, spec.id)
        ctx = ActionContext(
            inputs=inputs,
            external_key=key,
            attempt=attempt.attempt,
            deadline=time.monotonic() + adapter.timeout_seconds,
            identity=self.identity(),
            simulation=loaded.simulation,
            stop_event=self.stop,
            first_started_at=first_started_at,
        )
        # No transaction is open here: the RUNNING checkpoint committed above. The call
        # runs on its own thread; at the deadline this job stops waiting for it.
        began = time.monotonic()
        try:
            if call is _simulation_unsupported:
                output = call(ctx)  # raises; nothing to run on a thread
            else:
                output = self.x.calls.call(call, ctx, adapter.timeout_seconds, extra, key)
        except CallTimedOut:
            _timed(adapter, "unknown", began)
            self.stop.set()  # the call's stop signal: a cooperative adapter wraps up
            message = f"no answer within {adapter.timeout_seconds:g} s; the call was abandoned"
            log.warning("adapter timed out, outcome uncertain: %s", message, extra=extra)
            # The job's stop signal is now set as well, so after a lookup's Found the run
            # hands its lease back before the next action, and the next holder goes on
            # from the SUCCEEDED checkpoint without calling anything again.
            return self.uncertain(
                step, attempt.attempt, attempt.attempt - base, "ADAPTER_TIMEOUT", message
            )
        except NotReady as exc:
            _timed(adapter, "unknown" if adapter.effect.writes else "not_ready", began)
            if adapter.effect.writes:
                # The contract lets only a read wait. A writer saying "not ready" may have
                # written already: judged like any other unexpected answer, as uncertain
                # (retried under the same key, or settled by lookup or a person).
                message = "NotReady raised by a writing adapter; only a read may wait"
                log.warning("action outcome uncertain: %s", message, extra=extra)
                return self.uncertain(
                    step, attempt.attempt, attempt.attempt - base, "NOT_READY_FROM_WRITE", message
                )
            observed = exc.observed or dict(ctx.observed)
            if self.wait_outlived(step):
                message = (
                    f"still not ready {self.x.wait_max_seconds} s after the step first "
                    "started (WAIT_MAX_SECONDS)"
                )
                limit = PermanentError(WAIT_LIMIT_EXCEEDED, message, observed=observed or None)
                self.permanent(spec, limit, action_ids, message, observed)
            self.wait(step, exc, observed)
        except TransientError as exc:
            _timed(adapter, "retry", began)
            message = attempt_message(exc, inputs)
            log.info(
                "action failed transiently: %s", message, extra={**extra, "error": "TransientError"}
            )
            return self.retry_or_fail(
                step,
                attempt.attempt,
                "FAILED",
                "TRANSIENT",
                attempt.attempt - base,
                exc.retry_after,
                message,
            )
        except PermanentError as exc:
            if call is not _simulation_unsupported:  # nothing was called: nothing to time
                _timed(adapter, "failed", began)
            message = attempt_message(exc, inputs)
            log.info(
                "action failed permanently: %s",
                message,
                extra={**extra, "error": "PermanentError", "error_code": exc.code},
            )
            self.permanent(spec, exc, action_ids, message, exc.observed or dict(ctx.observed))
        except Exception as exc:  # UncertainError and anything unexpected: may have happened
            _timed(adapter, "unknown", began)
            message = attempt_message(exc, inputs)
            log.warning(
                "action outcome uncertain: %s",
                message,
                extra={**extra, "error": type(exc).__name__},
            )
            return self.uncertain(
                step, attempt.attempt, attempt.attempt - base, "UNCERTAIN", message
            )
        _timed(adapter, "simulated" if simulated else "succeeded", began)
        if self.x.hooks.after_adapter:
            self.x.hooks.after_adapter(claim, spec.id)

        problems = (
            ["/"]
            if not _is_json_object(output)
            else self.x.schemas.problems(adapter, "output", output)
        )
        if problems:
            outcome = CheckpointOutcome(spec.id, _interrupted_status(step.risk), "OUTPUT_INVALID")
            if step.risk is Effect.NON_IDEMPOTENT_WRITE:
                self.reconcile("OUTPUT_INVALID", outcome, actionId=spec.id, paths=problems)
            self.fail("OUTPUT_INVALID", outcome, actionId=spec.id, paths=problems)
        observed = dict(ctx.observed) or None
        audit = None
        if simulated:
            audit = {
                "actionId": spec.id,
                "capability": adapter.capability,
                "version": adapter.version,
                "effect": adapter.effect.value,
                "summary": str((observed or {}).get("summary") or f"would call {adapter.key}"),
            }
        if audit is None and step.risk is not Effect.NON_IDEMPOTENT_WRITE:
            # Repeating this step is safe, so its checkpoint may commit with the next
            # write (one transaction less per step): a crash before that commit leaves it
            # RUNNING, as a crash a moment after the call always could. A non-idempotent
            # write's success is never left to ride: it commits before anything else.
            self.held_back = SucceedRow(claim, spec.id, output, observed)
        elif audit is None:
            self.x.writer(self.source).succeed(claim, spec.id, output, observed)
        else:  # a dry run's simulated call: its audit row goes with the checkpoint
            succeed_checkpoint(self.conn, claim, spec.id, output, observed, audit)
        return output

    def recover(self, found: Checkpoint, attempt: ActionAttempt, step: _Step) -> tuple[Any] | None:
        """Apply the recovery rules to an existing checkpoint: (output,) to reuse, None to run."""
        adapter = step.adapter
        mismatched = [
            name
            for name, mine, theirs in (
                ("inputHash", attempt.input_hash, found.input_hash),
                ("externalKey", attempt.external_key, found.external_key),
                ("effect", attempt.effect, found.effect),
                ("capability", attempt.capability, found.capability),
                ("adapterVersion", attempt.adapter_version, found.adapter_version),
            )
            if mine != theirs
        ]
        if found.status == "FAILED" and found.error_code == RETRY_APPROVED:
            # An operator discarded this checkpoint: the step runs again as it is now.
            mismatched = []
        if mismatched:
            # Never reuse (or overwrite) a result recorded for something else.
            self.reconcile(ContractMismatch.code, actionId=found.action_id, mismatched=mismatched)
        if found.status == "SUCCEEDED":
            return (found.output,)
        if _is_waiting(found):
            return None  # the next round of the same attempt: nothing spent, nothing to settle
        interrupted = found.status in ("RUNNING", "UNKNOWN")
        exhausted = found.attempts_in_budget >= adapter.max_attempts
        non_idempotent = adapter.effect is Effect.NON_IDEMPOTENT_WRITE
        answer = None
        if interrupted and (non_idempotent or exhausted):
            # A write in doubt is about to be parked (a non-idempotent one always, a safe
            # one by the write rule once out of attempts): ask the provider first.
            answer = self.look_up(step, found.attempt)
            if isinstance(answer.result, Found):
                return (self.found(step, answer.result),)
        if answer is not None and isinstance(answer.result, NotFound) and found.status == "RUNNING":
            # The attempt left RUNNING did not happen: it ends FAILED, and the next one is
            # as safe as after a TransientError, within the budget.
            ended = CheckpointOutcome(
                found.action_id,
                "FAILED",
                "INTERRUPTED",
                _not_found_message(None),
                settles_earlier=exhausted,
            )
            if exhausted:
                self.fail("RETRIES_EXHAUSTED", ended, actionId=found.action_id)
            end_attempt(self.conn, self.claim, ended)
            return None
        if interrupted and non_idempotent:
            # An UNKNOWN attempt already ended (and is in the history); a RUNNING one ends
            # here, as found. A NotFound cannot settle an attempt that already ended
            # UNKNOWN without restarting the budget, so that one is parked too.
            self.reconcile(
                "INTERRUPTED_NON_IDEMPOTENT_WRITE",
                CheckpointOutcome(found.action_id, "UNKNOWN", "INTERRUPTED")
                if found.status == "RUNNING"
                else None,
                actionId=found.action_id,
                **_lookup_detail(answer),
            )
        if exhausted:
            outcome = None
            if found.status == "RUNNING":
                outcome = CheckpointOutcome(
                    found.action_id, _interrupted_status(adapter.effect), "INTERRUPTED"
                )
            self.fail("RETRIES_EXHAUSTED", outcome, actionId=found.action_id)
        return None

    def retry_or_fail(
        self,
        step: _Step,
        attempt_number: int,
        status: str,
        code: str,
        attempt: int,
        retry_after: float | None = None,
        message: str | None = None,
        *,
        not_found: bool = False,
    ) -> Any:
        """Schedule the next attempt, or fail the execution; the output if a lookup found it.

        `attempt_number` is the attempt as numbered in the history; `attempt` counts
        within the action's budget. `not_found`: a lookup already answered NotFound.
        """
        adapter = step.adapter
        action_id = step.action_id
        if attempt < adapter.max_attempts and self.claim.attempts < self.claim.max_attempts:
            outcome = CheckpointOutcome(action_id, status, code, message)
            delay = self.x.retry.delay(attempt, retry_after)
            schedule_retry(self.conn, self.claim, outcome, delay, attempt)
            metrics.RETRIES_TOTAL.labels(capability=adapter.key).inc()
            log.info(
                "retry scheduled in %.3fs",
                delay,
                extra={**self.claim.log_extra, "action_id": action_id},
            )
            raise ExecutionEnded("RETRY_WAIT")
        if not not_found and step.risk.writes and (status == "UNKNOWN" or attempt > 1):
            # Out of attempts while this one, or an earlier one of the budget, may have
            # written: the write rule would park the execution. Ask the provider first.
            answer = self.look_up(step, attempt_number)
            if isinstance(answer.result, Found):
                return self.found(step, answer.result)
            if isinstance(answer.result, NotFound):
                status, message, not_found = "FAILED", _not_found_message(message), True
        outcome = CheckpointOutcome(action_id, status, code, message, settles_earlier=not_found)
        self.fail("RETRIES_EXHAUSTED", outcome, actionId=action_id)

    def uncertain(
        self, step: _Step, attempt_number: int, attempt: int, code: str, message: str
    ) -> Any:
        """The call may have written: look it up, retry, or park; the output if it was found."""
        if step.risk is Effect.NON_IDEMPOTENT_WRITE:
            answer = self.look_up(step, attempt_number)
            if isinstance(answer.result, Found):
                return self.found(step, answer.result)
            if isinstance(answer.result, NotFound):
                # It did not happen: the next attempt is as safe as after a TransientError.
                return self.retry_or_fail(
                    step,
                    attempt_number,
                    "FAILED",
                    code,
                    attempt,
                    message=_not_found_message(message),
                    not_found=True,
                )
            self.reconcile(
                "UNCERTAIN_OUTCOME",
                CheckpointOutcome(step.action_id, "UNKNOWN", code, message),
                actionId=step.action_id,
                **_lookup_detail(answer),
            )
        # Safe to repeat with the same external key; the provider deduplicates writes.
        return self.retry_or_fail(
            step,
            attempt_number,
            _interrupted_status(step.risk),
            code,
            attempt,
            message=message,
        )

    def wait_outlived(self, step: _Step) -> bool:
        """Whether a wait has gone on longer than any wait may (WAIT_MAX_SECONDS), counted
        from the step's first start: a wait without a deadline of its own ends too."""
        started = step.first_started_at
        if started is None:
            return False
        return datetime.now(UTC) - started >= timedelta(seconds=self.x.wait_max_seconds)

    def wait(self, step: _Step, exc: NotReady, observed: dict[str, Any]) -> None:
        """Park the execution WAITING: lease given up, thread freed, no attempt spent."""
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
        raise ExecutionEnded("WAITING")

    # --- lookups ------------------------------------------------------------

    def identity(self) -> Identity:
        loaded = self.loaded
        assert loaded is not None
        return Identity(
            loaded.org_id, str(loaded.request_id), str(loaded.execution_id), loaded.actor
        )

    def look_up(self, step: _Step, attempt_number: int) -> _Answer:
        """Ask the adapter's lookup whether the write keyed by the step's key exists.

        Anything but a valid Found or a NotFound is Unknown: an error, no answer by the
        lookup's own timeout (the call is abandoned like an invocation), something
        that is not a lookup result, or a Found whose output breaks the schema.
        """
        adapter = step.adapter
        if adapter.lookup is None or adapter.lookup_timeout_seconds is None or step.simulated:
            # A dry run's writer wrote nothing, and its provider is not asked anything.
            return _Answer(Unknown(), "NO_LOOKUP")
        loaded = self.loaded
        assert loaded is not None
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
            result = self.x.calls.call(adapter.lookup, ctx, timeout, extra)
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
            problems = (
                ["/"]
                if not _is_json_object(output)
                else self.x.schemas.problems(adapter, "output", output)
            )
            if problems:
                log.warning(
                    "lookup found an output that breaks the schema at %s; still in doubt",
                    ", ".join(problems),
                    extra=extra,
                )
                return _Answer(Unknown(), "OUTPUT_INVALID")
            log.info("lookup found the write", extra=extra)
            return _Answer(result, "FOUND")
        if isinstance(result, NotFound):
            log.info("lookup found no write", extra=extra)
            return _Answer(result, "NOT_FOUND")
        if not isinstance(result, Unknown):
            log.warning(
                "lookup returned %s, not Found, NotFound or Unknown; still in doubt",
                type(result).__name__,
                extra=extra,
            )
            return _Answer(Unknown(), "ERROR")
        log.info("lookup cannot tell; still in doubt", extra=extra)
        return _Answer(result, "UNKNOWN")

    def abandoned_call_ended(self, step: _Step) -> bool:
        """Whether no call abandoned under the step's key still runs in this process,
        waiting for it until ADAPTER_ABANDON_GRACE_SECONDS after it was abandoned.

        While it runs, its request may not have left the process: the provider would
        truthfully say NotFound, and the write would land a moment later.
        """
        lingering = self.x.calls.lingering(step.external_key)
        if lingering is None:
            return True
        grace = self.x.abandon_grace_seconds
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

    def found(self, step: _Step, result: Found) -> Any:
        """Record the write the lookup found as the step's success; the run goes on with it."""
        attempt = record_found_write(
            self.conn, self.claim, step.action_id, step.external_key, result.output, WORKER_ACTOR
        )
        log.info(
            "write in doubt reconciled by lookup", extra={**step.log_extra, "attempt": attempt}
        )
        return result.output

    def permanent(
        self,
        spec: ActionSpec,
        exc: PermanentError,
        action_ids: list[str],
        message: str,
        observed: dict[str, Any],
    ) -> None:
        outcome = CheckpointOutcome(spec.id, "FAILED", exc.code, message, observed=observed or None)
        if spec.on_error:
            try:
                status = exit_on_error(self.conn, self.claim, outcome, spec.on_error, action_ids)
            except RequestChanged:
                self.fail("REQUEST_CHANGED", outcome, actionId=spec.id)
            raise ExecutionEnded(status)
        self.fail(exc.code, outcome, actionId=spec.id)
