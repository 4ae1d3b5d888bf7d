"""The ExecutionView shows what a step saw then beside what is true now, and dry runs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import Engine

from orquestador.api.schemas import EXECUTION
from tests.integration.api_support import ORG, OTHER_ORG, Api, problem, running_api
from tests.integration.execution_page_support import (
    SEEN_AT,
    accepted,
    completed,
    deadline_passed,
    dry_run,
    insert_command,
    point_audit_at,
    purge,
)


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _view(api: Api, execution_id: str) -> dict:
    response = api.get(f"/executions/{execution_id}")
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.get_json()
    Draft202012Validator(EXECUTION).validate(body)
    return body


def _step(body: dict, action_id: str) -> dict:
    return next(step for step in body["steps"] if step["actionId"] == action_id)


def test_a_deadline_exit_shows_sent_then_and_the_command_s_row_now(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine, now="timed_out")

    body = _view(api, arranged.execution_id)

    wait = _step(body, "wait")
    assert wait["observed"] == {
        "commandId": arranged.command_id,
        "status": "sent",
        "seenAt": SEEN_AT.isoformat(),
    }
    assert wait["current"]["status"] == "timed_out"
    assert set(wait["current"]) == {"status", "updatedAt", "deliverBy"}
    assert "observed" not in _step(body, "send")
    assert body["decision"] == {
        "by": "errorExit",
        "actionId": "wait",
        "errorCode": "WAIT_DEADLINE_EXCEEDED",
        "toState": "attention",
        "outcome": "STEP_ERROR",
    }
    assert (body["status"], body["toState"]) == ("FAILED", "attention")


def test_now_follows_the_command_while_then_stays_frozen(api: Api, owner_engine: Engine) -> None:
    arranged = deadline_passed(api, owner_engine, now="running")
    assert _step(_view(api, arranged.execution_id), "wait")["current"]["status"] == "running"

    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE machine_command SET status = 'succeeded' WHERE id = %s",
            (arranged.command_id,),
        )
    wait = _step(_view(api, arranged.execution_id), "wait")

    assert (wait["observed"]["status"], wait["current"]["status"]) == ("sent", "succeeded")


def test_a_purged_command_is_said_to_be_gone_never_repeated_from_the_audit(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine, now="timed_out")
    purge(owner_engine, arranged.command_id)

    wait = _step(_view(api, arranged.execution_id), "wait")

    assert wait["current"] == {"purged": True}
    assert wait["observed"]["status"] == "sent"


def test_a_completed_run_shows_the_decision_table_s_rules(api: Api, owner_engine: Engine) -> None:
    arranged = completed(api, owner_engine)

    body = _view(api, arranged.execution_id)

    assert body["decision"] == {
        "by": "rules",
        "hitPolicy": "FIRST",
        "ruleIds": ["ok"],
        "toState": "off",
        "outcome": "DONE",
    }
    assert _step(body, "wait")["current"]["status"] == "succeeded"
    assert "simulation" not in body and "wouldHaveDone" not in body


def test_an_audit_row_edited_to_name_another_org_s_command_reveals_nothing_of_it(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine, now="sent")
    # The other organization's command has a status this organization never had.
    foreign = insert_command(owner_engine, org=OTHER_ORG, status="failed", key="foreign:send")
    point_audit_at(owner_engine, arranged.execution_id, foreign)

    response = api.get(f"/executions/{arranged.execution_id}")
    listed = api.get("/executions").get_json()["items"]

    wait = _step(response.get_json(), "wait")
    assert wait["current"] == {"purged": True}
    assert "failed" not in response.get_data(as_text=True)
    (item,) = [i for i in listed if i["id"] == arranged.execution_id]
    assert _step(item, "wait")["current"] == {"purged": True}
    # The owner of that command still sees it: the row exists, only not for this caller.
    with owner_engine.connect() as connection:
        status = connection.exec_driver_sql(
            "SELECT status FROM machine_command WHERE id = %s", (foreign,)
        ).scalar_one()
    assert status == "failed"


def test_an_observation_whose_command_id_is_no_uuid_counts_as_gone(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine)
    point_audit_at(owner_engine, arranged.execution_id, "not-a-uuid' OR 1=1 --")

    wait = _step(_view(api, arranged.execution_id), "wait")

    assert wait["current"] == {"purged": True}


def test_a_dry_run_says_what_it_would_have_done_and_stays_out_of_the_normal_list(
    api: Api, owner_engine: Engine
) -> None:
    simulated = dry_run(api, owner_engine)
    real = deadline_passed(api, owner_engine).execution_id

    body = _view(api, simulated)
    normal = [item["id"] for item in api.get("/executions").get_json()["items"]]
    asked = api.get("/executions?simulation=true").get_json()["items"]

    assert body["simulation"] is True
    assert body["wouldHaveDone"] == [
        {
            "actionId": "send",
            "capability": "machine.command",
            "effect": "IDEMPOTENT_WRITE",
            "summary": "send poweroff to machine m-1",
        }
    ]
    assert normal == [real]
    assert [item["id"] for item in asked] == [simulated]
    assert asked[0]["wouldHaveDone"] == body["wouldHaveDone"]


def test_the_simulation_filter_takes_only_true_or_false(api: Api) -> None:
    response = api.get("/executions?simulation=yes")

    assert response.status_code == 400
    assert problem(response)["problems"] == [{"path": "/simulation", "message": "true or false"}]


def test_a_foreign_execution_with_observations_is_the_same_404_as_a_missing_one(
    api: Api, owner_engine: Engine
) -> None:
    arranged = deadline_passed(api, owner_engine)

    foreign = api.get(f"/executions/{arranged.execution_id}", org=OTHER_ORG)
    missing = api.get("/executions/00000000-0000-4000-8000-000000000000")

    assert foreign.status_code == missing.status_code == 404
    assert problem(foreign) == problem(missing)


def test_a_wait_between_its_rounds_reads_waiting_not_failed(api: Api, owner_engine: Engine) -> None:
    _, _, execution_id = accepted(api)
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
            " fencing_token, input_hash, external_key, effect, capability, adapter_version,"
            " error_code) VALUES (%s, 'wait', 'FAILED', 1, 1, 'hash', %s, 'READ_ONLY',"
            " 'machine.wait', 1, 'NOT_READY')",
            (execution_id, f"{execution_id}:wait"),
        )
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'WAITING', next_attempt_at = now() + interval '30 s'"
            " WHERE id = %s",
            (execution_id,),
        )

    waiting = _step(_view(api, execution_id), "wait")
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'CANCELLED' WHERE id = %s", (execution_id,)
        )
    cancelled = _step(_view(api, execution_id), "wait")

    assert (waiting["status"], "errorCode" in waiting) == ("WAITING", False)
    # Once cancelled the wait stopped without its answer: no internal marker, no failure.
    assert (cancelled["status"], "errorCode" in cancelled) == ("STOPPED", False)


def _waiting_on(owner_engine: Engine, execution_id: str, command_id: str) -> None:
    """The wait's third round parked: it first started 8 s ago, its last round just now."""
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
            " fencing_token, input_hash, external_key, effect, capability, adapter_version,"
            " error_code, observed, first_started_at, started_at, finished_at)"
            " VALUES (%s, 'wait', 'FAILED', 1, 1, 'hash', %s, 'READ_ONLY', 'machine.wait', 1,"
            " 'NOT_READY', jsonb_build_object('commandId', %s::text, 'status', 'pending'),"
            " now() - interval '8 s', now(), now())",
            (execution_id, f"{execution_id}:wait", command_id),
        )
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'WAITING', next_attempt_at = now() + interval '1 s'"
            " WHERE id = %s",
            (execution_id,),
        )


