"""Rate limits on routes: one bucket in the database for every worker, waits spend no attempt.

The route file declares `rate_limit = { per_second, burst }`; calls through the worker
take tokens from the route's bucket, and a call with none goes back to RETRY_WAIT for
the next one. The provider double counts what reached it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from orquestador.actions import Effect, NotReady
from orquestador.actions.contracts import RateLimit
from orquestador.errors import ConfigError, LeaseLost
from orquestador.integrations.routes import load_routes
from orquestador.queue.rate_limits import RATE_LIMITED, take_token, wait_for_token
from orquestador.queue.reconciliation import cancel
from tests.integration.route_provider import RouteProvider
from tests.integration.route_support import billing_route, fast_executor, route_registry
from tests.integration.worker_support import (
    ORG,
    RecordingAdapter,
    action,
    attempt_history,
    audit,
    checkpoints,
    claim_one,
    execution,
    expire_lease,
    flow_definition,
    make_due,
    run_once,
    scripted,
    start_execution,
    wait_until,
    waiting_on_locks,
)

ROUTE = "billing.invoice@1"
SLOW = "rate_limit = { per_second = 0.01, burst = 1 }"  # one call, then one every 100 s


def _flow(*action_ids: str) -> dict[str, Any]:
    return flow_definition(
        [action(a, "billing.invoice", input={"amount": {"const": 42}}) for a in action_ids]
    )


def _refill(owner_engine: Engine, seconds: float = 1000) -> None:
    """What the passing of time does to a bucket."""
    with owner_engine.begin() as conn:
        conn.execute(
            text("UPDATE rate_bucket SET refilled_at = refilled_at - make_interval(secs => :s)"),
            {"s": seconds},
        )


def _waits() -> float:
    return (
        REGISTRY.get_sample_value("orquestador_rate_limit_waits_total", {"capability": ROUTE})
        or 0.0
    )


# --- the route file ------------------------------------------------------------------


def test_the_route_file_reads_a_rate_limit_and_its_default_burst(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(
        billing_route(extra="rate_limit = { per_second = 2.5, burst = 4 }")
        + billing_route(extra="rate_limit = { per_second = 2.5 }").replace(
            "version = 1", "version = 2"
        )
        + billing_route().replace("version = 1", "version = 3")
    )
    environ = {"BILLING_URL": "http://127.0.0.1:9", "BILLING_TOKEN": "t"}
    limits = [r.rate_limit for r in load_routes(path, environ, lease_seconds=30)]
    # By default a second's worth of calls may go at once.
    assert limits == [RateLimit(2.5, 4), RateLimit(2.5, 3), None]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10", "rate_limit: must be a table"),
        (
            "{ per_second = 0 }",
            "rate_limit.per_second: must be a number of calls greater than zero",
        ),
        ('{ per_second = "10" }', "rate_limit.per_second: must be a number"),
        (
            "{ per_second = 1, burst = 0 }",
            "rate_limit.burst: must be a whole number of calls from 1",
        ),
        ("{ per_second = 1, burst = 1.5 }", "rate_limit.burst: must be a whole number"),
        ("{ per_second = 1, per_minute = 3 }", "rate_limit.per_minute: unknown key"),
    ],
)
def test_a_bad_rate_limit_is_named_with_its_line(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(billing_route(extra=f"rate_limit = {value}"))
    environ = {"BILLING_URL": "http://127.0.0.1:9", "BILLING_TOKEN": "t"}
    with pytest.raises(ConfigError) as raised:
        load_routes(path, environ, lease_seconds=30)
    (problem,) = raised.value.problems
    line = path.read_text().splitlines().index(f"rate_limit = {value}") + 1
    assert problem.startswith(f"{path}:{line}: route {ROUTE}: ") and message in problem


# --- the bucket ----------------------------------------------------------------------


def test_takers_queued_on_the_bucket_at_once_take_no_more_than_the_burst(
    runtime_engine: Engine, owner_engine: Engine
) -> None:
    limit = RateLimit(per_second=0.001, burst=3)
    with runtime_engine.connect() as conn:
        assert take_token(conn, "shared", limit) is None  # the bucket exists, 2 left
    takers = 6
    answers: list[float | None] = []
    ready = threading.Barrier(takers + 1)

    def take() -> None:
        with runtime_engine.connect() as conn:
            ready.wait()
            answers.append(take_token(conn, "shared", limit))

    threads = [threading.Thread(target=take) for _ in range(takers)]
    # Hold the bucket's row: every taker queues on its lock, then all go at once.
    with owner_engine.connect() as holder, owner_engine.connect() as watcher:
        holder.begin()
        holder.execute(text("SELECT * FROM rate_bucket WHERE name = 'shared' FOR UPDATE"))
        for thread in threads:
            thread.start()
        ready.wait()
        wait_until(lambda: waiting_on_locks(watcher) == takers, what="all takers queued")
        holder.rollback()
    for thread in threads:
        thread.join(10)
    assert sorted(a is None for a in answers) == [False] * 4 + [True] * 2
    # The others are told when the next token is due: in about 1,000 s (the rate).
    assert all(500 < a < 1500 for a in answers if a is not None)


def test_a_taker_whose_statement_began_earlier_never_moves_the_refill_clock_back(
    runtime_engine: Engine, owner_engine: Engine
) -> None:
    """A taker queued on the bucket since T0 takes after one who took at T0 + 1 s: the
    bucket keeps T0 + 1 s as its refill time, or the second between would be counted
    again and give a token nobody earned."""
    limit = RateLimit(per_second=1, burst=3)
    with runtime_engine.connect() as conn:
        assert take_token(conn, "clock", limit) is None  # the bucket exists, 2 left
    answers: list[float | None] = []

    def take() -> None:
        with runtime_engine.connect() as conn:
            answers.append(take_token(conn, "clock", limit))

    early = threading.Thread(target=take)
    with owner_engine.connect() as later, owner_engine.connect() as watcher:
        later.begin()
        later.execute(text("SELECT * FROM rate_bucket WHERE name = 'clock' FOR UPDATE"))
        early.start()  # its statement begins now (T0) and queues on the row
        wait_until(lambda: waiting_on_locks(watcher) == 1, what="the early taker queued")
        time.sleep(1.0)  # time passing: the later taker takes a second after T0
        later.execute(
            text(
                "UPDATE rate_bucket SET tokens = tokens - 1, refilled_at = clock_timestamp()"
                " WHERE name = 'clock'"
            )
        )
        later.commit()
    early.join(10)
    assert answers == [None]  # the last token
    with runtime_engine.connect() as conn:
        assert take_token(conn, "clock", limit) is not None, "a token from time counted twice"


def test_the_bucket_refills_at_the_rate_up_to_the_burst(
    runtime_engine: Engine, owner_engine: Engine
) -> None:
    limit = RateLimit(per_second=1, burst=2)
    with runtime_engine.connect() as conn:
        assert [take_token(conn, "b", limit) for _ in range(2)] == [None, None]
        assert take_token(conn, "b", limit) is not None
        _refill(owner_engine, 1.0)  # one second: one token back
        assert take_token(conn, "b", limit) is None
        assert take_token(conn, "b", limit) is not None
        _refill(owner_engine, 3600)  # an hour: no more than the burst
        assert [take_token(conn, "b", limit) is None for _ in range(3)] == [True, True, False]


# --- through the worker --------------------------------------------------------------


def test_a_call_over_the_limit_waits_for_the_next_token_without_spending_an_attempt(
    runtime_engine: Engine, owner_engine: Engine, tmp_path: Path
) -> None:
    with RouteProvider().serve() as provider:
        executor = fast_executor(route_registry(tmp_path, provider.url, billing_route(extra=SLOW)))
        first = start_execution(runtime_engine, _flow("charge"))
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
        second = start_execution(runtime_engine, _flow("charge"))
        waits = _waits()
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        row = execution(runtime_engine, second)
        assert (row.attempts, row.error_code, row.lease_owner) == (0, RATE_LIMITED, None)
        assert 50 < (row.next_attempt_at - row.updated_at).total_seconds() < 150
        assert "charge" not in checkpoints(runtime_engine, second)  # nothing was started
        assert len(provider.received) == 1 and _waits() == waits + 1
        (waited,) = audit(runtime_engine, second, "RATE_LIMITED")
        assert waited.detail["actionId"] == "charge" and waited.detail["capability"] == ROUTE
        # Still no token when claimed again early: it waits again, spending nothing.
        make_due(runtime_engine, second)
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        assert execution(runtime_engine, second).attempts == 0
        _refill(owner_engine)
        make_due(runtime_engine, second)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.effects == {f"{first}:charge": 1, f"{second}:charge": 1}
    assert execution(runtime_engine, second).attempts == 1
    assert [a.attempt for a in attempt_history(runtime_engine, second, "charge")] == [1]


def test_a_token_wait_gives_back_exactly_the_attempt_the_claim_took(
    runtime_engine: Engine, tmp_path: Path
) -> None:
    """A wait's round was claimed and its worker died before the round started: the
    reclaim counts an attempt (an interruption), though the step's checkpoint still says
    it waits. When the next step then finds no token, that attempt, the one the claim
    took, is given back: decided by the claimed row, not by what the checkpoints say."""
    ready = RecordingAdapter(
        "test.ready", Effect.READ_ONLY, output=scripted(NotReady(0.01), {"ready": True})
    )
    with RouteProvider().serve() as provider:
        registry = route_registry(tmp_path, provider.url, billing_route(extra=SLOW))
        registry.add(ready.adapter())
        executor = fast_executor(registry)
        with runtime_engine.connect() as conn:  # the route's only token is gone
            assert take_token(conn, ROUTE, RateLimit(per_second=0.01, burst=1)) is None
        definition = flow_definition(
            [
                action("ready", "test.ready"),
                action("charge", "billing.invoice", input={"amount": {"const": 42}}),
            ]
        )
        eid = start_execution(runtime_engine, definition)
        assert run_once(runtime_engine, executor) == "WAITING"
        make_due(runtime_engine, eid)
        claim_one(runtime_engine, "died")  # the worker dies before it loads anything
        expire_lease(runtime_engine, eid)
        before = execution(runtime_engine, eid).attempts

        assert run_once(runtime_engine, executor, "recovering") == "RETRY_WAIT"

        row = execution(runtime_engine, eid)
        assert row.error_code == RATE_LIMITED
        assert row.attempts == before, "the token wait kept the attempt its claim took"
        assert provider.received == []


def test_a_step_done_before_the_wait_is_not_called_again(
    runtime_engine: Engine, owner_engine: Engine, tmp_path: Path
) -> None:
    with RouteProvider().serve() as provider:
        executor = fast_executor(route_registry(tmp_path, provider.url, billing_route(extra=SLOW)))
        eid = start_execution(runtime_engine, _flow("charge", "again"))
        assert run_once(runtime_engine, executor) == "RETRY_WAIT"
        # The first step's success, held back to ride the next write, was written alone.
        assert checkpoints(runtime_engine, eid)["charge"].status == "SUCCEEDED"
        _refill(owner_engine)
        make_due(runtime_engine, eid)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.effects == {f"{eid}:charge": 1, f"{eid}:again": 1}
    assert len(provider.received) == 2


def test_a_dry_run_takes_no_token(runtime_engine: Engine, tmp_path: Path) -> None:
    example = 'example = { id = "inv-0" }'
    with RouteProvider().serve() as provider:
        routes = billing_route(extra=f"{SLOW}\n{example}")
        executor = fast_executor(route_registry(tmp_path, provider.url, routes))
        start_execution(runtime_engine, _flow("charge"), simulation=True)
        assert run_once(runtime_engine, executor) == "SUCCEEDED"
    assert provider.received == []
    with runtime_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM rate_bucket")).scalar_one() == 0


def test_workers_share_the_bucket(runtime_engine: Engine, tmp_path: Path) -> None:
    """Two executors (two workers' registries) calling one route: one token between them."""
    with RouteProvider().serve() as provider:
        one, other = (
            fast_executor(route_registry(tmp_path, provider.url, billing_route(extra=SLOW)))
            for _ in range(2)
        )
        for _ in range(2):
            start_execution(runtime_engine, _flow("charge"))
        ends = [run_once(runtime_engine, one, "w1"), run_once(runtime_engine, other, "w2")]
    assert ends == ["SUCCEEDED", "RETRY_WAIT"] and len(provider.received) == 1


def test_a_stale_holder_cannot_send_the_execution_back_to_wait(
    runtime_engine: Engine, tmp_path: Path
) -> None:
    eid = start_execution(runtime_engine, _flow("charge"))
    stale = claim_one(runtime_engine, "w1")
    expire_lease(runtime_engine, eid)
    claim_one(runtime_engine, "w2")
    with runtime_engine.connect() as conn, pytest.raises(LeaseLost):
        wait_for_token(conn, stale, action_id="charge", capability=ROUTE, delay_seconds=60)
    row = execution(runtime_engine, eid)
    assert (row.status, row.lease_owner, row.attempts) == ("RUNNING", "w2", 2)
    assert audit(runtime_engine, eid, "RATE_LIMITED") == []


def test_a_token_wait_with_a_cancel_requested_is_due_at_once_and_the_next_holder_cancels(
    runtime_engine: Engine, tmp_path: Path
) -> None:
    with RouteProvider().serve() as provider:
        executor = fast_executor(route_registry(tmp_path, provider.url, billing_route(extra=SLOW)))
        with runtime_engine.connect() as conn:  # the route's only token is gone
            assert take_token(conn, ROUTE, RateLimit(per_second=0.01, burst=1)) is None
        eid = start_execution(runtime_engine, _flow("charge"))
        holder = claim_one(runtime_engine, "w1")
        with runtime_engine.connect() as conn:  # asked while it runs, before the token
            assert cancel(conn, eid, org_id=ORG, actor="operator-1", reason="not tonight").requested
        with runtime_engine.connect() as conn:
            assert executor.run(conn, holder) == "RETRY_WAIT"
        row = execution(runtime_engine, eid)
        # Not the 100 s to the next token: due now, for the next holder to cancel.
        assert (row.next_attempt_at - row.updated_at).total_seconds() < 1
        assert run_once(runtime_engine, executor, "w2") == "CANCELLED"
        assert provider.received == []
