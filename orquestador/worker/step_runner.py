"""Runs one step of an execution: its adapter, its inputs and attempt, the call, its output.

For each action in turn the run resolves the inputs from the accepted data and the
earlier outputs, checks them, asks the recovery rules about a checkpoint found, writes
the RUNNING checkpoint through the protocol writer, calls the adapter on a call thread
with its deadline, and keeps what came back. Every outcome but a valid output goes to
the outcome decisions (`worker/step_outcomes.py`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, NoReturn

from sqlalchemy import Connection, Engine

from orquestador import metrics, tracing
from orquestador.actions import (
    ActionContext,
    Adapter,
    Effect,
    NotReady,
    PermanentError,
    TransientError,
)
from orquestador.actions.contracts import RateLimit
from orquestador.actions.registry import timeouts_of
from orquestador.actions.rehearsals import rehearsed
from orquestador.domain import recovery
from orquestador.domain.canonical import input_hash
from orquestador.domain.errors import MappingError
from orquestador.domain.flow_definition import ActionSpec
from orquestador.domain.mappings import build_context, resolve_inputs
from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.errors import (
    CancelRequested,
    ContractMismatch,
    IntegrationUnavailable,
    LeaseLost,
)
from orquestador.queue import ActionAttempt, Checkpoint, CheckpointOutcome, succeed_checkpoint
from orquestador.queue.batches import RidingSuccess
from orquestador.queue.loading import load_rehearsal
from orquestador.queue.rate_limits import take_token, wait_for_token
from orquestador.worker.calls import CallTimedOut
from orquestador.worker.messages import attempt_message
from orquestador.worker.step_outcomes import (
    WAIT_LIMIT_EXCEEDED,
    ExecutionEnded,
    Step,
    StepOutcomes,
    Underway,
    between_wait_rounds,
    output_problems,
)

log = logging.getLogger(__name__)


def external_key(execution_id: uuid.UUID, action_id: str) -> str:
    return f"{execution_id}:{action_id}"


def _timed(adapter: Adapter, outcome: str, began: float) -> None:
    metrics.ACTION_DURATION_SECONDS.labels(capability=adapter.key, outcome=outcome).observe(
        time.monotonic() - began
    )
    tracing.note("orquestador.outcome", outcome)


def records_at_end(step: Step, checkpoint: Checkpoint | None, *, riding: bool) -> bool:
    """Whether the step writes no RUNNING checkpoint before its call (SPEC 28).

    A step whose repeat is safe, of a real run: its attempt is written when it ends,
    with its success or its outcome. A non-idempotent write never: its RUNNING is
    durable before its call. The others only when nothing rides (every earlier step's
    outcome is durable): then the only step a crash can leave without a record, having
    written, is the first one without a success, and the holder that takes the
    execution over puts that attempt back as RUNNING (`recall_interrupted`) so the write
    rule counts it; and a success is written, dated by the database, before any later
    step begins, so no step's recorded end is after the next one's start nor before its
    own call returned. A checkpoint found RUNNING or UNKNOWN goes through the start,
    which records the interrupted attempt it replaces.
    """
    if step.simulated or step.risk is Effect.NON_IDEMPOTENT_WRITE or riding:
        return False
    return checkpoint is None or checkpoint.status == CheckpointStatus.FAILED


def mapped_inputs(spec: ActionSpec, inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs a stored message may not quote: those read from data or earlier outputs.

    A constant is the flow's own word, published for its readers: a refusal may name it
    (COMMAND_NOT_ALLOWED names a constant command). Configured secrets are still redacted.
    """
    return {
        name: value for name, value in inputs.items() if "const" not in spec.input.get(name, {})
    }


def _simulation_unsupported(ctx: ActionContext) -> dict[str, Any]:
    raise PermanentError(
        "SIMULATION_UNSUPPORTED",
        'the adapter declares no simulate (nor, for a read, dry_run = "call"); '
        "a dry run calls nothing outside",
    )


