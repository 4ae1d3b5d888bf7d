"""The Python client against the real API served on a loopback port: answers, refusals and
a server that is not there."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from orquestador.api.tokens import mint_token
from orquestador.client import ApiError, ApiUnreachable, Client
from tests.acceptance.served_api import served_api
from tests.db_support import TestDatabase
from tests.integration.worker_support import ORG, flow_definition

SECRET = "client-test-secret-" + "0123456789abcdef" * 3
SCOPES = ["flows:admin", "requests:write", "requests:read"]


@pytest.fixture
def client(database: TestDatabase) -> Iterator[Client]:
    """A client of the served API with an author's and a requester's scopes."""
    with served_api(database, SECRET) as (url, settings):
        token = mint_token(settings, sub="author", org=ORG, scopes=SCOPES)
        client = Client(url, token)
        yield client
        client.close()


def test_publish_start_move_find_and_cancel(client: Client) -> None:
    definition = flow_definition([])

    flow = client.publish_flow(definition)
    listed = client.list_flows(key=definition["key"])
    request = client.create_request(flow["id"], {"plan": "free"}, machine_id="vm-17")
    accepted = client.request_transition(request["id"], "go", expected_revision=1)
    execution = client.get_execution(accepted["executionId"])
    page = client.list_executions(request_id=request["id"], limit=5)
    cancelled = client.cancel_execution(execution["id"], "asked by the test")

    assert (flow["key"], flow["version"]) == (definition["key"], 1)
    assert [item["id"] for item in listed["items"]] == [flow["id"]]
    assert client.get_flow(flow["id"])["definition"] == definition
    assert (request["state"], request["revision"], request["machineId"]) == ("new", 1, "vm-17")
    assert (execution["requestId"], execution["status"]) == (request["id"], "PENDING")
    assert [item["id"] for item in page["items"]] == [execution["id"]]
    assert cancelled["status"] == "CANCELLED"
    # Released in the state and with the data it was accepted in.
    after = client.get_request(request["id"])
    assert (after["state"], after["data"]) == ("new", {"plan": "free"})


def test_an_error_answer_is_an_api_error_with_the_problem(client: Client) -> None:
    with pytest.raises(ApiError) as missing:
        client.get_execution(str(uuid.uuid4()))
    with pytest.raises(ApiError) as invalid:
        client.publish_flow({**flow_definition([]), "initialState": "nowhere"})

    assert (missing.value.status, missing.value.code) == (404, "NOT_FOUND")
    assert (invalid.value.status, invalid.value.code) == (422, "FLOW_INVALID")
    assert invalid.value.problem and invalid.value.problem["problems"]


def test_an_id_is_one_path_segment_whatever_it_holds(client: Client) -> None:
    # Quoted, "../flows" cannot climb to another route: the execution is simply not found.
    with pytest.raises(ApiError) as missing:
        client.get_execution("../flows")

    assert missing.value.code == "NOT_FOUND"


def test_a_server_that_does_not_answer_is_unreachable_with_the_system_s_reason() -> None:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        # Bound, never listening: nothing answers on this port.
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        with pytest.raises(ApiUnreachable) as unreachable:
            Client(url, "any token").list_flows()

    assert unreachable.value.reason == "Connection refused"
    assert str(unreachable.value) == f"cannot reach the API at {url}/api/v1: Connection refused"


def _finish(owner_engine: Engine, execution_id: str) -> None:
    with owner_engine.begin() as connection:
        connection.execute(
            text("UPDATE execution SET status = 'SUCCEEDED' WHERE id = :id"), {"id": execution_id}
        )


def test_wait_execution_answers_once_the_execution_has_ended(
    client: Client, owner_engine: Engine
) -> None:
    flow = client.publish_flow(flow_definition([]))
    started = client.start_run(flow["key"], "go", {})
    finished = threading.Timer(0.5, _finish, (owner_engine, started["executionId"]))

    finished.start()
    try:
        view = client.wait_execution(started["executionId"], timeout=60)
    finally:
        finished.join()

    assert view["status"] == "SUCCEEDED"


def test_wait_execution_reads_and_asks_again_when_the_server_has_no_place_for_a_wait(
    database: TestDatabase,
) -> None:
    # No place at all: every wait is refused with 429, and the client keeps reading.
    with served_api(database, SECRET, execution_wait_share=0) as (url, settings):
        client = Client(url, mint_token(settings, sub="author", org=ORG, scopes=SCOPES))
        flow = client.publish_flow(flow_definition([]))
        started = client.start_run(flow["key"], "go", {})
        with pytest.raises(ApiError) as refused:
            client.get_execution(started["executionId"], wait_for="final", timeout=5)

        view = client.wait_execution(started["executionId"], timeout=1.5)

    assert (refused.value.status, refused.value.retry_after) == (429, 1.0)
    assert view["status"] == "PENDING"