def test_a_waiting_step_shows_its_first_start_and_what_it_waits_for(
    api: Api, owner_engine: Engine
) -> None:
    _, _, execution_id = accepted(api)
    command_id = insert_command(owner_engine, org=ORG, status="sent", key="k-wait")
    _waiting_on(owner_engine, execution_id, command_id)
    with owner_engine.connect() as connection:
        first = connection.exec_driver_sql(
            "SELECT first_started_at FROM action_execution WHERE execution_id = %s",
            (execution_id,),
        ).scalar_one()

    before = _database_now(owner_engine)
    view = _view(api, execution_id)
    after = _database_now(owner_engine)
    wait = _step(view, "wait")

    assert wait["status"] == "WAITING"
    assert datetime.fromisoformat(wait["startedAt"]) == first
    waiting_for = wait["waitingFor"]
    keys = ("commandId", "machineId", "command", "args", "status")
    assert {k: waiting_for[k] for k in keys} == {
        "commandId": command_id,
        "machineId": "m-1",
        "command": "poweroff",
        "args": ["--grace", "30"],
        "status": "sent",
    }
    # deadlineSeconds is the flow's constant 30, counted from the first start.
    assert datetime.fromisoformat(waiting_for["deadline"]) == first + timedelta(seconds=30)
    # Counted when the view was read, in whole seconds.
    deadline = first + timedelta(seconds=30)
    left = waiting_for["secondsLeft"]
    assert (deadline - after).total_seconds() - 1 <= left <= (deadline - before).total_seconds() + 1
    # The listing carries the flow's key and the machine the request data names.
    listed = api.get("/executions").get_json()["items"][0]
    assert (listed["flowKey"], listed["flowVersion"], listed["machineId"]) == (
        "decommission",
        1,
        "m-1",
    )