class StepRunner(StepOutcomes):
    """Running one step (mixed into the execution run, with its outcome decisions)."""

    source: Engine | Connection
    stop: threading.Event
    outputs: dict[str, Any]
    riding_success: list[RidingSuccess]
    underway: Underway | None
    # The latest time the run measured itself: its measures never go back.
    measured: datetime | None
    rehearsal: dict[str, Any] | None

    def take_riding_success(self) -> tuple[RidingSuccess, ...]:
        raise NotImplementedError

    def settle_after_failed_ride(
        self, success: tuple[RidingSuccess, ...], error: Exception
    ) -> None:
        raise NotImplementedError

    def honour_cancel(self) -> NoReturn:
        raise NotImplementedError

    def run_action(self, spec: ActionSpec, action_ids: list[str]) -> Any:
        """Run one step to its output. A safe-to-repeat step's SUCCEEDED checkpoint is
        held back for the next write through the writer instead of written now."""
        loaded = self.execution
        adapter = self.adapter_for(spec)
        inputs = self.inputs_for(spec, adapter)
        step, action_attempt = self.step_for(spec, adapter, inputs)
        base = 0  # attempts before the budget: an operator's approved retry moves it
        checkpoint = loaded.checkpoints.get(spec.id)
        if checkpoint is not None:
            recovered = self.recover(checkpoint, action_attempt, step)
            if recovered is not None:
                return recovered[0]
            # A wait's next round goes on with the same attempt; anything else is a new one.
            number = (
                checkpoint.attempt if between_wait_rounds(checkpoint) else checkpoint.attempt + 1
            )
            action_attempt = ActionAttempt(**{**action_attempt.__dict__, "attempt": number})
            base = checkpoint.attempt_base

        # A wait's next round is the same call going on: its token was taken once.
        waiting = checkpoint is not None and between_wait_rounds(checkpoint)
        if adapter.rate_limit is not None and not step.simulated and not waiting:
            self.take_token(step, adapter.rate_limit)

        if records_at_end(step, checkpoint, riding=bool(self.riding_success)):
            # No RUNNING checkpoint: the attempt is written when it ends (see Underway),
            # and the earlier successes ride on with it.
            started_at = self.database_now()
            self.underway = Underway(action_attempt, started_at)
            step = replace(step, first_started_at=step.first_started_at or started_at)
        else:
            step = replace(step, first_started_at=self.start(spec, action_attempt))
        if self.services.hooks.before_adapter:
            self.services.hooks.before_adapter(self.claim, spec.id)
        # The call and what its outcome leads to; `_timed` notes the outcome on it.
        with tracing.span(
            "action.attempt",
            {
                "orquestador.action_id": spec.id,
                "orquestador.capability": adapter.key,
                "orquestador.effect": adapter.effect.value,
                "orquestador.attempt": action_attempt.attempt,
            },
        ):
            return self.call(
                spec,
                step,
                attempt_number=action_attempt.attempt,
                attempts_in_budget=action_attempt.attempt - base,
                action_ids=action_ids,
            )

    def recall_interrupted(self) -> None:
        """Put back what the holder this claim took over could not write: its step's
        attempt as RUNNING, as if it had written its checkpoint before the call.

        A safe step writes none before its call (SPEC 28), and the successes of the steps
        before it ride until the run's next write; so the step the stopped holder may
        have been in is the first one without a success (an idempotent write runs
        without a checkpoint only when nothing rides, so no other unrecorded step can
        have written). Written before anything else is decided (a cancel, the claims
        budget, a changed request), it is then judged by the recovery rules exactly as
        an interrupted RUNNING checkpoint always was: the history records it as
        interrupted, the next attempt is numbered after it, and an idempotent write is
        in doubt by the write rule. Dated when it is found: its start was not written.
        """
        loaded = self.execution
        if loaded.simulation:
            return  # a dry run's steps write their checkpoints before their calls
        flow = self.services.flows.get(loaded.flow_id, loaded.definition)
        transition = flow.transitions.get(loaded.transition_id)
        if transition is None:
            return
        outputs: dict[str, Any] = {}
        for spec in transition.actions:
            checkpoint = loaded.checkpoints.get(spec.id)
            if checkpoint is not None and checkpoint.status == CheckpointStatus.SUCCEEDED:
                outputs[spec.id] = checkpoint.output
                continue
            if checkpoint is not None and checkpoint.status != CheckpointStatus.FAILED:
                return  # RUNNING or UNKNOWN: written before the call, judged as found
            try:
                adapter = self.services.registry.get(spec.capability, spec.version)
            except IntegrationUnavailable:
                return  # the step fails here before any call, as it did there
            if adapter.effect is Effect.NON_IDEMPOTENT_WRITE or adapter.simulation_only:
                return  # its RUNNING is written before its call: nothing was left out
            context = build_context(loaded.data, outputs, loaded.request_id, loaded.accepted_state)
            try:
                inputs = resolve_inputs(spec.input, context)
            except MappingError:
                return  # the step could not have been called
            number = 1
            if checkpoint is not None:
                waiting = between_wait_rounds(checkpoint)
                number = checkpoint.attempt if waiting else checkpoint.attempt + 1
            attempt = ActionAttempt(
                action_id=spec.id,
                attempt=number,
                input_hash=input_hash(inputs),
                external_key=external_key(loaded.execution_id, spec.id),
                effect=adapter.effect.value,
                capability=adapter.capability,
                adapter_version=adapter.version,
            )
            first_started_at = self.services.writer(self.source).start(
                self.claim, attempt, (), started_at=self.database_now()
            )
            loaded.checkpoints[spec.id] = Checkpoint(
                **attempt.params,
                status=CheckpointStatus.RUNNING,
                fencing_token=self.claim.token,
                output=None,
                error_code=None,
                attempt_base=checkpoint.attempt_base if checkpoint is not None else 0,
                first_started_at=first_started_at,
                observed=checkpoint.observed if checkpoint is not None else None,
            )
            log.info(
                "recalled the interrupted attempt %d of %s",
                number,
                spec.id,
                extra={**self.claim.log_extra, "action_id": spec.id},
            )
            return

    def database_now(self) -> datetime:
        """The database's time now as this run measures it, without asking: its clock at
        the claim, or after the writer's last batch if later, plus the time since. A
        little early, never before a time the run's earlier writes recorded, never back
        in time within the run: a step's start (its end is the database's own clock, at
        the write its success rides in, before any later step begins)."""
        claimed = self.claim.database_now()
        written = self.services.writer(self.source).database_now()
        now = claimed if written is None else max(claimed, written)
        # A later batch's clock is a closer measure and may read earlier than the last.
        self.measured = now if self.measured is None else max(self.measured, now)
        return self.measured

    def start(self, spec: ActionSpec, action_attempt: ActionAttempt) -> datetime:
        """The RUNNING checkpoint, durable before the call; the step's first start.

        The earlier steps' held-back successes ride in it.
        """
        riding = self.take_riding_success()
        try:
            return self.services.writer(self.source).start(self.claim, action_attempt, riding)
        except ContractMismatch as exc:
            self.reconcile(ContractMismatch.code, actionId=spec.id, why=exc.message)
        except CancelRequested:
            # Asked while the previous call ran: its success is written; nothing more runs.
            self.honour_cancel()
        except LeaseLost:
            raise
        except Exception as exc:
            self.settle_after_failed_ride(riding, exc)
            raise

    def take_token(self, step: Step, limit: RateLimit) -> None:
        """Take a token of the route's rate limit, or go back to RETRY_WAIT until one is due.

        Taken on the job's connection, after the riding success is settled (durable): the
        execution may end here, and the next holder goes on after that step.
        """
        adapter = step.adapter
        self.settle_riding_success()
        delay = take_token(self.conn, adapter.key, limit)
        if delay is None:
            return
        # The claimed row said whether the claim counted an attempt (a wait's next round
        # counts none): exactly that one is given back.
        counted = self.claim.counted_attempt
        wait_for_token(
            self.conn,
            self.claim,
            action_id=step.action_id,
            capability=adapter.key,
            delay_seconds=delay,
            counted=counted,
        )
        metrics.RATE_LIMIT_WAITS_TOTAL.labels(capability=adapter.key).inc()
        log.info("rate limited; trying again in %.3fs", delay, extra=step.log_extra)
        raise ExecutionEnded(ExecutionStatus.RETRY_WAIT)

    def adapter_for(self, spec: ActionSpec) -> Adapter:
        """The step's adapter, if this worker has it and may run it here."""
        loaded = self.execution
        try:
            adapter = self.services.registry.get(spec.capability, spec.version)
        except IntegrationUnavailable:
            self.fail(
                IntegrationUnavailable.code,
                actionId=spec.id,
                capability=spec.capability,
                version=spec.version,
            )
        if not all(seconds < self.services.lease_seconds for _, seconds in timeouts_of(adapter)):
            self.fail(
                IntegrationUnavailable.code, actionId=spec.id, reason="timeout not below lease"
            )
        if adapter.simulation_only and not loaded.simulation:
            self.fail("SIMULATION_ONLY", actionId=spec.id, capability=spec.capability)
        return adapter

    def inputs_for(self, spec: ActionSpec, adapter: Adapter) -> dict[str, Any]:
        """The step's inputs, mapped from the accepted data and the outputs so far."""
        loaded = self.execution
        context = build_context(loaded.data, self.outputs, loaded.request_id, loaded.accepted_state)
        try:
            inputs = resolve_inputs(spec.input, context)
        except MappingError as exc:
            self.fail(exc.code, actionId=spec.id, **exc.location)
        problems = self.services.schemas.problems(adapter, "input", inputs)
        if problems:
            self.fail("INPUT_INVALID", actionId=spec.id, paths=problems)
        return inputs

    def step_for(
        self, spec: ActionSpec, adapter: Adapter, inputs: dict[str, Any]
    ) -> tuple[Step, ActionAttempt]:
        """The step as its call and lookup see it, and its first attempt's checkpoint."""
        loaded = self.execution
        key = external_key(loaded.execution_id, spec.id)
        action_attempt = ActionAttempt(
            action_id=spec.id,
            attempt=1,
            input_hash=input_hash(inputs),
            external_key=key,
            effect=adapter.effect.value,
            capability=adapter.capability,
            adapter_version=adapter.version,
        )
        # The simulation guarantee lives here, not in each adapter: a dry run calls
        # nothing outside. It calls simulate when the adapter has one; without it only a
        # read that opts in (dry_run = "call") is invoked, and any other step fails
        # SIMULATION_UNSUPPORTED, a declared failure. A writer is refused even when it
        # claims "call" past the contract's check.
        call: Callable[[ActionContext], Any] = adapter.invoke
        simulated = False
        outcome = self.rehearsed_outcome(spec.id) if loaded.simulation else None
        if outcome is not None:
            # The dry run rehearses this path: the step answers what it was told to.
            call, simulated = rehearsed(outcome, adapter.capability, adapter.rehearse), True
        elif loaded.simulation and adapter.simulate is not None:
            call, simulated = adapter.simulate, True
        elif loaded.simulation and (adapter.effect.writes or adapter.dry_run != "call"):
            call, simulated = _simulation_unsupported, True
        checkpoint = loaded.checkpoints.get(spec.id)
        extra = {
            **self.claim.log_extra,
            "action_id": spec.id,
            "capability": f"{spec.capability}@{spec.version}",
        }
        step = Step(
            spec.id,
            adapter,
            inputs,
            key,
            extra,
            simulated=simulated,
            first_started_at=checkpoint.first_started_at if checkpoint is not None else None,
            call=call,
        )
        return step, action_attempt

    def rehearsed_outcome(self, action_id: str) -> dict[str, Any] | None:
        """The dry run's outcome for this step, if it gave one."""
        if self.rehearsal is None:
            self.settle_riding_success()
            self.rehearsal = load_rehearsal(self.conn, self.claim)
        return self.rehearsal.get(action_id)

    def call(
        self,
        spec: ActionSpec,
        step: Step,
        *,
        attempt_number: int,
        attempts_in_budget: int,
        action_ids: list[str],
    ) -> Any:
        """Call the adapter and decide by what came back; the output the run goes on with.

        `attempt_number` is the attempt as numbered in the history (the adapter's
        `ctx.attempt`); `attempts_in_budget` counts this one within the action's budget.
        """
        loaded = self.execution
        adapter, extra, call = step.adapter, step.log_extra, step.call
        ctx = ActionContext(
            inputs=step.inputs,
            external_key=step.external_key,
            attempt=attempt_number,
            deadline=time.monotonic() + adapter.timeout_seconds,
            identity=self.identity(),
            simulation=loaded.simulation,
            stop_event=self.stop,
            first_started_at=step.first_started_at,
        )
        # No transaction is open here: the RUNNING checkpoint committed above. The call
        # runs on its own thread (an inline adapter's on this one); at the deadline this
        # job stops waiting for it.
        began = time.monotonic()
        key = step.external_key
        try:
            if call is _simulation_unsupported:
                output = call(ctx)  # raises; nothing to run on a thread
            elif adapter.inline:
                output = self.services.calls.inline(call, ctx, ctx.deadline)
            else:
                output = self.services.calls.call(call, ctx, ctx.deadline, extra, key)
        except CallTimedOut:
            _timed(adapter, "unknown", began)
            self.stop.set()  # the call's stop signal: a cooperative adapter wraps up
            message = f"no answer within {adapter.timeout_seconds:g} s; the call was abandoned"
            log.warning("adapter timed out, outcome uncertain: %s", message, extra=extra)
            if step.risk.writes and not self.abandoned_call_ended(step):
                # The write may still land, and whatever comes next (a retry, a look-up)
                # may run in another worker that cannot know: nothing is handed on
                # while the call is in flight. Past the grace, a person decides.
                self.reconcile(
                    "UNCERTAIN_OUTCOME",
                    outcome=CheckpointOutcome(
                        step.action_id, CheckpointStatus.UNKNOWN, "ADAPTER_TIMEOUT", message
                    ),
                    actionId=step.action_id,
                    lookup="IN_FLIGHT",
                )
            # The job's stop signal is now set as well, so after a lookup's Found the run
            # hands its lease back before the next action, and the next holder goes on
            # from the SUCCEEDED checkpoint without calling anything again.
            return self.uncertain(
                step,
                attempt_number=attempt_number,
                attempts_in_budget=attempts_in_budget,
                code="ADAPTER_TIMEOUT",
                message=message,
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
                    step,
                    attempt_number=attempt_number,
                    attempts_in_budget=attempts_in_budget,
                    code="NOT_READY_FROM_WRITE",
                    message=message,
                )
            observed = exc.observed or dict(ctx.observed)
            if self.wait_outlived(step):
                message = (
                    f"still not ready {self.services.wait_max_seconds} s after the step first "
                    "started (WAIT_MAX_SECONDS)"
                )
                limit = PermanentError(WAIT_LIMIT_EXCEEDED, message, observed=observed or None)
                self.permanent(spec, limit, action_ids, message, observed)
            self.wait(step, exc, observed)
        except TransientError as exc:
            _timed(adapter, "retry", began)
            message = attempt_message(exc, mapped_inputs(spec, step.inputs))
            log.info(
                "action failed transiently: %s", message, extra={**extra, "error": "TransientError"}
            )
            return self.retry_or_fail(
                step,
                attempt_number=attempt_number,
                attempts_in_budget=attempts_in_budget,
                status=CheckpointStatus.FAILED,
                code="TRANSIENT",
                retry_after=exc.retry_after,
                message=message,
            )
        except PermanentError as exc:
            if call is not _simulation_unsupported:  # nothing was called: nothing to time
                _timed(adapter, "failed", began)
            message = attempt_message(exc, mapped_inputs(spec, step.inputs))
            log.info(
                "action failed permanently: %s",
                message,
                extra={**extra, "error": "PermanentError", "error_code": exc.code},
            )
            self.permanent(spec, exc, action_ids, message, exc.observed or dict(ctx.observed))
        except Exception as exc:  # UncertainError and anything unexpected: may have happened
            _timed(adapter, "unknown", began)
            message = attempt_message(exc, mapped_inputs(spec, step.inputs))
            log.warning(
                "action outcome uncertain: %s",
                message,
                extra={**extra, "error": type(exc).__name__},
            )
            return self.uncertain(
                step,
                attempt_number=attempt_number,
                attempts_in_budget=attempts_in_budget,
                code="UNCERTAIN",
                message=message,
            )
        _timed(adapter, "simulated" if step.simulated else "succeeded", began)
        if self.services.hooks.after_adapter:
            self.services.hooks.after_adapter(self.claim, spec.id)
        return self.keep(step, output, dict(ctx.observed) or None)

    def keep(self, step: Step, output: Any, observed: dict[str, Any] | None) -> Any:
        """Check the output and record the step's success; the output."""
        claim, adapter, action_id = self.claim, step.adapter, step.action_id
        problems = output_problems(self.services.schemas, adapter, output)
        if problems:
            outcome = CheckpointOutcome(
                action_id, recovery.interrupted_status(step.risk), "OUTPUT_INVALID"
            )
            if step.risk is Effect.NON_IDEMPOTENT_WRITE:
                self.reconcile(
                    "OUTPUT_INVALID", outcome=outcome, actionId=action_id, paths=problems
                )
            self.fail("OUTPUT_INVALID", outcome=outcome, actionId=action_id, paths=problems)
        audit = None
        if step.simulated:
            audit = {
                "actionId": action_id,
                "capability": adapter.capability,
                "version": adapter.version,
                "effect": adapter.effect.value,
                "summary": str((observed or {}).get("summary") or f"would call {adapter.key}"),
            }
            # What a real run would have sent, as facts: the machine and command, the
            # e-mail's recipients after the organization's opt-out.
            sent = {k: v for k, v in (observed or {}).items() if k != "summary"}
            if sent:
                audit["wouldSend"] = sent
        underway, self.underway = self.underway, None
        if audit is None and step.risk is not Effect.NON_IDEMPOTENT_WRITE:
            # Repeating this step is safe, so its checkpoint may commit with the next
            # write (one transaction less per step): a crash before that commit leaves it
            # RUNNING (a read: no row), as a crash a moment after the call always could.
            # A non-idempotent write's success is never left to ride: it commits before
            # anything else. A read's success carries its whole attempt.
            if underway is not None:
                attempt, started_at = underway.attempt, underway.started_at
                ride = RidingSuccess(claim, action_id, output, observed, attempt, started_at)
            else:
                ride = RidingSuccess(claim, action_id, output, observed)
            self.riding_success.append(ride)
        elif audit is None:
            try:
                self.services.writer(self.source).succeed(
                    claim, action_id, output, observed, asks_cancel=True
                )
            except CancelRequested:
                # Asked during the call: the write is recorded; the next step, which may
                # write nothing before its call, is not called.
                self.honour_cancel()
        else:  # a dry run's simulated call: its audit row goes with the checkpoint
            self.settle_riding_success()
            succeed_checkpoint(self.conn, claim, action_id, output, observed, audit)
        return output
