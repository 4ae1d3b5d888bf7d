"""Claiming due executions: one statement that locks, skips what others hold, and leases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, text

from orquestador.db.schema import JSONB_VALUE
from orquestador.db.sql_literals import quoted
from orquestador.domain.statuses import UNHELD, ExecutionStatus
from orquestador.queue.fencing import WORKER_ACTOR, Claim
from orquestador.queue.prepared import run_alone
from orquestador.queue.snapshots import LoadedExecution

# The claim's index condition (ix_execution_ready): work that may be claimed once it is
# due. A PENDING execution whose key was full (key_blocked) is out until a holder ends.
# The audit row of an attempt whose holder stopped without ending it (its worker died,
# hung or lost its lease), written by the claim that takes the execution over.
ATTEMPT_INTERRUPTED = "ATTEMPT_INTERRUPTED"

# The worker as the actor of that row, spelt without a colon: the benchmarks run this
# statement's text through pgbench and their own binders, which take `:name` anywhere.
_ACTOR = "E'" + WORKER_ACTOR.replace(":", "\\x3a") + "'"

_READY = f"{{e}}status IN ({quoted(UNHELD)}) AND NOT {{e}}key_blocked"
# ... and due: what the ranking reads and the lock takes.
_DUE = _READY.format(e="e.") + " AND e.next_attempt_at <= now()"

# One statement, four steps:
#
# 1. abandoned: RUNNING rows whose holder let the lease lapse (crashed, hung or
#    partitioned), first: each keeps its request busy, and it was due before anything else.
#    Taking them bumps the token, which fences the old holder out for good.
# 2. ranked: the due work of every organization that has some, found with one probe per
#    organization (a loose index scan) and one per priority (0-9) within it, so the cost
#    follows how many organizations wait, not how much each has waiting. Within an
#    organization, higher priority first, then oldest due. Across organizations the free
#    slots are shared: an organization's k-th execution ranks by (its RUNNING executions
#    + k) / its weight (ORG_WEIGHTS, default 1), so a slot goes to whoever holds the
#    fewest for their weight, and a backlog never queues another organization behind it.
#    Nothing is locked yet.
# 3. chosen: each organization's share of the free slots (its quota among the best
#    ranked), taken by the same probes again, now locked with SKIP LOCKED: concurrent
#    claimers split the rows instead of queueing on each other (a row another claimer
#    took is passed over for the organization's next one), and the statement locks no
#    more rows than it takes.
# 4. keys: a first claim of an execution with a concurrency key needs room under its
#    key. orquestador_key_room (migration 0015) counts each key's holders under the key's
#    advisory lock, so two claims never both take the last place; the rest of a full key
#    are marked key_blocked and leave the index. The same call takes the keys holders
#    let go of since (key_release) and lets their oldest blocked executions back. A first
#    claim with an older execution of its key blocked is blocked behind it, whatever the
#    room: a newcomer never takes a freed place ahead of those already waiting.
#
# now() (this transaction's start) serves the index conditions; the claim is the
# transaction's first statement, so it differs from clock_timestamp() by microseconds and
# only ever in the conservative direction. Ids go through arrays (ANY (ARRAY(...))): a
# cached generic plan cannot know how few rows a step holds and would hash-join it with
# a scan of the whole table.
_CLAIM = text(
    f"""
    WITH RECURSIVE abandoned AS (
        SELECT id
        FROM execution
        WHERE status = '{ExecutionStatus.RUNNING}' AND lease_expires_at <= now()
        ORDER BY next_attempt_at, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), free AS (
        SELECT :limit - count(*) AS slots FROM abandoned
    ), organizations AS (
        (SELECT org_id FROM execution WHERE {_READY.format(e="")} ORDER BY org_id LIMIT 1)
        UNION ALL
        SELECT (SELECT e.org_id FROM execution e
                WHERE {_READY.format(e="e.")} AND e.org_id > o.org_id
                ORDER BY e.org_id LIMIT 1)
        FROM organizations o
        WHERE o.org_id IS NOT NULL
    ), ranked AS (
        SELECT c.id, o.org_id, c.next_attempt_at,
               (running.n + row_number() OVER (
                    PARTITION BY o.org_id ORDER BY c.priority DESC, c.next_attempt_at, c.id
                ))::float8 / coalesce((CAST(:weights AS jsonb) ->> o.org_id)::float8, 1) AS share
        FROM organizations o
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM execution r
            WHERE r.status = '{ExecutionStatus.RUNNING}' AND r.org_id = o.org_id
        ) running
        CROSS JOIN LATERAL (
            SELECT d.*
            FROM generate_series(9, 0, -1) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT e.id, e.priority, e.next_attempt_at
                FROM execution e
                WHERE e.org_id = o.org_id AND e.priority = p.priority
                  AND {_DUE}
                ORDER BY e.next_attempt_at, e.id
                LIMIT (SELECT slots FROM free)
            ) d
            LIMIT (SELECT slots FROM free)
        ) c
        WHERE o.org_id IS NOT NULL
    ), quotas AS (
        SELECT org_id, count(*) AS quota
        FROM (SELECT org_id FROM ranked
              ORDER BY share, next_attempt_at, id
              LIMIT (SELECT slots FROM free)) top
        GROUP BY org_id
    ), chosen AS (
        SELECT c.*
        FROM quotas q
        CROSS JOIN LATERAL (
            SELECT d.*
            FROM generate_series(9, 0, -1) AS p(priority)
            CROSS JOIN LATERAL (
                SELECT e.id, e.org_id, e.priority, e.next_attempt_at, e.concurrency_key,
                       e.concurrency_limit, e.started_at, e.created_at, e.status
                FROM execution e
                WHERE e.org_id = q.org_id AND e.priority = p.priority
                  AND {_DUE}
                ORDER BY e.next_attempt_at, e.id
                LIMIT q.quota
                FOR UPDATE SKIP LOCKED
            ) d
            LIMIT q.quota
        ) c
    ), behind AS (
        -- A first claim behind an execution of its key that waits blocked (out of this
        -- index, so not among the chosen) waits its turn too: oldest first under a key,
        -- in the order blocked ones are let back (priority, then age).
        SELECT c.id
        FROM chosen c
        WHERE c.concurrency_key IS NOT NULL AND c.started_at IS NULL
          AND EXISTS (
              SELECT FROM execution b
              WHERE b.org_id = c.org_id AND b.concurrency_key = c.concurrency_key
                AND b.key_blocked AND b.status = '{ExecutionStatus.PENDING}'
                AND (b.priority > c.priority
                     OR (b.priority = c.priority AND (b.created_at, b.id) < (c.created_at, c.id))))
    ), wanted AS (
        SELECT org_id, concurrency_key, min(concurrency_limit) AS lim, count(*) AS want
        FROM chosen
        WHERE concurrency_key IS NOT NULL AND started_at IS NULL
          AND id <> ALL (ARRAY(SELECT id FROM behind))
        GROUP BY org_id, concurrency_key
    ), released AS (
        DELETE FROM key_release
        WHERE id = ANY (ARRAY(
            SELECT id FROM key_release ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
        ))
        RETURNING org_id, concurrency_key
    ), keys AS (
        SELECT org_id, concurrency_key, max(lim)::integer AS lim, sum(want)::integer AS want
        FROM (SELECT org_id, concurrency_key, lim, want FROM wanted
              UNION ALL
              SELECT org_id, concurrency_key, NULL, 0 FROM released) k
        GROUP BY org_id, concurrency_key
    ), room AS (
        SELECT * FROM orquestador_key_room(
            ARRAY(SELECT org_id FROM keys ORDER BY org_id, concurrency_key),
            ARRAY(SELECT concurrency_key FROM keys ORDER BY org_id, concurrency_key),
            ARRAY(SELECT lim FROM keys ORDER BY org_id, concurrency_key),
            ARRAY(SELECT want FROM keys ORDER BY org_id, concurrency_key))
    ), decided AS (
        -- A holder already (a retry, a wait's next round, a requeued execution) keeps
        -- its place; a first claim runs if its rank under its key is within the room.
        SELECT c.id,
               c.concurrency_key IS NULL OR c.started_at IS NOT NULL
               OR (bh.id IS NULL AND row_number() OVER (
                    PARTITION BY c.org_id, c.concurrency_key, c.started_at IS NULL, bh.id IS NULL
                    ORDER BY c.priority DESC, c.next_attempt_at, c.id
               ) <= k.room) AS runs
        FROM chosen c
        LEFT JOIN room k ON k.org_id = c.org_id AND k.concurrency_key = c.concurrency_key
        LEFT JOIN behind bh ON bh.id = c.id
    ), blocked AS (
        UPDATE execution SET key_blocked = true
        WHERE id = ANY (ARRAY(SELECT id FROM decided WHERE NOT runs))
        RETURNING id
    ), claimed AS (
    UPDATE execution AS e
    SET status = '{ExecutionStatus.RUNNING}',
        -- A wait's next round is the same attempt going on: it spends none. (A holder
        -- that dies during the round leaves it RUNNING; that reclaim counts.) wait_key
        -- stays while the round runs, so a wake that lands meanwhile is not lost.
        attempts = e.attempts + CASE WHEN e.status = '{ExecutionStatus.WAITING}' THEN 0 ELSE 1 END,
        fencing_token = e.fencing_token + 1,
        lease_owner = :owner,
        lease_expires_at = clock_timestamp() + make_interval(secs => :lease_seconds),
        started_at = coalesce(e.started_at, clock_timestamp()),
        updated_at = clock_timestamp()
    FROM request AS r, flow AS f
    WHERE e.id = ANY (ARRAY(SELECT id FROM abandoned
                            UNION ALL SELECT id FROM decided WHERE runs))
      AND r.id = e.request_id AND f.id = e.flow_id
    RETURNING e.id, e.fencing_token, e.attempts, e.max_attempts, e.request_id,
              -- Whether this claim spent an attempt: what a rate limit's wait gives back.
              e.id <> ALL (ARRAY(SELECT id FROM chosen WHERE status = '{ExecutionStatus.WAITING}'))
                  AS counted_attempt,
              e.lease_expires_at, e.next_attempt_at, e.created_at,
              clock_timestamp() AS claimed_at, e.trace_parent,
              -- What the load reads, used only for a first holder (see _snapshot).
              e.org_id, e.flow_id, e.transition_id, e.accepted_state, e.accepted_revision,
              e.simulation, e.actor_snapshot ->> 'sub' AS actor,
              r.state AS request_state, r.revision AS request_revision,
              r.flow_id AS request_flow_id, r.busy_execution_id, r.owner_id, r.data,
              f.version AS flow_version, f.definition, f.data_schema,
              -- Taken over from a holder whose lease ran out (abandoned above).
              e.id = ANY (ARRAY(SELECT id FROM abandoned)) AS reclaimed
    ), interrupted AS (
        -- The attempt the abandoned holder never ended, on the execution's record: a
        -- safe step writes no checkpoint before its call, so a crash during one leaves
        -- no row of its own (SPEC 28). Its number is the one its claim counted.
        INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
        SELECT c.org_id, '{ATTEMPT_INTERRUPTED}', c.request_id, c.id, {_ACTOR},
               jsonb_build_object('attempt', c.attempts - 1, 'token', c.fencing_token - 1)
        FROM claimed c
        WHERE c.reclaimed
    )
    -- One row at least, so that a claim that only blocked or woke says so. Reading
    -- room here makes it run whatever the rest needs of it: a claim with no candidate
    -- still lets the executions blocked on a released key back.
    SELECT claimed.*, (SELECT count(*) FROM blocked) AS blocked,
           (SELECT count(*) FROM released) AS released,
           (SELECT count(*) FROM room) AS keys
    FROM (SELECT 1) AS one
    LEFT JOIN claimed ON true
    """
).bindparams(bindparam("weights", value={}, type_=JSONB_VALUE))


def _snapshot(row: Any) -> LoadedExecution | None:
    """The loaded execution, read by the claim itself, when this is its first holder.

    Token 1 means no one held the execution before this claim, so no checkpoint can
    exist and there is nothing that a separate load, reading after the claim
    committed, could see and this statement not. A later holder (a retry or a
    recovery) loads separately under the fence, after its claim committed: the
    previous holder's last checkpoint may have committed while this statement ran.
    The request read here is the one the load would read; nothing but this
    execution writes a busy request, and the finish checks it again anyway.
    """
    if row.fencing_token != 1:
        return None
    return LoadedExecution.from_row(row, checkpoints={})


class ClaimRound(NamedTuple):
    claims: list[Claim]
    # PENDING executions this claim found their key full for: they left the claim's
    # index, so another claim at once may find other work.
    blocked: int = 0
    # Keys let go of that this claim took up: the executions it let back are due now.
    released: int = 0

    @property
    def more_may_be_due(self) -> bool:
        return self.blocked > 0 or self.released > 0


def claim_round(
    conn: Connection,
    owner: str,
    *,
    limit: int,
    lease_seconds: float,
    org_weights: Mapping[str, float] | None = None,
) -> ClaimRound:
    """Claim up to `limit` due executions for `owner` and commit before returning them.

    `org_weights` shares the slots unevenly (an organization not named weighs 1). A first
    holder's claim carries its loaded execution (`Claim.snapshot`), which saves the
    worker the separate load.
    """
    if limit <= 0:
        return ClaimRound([])
    params = {
        "limit": limit,
        "owner": owner,
        "lease_seconds": float(lease_seconds),
        "weights": dict(org_weights or {}),
    }
    result = run_alone(conn, _CLAIM, params).fetchall()
    rows = [row for row in result if row.id is not None]
    # RETURNING gives no order; hand the claims out in the order they were chosen.
    rows.sort(key=lambda row: (row.next_attempt_at, row.created_at, row.id))
    claims = [
        Claim(
            execution_id=row.id,
            token=row.fencing_token,
            owner=owner,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            request_id=row.request_id,
            lease_expires_at=row.lease_expires_at,
            created_at=row.created_at,
            claimed_at=row.claimed_at,
            snapshot=_snapshot(row),
            trace_parent=row.trace_parent,
            counted_attempt=row.counted_attempt,
            reclaimed=row.reclaimed,
        )
        for row in rows
    ]
    return ClaimRound(claims, result[0].blocked, result[0].released)
