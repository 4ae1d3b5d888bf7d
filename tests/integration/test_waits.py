"""Durable waits: parked WAITING without a thread or an attempt, woken by key, deadlines kept."""

from __future__ import annotations

from sqlalchemy import text

from orquestador.queue.waits import wake_waiting
from tests.integration.worker_support import action, execution, flow_definition, start_execution


def _park(engine, execution_id, wait_key: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET status = 'WAITING', wait_key = :key,
                        next_attempt_at = clock_timestamp() + interval '1 hour'
                    WHERE id = :id"""),
            {"id": execution_id, "key": wait_key},
        )


def test_wake_waiting_makes_only_the_waiters_on_the_key_due_and_notifies(runtime_engine):
    waiting = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    other = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    _park(runtime_engine, waiting, "machine_command:one")
    _park(runtime_engine, other, "machine_command:two")

    with runtime_engine.connect() as listener:
        listener.execute(text("LISTEN orquestador_execution_ready"))
        listener.commit()
        with runtime_engine.begin() as conn:
            assert wake_waiting(conn, "machine_command:one") == 1
            assert wake_waiting(conn, "machine_command:nobody") == 0
        raw = listener.connection.driver_connection
        heard = list(raw.notifies(timeout=2, stop_after=1))
    assert heard and heard[0].channel == "orquestador_execution_ready"

    with runtime_engine.connect() as conn:
        due = conn.execute(
            text("SELECT id FROM execution WHERE next_attempt_at <= clock_timestamp()")
        ).scalars()
        assert set(due) == {waiting}
    assert execution(runtime_engine, other).status == "WAITING"


def test_wake_in_a_rolled_back_transaction_changes_nothing(runtime_engine):
    waiting = start_execution(runtime_engine, flow_definition([action("a", "test.read")]))
    _park(runtime_engine, waiting, "machine_command:x")
    with runtime_engine.connect() as conn, conn.begin() as tx:
        assert wake_waiting(conn, "machine_command:x") == 1
        tx.rollback()
    with runtime_engine.connect() as conn:
        late = conn.execute(
            text("SELECT next_attempt_at > clock_timestamp() FROM execution WHERE id = :id"),
            {"id": waiting},
        ).scalar_one()
    assert late