def test_a_waiting_step_never_shows_another_organization_s_command(
    api: Api, owner_engine: Engine
) -> None:
    _, _, execution_id = accepted(api)
    foreign = insert_command(owner_engine, org=OTHER_ORG, status="sent", key="k-foreign")
    _waiting_on(owner_engine, execution_id, foreign)

    waiting_for = _step(_view(api, execution_id), "wait")["waitingFor"]

    assert waiting_for["purged"] is True
    assert "machineId" not in waiting_for and "status" not in waiting_for


def test_an_operator_s_fail_decision_is_the_decision_shown(api: Api, owner_engine: Engine) -> None:
    _, _, execution_id = accepted(api)
    with owner_engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO action_execution (execution_id, action_id, status, attempt,"
            " fencing_token, input_hash, external_key, effect, capability, adapter_version,"
            " error_code) VALUES (%s, 'send', 'UNKNOWN', 1, 1, 'hash', %s,"
            " 'IDEMPOTENT_WRITE', 'machine.command', 1, 'UNCERTAIN_OUTCOME')",
            (execution_id, f"{execution_id}:send"),
        )
        connection.exec_driver_sql(
            "UPDATE execution SET status = 'RECONCILIATION_REQUIRED',"
            " error_code = 'UNCERTAIN_OUTCOME' WHERE id = %s",
            (execution_id,),
        )
    assert "decision" not in _view(api, execution_id)

    decided = api.post(
        f"/executions/{execution_id}/reconciliation",
        {"actionId": "send", "decision": "fail", "reason": "the machine is gone"},
        scopes=["executions:reconcile", "requests:read"],
    )

    assert decided.status_code == 200, decided.get_data(as_text=True)
    assert decided.get_json()["decision"] == {
        "by": "operator",
        "errorCode": "UNCERTAIN_OUTCOME",
        "toState": "attention",
        "outcome": "RECONCILED_FAILED",
    }
    assert _view(api, execution_id)["decision"]["by"] == "operator"
    client = api.client()
    client.post("/ui/login", data={"token": api.token()}, headers={"Origin": "http://localhost"})
    page = client.get(f"/ui/executions/{execution_id}").get_data(as_text=True)
    assert "An operator decided the effect could not be settled and gave up" in page
    assert "RECONCILED_FAILED" in page


def _database_now(engine: Engine) -> datetime:
    with engine.connect() as connection:
        return connection.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
