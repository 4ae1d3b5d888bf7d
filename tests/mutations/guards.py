"""Every guard of the worker protocol, written as the mutation that removes or weakens it.

A mutation names one file of the repository, a text that occurs exactly once in it, the
text that replaces it, the promise the guard keeps, and the tests that must fail once
the guard is gone: the smallest set that should catch it, so the whole list runs in
reasonable time. `python -m tests.mutations` applies each to a scratch copy and runs its
tests there; `tests/unit/test_guard_mutations.py` checks that every find-text still
occurs exactly once, so the list cannot silently fall behind the code.

Guards left out on purpose, because no test can tell them apart from the code without
them (an equivalent mutation is noise, not a survivor):

- `status = 'RUNNING'` in FENCE and in the renewal: the schema's CHECK constraint on
  execution ties RUNNING to a set owner and lease, so a row that is not RUNNING already
  fails the owner and lease clauses.
- The fence of `outcomes._COMPLETE`, `outcomes._END_EXECUTION` behind an error exit or a
  park, and the outer fence of `waits._PARK`: each runs in the same transaction (or
  statement) right after the same fence took the row lock FOR UPDATE, with nothing that
  can wait in between.
- `busy_execution_id = :execution_id` in `_COMPLETE` and `_MOVE_REQUEST`: the Python
  check of the locked request (`request_change`) refuses first.
- FOR UPDATE in `outcomes._LOCK_EXECUTION`: the transaction's
  next statement takes the same row lock under the same fence before it can wait on
  anything.
- `e.status = 'RUNNING'` in the batch function's fence (migration 0011): the CHECK
  constraint again. Its `e.fencing_token = i.token` is listed: a stale row whose
  execution another session holds must be refused, not answered busy.
- Migration 0010's batch function: 0011 replaces it, so no database runs it any more.
- The request lock of an approval decision (`approvals/store.py` `_LOCK_REQUEST`): it keeps
  the lock order of a cancel and a reconciliation (request, then execution), so the two
  never deadlock; without it the execution lock still serializes them, and only a
  deadlock, which PostgreSQL breaks by refusing one side, would tell.
- In `machines/cancel.py`'s untaken command steps, `a.capability = 'machine.command'`,
  `a.status = 'SUCCEEDED'` and `c.status IN ('cancelled', 'expired')`: a step's external
  key is its own command's only (another step's key names another action), only the
  succeeded writes are filtered by the result, and the cancel ended every pending
  command of the execution a statement earlier. `status = 'pending'` in
  `machines/expiry.py`'s `_EXPIRE` and `_RETIME`: the row is locked and its status read
  under the lock just before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Expect = Literal["KILLED", "SURVIVED"]


@dataclass(frozen=True)
class Mutation:
    """One guard removed or weakened: `find` (exactly once in `file`) becomes `replace`."""

    id: str
    file: str
    find: str
    replace: str
    promise: str  # what the guard keeps true, in one sentence
    tests: tuple[str, ...]  # pytest node ids or files, relative to the repository
    expect: Expect = "KILLED"
    timeout_seconds: float = 600.0
    notes: tuple[str, ...] = field(default=())


# --- where the tests are ----------------------------------------------------------------

FENCING = "tests/integration/test_queue_fencing.py"
CLAIMS = "tests/integration/test_queue_claims.py"
LOCKS = "tests/integration/test_fence_locks.py"
WRITE_RULE = "tests/integration/test_write_rule.py"
LOOKUP = "tests/integration/test_lookup.py"
WAITS = "tests/integration/test_waits.py"
SIMULATED = "tests/integration/test_simulated_steps.py"
LEASES_UNIT = "tests/unit/test_worker_leases.py"
GUARDS = "tests/integration/test_guards.py"


def stale(write: str) -> str:
    """The reclaimed-holder test of one write (test_queue_fencing.py)."""
    return f"{FENCING}::test_a_reclaimed_holder_can_no_longer_write[{write}]"


def guard(name: str) -> str:
    return f"{GUARDS}::{name}"


def _in_flight(write: str) -> str:
    return guard(f"test_a_holder_write_in_flight_keeps_a_reclaimer_out_until_it_commits[{write}]")


# --- queue/fencing.py -----------------------------------------------------------------

# Known defect, reported, not fixed here: the promise the test checks holds, but for a
# broader reason than the guard.
_FENCING_PY = "orquestador/queue/fencing.py"

FENCING_GUARDS = [
    Mutation(
        "fence-lease-live",
        _FENCING_PY,
        "\n    AND e.lease_expires_at > clock_timestamp()\n",
        "\n",
        "A holder whose lease ran out by database time writes nothing, even before anyone "
        "reclaims the execution.",
        (f"{FENCING}::test_an_expired_holder_cannot_write_even_before_anyone_reclaims",),
    ),
    Mutation(
        "fence-token",
        _FENCING_PY,
        "\n    AND e.fencing_token = :token\n",
        "\n",
        "The token, not the owner's name, tells a reclaimed execution apart: a worker that "
        "reclaims its own expired lease fences its earlier job out.",
        (guard("test_a_holder_reclaimed_by_its_own_worker_can_no_longer_write"),),
    ),
    Mutation(
        "fence-owner",
        _FENCING_PY,
        "\n    AND e.lease_owner = :owner\n",
        "\n",
        "Only the worker named as the lease's owner writes under it.",
        (guard("test_a_claim_under_another_owners_name_writes_nothing"),),
    ),
]

# --- queue/leases.py ------------------------------------------------------------------

_LEASES_PY = "orquestador/queue/leases.py"
_RENEWAL = f"{CLAIMS}::test_renewal_extends_only_exactly_held_valid_leases"

LEASE_GUARDS = [
    Mutation(
        "renew-lease-live",
        _LEASES_PY,
        "          AND e.lease_expires_at > clock_timestamp()\n",
        "",
        "An expired lease never revives by renewal, even if nobody has reclaimed it yet.",
        (_RENEWAL,),
    ),
    Mutation(
        "renew-token",
        _LEASES_PY,
        "          AND e.fencing_token = h.token\n",
        "",
        "A renewal names (execution, token): a stale job's key never extends the lease of "
        "the claim that replaced it, even one of the same worker.",
        (guard("test_a_renewal_under_a_stale_token_extends_nothing"),),
    ),
    Mutation(
        "renew-owner",
        _LEASES_PY,
        "          AND e.lease_owner = :owner\n",
        "",
        "A worker renews only leases it owns.",
        (guard("test_a_renewal_under_another_owners_name_extends_nothing"),),
    ),
    Mutation(
        "release-fence",
        _LEASES_PY,
        "    WHERE {FENCE}\n    RETURNING e.id",
        "    WHERE e.id = :execution_id\n    RETURNING e.id",
        "Giving a lease back is a holder write: a stale holder cannot expire its "
        "successor's lease.",
        (stale("release_lease"),),
    ),
]

# --- queue/loading.py -----------------------------------------------------------------

LOADING_GUARDS = [
    Mutation(
        "load-fence",
        "orquestador/queue/loading.py",
        "    JOIN flow f ON f.id = e.flow_id\n    WHERE {FENCE}\n",
        "    JOIN flow f ON f.id = e.flow_id\n    WHERE e.id = :execution_id\n",
        "A stale holder cannot even load the execution.",
        (stale("load"),),
    ),
]

# --- queue/claims.py ------------------------------------------------------------------

_CLAIMS_PY = "orquestador/queue/claims.py"

CLAIM_GUARDS = [
    Mutation(
        "claim-token-bump",
        _CLAIMS_PY,
        "fencing_token = e.fencing_token + 1,",
        "fencing_token = e.fencing_token,",
        "Every claim moves the token on, which fences the previous holder out for good.",
        (f"{CLAIMS}::test_expired_lease_is_reclaimed_with_a_new_token",),
    ),
    Mutation(
        "claim-spends-an-attempt",
        _CLAIMS_PY,
        "attempts = e.attempts + CASE WHEN e.status = '{ExecutionStatus.WAITING}'"
        " THEN 0 ELSE 1 END,",
        "attempts = e.attempts,",
        "A claim spends one of the execution's attempts, so a crash loop ends "
        "ATTEMPTS_EXHAUSTED instead of running forever.",
        (f"{CLAIMS}::test_expired_lease_is_reclaimed_with_a_new_token",),
    ),
    Mutation(
        "claim-only-expired-leases",
        _CLAIMS_PY,
        "WHERE status = '{ExecutionStatus.RUNNING}' AND lease_expires_at <= now()",
        "WHERE status = '{ExecutionStatus.RUNNING}'",
        "A RUNNING execution is taken over only once its lease has expired.",
        (f"{CLAIMS}::test_claim_sets_lease_token_and_attempts_from_database_time",),
    ),
    Mutation(
        "claim-skip-locked-abandoned",
        _CLAIMS_PY,
        "        LIMIT :limit\n        FOR UPDATE SKIP LOCKED",
        "        LIMIT :limit\n        FOR UPDATE",
        "A claim skips an expired RUNNING row another transaction holds (a holder's write "
        "in flight) instead of queueing behind it.",
        (guard("test_a_claim_skips_a_locked_expired_row_instead_of_waiting"),),
    ),
    Mutation(
        "claim-skip-locked-due",
        _CLAIMS_PY,
        "                LIMIT q.quota\n                FOR UPDATE SKIP LOCKED",
        "                LIMIT q.quota\n                FOR UPDATE",
        "Concurrent claimers split due rows instead of queueing on each other's locks.",
        (f"{CLAIMS}::test_a_row_locked_by_an_open_transaction_is_skipped_not_waited_on",),
    ),
    Mutation(
        "claim-due-time",
        _CLAIMS_PY,
        ' + " AND e.next_attempt_at <= now()"',
        "",
        "A retry or a wait is claimed only once it is due.",
        (f"{CLAIMS}::test_claim_order_and_due_retries",),
    ),
    Mutation(
        "claim-claimable-statuses",
        _CLAIMS_PY,
        "{{e}}status IN ({quoted(UNHELD)}) AND",
        "{{e}}status <> '{ExecutionStatus.RUNNING}' AND",
        "A finished, failed, cancelled or parked execution is never claimed again.",
        (guard("test_an_execution_that_ended_or_is_parked_is_never_claimed"),),
    ),
    Mutation(
        "claim-limit-shared",
        _CLAIMS_PY,
        "SELECT :limit - count(*) AS slots FROM abandoned",
        "SELECT :limit AS slots",
        "A claim takes at most the free slots, expired and due rows together, so claimed "
        "work never waits in a local queue while its lease runs down.",
        (f"{LOCKS}::test_a_claim_locks_no_more_rows_than_it_takes",),
    ),
    Mutation(
        "claim-lease-database-clock",
        _CLAIMS_PY,
        "lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),",
        "lease_expires_at = now() + make_interval(secs => :lease_seconds),",
        "The lease runs from the database's clock when the row is claimed, not from the "
        "start of the transaction.",
        (guard("test_a_lease_runs_from_the_moment_of_the_claim"),),
    ),
    Mutation(
        "claim-snapshot-first-holder-only",
        _CLAIMS_PY,
        "    if row.fencing_token != 1:\n        return None\n",
        "",
        "Only a first holder skips the load: a later holder loads the checkpoints under the "
        "fence and never re-runs a step that succeeded.",
        (f"{CLAIMS}::test_a_first_claim_carries_what_the_load_reads_and_a_reclaim_does_not",),
    ),
]

# --- concurrency keys and fair claims (queue/claims.py, migration 0015) ----------------

KEYS = "tests/integration/test_concurrency_keys.py"
_KEYS_SQL = "migrations/versions/0015_concurrency_keys_priorities.py"

KEY_GUARDS = [
    Mutation(
        "key-room-under-the-key-lock",
        _KEYS_SQL,
        "        PERFORM pg_advisory_xact_lock({KEY_LOCK_CLASS}, v.lock_id);\n",
        "",
        "Two claims never both take the last place under a key: each counts the holders "
        "under the key's lock, after the claim before it committed.",
        (f"{KEYS}::test_claims_racing_for_the_one_place_under_a_key_leave_one_holder",),
    ),
    Mutation(
        "key-room-counts-holders",
        _KEYS_SQL,
        "        room := greatest(coalesce(v.lim, 0) - v_held, 0);",
        "        room := coalesce(v.lim, 0);",
        "An execution holds its key from its first claim until it ends: a retry wait, a "
        "wait, a lapsed lease and a parked execution keep the place.",
        (
            f"{KEYS}::test_a_retry_wait_keeps_the_key_and_a_cancel_releases_it_in_its_transaction",
            f"{KEYS}::test_a_lapsed_lease_keeps_the_key_until_the_recovery_ends_the_execution",
        ),
    ),
    Mutation(
        "key-release-written-by-the-end",
        _KEYS_SQL,
        "    INSERT INTO key_release (org_id, concurrency_key)"
        " VALUES (OLD.org_id, OLD.concurrency_key);",
        "    NULL;",
        "A holder that ends, whoever ends it, hands the key on to the oldest blocked "
        "execution: nothing waits for a key nobody holds.",
        (
            f"{KEYS}::test_a_holder_that_ends_hands_the_key_to_the_oldest_blocked",
            f"{KEYS}::test_a_holder_ending_while_a_claim_blocks_on_its_key_still_hands_the_key_on",
        ),
    ),
    Mutation(
        "key-blocked-leaves-the-claim",
        _CLAIMS_PY,
        "        UPDATE execution SET key_blocked = true\n",
        "        UPDATE execution SET key_blocked = key_blocked\n",
        "An execution that found its key full leaves the claim's index until a holder ends: "
        "a long line behind one machine costs the claim nothing.",
        (f"{KEYS}::test_a_holder_that_ends_hands_the_key_to_the_oldest_blocked",),
    ),
    Mutation(
        "fair-share-counts-running",
        _CLAIMS_PY,
        "(running.n + row_number() OVER (",
        "(row_number() OVER (",
        "A free slot goes to the organization running the fewest executions for its "
        "weight, so one organization's backlog never queues another's execution.",
        (f"{KEYS}::test_a_backlog_of_one_organization_never_queues_another_behind_it",),
    ),
]

# --- rate limits on routes (queue/rate_limits.py, worker/step_runner.py) -----------------

RATES = "tests/integration/test_rate_limits.py"
_RATES_PY = "orquestador/queue/rate_limits.py"

RATE_GUARDS = [
    Mutation(
        "rate-take-only-a-whole-token",
        _RATES_PY,
        "    WHERE {_REFILLED} >= 1\n",
        "    WHERE true\n",
        "A route gets no more calls than its bucket holds, however many workers take at once.",
        (
            f"{RATES}::test_takers_queued_on_the_bucket_at_once_take_no_more_than_the_burst",
            f"{RATES}::test_the_bucket_refills_at_the_rate_up_to_the_burst",
        ),
    ),
    Mutation(
        "rate-refill-capped-at-the-burst",
        _RATES_PY,
        '"least(:burst, ',
        '"(',
        "An idle route saves up no more than its burst.",
        (f"{RATES}::test_the_bucket_refills_at_the_rate_up_to_the_burst",),
    ),
    Mutation(
        "rate-token-before-the-call",
        "orquestador/worker/step_runner.py",
        "            self.take_token(step, adapter.rate_limit)\n",
        "            pass\n",
        "A call over the route's limit is not sent: it waits for the next token.",
        (
            f"{RATES}::test_a_call_over_the_limit_waits_for_the_next_token_without_spending_an_attempt",
        ),
    ),
    Mutation(
        "rate-wait-spends-no-attempt",
        _RATES_PY,
        "            attempts = e.attempts - :counted,\n",
        "",
        "Waiting for a token spends no attempt: the budgets count calls that were made.",
        (
            f"{RATES}::test_a_call_over_the_limit_waits_for_the_next_token_without_spending_an_attempt",
        ),
    ),
    Mutation(
        "rate-wait-under-the-fence",
        _RATES_PY,
        "        WHERE {FENCE}\n        RETURNING e.id, e.org_id",
        "        WHERE e.id = :execution_id\n        RETURNING e.id, e.org_id",
        "Only the holder sends an execution back to wait: a stale worker cannot take it "
        "from the worker that holds it now.",
        (f"{RATES}::test_a_stale_holder_cannot_send_the_execution_back_to_wait",),
    ),
]

# --- approvals (approvals/store.py, api/approval_routes.py) ------------------------------

APPROVALS = "tests/integration/test_approvals.py"
_APPROVALS_PY = "orquestador/approvals/store.py"

APPROVAL_GUARDS = [
    Mutation(
        "approval-one-decision",
        _APPROVALS_PY,
        "    WHERE id = :id AND status = '{ApprovalStatus.OPEN}'\n"
        "      AND deadline_at > clock_timestamp()",
        "    WHERE id = :id\n      AND deadline_at > clock_timestamp()",
        "An approval takes one decision: a second, even at the same moment, is refused.",
        (
            f"{APPROVALS}::test_two_approvers_deciding_at_once_make_one_decision",
            f"{APPROVALS}::test_the_step_waits_for_an_approver_and_goes_on_with_the_decision",
        ),
    ),
    Mutation(
        "approval-decision-before-the-deadline",
        _APPROVALS_PY,
        "      AND deadline_at > clock_timestamp()\n",
        "",
        "Of a decision and the deadline, exactly one wins: past it, nobody decides.",
        (
            f"{APPROVALS}::test_a_decision_and_the_deadline_racing_one_wins",
            f"{APPROVALS}::test_the_deadline_fails_the_step_through_its_error_exit",
        ),
    ),
    Mutation(
        "approval-decision-while-the-execution-lives",
        _APPROVALS_PY,
        "                  WHERE e.id = approval.execution_id"
        " AND e.status IN ({quoted(UNFINISHED)})\n",
        "                  WHERE e.id = approval.execution_id\n",
        "An approval whose execution ended is not decided: nobody would act on it.",
        (f"{APPROVALS}::test_an_approval_whose_execution_was_cancelled_is_not_decided",),
    ),
    Mutation(
        "approval-deadline-only-while-open",
        _APPROVALS_PY,
        "    WHERE id = :id AND status = '{ApprovalStatus.OPEN}'"
        " AND deadline_at <= clock_timestamp()",
        "    WHERE id = :id AND deadline_at <= clock_timestamp()",
        "A decision stands: the deadline passing later never turns it into a failure.",
        (f"{APPROVALS}::test_the_deadline_never_closes_an_approval_a_decision_holds",),
    ),
    Mutation(
        "approval-decision-wakes-the-execution",
        _APPROVALS_PY,
        "    wake_waiting(conn, wait_key(after.id))\n",
        "",
        "A decision wakes its execution at once, not at the next look.",
        (f"{APPROVALS}::test_the_step_waits_for_an_approver_and_goes_on_with_the_decision",),
    ),
    Mutation(
        "approval-never-your-own",
        "orquestador/api/approval_routes.py",
        "        if caller.sub in row.requesters:\n",
        "        if False:\n",
        "Whoever asked for the transition, or owns the request, never decides it.",
        (f"{APPROVALS}::test_the_requester_never_decides_their_own_request",),
    ),
]

# --- schedules (automation/firing.py, automation/schedules.py, domain/schedule_times.py) --

FIRING = "tests/integration/test_schedule_firing.py"
SCHEDULE_API = "tests/integration/test_api_schedules.py"
_FIRING_PY = "orquestador/automation/firing.py"

SCHEDULE_GUARDS = [
    Mutation(
        "schedule-fire-time-once",
        _FIRING_PY,
        "    return claimed is not None\n",
        "    return True\n",
        "A fire time whose fire row is written already starts no second execution.",
        (
            f"{FIRING}::test_a_fire_time_already_handled_never_starts_a_second_execution",
            f"{FIRING}::test_two_transactions_firing_one_fire_time_at_once_start_one_execution",
        ),
    ),
    Mutation(
        "schedule-paused-never-fires",
        _FIRING_PY,
        "        ~table.c.paused,\n",
        "",
        "A paused schedule never fires, whatever its next fire time says.",
        (f"{FIRING}::test_a_paused_schedule_never_fires",),
    ),
    Mutation(
        "schedule-advances",
        _FIRING_PY,
        "            next_fire_at=next_fire_at,\n",
        "",
        "A round moves the schedule past the fire times it handled.",
        (f"{FIRING}::test_a_due_schedule_starts_its_flow_once_with_the_fire_data",),
    ),
    Mutation(
        "schedule-misses-counted",
        _FIRING_PY,
        "            missed=schedule.c.missed + missed,\n",
        "",
        "Fire times the catch-up policy lets go are counted where GET /schedules shows them.",
        (f"{FIRING}::test_after_downtime_the_catch_up_policy_applies_and_misses_are_visible",),
    ),
    Mutation(
        "schedule-skip-starts-nothing-late",
        "orquestador/domain/schedule_times.py",
        "    elif catch_up == CATCH_UP_ONE"
        " or (now - due[-1]).total_seconds() <= ON_TIME_SECONDS:\n",
        "    elif True:\n",
        "Under skip, a fire time reached late after downtime is let go, not started.",
        (f"{FIRING}::test_after_downtime_the_catch_up_policy_applies_and_misses_are_visible",),
    ),
    Mutation(
        "schedule-put-keeps-its-next-fire",
        "orquestador/automation/schedules.py",
        "    elif current is not None and not current.paused"
        " and _same_timing(current, spec.timing):\n",
        "    elif False:\n",
        "Putting a schedule again with the same timing neither skips nor repeats a fire time.",
        (
            f"{SCHEDULE_API}::test_putting_again_keeps_the_next_fire_time_unless_the_timing_or_pause_changes",
        ),
    ),
]

# --- queue/checkpoints.py -------------------------------------------------------------
# The worker writes RUNNING and SUCCEEDED through the batch function (migration 0010 and
# its successors); these one-execution statements remain the reference for each write,
# and a dry run's simulated success, the attempt outcomes and a lookup's finding still
# run them.

_CHECKPOINTS_PY = "orquestador/queue/checkpoints.py"
_START_HOLDER = (
    "        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE\n    ), interrupted AS ("
)
_END_HOLDER = "        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE\n    ), ended AS ("

CHECKPOINT_GUARDS = [
    Mutation(
        "start-fence",
        _CHECKPOINTS_PY,
        _START_HOLDER,
        _START_HOLDER.replace("{FENCE}", "e.id = :execution_id"),
        "A stale holder cannot start a checkpoint.",
        (stale("start_checkpoint"),),
    ),
    Mutation(
        "start-row-lock",
        _CHECKPOINTS_PY,
        _START_HOLDER,
        _START_HOLDER.replace(" FOR UPDATE", ""),
        "The fence check locks the execution row, so no reclaimer starts while the write "
        "that passed it is in flight.",
        (
            f"{LOCKS}::test_a_holder_write_in_flight_keeps_a_reclaimer_out_until_it_commits"
            "[start_checkpoint]",
        ),
    ),
    Mutation(
        "start-never-over-succeeded",
        _CHECKPOINTS_PY,
        "    WHERE a.status <> '{CheckpointStatus.SUCCEEDED}'\n"
        "      AND a.external_key = EXCLUDED.external_key\n",
        "    WHERE a.external_key = EXCLUDED.external_key\n",
        "A SUCCEEDED checkpoint is never started again (never re-run, never overwritten).",
        (guard("test_a_start_never_replaces_a_checkpoint_it_may_not[succeeded]"),),
    ),
    Mutation(
        "start-same-key",
        _CHECKPOINTS_PY,
        "      AND a.external_key = EXCLUDED.external_key\n",
        "",
        "A checkpoint is never replaced by an attempt under another external key.",
        (guard("test_a_start_never_replaces_a_checkpoint_it_may_not[another key]"),),
    ),
    Mutation(
        "start-no-restart-interrupted-non-idempotent",
        _CHECKPOINTS_PY,
        "\n      AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE'\n"
        "               AND a.status IN ('{CheckpointStatus.RUNNING}',"
        " '{CheckpointStatus.UNKNOWN}'))",
        "",
        "An interrupted NON_IDEMPOTENT_WRITE (RUNNING or UNKNOWN) is never started again.",
        (
            guard("test_a_start_never_replaces_a_checkpoint_it_may_not[interrupted payment]"),
            guard("test_a_start_never_replaces_a_checkpoint_it_may_not[uncertain payment]"),
        ),
    ),
    Mutation(
        "start-history-same-conditions",
        _CHECKPOINTS_PY,
        "          AND a.effect <> 'NON_IDEMPOTENT_WRITE'\n        ON CONFLICT DO NOTHING",
        "        ON CONFLICT DO NOTHING",
        "A refused start writes nothing at all, not even the replaced attempt's line in "
        "the history.",
        (guard("test_a_start_never_replaces_a_checkpoint_it_may_not[interrupted payment]"),),
    ),
    Mutation(
        "start-interrupted-write-unknown",
        _CHECKPOINTS_PY,
        "CASE WHEN a.effect = 'READ_ONLY' THEN '{CheckpointStatus.FAILED}'\n"
        "                    ELSE '{CheckpointStatus.UNKNOWN}' END",
        "'{CheckpointStatus.FAILED}'",
        "An interrupted write enters the history as UNKNOWN (it may have happened), which "
        "the write rule reads.",
        (guard("test_an_interrupted_write_enters_the_history_as_in_doubt"),),
    ),
    Mutation(
        "succeed-fence",
        _CHECKPOINTS_PY,
        "        SELECT {{holder}} FROM execution e WHERE {{fence}} FOR UPDATE",
        "        SELECT {{holder}} FROM execution e WHERE e.id = :execution_id FOR UPDATE",
        "A stale holder that returns late records no success.",
        (
            stale("succeed_checkpoint"),
            stale("succeed_checkpoint_observed"),
            stale("succeed_checkpoint_simulated"),
        ),
    ),
    Mutation(
        "succeed-row-lock",
        _CHECKPOINTS_PY,
        "        SELECT {{holder}} FROM execution e WHERE {{fence}} FOR UPDATE",
        "        SELECT {{holder}} FROM execution e WHERE {{fence}}",
        "The success's fence check locks the execution row, so no reclaimer starts while "
        "the write is in flight.",
        (
            f"{LOCKS}::test_a_holder_write_in_flight_keeps_a_reclaimer_out_until_it_commits"
            "[succeed_checkpoint]",
        ),
    ),
    Mutation(
        "succeed-only-running",
        _CHECKPOINTS_PY,
        "          AND a.status = '{CheckpointStatus.RUNNING}' AND a.fencing_token = :token\n"
        "        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,",
        "          AND a.fencing_token = :token\n"
        "        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,",
        "Only a RUNNING checkpoint succeeds: a recorded success is never overwritten.",
        (guard("test_only_this_holders_running_checkpoint_can_succeed[succeeded]"),),
    ),
    Mutation(
        "succeed-own-token",
        _CHECKPOINTS_PY,
        "          AND a.status = '{CheckpointStatus.RUNNING}' AND a.fencing_token = :token\n"
        "        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,",
        "          AND a.status = '{CheckpointStatus.RUNNING}'\n"
        "        RETURNING a.execution_id, a.action_id, a.attempt, a.fencing_token, a.started_at,",
        "A holder succeeds only the attempt it started, never one an earlier holder left RUNNING.",
        (guard("test_only_this_holders_running_checkpoint_can_succeed[left running]"),),
    ),
    Mutation(
        "succeed-refuses-stale",
        _CHECKPOINTS_PY,
        "    row = run_alone(conn, statement, params).fetchone()\n    if row is None:\n"
        '        raise refuse_stale(claim, f"succeed checkpoint {action_id}")',
        "    row = run_alone(conn, statement, params).fetchone()",
        "A success that was not recorded is never reported as recorded.",
        (stale("succeed_checkpoint"),),
    ),
    Mutation(
        "end-attempt-fence",
        _CHECKPOINTS_PY,
        _END_HOLDER,
        _END_HOLDER.replace("{FENCE}", "e.id = :execution_id"),
        "A stale holder cannot end an attempt.",
        (stale("write_attempt_outcome"),),
    ),
    Mutation(
        "end-attempt-row-lock",
        _CHECKPOINTS_PY,
        _END_HOLDER,
        _END_HOLDER.replace(" FOR UPDATE", ""),
        "Ending an attempt locks the execution row with its fence check, so no reclaimer "
        "starts while the write is in flight.",
        (_in_flight("end_attempt"),),
    ),
    Mutation(
        "end-attempt-only-running",
        _CHECKPOINTS_PY,
        "WHERE a.execution_id = holder.id AND a.action_id = :action_id\n"
        "          AND a.status = '{CheckpointStatus.RUNNING}'\n",
        "WHERE a.execution_id = holder.id AND a.action_id = :action_id\n",
        "Only a RUNNING attempt ends: an ended one (a success above all) is history.",
        (guard("test_an_attempt_that_ended_cannot_end_again"),),
    ),
    Mutation(
        "end-attempt-refuses",
        _CHECKPOINTS_PY,
        "    if row is None:\n        if still_holds(conn, claim):\n"
        "            raise ContractMismatch(",
        "    if row is None and False:\n        if still_holds(conn, claim):\n"
        "            raise ContractMismatch(",
        "An attempt outcome that wrote nothing is refused, never taken as written.",
        (guard("test_an_attempt_that_ended_cannot_end_again"),),
    ),
    Mutation(
        "found-fence",
        _CHECKPOINTS_PY,
        "        SELECT e.id, e.org_id, e.request_id FROM execution e WHERE {FENCE} FOR UPDATE",
        "        SELECT e.id, e.org_id, e.request_id FROM execution e"
        " WHERE e.id = :execution_id FOR UPDATE",
        "A stale holder's lookup records nothing.",
        (f"{LOOKUP}::test_a_stale_holders_lookup_answer_writes_nothing[recovery-found]",),
    ),
    Mutation(
        "found-row-lock",
        _CHECKPOINTS_PY,
        "        SELECT e.id, e.org_id, e.request_id FROM execution e WHERE {FENCE} FOR UPDATE",
        "        SELECT e.id, e.org_id, e.request_id FROM execution e WHERE {FENCE}",
        "Recording a lookup's finding locks the execution row with its fence check, so no "
        "reclaimer starts while the write is in flight.",
        (_in_flight("record_found_write"),),
    ),
    Mutation(
        "found-only-in-doubt",
        _CHECKPOINTS_PY,
        "          AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}')\n"
        "          AND a.external_key = :external_key",
        "          AND a.external_key = :external_key",
        "A lookup's finding settles only a write in doubt, never a recorded outcome.",
        (guard("test_a_finding_is_recorded_only_on_a_write_in_doubt_under_its_key[succeeded]"),),
    ),
    Mutation(
        "found-same-key",
        _CHECKPOINTS_PY,
        "          AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}')\n"
        "          AND a.external_key = :external_key",
        "          AND a.status IN ('{CheckpointStatus.RUNNING}', '{CheckpointStatus.UNKNOWN}')",
        "A lookup's finding is recorded only under the key it was asked about.",
        (guard("test_a_finding_is_recorded_only_on_a_write_in_doubt_under_its_key[another key]"),),
    ),
]

# --- queue/outcomes.py ----------------------------------------------------------------

_OUTCOMES_PY = "orquestador/queue/outcomes.py"
_EXHAUSTION = (
    "tests/integration/test_worker_executor.py::test_exhaustion_fails_only_when_no_write_happened"
)

OUTCOME_GUARDS = [
    Mutation(
        "lock-execution-fence",
        _OUTCOMES_PY,
        "    FROM execution e\n    WHERE {FENCE}\n    FOR UPDATE\n",
        "    FROM execution e\n    WHERE e.id = :execution_id\n    FOR UPDATE\n",
        "A stale holder's finish is refused for its lease before anything else is judged.",
        (guard("test_a_stale_finish_is_refused_for_its_lease_first"),),
    ),
    Mutation(
        "end-execution-fence",
        _OUTCOMES_PY,
        "                           THEN clock_timestamp() END,\n"
        "        updated_at = clock_timestamp()\n    WHERE {FENCE}",
        "                           THEN clock_timestamp() END,\n"
        "        updated_at = clock_timestamp()\n    WHERE e.id = :execution_id",
        "A failure checks the lease again just before commit: a lease that ran out while "
        "the transaction waited rolls all of it back.",
        (
            guard(
                "test_a_lease_that_runs_out_inside_the_transaction_is_refused_before_commit[fail]"
            ),
        ),
    ),
    Mutation(
        "retry-fence",
        _OUTCOMES_PY,
        "        updated_at = clock_timestamp()\n"
        "    WHERE {FENCE}\n    RETURNING e.next_attempt_at",
        "        updated_at = clock_timestamp()\n"
        "    WHERE e.id = :execution_id\n    RETURNING e.next_attempt_at",
        "A retry checks the lease again just before commit: a lease that ran out while the "
        "transaction waited rolls all of it back.",
        (
            guard(
                "test_a_lease_that_runs_out_inside_the_transaction_is_refused_before_commit[retry]"
            ),
        ),
    ),
    Mutation(
        "finish-rechecks-after-seam",
        _OUTCOMES_PY,
        "            if not lease_still_valid(conn, finished):\n"
        '                raise refuse_stale(claim, "finish")',
        "            if False:\n                pass",
        "A finish whose commit was delayed past the lease is refused and rolled back.",
        (guard("test_a_finish_whose_seam_outlasts_the_lease_is_rolled_back"),),
    ),
    Mutation(
        "finish-request-held",
        _OUTCOMES_PY,
        "    if request.busy_execution_id != claim.execution_id:\n"
        '        return "the request is no longer held by this execution"\n',
        "",
        "Only the execution that holds the request may move it.",
        (guard("test_an_error_exit_is_refused_when_the_request_changed[released]"),),
    ),
    Mutation(
        "finish-pinned-flow",
        _OUTCOMES_PY,
        "    if request.flow_id != execution.flow_id:\n"
        '        return "the request is pinned to another flow version"\n',
        "",
        "A finish is refused when the request was pinned to another flow version since acceptance.",
        (guard("test_a_finish_is_refused_when_the_request_changed[flow]"),),
    ),
    Mutation(
        "finish-accepted-state",
        _OUTCOMES_PY,
        "    if request.state != execution.accepted_state or request.revision != "
        "execution.accepted_revision:",
        "    if request.revision != execution.accepted_revision:",
        "A finish is refused when the request's state moved since acceptance.",
        (guard("test_a_finish_is_refused_when_the_request_changed[state]"),),
    ),
    Mutation(
        "finish-accepted-revision",
        _OUTCOMES_PY,
        "    if request.state != execution.accepted_state or request.revision != "
        "execution.accepted_revision:",
        "    if request.state != execution.accepted_state:",
        "A finish is refused when the request's revision moved since acceptance.",
        (guard("test_a_finish_is_refused_when_the_request_changed[revision]"),),
    ),
    Mutation(
        "finish-expected-succeeded",
        _OUTCOMES_PY,
        "    missing = [a for a in finish.action_ids if a not in set(execution.succeeded)]",
        "    missing: list[str] = []",
        "A finish is refused unless every expected checkpoint is SUCCEEDED.",
        (guard("test_a_finish_is_refused_while_a_checkpoint_is_not_succeeded"),),
    ),
    Mutation(
        "writes-succeeded",
        _OUTCOMES_PY,
        "FILTER (WHERE a.status = '{CheckpointStatus.SUCCEEDED}'), '{{}}') AS succeeded,",
        "FILTER (WHERE false), '{{}}') AS succeeded,",
        "A failure after a write that succeeded parks the execution and keeps the request busy.",
        (f"{_EXHAUSTION}[IDEMPOTENT_WRITE-RECONCILIATION_REQUIRED]",),
    ),
    Mutation(
        "writes-in-doubt-unknown",
        _OUTCOMES_PY,
        "                     a.status IN ('{CheckpointStatus.RUNNING}',"
        " '{CheckpointStatus.UNKNOWN}')\n",
        "                     a.status IN ('{CheckpointStatus.RUNNING}')\n",
        "A write whose latest attempt ended UNKNOWN is in doubt.",
        (guard("test_a_checkpoint_left_unknown_is_a_write_in_doubt_on_its_own"),),
    ),
    Mutation(
        "writes-in-doubt-running",
        _OUTCOMES_PY,
        "                     a.status IN ('{CheckpointStatus.RUNNING}',"
        " '{CheckpointStatus.UNKNOWN}')\n",
        "                     a.status IN ('{CheckpointStatus.UNKNOWN}')\n",
        "A write left RUNNING (its holder died mid-call) is in doubt.",
        (guard("test_a_write_left_running_keeps_the_request_when_attempts_run_out"),),
    ),
    Mutation(
        "writes-history-unknown",
        _OUTCOMES_PY,
        "                     OR EXISTS (SELECT 1 FROM action_attempt t\n",
        "                     OR false AND EXISTS (SELECT 1 FROM action_attempt t\n",
        "An earlier attempt that ended UNKNOWN keeps the write in doubt, whatever a later "
        "attempt's FAILED says.",
        (f"{WRITE_RULE}::test_a_crash_mid_call_then_transient_failures_park_the_execution",),
    ),
    Mutation(
        "writes-attempt-base",
        _OUTCOMES_PY,
        "                                  AND t.attempt > a.attempt_base\n",
        "",
        "Attempts settled by a lookup's NotFound or an operator's approved retry no longer "
        "count as in doubt.",
        (
            f"{LOOKUP}::test_an_idempotent_write_out_of_attempts_is_looked_up_before_the_write_"
            "rule_parks[not found]",
        ),
    ),
    Mutation(
        "writes-idempotent-counted",
        _OUTCOMES_PY,
        "    WHERE a.execution_id = :execution_id AND a.effect <> 'READ_ONLY'",
        "    WHERE a.execution_id = :execution_id AND a.effect = 'NON_IDEMPOTENT_WRITE'",
        "An IDEMPOTENT_WRITE is a write too: its success or doubt keeps the request busy.",
        (f"{_EXHAUSTION}[IDEMPOTENT_WRITE-RECONCILIATION_REQUIRED]",),
    ),
    Mutation(
        "writes-simulation",
        _OUTCOMES_PY,
        "      AND NOT EXISTS (SELECT 1 FROM execution x"
        " WHERE x.id = a.execution_id AND x.simulation)",
        "",
        "A dry run wrote nothing: its failure ends FAILED with the request released.",
        (f"{SIMULATED}::test_a_failed_dry_run_after_a_simulated_write_is_failed_not_parked",),
    ),
    Mutation(
        "fail-parks-after-success",
        _OUTCOMES_PY,
        "        if writes.succeeded or writes.in_doubt:",
        "        if writes.in_doubt:",
        "A failure after a write that succeeded parks instead of releasing the request.",
        (f"{_EXHAUSTION}[IDEMPOTENT_WRITE-RECONCILIATION_REQUIRED]",),
    ),
    Mutation(
        "fail-parks-in-doubt",
        _OUTCOMES_PY,
        "        if writes.succeeded or writes.in_doubt:",
        "        if writes.succeeded:",
        "A failure while a write is in doubt parks instead of releasing the request.",
        (f"{WRITE_RULE}::test_a_crash_mid_call_then_transient_failures_park_the_execution",),
    ),
    Mutation(
        "fail-releases-only-its-own-request",
        _OUTCOMES_PY,
        "    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()\n"
        "    WHERE id = :request_id AND busy_execution_id = :execution_id",
        "    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()\n"
        "    WHERE id = :request_id",
        "A failing execution releases the request only while it still holds it.",
        (guard("test_a_failure_never_releases_a_request_another_execution_holds"),),
    ),
    Mutation(
        "error-exit-parks-in-doubt",
        _OUTCOMES_PY,
        "        writes = _writes(conn, claim)\n        if writes.in_doubt:",
        "        writes = _writes(conn, claim)\n        if False:",
        "A declared error exit with a write in doubt parks instead of moving the request.",
        (f"{WRITE_RULE}::test_an_earlier_uncertain_write_blocks_a_later_steps_error_exit",),
    ),
    Mutation(
        "error-exit-request-unchanged",
        _OUTCOMES_PY,
        '        request, execution = _lock_request_then_execution(conn, claim, "error exit")\n'
        "        change = request_change(request, execution, claim)\n"
        "        if change:\n",
        '        request, execution = _lock_request_then_execution(conn, claim, "error exit")\n'
        "        change = request_change(request, execution, claim)\n"
        "        if False:\n",
        "An error exit never moves a request that changed since acceptance.",
        (guard("test_an_error_exit_is_refused_when_the_request_changed[state]"),),
    ),
]

# --- queue/snapshots.py ---------------------------------------------------------------

_SNAPSHOTS_PY = "orquestador/queue/snapshots.py"


def _changed_at_load(change: str) -> str:
    return guard(f"test_a_request_changed_since_acceptance_is_refused_before_any_adapter[{change}]")


LOAD_GUARDS = [
    Mutation(
        "load-request-held",
        _SNAPSHOTS_PY,
        "        if self.request_busy_execution_id != self.execution_id:\n"
        '            return "the request is no longer held by this execution"\n',
        "",
        "A request no longer held by the execution is refused before any adapter is called.",
        (_changed_at_load("released"),),
    ),
    Mutation(
        "load-pinned-flow",
        _SNAPSHOTS_PY,
        "        if self.request_flow_id != self.flow_id:\n"
        '            return "the request is pinned to another flow version"\n',
        "",
        "A request pinned to another flow version since acceptance is refused before any "
        "adapter is called.",
        (_changed_at_load("flow"),),
    ),
    Mutation(
        "load-accepted-state",
        _SNAPSHOTS_PY,
        "        if self.request_state != self.accepted_state:\n",
        "        if False:\n",
        "A request whose state moved since acceptance is refused before any adapter is called.",
        (_changed_at_load("state"),),
    ),
    Mutation(
        "load-accepted-revision",
        _SNAPSHOTS_PY,
        "        if self.request_revision != self.accepted_revision:\n",
        "        if False:\n",
        "A request whose revision moved since acceptance is refused before any adapter is called.",
        (_changed_at_load("revision"),),
    ),
]

# --- queue/waits.py -------------------------------------------------------------------

_WAITS_PY = "orquestador/queue/waits.py"

WAIT_GUARDS = [
    Mutation(
        "park-fence",
        _WAITS_PY,
        "        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE",
        "        SELECT e.id FROM execution e WHERE e.id = :execution_id FOR UPDATE",
        "A stale holder parks nothing: not the execution, not the step's checkpoint.",
        (guard("test_a_stale_park_leaves_the_read_it_was_waiting_on_alone"),),
    ),
    Mutation(
        "park-row-lock",
        _WAITS_PY,
        "        SELECT e.id FROM execution e WHERE {FENCE} FOR UPDATE",
        "        SELECT e.id FROM execution e WHERE {FENCE}",
        "A park locks the execution row with its fence check, so no reclaimer starts while "
        "the step's checkpoint is being paused.",
        (_in_flight("park_waiting"),),
    ),
    Mutation(
        "park-only-a-read",
        _WAITS_PY,
        "\n          AND a.effect = 'READ_ONLY'\n",
        "\n",
        "Only a read may wait: a write's checkpoint is never paused as NOT_READY.",
        (guard("test_only_a_running_read_of_this_holder_can_wait[write]"),),
    ),
    Mutation(
        "park-own-running-attempt",
        _WAITS_PY,
        "          AND a.status = '{CheckpointStatus.RUNNING}' AND a.fencing_token = :token\n",
        "",
        "A wait pauses only the attempt this holder is running.",
        (guard("test_only_a_running_read_of_this_holder_can_wait[left running]"),),
    ),
    Mutation(
        "park-first-round-looks-at-the-command",
        _WAITS_PY,
        "                WHERE c.id = :command_id\n",
        "                WHERE false AND c.id = :command_id\n",
        "A status change between a first round's read and its park (no wait key on the row "
        "yet, so no wake marks it) makes the park due at once.",
        (
            "tests/integration/test_machine_flow.py::test_a_report_landing_between_a_first"
            "_round_s_read_and_its_park_wakes_it_at_once",
        ),
    ),
]

# --- worker/leases.py and worker/heartbeat.py -----------------------------------------

_WORKER_LEASES_PY = "orquestador/worker/leases.py"
_HEARTBEAT_PY = "orquestador/worker/heartbeat.py"

WORKER_LEASE_GUARDS = [
    Mutation(
        "held-lease-key-has-token",
        _WORKER_LEASES_PY,
        "        return (claim.execution_id, claim.token)",
        "        return (claim.execution_id, 0)",
        "A late renewal answer reaches only the job it was about, never a later job on the "
        "same execution.",
        (f"{LEASES_UNIT}::test_a_late_loss_never_signals_a_later_job_on_the_same_execution",),
    ),
    Mutation(
        "heartbeat-stops-a-lost-lease",
        _HEARTBEAT_PY,
        "                lost = self._leases.lose(key)\n",
        "                lost = None\n",
        "A job whose lease was not renewed is told to stop.",
        (guard("test_a_job_whose_lease_was_not_renewed_is_told_to_stop"),),
    ),
    Mutation(
        "heartbeat-presumes-overdue-lost",
        _HEARTBEAT_PY,
        "            for claim in self._leases.lose_overdue(time.monotonic()):\n",
        "            for claim in []:\n",
        "When renewals fail for longer than a lease, the jobs are told to stop instead of "
        "trusting a lease nobody can renew.",
        (guard("test_a_heartbeat_that_cannot_renew_stops_its_jobs_once_the_lease_is_over"),),
    ),
    Mutation(
        "heartbeat-stops-a-lease-kept-busy-too-long",
        _HEARTBEAT_PY,
        "        for claim in self._leases.lose_overdue(time.monotonic()):\n"
        "            log.warning(\n"
        '                "lease could not be renewed in time',
        "        for claim in []:\n            log.warning(\n"
        '                "lease could not be renewed in time',
        "A lease another session keeps locked (renewal skips it) past its length stops its "
        "job: no job runs on a lease it could not renew.",
        (guard("test_a_lease_another_session_keeps_locked_past_its_length_stops_its_job[0.0]"),),
    ),
    Mutation(
        "overdue-bound",
        _WORKER_LEASES_PY,
        "            overdue = [h for h in self._held.values() if h.valid_until <= now]",
        "            overdue: list[HeldLease] = []",
        "A lease not renewed within its length is presumed lost.",
        (f"{LEASES_UNIT}::test_leases_not_renewed_in_time_are_presumed_lost",),
    ),
]

# --- the batch function (migration 0011) and queue/batches.py -------------------------
# What the worker's protocol writer really runs: every RUNNING and SUCCEEDED checkpoint
# and every finish of a job goes through one call of orquestador_write_batch.

_BATCH_SQL = "migrations/versions/0011_write_batch_rows.py"
_BATCHES_PY = "orquestador/queue/batches.py"
BATCH_GUARDS_TESTS = "tests/integration/test_batch_guards.py"
WRITER = "tests/integration/test_protocol_writer.py"


def batch(name: str) -> str:
    return f"{BATCH_GUARDS_TESTS}::{name}"


_NOT_BUSY = "test_a_row_that_fails_its_fence_is_refused_not_busy_while_another_session_holds_it"
_NEIGHBOURS = "test_a_row_that_fails_its_fence_is_refused_and_its_neighbours_commit"
_BATCH_START = "test_a_batch_start_never_replaces_a_checkpoint_it_may_not"
_BATCH_FINISH = "test_a_batch_finish_is_refused_when_the_request_changed"
_BATCH_SUCCESS = "test_a_batch_success_is_recorded_only_on_this_holders_running_checkpoint"

BATCH_GUARDS = [
    Mutation(
        "batch-fence-lease-live",
        _BATCH_SQL,
        "        AND e.lease_expires_at > clock_timestamp()\n",
        "",
        "A batch row whose lease ran out is refused by its own fence, at once and alone: "
        "its neighbours commit in the same transaction.",
        (batch(f"{_NEIGHBOURS}[expired lease]"), batch(f"{_NOT_BUSY}[expired lease]")),
    ),
    Mutation(
        "batch-fence-owner",
        _BATCH_SQL,
        "        AND e.lease_owner = i.owner\n",
        "",
        "A batch row is written only under the lease of the worker that owns it.",
        (batch(f"{_NEIGHBOURS}[other owner]"),),
    ),
    Mutation(
        "batch-fence-token",
        _BATCH_SQL,
        "        AND e.fencing_token = i.token\n",
        "",
        "A stale token's row is refused, never taken for one that only waits for a lock.",
        (batch(f"{_NOT_BUSY}[stale token]"),),
    ),
    Mutation(
        "batch-rows-by-token",
        _BATCH_SQL,
        "      ON held.id = i.execution_id AND held.token = i.token\n",
        "      ON held.id = i.execution_id\n",
        "A row writes only under the (execution, token) the batch locked, never under the "
        "execution id alone: a stale holder batched with the current one writes nothing.",
        (batch("test_a_stale_row_is_refused_even_batched_with_the_current_holders"),),
    ),
    Mutation(
        "batch-rider-written-first",
        _BATCH_SQL,
        "    (i.after_action IS NULL\n"
        "     OR (i.execution_id, i.token) IN (SELECT * FROM unnest(v_done, v_done_tokens)))\n",
        "    (true)\n",
        "A RUNNING checkpoint or a finish whose riding SUCCEEDED was refused writes nothing.",
        (
            batch("test_a_row_whose_riding_success_is_refused_writes_nothing_else[start]"),
            batch("test_a_row_whose_riding_success_is_refused_writes_nothing_else[finish]"),
        ),
    ),
    Mutation(
        "batch-succeed-only-running",
        _BATCH_SQL,
        "              AND a.status = 'RUNNING' AND a.fencing_token = h.token\n",
        "              AND a.fencing_token = h.token\n",
        "A batch success is recorded only on a RUNNING checkpoint, never over a recorded one.",
        (batch(f"{_BATCH_SUCCESS}[succeeded]"),),
    ),
    Mutation(
        "batch-succeed-own-token",
        _BATCH_SQL,
        "              AND a.status = 'RUNNING' AND a.fencing_token = h.token\n",
        "              AND a.status = 'RUNNING'\n",
        "A batch success is recorded only on the attempt this holder started.",
        (batch(f"{_BATCH_SUCCESS}[left running]"),),
    ),
    Mutation(
        "batch-start-never-over-succeeded",
        _BATCH_SQL,
        "            WHERE a.status <> 'SUCCEEDED'\n"
        "              AND a.external_key = EXCLUDED.external_key\n",
        "            WHERE a.external_key = EXCLUDED.external_key\n",
        "A batch never starts a SUCCEEDED checkpoint again.",
        (batch(f"{_BATCH_START}[succeeded]"),),
    ),
    Mutation(
        "batch-start-same-key",
        _BATCH_SQL,
        "              AND a.external_key = EXCLUDED.external_key\n",
        "",
        "A batch never replaces a checkpoint with an attempt under another external key.",
        (batch(f"{_BATCH_START}[another key]"),),
    ),
    Mutation(
        "batch-start-no-restart-interrupted-non-idempotent",
        _BATCH_SQL,
        "\n              AND NOT (a.effect = 'NON_IDEMPOTENT_WRITE'"
        " AND a.status IN ('RUNNING', 'UNKNOWN'))",
        "",
        "A batch never starts an interrupted NON_IDEMPOTENT_WRITE again.",
        (
            batch(f"{_BATCH_START}[interrupted payment]"),
            batch(f"{_BATCH_START}[uncertain payment]"),
        ),
    ),
    Mutation(
        "batch-start-history-same-conditions",
        _BATCH_SQL,
        "              AND a.effect <> 'NON_IDEMPOTENT_WRITE'\n",
        "",
        "A start the batch refuses writes no line in the history either.",
        (batch(f"{_BATCH_START}[interrupted payment]"),),
    ),
    Mutation(
        "batch-start-interrupted-write-unknown",
        _BATCH_SQL,
        "CASE WHEN a.effect = 'READ_ONLY' THEN 'FAILED' ELSE 'UNKNOWN' END",
        "'FAILED'",
        "An interrupted write started again in a batch enters the history as UNKNOWN.",
        (
            batch(
                "test_an_interrupted_attempt_started_again_in_a_batch_is_recorded_by_its_effect"
                "[IDEMPOTENT_WRITE-UNKNOWN]"
            ),
        ),
    ),
    Mutation(
        "batch-finish-request-held",
        _BATCH_SQL,
        " AND r.busy_execution_id = h.execution_id\n",
        "\n",
        "A batch finish moves the request only while this execution holds it.",
        (batch(f"{_BATCH_FINISH}[released]"),),
    ),
    Mutation(
        "batch-finish-pinned-flow",
        _BATCH_SQL,
        "              AND r.flow_id = h.flow_id AND r.state = h.accepted_state\n",
        "              AND r.state = h.accepted_state\n",
        "A batch finish is refused when the request was pinned to another flow version.",
        (batch(f"{_BATCH_FINISH}[flow]"),),
    ),
    Mutation(
        "batch-finish-accepted-state",
        _BATCH_SQL,
        "              AND r.flow_id = h.flow_id AND r.state = h.accepted_state\n",
        "              AND r.flow_id = h.flow_id\n",
        "A batch finish is refused when the request's state moved since acceptance.",
        (batch(f"{_BATCH_FINISH}[state]"),),
    ),
    Mutation(
        "batch-finish-accepted-revision",
        _BATCH_SQL,
        "              AND r.revision = h.accepted_revision\n",
        "",
        "A batch finish is refused when the request's revision moved since acceptance.",
        (batch(f"{_BATCH_FINISH}[revision]"),),
    ),
    Mutation(
        "batch-finish-expected-succeeded",
        _BATCH_SQL,
        "SELECT 1 FROM jsonb_array_elements_text(h.expected) AS wanted(action_id)",
        "SELECT 1 FROM jsonb_array_elements_text('[]'::jsonb) AS wanted(action_id)",
        "A batch finish is refused unless every expected checkpoint is SUCCEEDED.",
        (batch("test_a_batch_finish_is_refused_while_a_checkpoint_is_not_succeeded"),),
    ),
    Mutation(
        "batch-skips-locked-executions",
        _BATCH_SQL,
        "        FOR UPDATE OF e SKIP LOCKED\n",
        "        FOR UPDATE OF e\n",
        "An execution row another session holds does not hold back the rest of the batch.",
        (f"{WRITER}::test_a_row_another_session_holds_does_not_hold_back_the_others[execution]",),
    ),
    Mutation(
        "batch-skips-locked-requests",
        _BATCH_SQL,
        "            FOR UPDATE SKIP LOCKED\n",
        "            FOR UPDATE\n",
        "A request another session holds does not hold back the rest of the batch.",
        (f"{WRITER}::test_a_row_another_session_holds_does_not_hold_back_the_others[request]",),
    ),
    Mutation(
        "batch-lease-checked-before-commit",
        _BATCH_SQL,
        "    IF EXISTS (SELECT 1 FROM unnest(v_leases) AS lease WHERE lease <= clock_timestamp())\n"
        "       OR EXISTS (SELECT 1 FROM execution e\n"
        "                  WHERE e.id = ANY (v_held) AND e.status = 'RUNNING'\n"
        "                    AND e.lease_expires_at <= clock_timestamp()) THEN",
        "    IF false THEN",
        "A batch during which a lease ran out keeps nothing: no part of a row is written.",
        (f"{WRITER}::test_a_lease_running_out_mid_batch_leaves_no_part_of_the_row_written",),
    ),
    Mutation(
        "batch-finished-lease-checked-before-commit",
        _BATCH_SQL,
        "    IF EXISTS (SELECT 1 FROM unnest(v_leases) AS lease WHERE lease <= clock_timestamp())\n"
        "       OR EXISTS",
        "    IF EXISTS",
        "A finish whose lease ran out while the batch worked is refused, though the finish "
        "itself cleared the lease it wrote under.",
        (batch("test_a_finish_whose_lease_runs_out_inside_the_batch_is_refused"),),
    ),
    Mutation(
        "batch-finish-answered-by-token",
        _BATCHES_PY,
        "    if _key(claim) in finished:",
        "    if str(claim.execution_id) in {key[0] for key in finished}:",
        "A stale holder's finish is never told it succeeded because the current holder's did.",
        (f"{WRITER}::test_a_stale_holders_finish_batched_with_the_current_holders_is_refused",),
    ),
    Mutation(
        "batch-success-answered-by-token",
        _BATCHES_PY,
        "    if (*key, row.action_id) in succeeded or (*key, None) in succeeded:",
        "    if str(row.claim.execution_id) in {done[0] for done in succeeded}:",
        "A stale holder's success is never reported recorded because the current holder's was.",
        (batch("test_a_stale_row_is_refused_even_batched_with_the_current_holders"),),
    ),
]

# --- bounded waits: lock and statement timeouts ---------------------------------------

_WRITER_PY = "orquestador/worker/protocol_writer.py"
_EXECUTOR_PY = "orquestador/worker/executor.py"
_STEP_RUNNER_PY = "orquestador/worker/step_runner.py"
_STEP_OUTCOMES_PY = "orquestador/worker/step_outcomes.py"
_RECOVERY_PY = "orquestador/domain/recovery.py"
# The dry-run rule: a writer is never invoked, a read only when it opts in.
_DRY_RUN_REFUSAL = (
    '        elif loaded.simulation and (adapter.effect.writes or adapter.dry_run != "call"):'
)
_ENGINE_PY = "orquestador/db/engine.py"
_DAEMON_PY = "orquestador/worker/daemon.py"
_CONFIG_PY = "orquestador/config.py"
_BOUNDS = guard("test_every_worker_connection_bounds_its_lock_and_statement_waits")

TIMEOUT_GUARDS = [
    Mutation(
        "writer-lock-timeout",
        _WRITER_PY,
        'f"-c jit=off -c lock_timeout={lock_timeout_ms}"',
        '"-c jit=off"',
        "The writer waits for a lock no longer than its lock timeout.",
        (batch("test_a_writer_statement_waits_for_a_lock_no_longer_than_its_lock_timeout"),),
    ),
    Mutation(
        "writer-statement-timeout",
        _WRITER_PY,
        'f" -c statement_timeout={statement_timeout_ms}"',
        '""',
        "A writer statement that runs long is cut at its statement timeout.",
        (batch("test_a_writer_statement_is_cut_at_its_statement_timeout"),),
    ),
    Mutation(
        "workers-writer-lock-timeout",
        _EXECUTOR_PY,
        "                        lock_timeout_ms=self.settings.lock_timeout_ms,\n",
        "",
        "The worker's protocol writer waits for a lock no longer than WORKER_LOCK_TIMEOUT_MS.",
        (batch("test_the_workers_writer_waits_for_a_lock_no_longer_than_configured"),),
    ),
    Mutation(
        "workers-writer-statement-timeout",
        _EXECUTOR_PY,
        "                        statement_timeout_ms=self.settings.statement_timeout_ms,\n",
        "",
        "The worker's protocol writer cuts a statement well within the lease.",
        (batch("test_the_workers_writer_cuts_a_statement_within_the_lease"),),
    ),
    Mutation(
        "engine-lock-timeout",
        _ENGINE_PY,
        '            ("lock_timeout", lock_timeout_ms),\n',
        "",
        "A worker's own connections wait for a lock no longer than the lock timeout.",
        (_BOUNDS,),
    ),
    Mutation(
        "engine-statement-timeout",
        _ENGINE_PY,
        '            ("statement_timeout", statement_timeout_ms),\n',
        "",
        "A worker's own connections cut a statement at the statement timeout.",
        (_BOUNDS,),
    ),
    Mutation(
        "worker-engine-lock-timeout",
        _DAEMON_PY,
        "        lock_timeout_ms=settings.lock_timeout_ms,\n",
        "",
        "The worker process builds its engine with the lock timeout.",
        (_BOUNDS,),
    ),
    Mutation(
        "worker-engine-statement-timeout",
        _DAEMON_PY,
        "        statement_timeout_ms=settings.statement_timeout_ms,\n",
        "",
        "The worker process builds its engine with the statement timeout.",
        (_BOUNDS,),
    ),
    Mutation(
        "statement-timeout-below-lease",
        _CONFIG_PY,
        "min(self.worker_statement_timeout_ms, self.worker_lease_seconds * 250)",
        "self.worker_statement_timeout_ms",
        "No worker statement may wait longer than a quarter of the lease it writes under.",
        (_BOUNDS,),
    ),
    Mutation(
        "lock-timeout-within-statement-timeout",
        _CONFIG_PY,
        "min(self.worker_lock_timeout_ms, self.statement_timeout_ms)",
        "self.worker_lock_timeout_ms",
        "A lock wait stays within the statement's bound.",
        (_BOUNDS,),
    ),
]

# --- worker/executor.py, step_runner.py, step_outcomes.py and calls.py: recovery rules ---

_CALLS_PY = "orquestador/worker/calls.py"
EXECUTOR = "tests/integration/test_worker_executor.py"


def _mismatch(field: str) -> str:
    return guard(f"test_a_recovered_success_recorded_for_something_else_is_never_reused[{field}]")


def _compared(name: str, attribute: str) -> str:
    return f'                ("{name}", action_attempt.{attribute}, checkpoint.{attribute}),\n'


_IN_FLIGHT = f"{LOOKUP}::test_an_overrun_write_is_looked_up_only_once_its_call_ended[1]"
_PAST_GRACE = f"{LOOKUP}::test_an_abandoned_call_still_running_past_the_grace_parks_its_write"
_SAME_WORKER_RECLAIM = (
    f"{LOOKUP}::test_a_reclaim_in_the_same_worker_does_not_look_up_while_the_old_call_lingers"
)

EXECUTOR_GUARDS = [
    *(
        Mutation(
            f"recover-compares-{slug}",
            _STEP_OUTCOMES_PY,
            _compared(name, attribute),
            "",
            f"A SUCCEEDED checkpoint is reused only if its {name} matches; otherwise the "
            "execution parks with CONTRACT_MISMATCH.",
            (_mismatch(name),),
        )
        for slug, name, attribute in (
            ("input-hash", "inputHash", "input_hash"),
            ("external-key", "externalKey", "external_key"),
            ("effect", "effect", "effect"),
            ("capability", "capability", "capability"),
            ("adapter-version", "adapterVersion", "adapter_version"),
        )
    ),
    Mutation(
        "recover-mismatch-parks",
        _RECOVERY_PY,
        "    if begun.mismatched and not begun.retry_approved:\n",
        "    if False:\n",
        "A checkpoint recorded for something else is never reused nor overwritten.",
        (_mismatch("inputHash"),),
    ),
    Mutation(
        "recover-reuses-success",
        _RECOVERY_PY,
        "    if begun.status is CheckpointStatus.SUCCEEDED:\n        return Reuse()\n",
        "",
        "A step that succeeded is never run again: recovery reuses its output.",
        (f"{EXECUTOR}::test_recovery_reuses_succeeded_outputs_and_keeps_the_external_key",),
    ),
    Mutation(
        "recover-interrupted-non-idempotent-parks",
        _RECOVERY_PY,
        "    if interrupted and non_idempotent:\n",
        "    if False:\n",
        "An interrupted NON_IDEMPOTENT_WRITE is never repeated: the execution parks "
        "INTERRUPTED_NON_IDEMPOTENT_WRITE.",
        (f"{EXECUTOR}::test_interrupted_non_idempotent_write_requires_reconciliation",),
    ),
    Mutation(
        "recover-exhausted-fails",
        _RECOVERY_PY,
        "    if exhausted:\n        return Fail(\n",
        "    if False:\n        return Fail(\n",
        "An interrupted step with no attempt left is not called again; the write rule ends "
        "the execution.",
        (f"{WRITE_RULE}::test_an_interrupted_idempotent_write_with_no_attempt_left_is_parked",),
    ),
    Mutation(
        "attempts-exhausted-at-load",
        _EXECUTOR_PY,
        "        if claim.attempts > loaded.max_attempts:\n",
        "        if False:\n",
        "An execution out of claims ends ATTEMPTS_EXHAUSTED before anything runs.",
        (guard("test_a_write_left_running_keeps_the_request_when_attempts_run_out"),),
    ),
    Mutation(
        "request-changed-refused-at-load",
        _EXECUTOR_PY,
        "        change = loaded.request_changed()\n        if change:\n",
        "        change = loaded.request_changed()\n        if False:\n",
        "A request changed since acceptance is refused before any adapter is called.",
        (f"{EXECUTOR}::test_a_request_modified_since_acceptance_is_rejected_before_any_adapter",),
    ),
    Mutation(
        "riding-success-settled-before-a-failure",
        _EXECUTOR_PY,
        "        self.settle_riding_success()\n        status = fail_execution(",
        "        status = fail_execution(",
        "A run that fails after a safe step settles that step's riding SUCCEEDED first: the "
        "failure is judged with the step's success durable.",
        (f"{EXECUTOR}::test_a_failed_decision_keeps_the_last_steps_success",),
    ),
    Mutation(
        "non-idempotent-success-never-rides",
        _STEP_RUNNER_PY,
        "        if audit is None and step.risk is not Effect.NON_IDEMPOTENT_WRITE:\n",
        "        if audit is None:\n",
        "A NON_IDEMPOTENT_WRITE's success commits on its own before anything else, never "
        "riding in a later write.",
        (f"{EXECUTOR}::test_a_non_idempotent_last_steps_success_commits_before_the_finish",),
    ),
    Mutation(
        "stop-between-actions",
        _EXECUTOR_PY,
        "            if self.stop.is_set():\n                self.settle_riding_success()\n",
        "            if False:\n                self.settle_riding_success()\n",
        "A job told to stop (its lease lost or the drain over) starts no further action "
        "and gives its lease back.",
        ("tests/integration/test_worker_shutdown.py",),
    ),
    Mutation(
        "uncertain-non-idempotent-parks",
        _RECOVERY_PY,
        "    if effect is Effect.NON_IDEMPOTENT_WRITE:\n        if answer is LookUp.NOT_ASKED:\n",
        "    if False:\n        if answer is LookUp.NOT_ASKED:\n",
        "A NON_IDEMPOTENT_WRITE whose outcome is uncertain is never retried blindly: looked "
        "up, or parked.",
        (f"{EXECUTOR}::test_uncertain_non_idempotent_write_is_parked_not_retried",),
    ),
    Mutation(
        "writer-not-ready-is-uncertain",
        _STEP_RUNNER_PY,
        "            if adapter.effect.writes:\n"
        "                # The contract lets only a read wait.",
        "            if False:\n                # The contract lets only a read wait.",
        "A writer's NotReady is an uncertain outcome, never a wait.",
        (f"{WAITS}::test_not_ready_from_a_writer_is_uncertain_never_a_wait",),
    ),
    Mutation(
        "dry-run-never-invokes-a-writer",
        _STEP_RUNNER_PY,
        _DRY_RUN_REFUSAL,
        '        elif loaded.simulation and (adapter.dry_run != "call"):',
        "A dry run never calls a writing adapter's invoke, whatever the adapter declares.",
        (f"{SIMULATED}::test_a_writer_claiming_dry_run_call_past_the_contract_is_never_invoked",),
    ),
    Mutation(
        "dry-run-calls-a-read-only-on-opt-in",
        _STEP_RUNNER_PY,
        _DRY_RUN_REFUSAL,
        "        elif loaded.simulation and (adapter.effect.writes):",
        "A dry run calls nothing outside: a read without simulate is invoked only when it "
        'declares dry_run = "call".',
        (
            f"{SIMULATED}::test_a_read_without_simulate_is_not_called_in_a_dry_run_unless_it_opts_in",
        ),
    ),
    Mutation(
        "adapter-timeouts-below-lease",
        _STEP_RUNNER_PY,
        "        if not all(seconds < self.services.lease_seconds"
        " for _, seconds in timeouts_of(adapter)):",
        "        if False:",
        "No adapter call or lookup may outlast the lease it runs under.",
        (f"{LOOKUP}::test_a_lookup_timeout_not_below_the_lease_fails_before_any_call",),
    ),
    Mutation(
        "lookup-waits-for-abandoned-call",
        _STEP_OUTCOMES_PY,
        "        if not self.abandoned_call_ended(step):\n"
        '            return _Answer(Unknown(), "IN_FLIGHT")\n',
        "",
        "While a call abandoned under the key still runs, the provider is not asked: its "
        "NotFound is no proof, the write may land a moment later (a reclaim in the same "
        "worker included).",
        (_SAME_WORKER_RECLAIM,),
    ),
    Mutation(
        "lookup-in-flight-past-grace",
        _STEP_OUTCOMES_PY,
        "        if lingering.ended(lingering.abandoned_at + grace - time.monotonic()):",
        "        if True:",
        "An abandoned call still running past ADAPTER_ABANDON_GRACE_SECONDS leaves the "
        "write in doubt: the execution parks (lookup IN_FLIGHT).",
        (_PAST_GRACE,),
    ),
    Mutation(
        "timed-out-write-waits-for-its-call",
        _STEP_RUNNER_PY,
        "            if step.risk.writes and not self.abandoned_call_ended(step):\n",
        "            if False:\n",
        "A timed-out write is handed on (a retry, a look-up, maybe in another worker) only "
        "once its abandoned call ended; past the grace it parks.",
        (
            "tests/integration/test_adapter_deadlines.py"
            "::test_a_timed_out_write_is_handed_on_only_once_its_call_ended",
        ),
    ),
    Mutation(
        "abandoned-call-keyed",
        _STEP_RUNNER_PY,
        "output = self.services.calls.call(call, ctx, ctx.deadline, extra, key)",
        "output = self.services.calls.call(call, ctx, ctx.deadline, extra)",
        "A call is made under its external key, so that once abandoned it is known by it.",
        (_IN_FLIGHT,),
    ),
    Mutation(
        "abandoned-call-lingers",
        _CALLS_PY,
        "            if key is not None:\n                self._linger(key, answer)\n",
        "",
        "An abandoned call stays known under its external key until its thread ends.",
        (_IN_FLIGHT,),
    ),
    Mutation(
        "abandoned-call-end-seen",
        _CALLS_PY,
        "                self._value, self._error = value, error\n        self._done.release()\n",
        "                self._value, self._error = value, error\n"
        "        if not abandoned:\n            self._done.release()\n",
        "The end of an abandoned call is seen by whoever waits for it before a lookup.",
        (_IN_FLIGHT,),
    ),
    Mutation(
        "inline-late-answer-dropped",
        _CALLS_PY,
        "        if time.monotonic() >= deadline:\n            raise CallTimedOut()\n"
        "        return result\n",
        "        return result\n",
        "An inline adapter's answer at or past its deadline is late, as a call thread's is.",
        (
            "tests/integration/test_adapter_deadlines.py::"
            "test_an_inline_adapter_runs_on_the_job_thread_and_is_late_past_its_deadline",
            "tests/unit/test_adapter_calls.py::test_an_inline_answer_given_at_or_past_its_deadline_is_late",
        ),
    ),
]

# --- queue/reconciliation.py: cancel obeys the write rule -------------------------------

_RECONCILIATION_PY = "orquestador/queue/reconciliation.py"
RECONCILIATION = "tests/integration/test_reconciliation.py"
MACHINE_CANCEL = "tests/integration/test_machine_cancel.py"

CANCEL_GUARDS = [
    Mutation(
        "cancel-only-when-live",
        _RECONCILIATION_PY,
        "    if execution.status not in UNHELD:\n",
        "    if False:\n",
        "An ended or parked execution is never cancelled again.",
        (f"{RECONCILIATION}::test_an_ended_execution_cannot_be_cancelled",),
    ),
    Mutation(
        "cancel-of-running-only-requested",
        _RECONCILIATION_PY,
        "    if execution.status == CANCEL_REQUESTABLE:\n",
        "    if False:\n",
        "A cancel of a RUNNING execution is recorded for its holder, never refused and never "
        "applied under the call in flight.",
        (f"{RECONCILIATION}::test_a_running_execution_records_the_cancel_for_its_holder_once",),
    ),
    Mutation(
        "cancel-locks-the-execution",
        _RECONCILIATION_PY,
        "    WHERE e.id = :execution_id AND e.org_id = :org_id\n    FOR UPDATE OF e\n",
        "    WHERE e.id = :execution_id AND e.org_id = :org_id\n",
        "A cancel reads the execution's status under its row lock: a cancel racing a claim, "
        "exactly one wins.",
        (f"{RECONCILIATION}::test_cancel_racing_a_claim_exactly_one_wins",),
    ),
    Mutation(
        "cancel-parks-after-success",
        _RECONCILIATION_PY,
        "    if writes.succeeded or writes.in_doubt:\n",
        "    if writes.in_doubt:\n",
        "A cancel after a write succeeded parks CANCELLED_AFTER_WRITES, the request busy.",
        (
            f"{RECONCILIATION}::test_cancel_in_retry_wait_after_a_charge_parks_and_an_operator"
            "_s_fail_releases",
        ),
    ),
    Mutation(
        "cancel-parks-in-doubt",
        _RECONCILIATION_PY,
        "    if writes.succeeded or writes.in_doubt:\n",
        "    if writes.succeeded:\n",
        "A cancel while a write is in doubt parks CANCELLED_AFTER_WRITES, the request busy.",
        (guard("test_a_cancel_with_only_a_write_in_doubt_parks_and_keeps_the_request"),),
    ),
    Mutation(
        "cancel-releases-only-its-own-request",
        _RECONCILIATION_PY,
        "    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()\n"
        "    WHERE id = :request_id AND busy_execution_id = :execution_id\n",
        "    UPDATE request SET busy_execution_id = NULL, updated_at = clock_timestamp()\n"
        "    WHERE id = :request_id\n",
        "A cancel releases the request only while the cancelled execution holds it.",
        (guard("test_a_cancel_never_releases_a_request_another_execution_holds"),),
    ),
    Mutation(
        "cancel-ends-only-its-own-commands",
        "orquestador/machines/cancel.py",
        "        WHERE org_id = :org_id AND external_key LIKE :key_prefix\n",
        "        WHERE org_id = :org_id\n",
        "A cancel ends or stops only the cancelled execution's machine commands.",
        (f"{MACHINE_CANCEL}::test_a_command_of_another_execution_is_left_alone",),
    ),
    Mutation(
        "cancel-ends-only-commands-nobody-took",
        "orquestador/machines/cancel.py",
        "    SET status = CASE WHEN open.status = '{CommandStatus.PENDING}'"
        " THEN '{CommandStatus.CANCELLED}'\n"
        "                      ELSE c.status END,\n",
        "    SET status = '{CommandStatus.CANCELLED}',\n",
        "A command an agent already took keeps its status: the agent is asked to stop it and "
        "reports what became of it.",
        (f"{MACHINE_CANCEL}::test_a_taken_command_is_asked_to_stop_at_the_next_report_and_poll",),
    ),
]

# --- machines/: a command never arrives late; a withdrawn command is not a write --------

_COMMANDS_PY = "orquestador/machines/commands.py"
_EXPIRY_PY = "orquestador/machines/expiry.py"
_MACHINE_CANCEL_PY = "orquestador/machines/cancel.py"
EXPIRY = "tests/integration/test_command_expiry.py"
AGENT_COMMANDS = "tests/unit/test_agent_commands.py"

SCHEDULE_QUOTAS = "tests/integration/test_schedule_quotas.py"
OPEN_EXECUTIONS = "tests/integration/test_open_executions_quota.py"
FIRES_OVER_QUOTA = "tests/integration/test_schedule_fires_over_quota.py"
ROLLOUT_LIMITS = "tests/integration/test_rollout_limits.py"
CREDENTIALS = "tests/integration/test_machine_credentials.py"
_CREDENTIALS_PY = "orquestador/machines/credentials.py"

EXPIRY_GUARDS = [
    Mutation(
        "schedules-fire-in-turns-across-organizations",
        _FIRING_PY,
        ".order_by(ranked.c.turn, schedule.c.next_fire_at, schedule.c.org_id)",
        ".order_by(schedule.c.next_fire_at, schedule.c.org_id)",
        "A firing round takes each organization's earliest due schedule before anyone's "
        "second: one organization's flood never pushes another's schedule out of a round.",
        (
            f"{SCHEDULE_QUOTAS}::test_one_organization_s_flood_never_pushes_another_s_schedule"
            "_out_of_a_round",
        ),
    ),
    Mutation(
        "bulk-never-beyond-its-quota",
        "orquestador/queue/bulk.py",
        "            ).where(counted <= max_items),\n",
        "            ),\n",
        "A bulk action whose filter matches more executions than the organization's quota "
        "bulkItems writes nothing.",
        (
            "tests/integration/test_bulk_actions.py::test_too_many_matches_are_refused_before"
            "_anything_is_written",
        ),
    ),
    Mutation(
        "open-executions-quota-checked-at-acceptance",
        "orquestador/api/quota_checks.py",
        "    if used is not None:\n",
        "    if False:\n",
        "An organization holding its quota openExecutions of executions not ended gets no "
        "new one from the API: 429 naming the quota.",
        (f"{OPEN_EXECUTIONS}::test_runs_transitions_and_dry_runs_beyond_the_quota_are_429",),
    ),
    Mutation(
        "open-executions-counted-up-to-the-limit",
        "orquestador/queue/open_executions.py",
        "        return None if used < limit else used\n",
        "        return None\n",
        "A schedule's fire over the quota openExecutions starts nothing.",
        (
            f"{FIRES_OVER_QUOTA}::test_a_fire_over_the_quota_waits_and_starts_once_an_execution_ends",
        ),
    ),
    Mutation(
        "schedule-fire-over-quota-held",
        _FIRING_PY,
        "    return unstarted[-1], unstarted[-1], False\n",
        "    return planned.next_fire_at, None, planned.more\n",
        "A fire put off by the quota openExecutions stays the schedule's next fire time and "
        "starts once there is room, while the schedule's following fire time has not come.",
        (
            f"{FIRES_OVER_QUOTA}::test_a_fire_over_the_quota_waits_and_starts_once_an_execution_ends",
        ),
    ),
    Mutation(
        "schedule-fire-over-quota-missed-when-its-window-ends",
        _FIRING_PY,
        "    return unstarted[-1], unstarted[-1], False\n",
        "    return unstarted[0], unstarted[0], False\n",
        "A fire still over the quota when the schedule's following fire time passes is "
        "missed, counted where GET /schedules shows it.",
        (
            f"{FIRES_OVER_QUOTA}::test_a_fire_still_over_the_quota_when_the_next_one_comes_is_missed",
        ),
    ),
    Mutation(
        "rollout-children-held-to-open-executions",
        "orquestador/rollouts/store.py",
        "            if has_room is not None and not has_room(conn):\n",
        "            if False:\n",
        "A rollout starts no child while its organization holds its quota openExecutions.",
        (f"{ROLLOUT_LIMITS}::test_a_rollout_starts_no_child_beyond_the_quota_open_executions",),
    ),
    Mutation(
        "rollout-items-quota-when-the-step-starts",
        "orquestador/actions/builtin/rollout.py",
        "        if len(items) > limit:\n",
        "        if False:\n",
        "A rollout step over a list longer than its organization's quota rolloutItems fails "
        "before any child starts.",
        (f"{ROLLOUT_LIMITS}::test_a_list_over_the_organization_s_lower_quota_fails_the_step",),
    ),
    Mutation(
        "schedule-quota-checked-at-creation",
        "orquestador/automation/schedules.py",
        "    if current is None and max_schedules is not None:\n",
        "    if False:\n",
        "An organization never holds more schedules than its quota.",
        (f"{SCHEDULE_QUOTAS}::test_an_organization_holds_at_most_its_quota_of_schedules",),
    ),
    Mutation(
        "claim-refuses-a-revoked-credential",
        _COMMANDS_PY,
        "WHERE revoked_at IS NOT NULL OR org_id <> :org_id OR machine_id <> :machine_id\n",
        "WHERE false\n",
        "A poll open when its machine's credential is revoked is handed no command: the "
        "statement that marks it sent checks the credential.",
        (
            f"{CREDENTIALS}::test_the_claim_itself_refuses_a_credential_revoked_after_its_poll_began",
        ),
    ),
    Mutation(
        "revocation-ends-open-polls",
        _CREDENTIALS_PY,
        "    announce_revocation(conn, org_id=org_id, machine_id=machine_id)\n",
        "",
        "Revoking a machine's credentials ends its open polls at once.",
        (
            f"{CREDENTIALS}::test_revoking_ends_the_machine_s_open_poll_at_once_and_hands_it_nothing",
        ),
    ),
    Mutation(
        "claim-never-past-deliver-by",
        _COMMANDS_PY,
        "          AND c.deliver_by > moment.at\n",
        "",
        "No agent is handed a command past its deliver-by time.",
        (
            f"{EXPIRY}::test_a_command_past_its_deliver_by_time_is_never_handed_out",
            "tests/integration/test_agent_after_deadline.py",
        ),
    ),
    Mutation(
        "wait-deadline-expires-its-pending-command",
        _EXPIRY_PY,
        "        if row.deliver_by <= row.now or row.deadline <= row.now:\n",
        "        if row.deliver_by <= row.now:\n",
        "A wait whose deadline passed with its command pending expires it in the same "
        "transaction: the flow's error exit and every agent see the same thing.",
        (
            f"{EXPIRY}::test_a_wait_whose_deadline_passes_expires_its_pending_command_in_the"
            "_same_read",
        ),
    ),
    Mutation(
        "wait-never-revives-an-undelivered-command",
        _EXPIRY_PY,
        "        if row.deliver_by <= row.now or row.deadline <= row.now:\n",
        "        if row.deadline <= row.now:\n",
        "A wait never moves a deliver-by time that already passed: a command written long "
        "before its wait started stays undelivered.",
        (f"{EXPIRY}::test_a_wait_never_revives_a_command_whose_deliver_by_time_passed",),
    ),
    Mutation(
        "sweep-expires-only-commands-past-their-time",
        _EXPIRY_PY,
        "        WHERE status = '{CommandStatus.PENDING}' AND deliver_by <= clock_timestamp()\n",
        "        WHERE status = '{CommandStatus.PENDING}'\n",
        "The maintenance pass expires only pending commands whose deliver-by time passed.",
        (
            f"{EXPIRY}::test_the_maintenance_sweep_expires_only_undelivered_commands_past_"
            "their_time",
        ),
    ),
    Mutation(
        "agent-refuses-a-late-command",
        "orquestador/agent.py",
        "        if late < 0:\n",
        "        if True:\n",
        "The reference agent never starts a command past its deliver-by time, however late "
        "the answer or its own report of running.",
        (
            f"{AGENT_COMMANDS}::test_a_command_past_its_deliver_by_time_is_reported_expired_and"
            "_never_run",
            f"{AGENT_COMMANDS}::test_a_command_whose_time_runs_out_while_reporting_running_is"
            "_not_started",
        ),
    ),
    Mutation(
        "cancel-undone-only-if-no-agent-took-it",
        _MACHINE_CANCEL_PY,
        "      AND c.sent_at IS NULL\n",
        "",
        "A command an agent took (even one now final) is a write the cancel parks for: the "
        "machine may have done part of it.",
        (f"{MACHINE_CANCEL}::test_a_command_an_agent_took_parks_the_cancel_even_once_it_ended",),
    ),
    Mutation(
        "cancel-undone-only-its-own-commands",
        _MACHINE_CANCEL_PY,
        "    WHERE a.execution_id = :execution_id AND a.status = '{CheckpointStatus.SUCCEEDED}'\n",
        "    WHERE a.status = '{CheckpointStatus.SUCCEEDED}'\n",
        "Only the cancelled execution's own withdrawn command undoes its write.",
        (
            f"{MACHINE_CANCEL}::test_another_execution_s_withdrawn_command_does_not_undo_this"
            "_one_s_write",
        ),
    ),
    Mutation(
        "cancel-undone-only-the-withdrawn-write",
        _RECONCILIATION_PY,
        "succeeded=[a for a in writes.succeeded if a not in untaken]",
        "succeeded=[]",
        "A write besides the withdrawn command still parks the cancel.",
        (f"{MACHINE_CANCEL}::test_a_write_besides_the_withdrawn_command_still_parks_the_cancel",),
    ),
]

# --- queue/reconciliation.py: a retry's correction is written with the retry ------------

CORRECTION = "tests/integration/test_reconcile_correction.py"
_CORRECTED_RUN = (
    f"{CORRECTION}::test_the_retried_step_runs_with_the_corrected_data_and_the_audit_keeps"
    "_then_and_now"
)

CORRECTION_GUARDS = [
    Mutation(
        "correction-written-with-the-retry",
        _RECONCILIATION_PY,
        "        SET data = :data, revision = revision + 1, updated_at = clock_timestamp()\n",
        # The bound :data stays (text() refuses a bindparam it lacks); NOT NULL data wins.
        "        SET data = coalesce(data, :data), revision = revision + 1,"
        " updated_at = clock_timestamp()\n",
        "A retry's correction is written to the request in the retry's own transaction: the "
        "retried step runs with the corrected data.",
        (_CORRECTED_RUN,),
    ),
    Mutation(
        "correction-accepted-by-the-execution",
        _RECONCILIATION_PY,
        "    SET accepted_revision = corrected.revision, updated_at = clock_timestamp()\n",
        "    SET updated_at = clock_timestamp()\n",
        "The execution accepts the corrected revision with the correction, so the retried step "
        "runs instead of failing REQUEST_CHANGED.",
        (_CORRECTED_RUN,),
    ),
    Mutation(
        "correction-keeps-what-finished-steps-read",
        _RECONCILIATION_PY,
        "    _keep_what_finished_steps_read(execution, data, correction, checkpoints, in_doubt)\n",
        "",
        "A retry's correction never changes the input of a step that already succeeded: the "
        "retry does not park again CONTRACT_MISMATCH on a step nobody asked to run again.",
        (
            f"{CORRECTION}::test_a_correction_of_what_a_finished_step_read_is_refused_and_writes"
            "_nothing",
        ),
    ),
]

# --- queue/bulk.py: bulk actions act on each item once, under the normal rules ----------

_BULK_PY = "orquestador/queue/bulk.py"
BULK = "tests/integration/test_bulk_actions.py"
BULK_RACES = "tests/integration/test_bulk_races.py"

BULK_GUARDS = [
    Mutation(
        "bulk-items-skip-locked",
        _BULK_PY,
        "    LIMIT 1\n    FOR UPDATE SKIP LOCKED\n",
        "    LIMIT 1\n",
        "Two workers on one bulk never take the same item.",
        (f"{BULK_RACES}::test_two_workers_on_one_bulk_never_take_the_same_item",),
    ),
    Mutation(
        "bulk-takes-only-items-without-an-outcome",
        _BULK_PY,
        "    WHERE bulk_id = :bulk_id AND outcome IS NULL AND execution_id > :after\n",
        "    WHERE bulk_id = :bulk_id AND execution_id > :after\n",
        "An item with an outcome is never taken, so never acted on, again.",
        (f"{BULK}::test_a_bulk_cancel_runs_in_chunks_to_the_end_and_reports_what_it_did",),
    ),
    Mutation(
        "bulk-ends-only-when-no-item-is-left",
        _BULK_PY,
        "      AND NOT EXISTS (SELECT 1 FROM bulk_item WHERE bulk_id = :bulk_id"
        " AND outcome IS NULL)\n",
        "",
        "A bulk is DONE only once every item has its outcome.",
        (f"{BULK_RACES}::test_a_bulk_ends_only_once_every_item_has_its_outcome",),
    ),
    Mutation(
        "bulk-reports-a-cancel-the-write-rule-parked",
        _BULK_PY,
        "    if status == ExecutionStatus.RECONCILIATION_REQUIRED and cancelled is not None:\n",
        "    if False:\n",
        "A cancel the write rule turned into a park is reported with its code, not as done.",
        (f"{BULK}::test_a_bulk_cancel_runs_in_chunks_to_the_end_and_reports_what_it_did",),
    ),
    Mutation(
        "bulk-takes-the-caller-s-organization-only",
        "orquestador/api/access.py",
        "        conditions = [self._sees_execution(), execution.c.simulation.is_(false())]\n",
        "        conditions = [execution.c.simulation.is_(false())]\n",
        "A bulk's items are executions of the caller's organization only.",
        (f"{BULK}::test_a_preview_counts_and_samples_and_records_nothing",),
    ),
    Mutation(
        "bulk-never-takes-dry-runs",
        "orquestador/api/access.py",
        "        conditions = [self._sees_execution(), execution.c.simulation.is_(false())]\n",
        "        conditions = [self._sees_execution()]\n",
        "A bulk never acts on a dry run.",
        (f"{BULK}::test_a_preview_counts_and_samples_and_records_nothing",),
    ),
    Mutation(
        "bulk-progress-of-the-caller-s-organization",
        _BULK_PY,
        "    WHERE b.id = :bulk_id AND b.org_id = :org_id\n",
        "    WHERE b.id = :bulk_id\n",
        "Another organization's bulk is the same 404 as a missing one.",
        (f"{BULK}::test_a_bulk_is_read_only_within_its_organization",),
    ),
    Mutation(
        "bulk-action-needs-its-scope",
        "orquestador/api/bulk_routes.py",
        "    if not caller.has_scope(scope):\n",
        "    if False:\n",
        "Each action needs the scope the same action on one execution needs.",
        (f"{BULK}::test_an_action_needs_its_own_scope",),
    ),
]

# --- migration 0029: what stays written, whatever the runtime role's grants allow ---------

_LIMITS_SQL = "migrations/versions/0029_runtime_role_limits.py"
ROLE_ATTACKS = "tests/security/test_role_attacks.py"
_SUCCESS_STAYS = f"{ROLE_ATTACKS}::test_a_succeeded_checkpoint_keeps_its_status_and_output"

RUNTIME_ROLE_GUARDS = [
    Mutation(
        "success-output-stays",
        _LIMITS_SQL,
        "    IF NEW.output IS DISTINCT FROM OLD.output THEN\n",
        "    IF false THEN\n",
        "A SUCCEEDED checkpoint's output never changes, whatever the runtime role writes.",
        (f"{_SUCCESS_STAYS}[output = '{{\"charged\": 0}}']",),
    ),
    Mutation(
        "success-status-stays",
        _LIMITS_SQL,
        "    IF NEW.status <> 'SUCCEEDED' AND NOT (\n",
        "    IF false AND NOT (\n",
        "A SUCCEEDED checkpoint stays SUCCEEDED, so its step never runs again.",
        (f"{_SUCCESS_STAYS}[status = 'UNKNOWN']",),
    ),
    Mutation(
        "success-undone-only-by-a-mismatch-retry",
        _LIMITS_SQL,
        "              AND e.error_code = 'CONTRACT_MISMATCH'\n",
        "",
        "Only an operator's retry of a step parked for another contract undoes its success.",
        (
            f"{ROLE_ATTACKS}::"
            "test_only_a_retry_of_the_step_a_contract_mismatch_names_may_undo_its_success",
        ),
    ),
    Mutation(
        "success-undone-only-for-the-named-step",
        _LIMITS_SQL,
        "              AND e.error_detail ->> 'actionId' = NEW.action_id))\n",
        "))\n",
        "A contract mismatch undoes the success of the step it names, never another's.",
        (
            f"{ROLE_ATTACKS}::"
            "test_only_a_retry_of_the_step_a_contract_mismatch_names_may_undo_its_success",
        ),
    ),
    Mutation(
        "success-trigger-fires-on-succeeded-rows",
        _LIMITS_SQL,
        "        \"OLD.status = 'SUCCEEDED'\",\n",
        "        \"OLD.status = 'FAILED'\",\n",
        "The guard fires on every SUCCEEDED checkpoint.",
        (f"{_SUCCESS_STAYS}[status = 'UNKNOWN']",),
    ),
    Mutation(
        "credential-stays-revoked",
        _LIMITS_SQL,
        "    IF (NEW.revoked_at, NEW.revoked_by) IS DISTINCT FROM"
        " (OLD.revoked_at, OLD.revoked_by)\n",
        "    IF false\n",
        "A revoked machine credential stays revoked.",
        (
            "tests/integration/test_machine_credentials.py::"
            "test_the_runtime_role_cannot_take_a_revocation_back",
        ),
    ),
    Mutation(
        "link-stays-used",
        _LIMITS_SQL,
        "    IF NEW.used_at IS DISTINCT FROM OLD.used_at AND NOT",
        "    IF false AND NOT",
        "A used sign-in link stays used.",
        (
            "tests/integration/test_sign_in_links.py::"
            "test_the_runtime_role_cannot_make_a_used_link_usable_again",
        ),
    ),
    Mutation(
        "sign-out-stays",
        _LIMITS_SQL,
        "    IF OLD.expires_at >= clock_timestamp() AND NOT",
        "    IF false AND NOT",
        "A sign-out's record stays until its token expires.",
        (
            "tests/security/test_page_sign_out.py::"
            "test_the_runtime_role_cannot_delete_a_sign_out_before_its_token_expires",
        ),
    ),
]

# --- queue/continuations.py: a finish continues exactly once ---------------------------

_CONTINUATIONS_PY = "orquestador/queue/continuations.py"
CONTINUATIONS = "tests/integration/test_continuations.py"


def continued(name: str) -> str:
    return f"{CONTINUATIONS}::{name}"


CONTINUATION_GUARDS = [
    Mutation(
        "continuation-in-the-finish-transaction",
        _CONTINUATIONS_PY,
        "        finished = finish_in_transaction(conn, claim, finish)\n"
        "        continued = _continue(conn, claim, finish, continuation, finished.revision)\n",
        "        finished = finish_in_transaction(conn, claim, finish)\n"
        "    with conn.begin():\n"
        "        continued = _continue(conn, claim, finish, continuation, finished.revision)\n",
        "A finish and its continuation commit together or not at all: a worker that dies "
        "between them neither loses the continuation nor makes two.",
        (
            continued(
                "test_a_crash_before_the_finish_commits_keeps_neither_and_the_next_holder"
                "_continues_once"
            ),
        ),
    ),
    Mutation(
        "continuation-limit",
        _CONTINUATIONS_PY,
        "    parked = count > continuation.max_continuations\n",
        "    parked = False\n",
        "Past MAX_CONTINUATIONS in a row without a person, the next continuation waits for one.",
        (continued("test_past_the_limit_the_continuation_parks_until_a_person_lets_it_run"),),
    ),
    Mutation(
        "continuation-counts-the-chain",
        _CONTINUATIONS_PY,
        "    count = chain.continuations + 1\n",
        "    count = 1\n",
        "Continuations are counted along the chain, so a loop reaches the limit.",
        (continued("test_past_the_limit_the_continuation_parks_until_a_person_lets_it_run"),),
    ),
    Mutation(
        "continuation-as-the-person",
        _CONTINUATIONS_PY,
        "            actor=actor or WORKER_ACTOR,\n",
        "            actor=WORKER_ACTOR,\n",
        "A continuation is accepted as the person who started the run.",
        (
            continued(
                "test_a_finish_into_a_continuing_state_accepts_its_transition_as_the_same_person"
            ),
        ),
    ),
    Mutation(
        "continuation-leaves-its-state",
        _CONTINUATIONS_PY,
        "    if transition is None or not transition.leaves(state):\n",
        "    if transition is None:\n",
        "A continuation is accepted only for a transition that leaves the state reached.",
        (
            continued(
                "test_a_continuation_to_a_transition_that_does_not_leave_its_state_is_refused"
            ),
        ),
    ),
    Mutation(
        "continuation-once-per-finish",
        "migrations/versions/0030_continuations.py",
        '        ["continued_from"],\n        unique=True,\n',
        '        ["continued_from"],\n        unique=False,\n',
        "No finish is ever continued twice, whoever writes.",
        (continued("test_no_finish_is_continued_twice_whoever_writes"),),
    ),
    Mutation(
        "continuation-retry-counts-again",
        _RECONCILIATION_PY,
        "    SET continuations = CASE WHEN error_code = 'CONTINUATION_LIMIT' THEN 0\n",
        "    SET continuations = CASE WHEN false THEN 0\n",
        "A person's retry of a continuation parked at the limit lets the run go on another "
        "MAX_CONTINUATIONS.",
        (continued("test_past_the_limit_the_continuation_parks_until_a_person_lets_it_run"),),
    ),
    Mutation(
        "continuation-finish-into-its-state",
        "orquestador/worker/executor.py",
        "        continuing = flow.continuations.get(decided.to)\n",
        "        continuing = None\n",
        "A finish into a continuing state continues; none other does.",
        (
            continued(
                "test_a_finish_into_a_continuing_state_accepts_its_transition_as_the_same_person"
            ),
        ),
    ),
]

# --- a paused holder cannot send late (queue/earlier_calls.py, the adapters) -------------

_EARLIER_CALLS_PY = "orquestador/queue/earlier_calls.py"
_HTTP_ADAPTER_PY = "orquestador/integrations/http_adapter.py"
HTTP_ROUTES = "tests/integration/test_http_routes.py"
PAUSED_HOLDER = "tests/acceptance/test_paused_holder.py"
_PAUSED_LOOKUP = (
    f"{LOOKUP}::test_not_found_for_a_holder_that_may_only_be_paused_waits_until_its_call_cannot"
    "_send"
)

PAUSED_HOLDER_GUARDS = [
    Mutation(
        "earlier-call-not-found-waits",
        _STEP_OUTCOMES_PY,
        "            self.await_earlier_call(step, checkpoint)\n",
        "            pass\n",
        "A NotFound about an earlier holder's attempt is trusted only once that holder's "
        "call can no longer send: a paused holder's late write is found, not made twice.",
        (_PAUSED_LOOKUP, PAUSED_HOLDER),
    ),
    Mutation(
        "earlier-call-waits-out-the-grace",
        _STEP_OUTCOMES_PY,
        "settle_seconds=step.adapter.timeout_seconds + self.services.abandon_grace_seconds,",
        "settle_seconds=step.adapter.timeout_seconds,",
        "The new holder waits the attempt's timeout and ADAPTER_ABANDON_GRACE_SECONDS after "
        "its start (the clocks of two processes and the last check before the send differ).",
        (_PAUSED_LOOKUP,),
    ),
    Mutation(
        "earlier-call-wait-spends-no-attempt",
        _EARLIER_CALLS_PY,
        "            attempts = greatest(e.attempts - 1, 0),\n",
        "",
        "Waiting for an earlier holder's call spends no attempt: nothing was called.",
        (_PAUSED_LOOKUP,),
    ),
    Mutation(
        "http-deadline-checked-before-sending",
        _HTTP_ADAPTER_PY,
        '    ctx.check_deadline(f"the {what} of route {route.key}")\n    left = ',
        "    left = ",
        "An HTTP route sends nothing once its attempt's deadline passed, looked at "
        "immediately before the request leaves.",
        (f"{HTTP_ROUTES}::test_a_call_paused_past_its_deadline_on_its_way_out_is_not_sent",),
    ),
    Mutation(
        "http-request-deadline-sent",
        _HTTP_ADAPTER_PY,
        "    headers[REQUEST_DEADLINE] = ctx.deadline_text()\n",
        "",
        "Every HTTP route request carries its attempt's deadline, so a provider can refuse "
        "a request that arrives late.",
        (f"{HTTP_ROUTES}::test_the_attempts_deadline_goes_with_the_request",),
    ),
]

# --- rollouts/store.py and migration 0031 ---------------------------------------------

_ROLLOUT_STORE_PY = "orquestador/rollouts/store.py"
_ROLLOUTS_MIGRATION = "migrations/versions/0031_rollouts.py"
ROLLOUTS = "tests/integration/test_rollouts.py"


def rolled(name: str) -> str:
    return f"{ROLLOUTS}::{name}"


ROLLOUT_GUARDS = [
    Mutation(
        "rollout-failure-budget",
        _ROLLOUT_STORE_PY,
        "      AND r.failed <= r.max_failures\n",
        "",
        "No child starts once failures exceed the rollout's budget.",
        (
            rolled(
                "test_once_failures_exceed_the_budget_no_child_starts_and_the_step_fails"
                "_through_its_exit"
            ),
        ),
    ),
    Mutation(
        "rollout-batch",
        _ROLLOUT_STORE_PY,
        "      AND r.running < r.batch\n",
        "",
        "Never more than `batch` children of a rollout run at once.",
        (rolled("test_a_rollout_starts_one_child_per_item_never_more_than_the_batch_at_once"),),
    ),
    Mutation(
        "rollout-one-child-per-item",
        _ROLLOUTS_MIGRATION,
        'sa.PrimaryKeyConstraint("rollout_id", "item_index", name="pk_rollout_child")',
        'sa.PrimaryKeyConstraint("rollout_id", "item_index", "created_at",'
        ' name="pk_rollout_child")',
        "An item of a rollout never gets a second child, whoever writes.",
        (rolled("test_an_item_never_gets_a_second_child_even_if_the_rollout_s_place_goes_back"),),
    ),
    Mutation(
        "rollout-end-counts-failures",
        _ROLLOUTS_MIGRATION,
        "        failed = failed + (v_now = 'failed')::int - (v_was = 'failed')::int,\n",
        "",
        "A child's failure counts against its rollout's budget in the child's own ending "
        "transaction.",
        (
            rolled(
                "test_once_failures_exceed_the_budget_no_child_starts_and_the_step_fails"
                "_through_its_exit"
            ),
        ),
    ),
    Mutation(
        "rollout-end-wakes-the-parent",
        _ROLLOUTS_MIGRATION,
        "    SET next_attempt_at = clock_timestamp(), updated_at = clock_timestamp()\n"
        "    WHERE id = NEW.parent_execution_id",
        "    SET updated_at = clock_timestamp()\n    WHERE id = NEW.parent_execution_id",
        "A child's end makes its waiting parent due at once.",
        (rolled("test_a_child_s_end_wakes_the_waiting_parent_at_once"),),
    ),
    Mutation(
        "rollout-child-in-the-taking-transaction",
        _ROLLOUT_STORE_PY,
        "            _start_child(conn, rollout, taken, flow_row, definition, max_attempts)\n",
        "            pass\n"
        "        with engine.begin() as conn:\n"
        "            _start_child(conn, rollout, taken, flow_row, definition, max_attempts)\n",
        "An item is taken and its child written in one transaction: a worker killed between "
        "the two neither loses the item nor starts it twice.",
        ("tests/acceptance/test_rollout_crash.py",),
    ),
    Mutation(
        "rollout-pause-stops-starts",
        _ROLLOUT_STORE_PY,
        "      AND r.paused_at IS NULL AND r.cancelled_at IS NULL\n",
        "      AND r.cancelled_at IS NULL\n",
        "No child of a paused rollout starts until it resumes.",
        (
            "tests/integration/test_rollout_control.py::test_a_paused_rollout_starts_no_child"
            "_until_it_resumes",
        ),
    ),
    Mutation(
        "rollout-cancel-stops-starts",
        _ROLLOUT_STORE_PY,
        "      AND r.paused_at IS NULL AND r.cancelled_at IS NULL\n",
        "      AND r.paused_at IS NULL\n",
        "No child of a cancelled rollout starts.",
        (
            "tests/integration/test_rollout_control.py::test_a_cancel_starts_no_new_child_and"
            "_cancels_the_running_ones",
        ),
    ),
    Mutation(
        "park-first-round-looks-at-the-rollout",
        _WAITS_PY,
        "WHERE r.id = :rollout_id AND r.changed_at > :claimed_at\n",
        "WHERE false AND r.id = :rollout_id AND r.changed_at > :claimed_at\n",
        "A child ending between a rollout's first round's read and its park (no wait key on "
        "the row yet, so no wake marks it) makes the park due at once.",
        (
            rolled(
                "test_a_child_ending_between_a_first_round_s_read_and_its_park_makes_it_due_at_once"
            ),
        ),
    ),
]

# --- a bulk item acts on the episode it matched (queue/bulk.py, queue/reconciliation.py) --

_BULK_RACES = "tests/integration/test_bulk_races.py"
_STALE_BULK_ITEM = (
    f"{_BULK_RACES}::test_a_bulk_retry_refuses_an_execution_that_parked_again_after_another"
    "_decision"
)

BULK_ITEM_GUARDS = [
    Mutation(
        "bulk-decision-only-on-the-episode-it-matched",
        _RECONCILIATION_PY,
        "    if seen is not None and execution.updated_at != seen:\n",
        "    if False:\n",
        "A bulk retry or fail never decides about an execution that changed after the bulk "
        "was accepted (another decision, a new park): STALE_ITEM.",
        (_STALE_BULK_ITEM,),
    ),
    Mutation(
        "bulk-item-carries-what-it-saw",
        _BULK_PY,
        "                    seen_updated_at=seen_updated_at,\n",
        "",
        "Each bulk decision carries the execution as the bulk found it.",
        (_STALE_BULK_ITEM,),
    ),
]

# --- a correction cannot move a concurrency key (queue/reconciliation.py) ---------------

CORRECTION_KEY_GUARDS = [
    Mutation(
        "correction-keeps-the-concurrency-key",
        _RECONCILIATION_PY,
        "    _keep_the_key(execution, data, correction)\n",
        "",
        "A retry's correction never changes the value of the key the execution holds: no "
        "two executions run on one machine over the key's limit.",
        (f"{KEYS}::test_a_correction_cannot_move_an_execution_to_a_machine_another_holds",),
    ),
    Mutation(
        "correction-compares-the-held-key",
        _RECONCILIATION_PY,
        "    if corrected == execution.concurrency_key:\n        return\n",
        "    if corrected is not None:\n        return\n",
        "A correction is judged against the key the execution holds, not merely for having one.",
        (f"{KEYS}::test_a_correction_cannot_move_an_execution_to_a_machine_another_holds",),
    ),
]

# --- an approval decision locks what it decides about (approvals/store.py) --------------

_APPROVAL_RACE = (
    f"{APPROVALS}::test_a_decision_racing_an_uncommitted_cancel_waits_for_it_and_is_refused"
    "_in_words"
)

APPROVAL_LOCK_GUARDS = [
    Mutation(
        "approval-decision-locks-the-execution",
        _APPROVALS_PY,
        '    conn.execute(_LOCK_EXECUTION, {"execution_id": row.execution_id})\n',
        "",
        "A decision reads its execution's status under the execution's row lock: a decision "
        "racing a park or a cancel is never recorded for an execution that no longer waits.",
        (
            f"{APPROVALS}::test_a_decision_racing_a_park_that_holds_only_the_execution_waits"
            "_and_is_refused",
        ),
    ),
    Mutation(
        "approval-closed-says-why",
        _APPROVALS_PY,
        '    ended = _EXECUTION_ENDED.get(found.execution_status, "its execution has ended")\n',
        '    ended = "it is closed"\n',
        "A refused decision says in words why: decided by whom, the deadline, or the "
        "execution's end.",
        (_APPROVAL_RACE,),
    ),
]

# --- keys and rate limits the review removed by hand (claims, migration 0015, buckets) ---

KEY_PLACE_GUARDS = [
    Mutation(
        "key-holder-keeps-its-place",
        _CLAIMS_PY,
        "               c.concurrency_key IS NULL OR c.started_at IS NOT NULL\n",
        "               c.concurrency_key IS NULL\n",
        "An execution that holds its key (a retry, a wait's next round, a requeue) runs "
        "again without asking the key for room it already has.",
        (f"{KEYS}::test_a_holder_due_again_runs_without_asking_the_full_key_for_room",),
    ),
    Mutation(
        "key-parked-holder-holds",
        _KEYS_SQL,
        "'WAITING', 'RECONCILIATION_REQUIRED')\"",
        "'WAITING')\"",
        "An execution parked for a person still holds its key: the machine may be mid-change.",
        (f"{KEYS}::test_a_parked_holder_keeps_a_newcomer_of_its_key_out",),
    ),
    Mutation(
        "rate-refill-clock-never-goes-back",
        _RATES_PY,
        "        refilled_at = greatest(b.refilled_at, now())\n",
        "        refilled_at = now()\n",
        "A taker whose transaction began earlier never moves the bucket's clock back, so no "
        "time is counted twice towards new tokens.",
        (f"{RATES}::test_a_taker_whose_statement_began_earlier_never_moves_the_refill_clock_back",),
    ),
    Mutation(
        "rate-wait-gives-back-what-the-claim-took",
        _STEP_RUNNER_PY,
        "        counted = self.claim.counted_attempt\n",
        "        counted = False\n",
        "A rate limit's wait gives back exactly the attempt its claim took, as the claimed "
        "row said, whatever the loaded checkpoints say.",
        (f"{RATES}::test_a_token_wait_gives_back_exactly_the_attempt_the_claim_took",),
    ),
    Mutation(
        "key-newcomer-waits-behind-the-blocked",
        _CLAIMS_PY,
        "          AND EXISTS (\n              SELECT FROM execution b\n",
        "          AND false AND EXISTS (\n              SELECT FROM execution b\n",
        "A new execution never takes a freed place under its key ahead of an older blocked "
        "one: oldest first.",
        (f"{KEYS}::test_a_new_execution_never_takes_a_freed_place_ahead_of_an_older_blocked_one",),
    ),
]

# --- what operators read: a cancel's preview, the ends counted, gauges of the leader ----

OPERATOR_SEAM_GUARDS = [
    Mutation(
        "bulk-preview-parks-only-the-executions-with-a-write",
        _BULK_PY,
        "    return exists().where(\n        step.c.execution_id == execution_id,\n",
        "    return exists().where(\n        step.c.execution_id != execution_id,\n",
        "A cancel's preview warns of exactly the executions a cancel would park.",
        (f"{BULK}::test_a_bulk_cancel_runs_in_chunks_to_the_end_and_reports_what_it_did",),
    ),
    Mutation(
        "executions-finished-counts-only-final-statuses",
        "orquestador/metrics.py",
        "    if status in FINAL_STATUSES:\n",
        "    if True:\n",
        "An execution is counted as ended once, by its final status, never by a move.",
        ("tests/integration/test_engine_metrics.py",),
    ),
    Mutation(
        "queue-gauges-sampled-by-the-leader-only",
        "orquestador/worker/maintenance.py",
        "            if not self._was_leader:\n                return False\n",
        "",
        "Only the maintenance leader sets the queue gauges, so the fleet exposes one value.",
        (
            "tests/integration/test_maintenance.py::"
            "test_the_leader_s_queue_gauges_follow_the_queue_between_passes",
        ),
    ),
]

# --- the list -------------------------------------------------------------------------

# --- a cancel asked of a RUNNING execution: applied by its holder, after the call -------

CANCEL_RUNNING = "tests/integration/test_cancel_running.py"
_CANCEL_REQUESTS_PY = "orquestador/queue/cancel_requests.py"


def running(name: str) -> str:
    return f"{CANCEL_RUNNING}::{name}"


CANCEL_REQUEST_GUARDS = [
    Mutation(
        "batch-refuses-the-next-step-after-a-cancel-request",
        "migrations/versions/0034_cancel_requested.py",
        '_NOT_CANCELLED = " AND NOT (i.execution_id = ANY (v_cancel))"',
        '_NOT_CANCELLED = ""',
        "A worker whose step's call returns after a cancel was requested starts no next step "
        "and does not finish: it applies the cancel.",
        (
            running(
                "test_a_read_in_flight_ends_cancelled_when_its_call_returns_and_nothing_after_runs"
            ),
            running(
                "test_a_write_done_in_flight_parks_cancelled_after_writes_with_the_write_listed"
            ),
        ),
    ),
    Mutation(
        "requested-cancel-applied-under-the-fence",
        _CANCEL_REQUESTS_PY,
        "    WHERE {FENCE} AND e.cancel_requested_at IS NOT NULL\n",
        "    WHERE e.id = :execution_id AND e.cancel_requested_at IS NOT NULL\n",
        "Only the holder of the lease applies a requested cancel; a stale holder applies nothing.",
        (running("test_a_stale_holder_cannot_apply_a_requested_cancel_and_the_next_holder_does"),),
    ),
    Mutation(
        "requested-cancel-parks-after-a-write-done",
        _CANCEL_REQUESTS_PY,
        "        if writes.succeeded or writes.in_doubt:\n",
        "        if writes.in_doubt:\n",
        "A requested cancel applied after a write succeeded parks CANCELLED_AFTER_WRITES.",
        (
            running(
                "test_a_write_done_in_flight_parks_cancelled_after_writes_with_the_write_listed"
            ),
        ),
    ),
    Mutation(
        "requested-cancel-parks-on-a-write-in-doubt",
        _CANCEL_REQUESTS_PY,
        "        if writes.succeeded or writes.in_doubt:\n",
        "        if writes.succeeded:\n",
        "A requested cancel applied while a write is in doubt parks; the request stays busy.",
        (
            running(
                "test_a_cancel_found_by_the_next_holder_parks_when_the_dead_holders_write_is_in_doubt"
            ),
        ),
    ),
    Mutation(
        "worker-reads-the-cancel-request-when-it-loads",
        "orquestador/worker/executor.py",
        "        if loaded.cancel_requested:\n",
        "        if False:\n",
        "A holder that loads an execution with a cancel requested applies it before calling "
        "anything (a look-up of a dead holder's write included).",
        (
            running(
                "test_a_cancel_found_by_the_next_holder_parks_when_the_dead_holders_write_is_in_doubt"
            ),
        ),
    ),
    Mutation(
        "a-wait-with-a-cancel-requested-is-due-at-once",
        "orquestador/queue/waits.py",
        "            WHEN e.cancel_requested_at IS NOT NULL THEN clock_timestamp()\n",
        "",
        "A wait's round that returns after a cancel was requested is due again at once, so "
        "the cancel is applied without waiting out the wait.",
        (running("test_a_wait_being_checked_again_honours_a_cancel_asked_during_the_check"),),
    ),
    Mutation(
        "a-retry-with-a-cancel-requested-is-due-at-once",
        "orquestador/queue/outcomes.py",
        "        next_attempt_at = CASE WHEN e.cancel_requested_at IS NOT NULL THEN",
        "        next_attempt_at = CASE WHEN false THEN",
        "A call that ends in a retry after a cancel was requested is due again at once, so the "
        "cancel is applied without waiting out the backoff.",
        (running("test_a_call_that_ends_in_a_retry_is_due_at_once_and_the_next_claim_cancels_it"),),
    ),
    Mutation(
        "a-continuing-finish-refuses-a-requested-cancel",
        "orquestador/queue/outcomes.py",
        "    if execution.cancel_requested_at is not None:\n",
        "    if False:\n",
        "A finish that would continue into another transition is not written once a cancel "
        "was requested: the holder applies the cancel, and nothing continues.",
        (
            running(
                "test_a_cancel_asked_before_a_finish_that_continues_ends_it_and_continues_nothing"
            ),
        ),
    ),
    Mutation(
        "the-view-says-cancel-requested-only-while-live",
        "orquestador/api/views.py",
        "    if requested_at is None or row.status not in UNFINISHED:\n",
        "    if requested_at is None:\n",
        "An execution the requested cancel ended no longer says a cancel is requested.",
        (
            running(
                "test_a_read_in_flight_ends_cancelled_when_its_call_returns_and_nothing_after_runs"
            ),
        ),
    ),
    Mutation(
        "no-approval-decided-once-a-cancel-is-requested",
        "orquestador/approvals/store.py",
        "                    AND e.cancel_requested_at IS NULL)",
        ")",
        "An approval is not decided once a cancel of its execution was requested: the "
        "execution is ending, and the person is told so.",
        (
            "tests/integration/test_approvals.py::"
            "test_an_approval_whose_execution_has_a_cancel_requested_is_not_decided",
        ),
    ),
    Mutation(
        "a-token-wait-with-a-cancel-requested-is-due-at-once",
        "orquestador/queue/rate_limits.py",
        "            next_attempt_at = CASE WHEN e.cancel_requested_at IS NOT NULL THEN",
        "            next_attempt_at = CASE WHEN false THEN",
        "A rate limit's wait that begins after a cancel was requested is due at once, so the "
        "cancel is applied without waiting for the next token.",
        (
            "tests/integration/test_rate_limits.py::"
            "test_a_token_wait_with_a_cancel_requested_is_due_at_once_and_the_next_holder_cancels",
        ),
    ),
    Mutation(
        "an-operator-retry-clears-the-cancel-request",
        _RECONCILIATION_PY,
        "        max_attempts = attempts + :claims_budget, cancel_requested_at = NULL,\n",
        "        max_attempts = attempts + :claims_budget,\n",
        "An operator's retry of a park a cancel led to lets the execution run again.",
        (running("test_an_operator_retry_of_a_cancel_park_clears_the_request"),),
    ),
]

# --- a RUNNING checkpoint only where the write rule needs it (SPEC 28) -----------------

LEAN = "tests/integration/test_lean_steps.py"
_MIGRATION_0036 = "migrations/versions/0036_lean_steps.py"


def lean(name: str) -> str:
    return f"{LEAN}::{name}"


LEAN_GUARDS = [
    Mutation(
        "lean-same-external-key",
        _STEP_RUNNER_PY,
        '    return f"{execution_id}:{action_id}"',
        '    return f"{execution_id}:{action_id}:{uuid.uuid4()}"',
        "An idempotent step re-run after a crash uses the same external key.",
        (lean("test_an_idempotent_step_rerun_after_a_crash_uses_the_same_external_key"),),
    ),
    Mutation(
        "lean-never-non-idempotent",
        _STEP_RUNNER_PY,
        "    if step.simulated or step.risk is Effect.NON_IDEMPOTENT_WRITE or riding:\n",
        "    if step.simulated or riding:\n",
        "A non-idempotent write never runs without its RUNNING checkpoint.",
        (lean("test_a_non_idempotent_write_never_runs_without_its_running_checkpoint"),),
    ),
    Mutation(
        "lean-only-with-nothing-held-back",
        _STEP_RUNNER_PY,
        "    if step.simulated or step.risk is Effect.NON_IDEMPOTENT_WRITE or riding:\n",
        "    if step.simulated or step.risk is Effect.NON_IDEMPOTENT_WRITE:\n",
        "A safe step runs without a RUNNING checkpoint only when no success is held back, so "
        "a crash leaves at most the first step without a success unrecorded, and a held-back "
        "success is written, dated, before any later step begins.",
        (
            lean("test_a_write_after_a_held_back_success_keeps_its_running_checkpoint"),
            lean("test_a_read_after_a_held_back_success_writes_it_with_its_running_first"),
        ),
    ),
    Mutation(
        "lean-recall-the-interrupted-attempt",
        _EXECUTOR_PY,
        "        if claim.reclaimed:\n",
        "        if False:\n",
        "The holder that takes a crashed execution over recalls the step it was in, so the "
        "write rule counts an interrupted idempotent write in doubt.",
        (lean("test_an_interrupted_idempotent_write_out_of_attempts_stays_in_doubt"),),
    ),
    Mutation(
        "lean-recall-numbers-the-attempt",
        _STEP_RUNNER_PY,
        "                number = checkpoint.attempt if waiting else checkpoint.attempt + 1\n",
        "                number = checkpoint.attempt\n",
        "A recalled attempt after an ended one takes the next number, never an ended one's.",
        (lean("test_a_read_cut_short_after_a_retry_is_recalled_as_the_next_attempt"),),
    ),
    Mutation(
        "claim-records-the-interrupted-attempt",
        _CLAIMS_PY,
        "        WHERE c.reclaimed\n",
        "        WHERE false\n",
        "The claim that takes a RUNNING row over records the attempt its holder never ended.",
        (lean("test_an_idempotent_step_rerun_after_a_crash_uses_the_same_external_key"),),
    ),
    Mutation(
        "lean-success-never-over-another-key",
        _MIGRATION_0036,
        "            WHERE a.status <> 'SUCCEEDED'\n"
        "              AND a.external_key = EXCLUDED.external_key\n",
        "            WHERE true\n",
        "A safe step's whole attempt never replaces a success or another key's checkpoint.",
        (
            "tests/integration/test_write_rule.py::test_a_checkpoint_written_behind_the_runs_back_is_parked_not_raised",
        ),
    ),
    Mutation(
        "lean-cancel-learned-from-a-payment",
        _STEP_RUNNER_PY,
        "                    claim, action_id, output, observed, asks_cancel=True\n",
        "                    claim, action_id, output, observed, asks_cancel=False\n",
        "After a non-idempotent write's success, a cancel requested during its call stops the "
        "run before the next step, which may write nothing before its call.",
        (running("test_an_operator_retry_of_a_cancel_park_clears_the_request"),),
    ),
]

MUTATIONS: list[Mutation] = [
    *FENCING_GUARDS,
    *LEASE_GUARDS,
    *LOADING_GUARDS,
    *CLAIM_GUARDS,
    *KEY_GUARDS,
    *RATE_GUARDS,
    *APPROVAL_GUARDS,
    *SCHEDULE_GUARDS,
    *CHECKPOINT_GUARDS,
    *OUTCOME_GUARDS,
    *LOAD_GUARDS,
    *WAIT_GUARDS,
    *WORKER_LEASE_GUARDS,
    *BATCH_GUARDS,
    *TIMEOUT_GUARDS,
    *EXECUTOR_GUARDS,
    *CANCEL_GUARDS,
    *EXPIRY_GUARDS,
    *CORRECTION_GUARDS,
    *BULK_GUARDS,
    *RUNTIME_ROLE_GUARDS,
    *CONTINUATION_GUARDS,
    *PAUSED_HOLDER_GUARDS,
    *ROLLOUT_GUARDS,
    *BULK_ITEM_GUARDS,
    *CORRECTION_KEY_GUARDS,
    *APPROVAL_LOCK_GUARDS,
    *KEY_PLACE_GUARDS,
    *OPERATOR_SEAM_GUARDS,
    *CANCEL_REQUEST_GUARDS,
    *LEAN_GUARDS,
]

# The script's own proof, run before the list and in this order: a change to nothing but
# a comment must SURVIVE the union of every test the run names (so the tests pass
# unmutated in the scratch copy, and a KILLED below means the mutation, not the copy;
# `tests=()` means that union); then a fatal change to the product's Python and one to a
# migration must be KILLED (so the copy's code and migrations are the ones tested, not
# the editable install's).
CONTROLS: list[Mutation] = [
    Mutation(
        "control-no-op",
        _FENCING_PY,
        "# Every write a holder makes carries this predicate.",
        "# Every write a holder makes carries this predicate (a comment changed, nothing else).",
        "Control: changing a comment changes nothing; every test the run names passes.",
        (),
        expect="SURVIVED",
        timeout_seconds=3600.0,
    ),
    Mutation(
        "control-fatal-python",
        _CLAIMS_PY,
        "    if limit <= 0:\n        return ClaimRound([])",
        "    if limit <= 1_000_000_000:\n        return ClaimRound([])",
        "Control: a claim that never takes anything fails the claim tests.",
        (f"{CLAIMS}::test_claim_sets_lease_token_and_attempts_from_database_time",),
    ),
    Mutation(
        "control-fatal-migration",
        "migrations/versions/0001_base_schema.py",
        'sa.Column("fencing_token", sa.BigInteger, nullable=False, server_default=sa.text("0")),',
        'sa.Column("fencing_token", sa.BigInteger, nullable=False, server_default=sa.text("7")),',
        "Control: a first claim's token is 1 only if the scratch copy's migrations built "
        "the test database.",
        (f"{CLAIMS}::test_claim_sets_lease_token_and_attempts_from_database_time",),
    ),
]
