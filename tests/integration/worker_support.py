"""Arranging flows, requests and accepted executions with plain SQL, as the API would."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from orquestador.actions import ActionContext, Adapter, AdapterRegistry, Effect
from orquestador.config import Settings
from orquestador.db.bounds import FunctionBounds, apply_function_bounds
from orquestador.db.schema import EXECUTION_READY_CHANNEL
from orquestador.queue import ActionAttempt, Claim, claim_round
from orquestador.worker.daemon import Worker

ORG = "org-test"
OWNER = "user-1"


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "worker_concurrency": 4,
        "worker_batch": 4,
        "worker_poll_ms": 50,
        "worker_lease_seconds": 30,
        "worker_renew_seconds": 5,
        "worker_drain_seconds": 5,
        "retry_base_seconds": 1.0,
        "retry_cap_seconds": 8.0,
    }
    values.update(overrides)
    return Settings.from_env({}, **values)


def migrated_with(owner: Engine, **retention: Any) -> None:
    """The functions' bounds as `orquestador migrate` writes them for these retention
    settings (the owner's floors: a pass of the same settings then keeps no more)."""
    with owner.begin() as conn:
        apply_function_bounds(conn, FunctionBounds.from_settings(settings(**retention)))


def flow_definition(
    actions: list[dict[str, Any]],
    *,
    to: str | None = "done",
    decision: dict[str, Any] | None = None,
    updates: list[dict[str, Any]] | None = None,
    data_schema: dict[str, Any] | None = None,
    states: tuple[str, ...] = ("new", "done", "attention", "other"),
    transition_id: str = "go",
) -> dict[str, Any]:
    transition: dict[str, Any] = {"id": transition_id, "from": ["new"], "actions": actions}
    if decision is not None:
        transition["decision"] = decision
    else:
        transition["to"] = to
    if updates:
        transition["updates"] = updates
    return {
        "key": f"flow-{uuid.uuid4().hex[:8]}",
        "trigger": "manual",
        "dataSchema": data_schema or {"type": "object"},
        "initialState": "new",
        "states": list(states),
        "transitions": [transition],
    }


def action(action_id: str, capability: str, version: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "id": action_id,
        "capability": capability,
        "version": version,
        "input": extra.pop("input", {}),
        **extra,
    }


def publish_flow(engine: Engine, definition: dict[str, Any]) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text("""INSERT INTO flow (org_id, key, version, trigger, definition, data_schema,
                                      created_by)
                    VALUES (:org, :key, 1, :trigger, CAST(:definition AS jsonb),
                            CAST(:schema AS jsonb), 'tester')
                    RETURNING id"""),
            {
                "org": ORG,
                "key": definition["key"],
                "trigger": definition["trigger"],
                "definition": json.dumps(definition),
                "schema": json.dumps(definition["dataSchema"]),
            },
        ).scalar_one()


def create_request(
    engine: Engine,
    flow_id: uuid.UUID,
    data: dict[str, Any] | None = None,
    state: str = "new",
    *,
    simulation: bool = False,
    machine_id: str | None = None,
) -> uuid.UUID:
    with engine.begin() as conn:
        return conn.execute(
            text("""INSERT INTO request (org_id, owner_id, flow_id, state, data, created_by,
                                         simulation, machine_id)
                    VALUES (:org, :owner, :flow, :state, CAST(:data AS jsonb), :owner, :sim,
                            :machine)
                    RETURNING id"""),
            {
                "org": ORG,
                "owner": OWNER,
                "flow": flow_id,
                "state": state,
                "data": json.dumps(data or {}),
                "sim": simulation,
                "machine": machine_id,
            },
        ).scalar_one()


