"""Claims and leases against a real PostgreSQL: SKIP LOCKED, ordering, expiry, renewal."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from orquestador.queue import claim_round, renew_leases
from tests.integration.worker_support import (
    accept_transition,
    action,
    claim_one,
    create_request,
    execution,
    expire_lease,
    flow_definition,
    publish_flow,
)


def _accept_many(engine, count: int) -> list[uuid.UUID]:
    flow_id = publish_flow(engine, flow_definition([action("a", "noop")]))
    return [accept_transition(engine, create_request(engine, flow_id)) for _ in range(count)]


def test_concurrent_claimers_never_share_an_execution(runtime_engine):
    ids = set(_accept_many(runtime_engine, 300))
    claimers = 6
    barrier = threading.Barrier(claimers)
    taken: list[list[uuid.UUID]] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait()
            with runtime_engine.connect() as conn:
                while True:
                    claims = claim_round(conn, f"w{index}", limit=7, lease_seconds=30).claims
                    if not claims:
                        return
                    taken[index].extend(c.execution_id for c in claims)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    everything = [eid for part in taken for eid in part]
    assert len(everything) == len(set(everything)), "an execution was claimed twice"
    assert set(everything) == ids
    assert sum(1 for part in taken if part) > 1, "the claimers did not actually overlap"


def test_a_row_locked_by_an_open_transaction_is_skipped_not_waited_on(runtime_engine):
    locked, free = _accept_many(runtime_engine, 2)
    with runtime_engine.connect() as holder:
        holder.begin()
        holder.execute(text("SELECT 1 FROM execution WHERE id = :id FOR UPDATE"), {"id": locked})
        with runtime_engine.connect() as conn:
            conn.execute(text("SET lock_timeout = '2s'"))
            conn.commit()
            claims = claim_round(conn, "w1", limit=10, lease_seconds=30).claims
        holder.rollback()
    assert [c.execution_id for c in claims] == [free]


def test_claim_sets_lease_token_and_attempts_from_database_time(runtime_engine):
    (eid,) = _accept_many(runtime_engine, 1)
    claim = claim_one(runtime_engine, "w1", lease_seconds=30)
    row = execution(runtime_engine, eid)
    assert (row.status, row.lease_owner, row.fencing_token, row.attempts) == ("RUNNING", "w1", 1, 1)
    assert claim.token == 1 and claim.attempts == 1
    assert 29 < (row.lease_expires_at - claim.claimed_at).total_seconds() <= 30
    with runtime_engine.connect() as conn:
        assert claim_round(conn, "w2", limit=10, lease_seconds=30).claims == [], (
            "a live lease was taken"
        )


def test_claim_order_and_due_retries(runtime_engine):
    first, second, later = _accept_many(runtime_engine, 3)
    with runtime_engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET status = 'RETRY_WAIT',
                             next_attempt_at = clock_timestamp() + interval '1 hour'
                             WHERE id = :id"""),
            {"id": later},
        )
        conn.execute(
            text("""UPDATE execution SET status = 'RETRY_WAIT',
                             next_attempt_at = now() - interval '1 hour' WHERE id = :id"""),
            {"id": second},
        )
    with runtime_engine.connect() as conn:
        claims = claim_round(conn, "w1", limit=10, lease_seconds=30).claims
    assert [c.execution_id for c in claims] == [second, first]


def test_expired_lease_is_reclaimed_with_a_new_token(runtime_engine):
    (eid,) = _accept_many(runtime_engine, 1)
    old = claim_one(runtime_engine, "w1")
    expire_lease(runtime_engine, eid)
    new = claim_one(runtime_engine, "w2")
    assert new.execution_id == eid and new.token == old.token + 1 and new.attempts == 2
    assert execution(runtime_engine, eid).lease_owner == "w2"


def test_renewal_skips_a_row_another_session_holds_and_renews_the_rest(runtime_engine):
    # Regression: the renewal waited for a row an operator's open transaction held, and
    # with it every lease of the worker ran towards expiry.
    locked, free = _accept_many(runtime_engine, 2)
    with runtime_engine.connect() as conn:
        claims = {
            c.execution_id: c for c in claim_round(conn, "w1", limit=2, lease_seconds=30).claims
        }
    before = execution(runtime_engine, locked).lease_expires_at
    stranger = runtime_engine.connect()
    transaction = stranger.begin()
    stranger.execute(text("SELECT 1 FROM execution WHERE id = :id FOR UPDATE"), {"id": locked})
    try:
        with runtime_engine.connect() as conn:
            # Bounded, so that a renewal that waits fails this test instead of hanging it.
            conn.execute(text("SET lock_timeout = '5s'"))
            conn.commit()
            renewal = renew_leases(
                conn, "w1", [(c.execution_id, c.token) for c in claims.values()], 60
            )
    finally:
        transaction.rollback()
        stranger.close()
    assert renewal.renewed == {(free, claims[free].token)}
    # Still ours, not extended: neither renewed nor lost this round.
    assert renewal.busy == {(locked, claims[locked].token)}
    assert execution(runtime_engine, locked).lease_expires_at == before


def test_renewal_extends_only_exactly_held_valid_leases(runtime_engine):
    kept, expired, stolen = _accept_many(runtime_engine, 3)
    with runtime_engine.connect() as conn:
        claims = {
            c.execution_id: c for c in claim_round(conn, "w1", limit=3, lease_seconds=30).claims
        }
    expire_lease(runtime_engine, expired)
    expire_lease(runtime_engine, stolen)
    thief = claim_one(runtime_engine, "w2")
    assert thief.execution_id in (expired, stolen)
    before = execution(runtime_engine, kept).lease_expires_at
    with runtime_engine.connect() as conn:
        renewed = renew_leases(conn, "w1", [(c.execution_id, c.token) for c in claims.values()], 60)
    assert renewed.renewed == {(kept, claims[kept].token)} and renewed.busy == set()
    assert execution(runtime_engine, kept).lease_expires_at > before
    # the expired lease stays expired: renewal never revives it
    leftover = expired if thief.execution_id == stolen else stolen
    row = execution(runtime_engine, leftover)
    assert row.lease_owner == "w1"
    with runtime_engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT :t > clock_timestamp()"), {"t": row.lease_expires_at}
            ).scalar()
            is False
        )


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_claim_never_takes_more_than_the_limit(runtime_engine, limit):
    _accept_many(runtime_engine, 5)
    with runtime_engine.connect() as conn:
        assert len(claim_round(conn, "w1", limit=limit, lease_seconds=30).claims) == limit


def test_a_first_claim_carries_what_the_load_reads_and_a_reclaim_does_not(runtime_engine):
    from orquestador.queue import load_execution

    (eid,) = _accept_many(runtime_engine, 1)
    first = claim_one(runtime_engine, "w1")
    assert first.snapshot is not None
    with runtime_engine.connect() as conn:
        assert first.snapshot == load_execution(conn, first)
    expire_lease(runtime_engine, eid)
    again = claim_one(runtime_engine, "w2")
    # A later holder may find checkpoints committed while its claim ran: it loads apart.
    assert again.token == 2 and again.snapshot is None