def accept_transition(
    engine: Engine,
    request_id: uuid.UUID,
    transition_id: str = "go",
    *,
    simulation: bool = False,
    max_attempts: int = 10,
) -> uuid.UUID:
    """What the API does when it accepts a transition, in one transaction."""
    with engine.begin() as conn:
        req = conn.execute(
            text("SELECT org_id, flow_id, state, revision FROM request WHERE id = :id FOR UPDATE"),
            {"id": request_id},
        ).one()
        execution_id = conn.execute(
            text("""INSERT INTO execution (request_id, org_id, flow_id, transition_id,
                        accepted_revision, accepted_state, max_attempts, simulation,
                        actor_snapshot)
                    VALUES (:rid, :org, :flow, :tid, :rev, :state, :max, :sim,
                            CAST(:actor AS jsonb))
                    RETURNING id"""),
            {
                "rid": request_id,
                "org": req.org_id,
                "flow": req.flow_id,
                "tid": transition_id,
                "rev": req.revision + 1,
                "state": req.state,
                "max": max_attempts,
                "sim": simulation,
                "actor": json.dumps({"sub": OWNER}),
            },
        ).scalar_one()
        conn.execute(
            text("""UPDATE request SET busy_execution_id = :eid, revision = revision + 1
                    WHERE id = :rid"""),
            {"eid": execution_id, "rid": request_id},
        )
        conn.execute(
            text("""INSERT INTO audit_event (org_id, kind, request_id, execution_id, actor, detail)
                    VALUES (:org, 'TRANSITION_ACCEPTED', :rid, :eid, :actor,
                            CAST(:detail AS jsonb))"""),
            {
                "org": req.org_id,
                "rid": request_id,
                "eid": execution_id,
                "actor": OWNER,
                "detail": json.dumps(
                    {
                        "transitionId": transition_id,
                        "fromState": req.state,
                        "acceptedRevision": req.revision + 1,
                    }
                ),
            },
        )
        conn.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": EXECUTION_READY_CHANNEL, "payload": str(execution_id)},
        )
    return execution_id


def start_execution(
    engine: Engine, definition: dict[str, Any], data: dict[str, Any] | None = None, **kwargs: Any
) -> uuid.UUID:
    flow_id = publish_flow(engine, definition)
    # A dry run's execution goes on a dry run's request (the schema ties the two).
    request_id = create_request(engine, flow_id, data, simulation=kwargs.get("simulation", False))
    return accept_transition(engine, request_id, **kwargs)


def scripted(*steps: Any) -> Callable[[ActionContext], dict[str, Any]]:
    """An adapter body that plays `steps` in order: an exception to raise or an output."""
    remaining = list(steps)

    def play(ctx: ActionContext) -> dict[str, Any]:
        step = remaining.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    return play


class SimulatedCrash(Exception):
    """Stands for the process dying at a hook: nothing after it runs."""


def crash_at_hook(*args: Any) -> None:
    raise SimulatedCrash


def run_once(engine: Engine, executor: Any, owner: str = "w1") -> str:
    """Claim the one due execution and run it through `executor`; its end status."""
    claim = claim_one(engine, owner)
    with engine.connect() as conn:
        return executor.run(conn, claim)


def make_due(engine: Engine, execution_id: uuid.UUID) -> None:
    """What the passing of time does to a retry's backoff."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE execution SET next_attempt_at = now() - interval '1 s' WHERE id = :id"),
            {"id": execution_id},
        )


def attempt_history(engine: Engine, execution_id: uuid.UUID, action_id: str) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(
            text("""SELECT * FROM action_attempt
                    WHERE execution_id = :id AND action_id = :action ORDER BY attempt"""),
            {"id": execution_id, "action": action_id},
        ).all()


def claim_one(engine: Engine, owner: str = "w1", lease_seconds: float = 30) -> Claim:
    with engine.connect() as conn:
        claims = claim_round(conn, owner, limit=1, lease_seconds=lease_seconds).claims
    assert len(claims) == 1, claims
    return claims[0]


def execution(engine: Engine, execution_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM execution WHERE id = :id"), {"id": execution_id}
        ).one()


def request_row(engine: Engine, request_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT * FROM request WHERE id = :id"), {"id": request_id}).one()


def checkpoints(engine: Engine, execution_id: uuid.UUID) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM action_execution WHERE execution_id = :id"), {"id": execution_id}
        ).all()
    return {row.action_id: row for row in rows}


def audit(engine: Engine, execution_id: uuid.UUID, kind: str | None = None) -> list[Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM audit_event WHERE execution_id = :id ORDER BY id"),
            {"id": execution_id},
        ).all()
    return [row for row in rows if kind is None or row.kind == kind]


def expire_lease(engine: Engine, execution_id: uuid.UUID) -> None:
    """What the passing of time does to a lease whose holder died."""
    with engine.begin() as conn:
        conn.execute(
            text("""UPDATE execution SET lease_expires_at = clock_timestamp() - interval '1 s'
                    WHERE id = :id AND status = 'RUNNING'"""),
            {"id": execution_id},
        )


def lapse_earlier_calls(engine: Engine, execution_id: uuid.UUID) -> None:
    """What the passing of time does to a dead holder's call: its attempt started long ago,
    so its adapter's deadline and the grace after it have passed (a look-up's NotFound is
    then proof that no write happened)."""
    with engine.begin() as conn:
        conn.execute(
            text("""UPDATE action_execution SET started_at = started_at - interval '1 hour'
                    WHERE execution_id = :id AND status = 'RUNNING'"""),
            {"id": execution_id},
        )


def wait_until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    """Poll `condition` until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def waiting_on_locks(conn: Any) -> int:
    """How many sessions of this database wait for a lock (a barrier's queue), freshly."""
    count = conn.execute(
        text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    ).scalar_one()
    conn.rollback()  # pg_stat_activity is read once per transaction: the next look is fresh
    return count


def status_is(engine: Engine, execution_id: uuid.UUID, *statuses: str) -> Callable[[], bool]:
    return lambda: execution(engine, execution_id).status in statuses


@dataclass
class RecordingAdapter:
    """An adapter double that records every call and behaves as a test script says."""

    capability: str
    effect: Effect = Effect.IDEMPOTENT_WRITE
    version: int = 1
    timeout_seconds: float = 5
    max_attempts: int = 3
    output: Callable[[ActionContext], dict[str, Any]] | dict[str, Any] = field(
        default_factory=lambda: {"ok": True}
    )
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    inline: bool = False
    calls: list[ActionContext] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invoke(self, ctx: ActionContext) -> dict[str, Any]:
        with self._lock:
            self.calls.append(ctx)
        if callable(self.output):
            return self.output(ctx)
        return dict(self.output)

    def adapter(self) -> Adapter:
        return Adapter(
            capability=self.capability,
            version=self.version,
            effect=self.effect,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            timeout_seconds=self.timeout_seconds,
            max_attempts=self.max_attempts,
            invoke=self.invoke,
            inline=self.inline,
        )


def registry_of(*doubles: RecordingAdapter) -> AdapterRegistry:
    registry = AdapterRegistry()
    from orquestador.actions.builtin import register_builtins

    register_builtins(registry)
    for double in doubles:
        registry.add(double.adapter())
    return registry


def decommission(deadline_seconds: int) -> dict:
    """The docs' decommission transition on the machine built-ins: send poweroff, wait."""
    return flow_definition(
        [
            action(
                "send",
                "machine.command",
                input={"machineId": {"from": "/data/machineId"}, "command": {"const": "poweroff"}},
                onError="attention",
            ),
            action(
                "wait",
                "machine.wait",
                input={
                    "commandId": {"from": "/actions/send/commandId"},
                    "deadlineSeconds": {"const": deadline_seconds},
                },
                onError="attention",
            ),
        ],
        decision={
            "hitPolicy": "FIRST",
            "inputs": ["/actions/wait/status"],
            "rules": [
                {"id": "ok", "when": ['"succeeded"'], "then": {"to": "done", "outcome": "DONE"}},
                {"id": "other", "when": ["-"], "then": {"to": "attention", "outcome": "REVIEW"}},
            ],
        },
        updates=[{"path": "/power", "from": "/actions/wait/status"}],
    )


def attempt_of(
    claim: Claim, action_id: str = "a", attempt: int = 1, **fields: Any
) -> ActionAttempt:
    """A checkpoint's attempt for `claim`'s action, as the worker starts one."""
    values: dict[str, Any] = {
        "action_id": action_id,
        "attempt": attempt,
        "input_hash": "h" * 64,
        "external_key": f"{claim.execution_id}:{action_id}",
        "effect": "IDEMPOTENT_WRITE",
        "capability": "test.write",
        "adapter_version": 1,
    }
    values.update(fields)
    return ActionAttempt(**values)


def dry_run_with_worker(
    api: Any, engine: Engine, registry: AdapterRegistry, flow_id: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Start a dry run of the published flow through `api` (a running_api) and let a
    worker with `registry` run it: its view once it has ended."""
    worker = Worker(settings(database_url=api.settings.database_url), engine, registry)
    worker.start()
    try:
        response = api.post(f"/flows/{flow_id}/dry-runs", body)
        assert response.status_code == 202, response.get_data(as_text=True)
        location = response.headers["Location"]

        def ended() -> dict[str, Any] | None:
            view = api.client().get(location, headers=api.headers()).get_json()
            return view if view["status"] in ("SUCCEEDED", "FAILED") else None

        return wait_until(ended, what="the dry run ended")
    finally:
        worker.stop(timeout=30)
