"""The flow page's Start form: fields from the flow's data schema, a real run started as the
person, and a refusal shown again as typed, each problem next to its field."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine, text

from tests.integration.api_support import Api, decommission, running_api
from tests.integration.execution_page_support import HOST, signed_in, text_of
from tests.integration.test_ui_actions import csrf_of
from tests.integration.worker_support import audit, execution, request_row

STARTER = ["requests:read", "requests:write", "flows:admin"]

REBOOT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["machineId", "reason"],
    "properties": {
        "machineId": {
            "type": "string",
            "description": "The machine to reboot, as the panel names it.",
        },
        "reason": {"type": "string", "minLength": 3},
        "mode": {"enum": ["soft", "hard"], "description": "soft asks the system; hard cuts power."},
        "graceSeconds": {"type": "integer", "minimum": 0, "maximum": 600},
        "notify": {"type": "boolean"},
        "labels": {"type": "object"},
    },
}


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


@pytest.fixture
def flow_id(api: Api) -> str:
    return api.publish(decommission(dataSchema=REBOOT_SCHEMA))["id"]


def form_of(client: FlaskClient, flow_id: str, **fields: str) -> dict[str, str]:
    return {
        "csrf": csrf_of(client, f"/ui/flows/{flow_id}"),
        "transition": "power-off",
        "field.machineId": "m-1",
        "field.reason": "kernel update",
        "field.mode": "soft",
        "field.graceSeconds": "30",
        "data": '{"labels": {"ticket": "OPS-7"}}',
        **fields,
    }


def post(client: FlaskClient, flow_id: str, form: dict[str, str]) -> Any:
    return client.post(f"/ui/flows/{flow_id}/runs", data=form, headers={"Origin": HOST})


def rows(engine: Engine, table: str) -> int:
    with engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def field_html(html: str, name: str) -> str:
    """The Start form's block of one field: its label, control, help and problem."""
    found = re.search(
        rf'<div class="start-field">\s*(?:(?!</div>).)*?start-field-{name}"(?:(?!</div>).)*</div>',
        html,
        re.S,
    )
    assert found, f"no field {name}"
    return found.group(0)


def test_the_form_has_a_field_per_property_with_its_help_and_a_json_box_for_the_rest(
    api: Api, flow_id: str
) -> None:
    html = signed_in(api, scopes=STARTER).get(f"/ui/flows/{flow_id}").get_data(as_text=True)

    assert 'id="start-transition"' in html and "Start the run" in html
    machine = field_html(html, "machineId")
    assert 'type="text"' in machine and "machineId (required)" in machine
    assert "The machine to reboot, as the panel names it." in machine
    assert 'aria-describedby="start-field-machineId-help"' in machine
    mode = field_html(html, "mode")
    assert "<select" in mode and '<option value="hard">hard</option>' in mode
    assert "Leave it out" in mode
    assert 'inputmode="numeric"' in field_html(html, "graceSeconds")
    assert 'type="checkbox"' in field_html(html, "notify")
    # What has no field of its own is typed in the JSON box, which says so.
    assert "Give labels here." in html
    # Only transitions that leave the initial state can start a run.
    start_form = html.split('id="start-heading"')[1].split("</form>")[0]
    assert 'value="power-off"' in start_form and 'value="retry"' not in start_form


def test_a_person_starts_a_real_run_and_lands_on_its_page(
    api: Api, flow_id: str, runtime_engine: Engine
) -> None:
    client = signed_in(api, scopes=STARTER)

    response = post(
        client, flow_id, form_of(client, flow_id, **{"field.notify": "on", "priority": "8"})
    )

    assert response.status_code == 303, response.get_data(as_text=True)
    location = response.headers["Location"]
    assert location.endswith("?done=started")
    started = execution(runtime_engine, uuid.UUID(location.split("/")[-1].split("?")[0]))
    assert (started.simulation, started.status, started.priority) == (False, "PENDING", 8)
    assert request_row(runtime_engine, started.request_id).data == {
        "labels": {"ticket": "OPS-7"},
        "machineId": "m-1",
        "reason": "kernel update",
        "mode": "soft",
        "graceSeconds": 30,
        "notify": True,
    }
    (accepted,) = audit(runtime_engine, started.id, "TRANSITION_ACCEPTED")
    assert accepted.actor == "alice"
    assert "The run started" in text_of(client.get(location).get_data(as_text=True))


def test_a_refusal_shows_the_form_as_typed_with_the_problem_next_to_its_field(
    api: Api, flow_id: str, runtime_engine: Engine
) -> None:
    client = signed_in(api, scopes=STARTER)

    refused = post(client, flow_id, form_of(client, flow_id, **{"field.graceSeconds": "900"}))

    assert refused.status_code == 422
    html = refused.get_data(as_text=True)
    grace = field_html(html, "graceSeconds")
    assert 'value="900"' in grace and 'aria-invalid="true"' in grace
    assert "900 is greater than the maximum of 600" in grace
    assert 'value="kernel update"' in field_html(html, "reason")
    assert "The run was not started" in html
    assert "{&#34;labels&#34;: {&#34;ticket&#34;: &#34;OPS-7&#34;}}" in html
    assert rows(runtime_engine, "request") == 0


@pytest.mark.parametrize(
    ("fields", "field", "said"),
    [
        ({"field.machineId": ""}, "machineId", "Fill this in: the flow needs it."),
        ({"field.graceSeconds": "half a minute"}, "graceSeconds", "Type a whole number"),
        ({"field.reason": "no"}, "reason", "&#39;no&#39; is too short"),
    ],
)
def test_each_kind_of_problem_lands_at_its_field_and_nothing_is_written(
    api: Api,
    flow_id: str,
    runtime_engine: Engine,
    fields: dict[str, str],
    field: str,
    said: str,
) -> None:
    client = signed_in(api, scopes=STARTER)

    refused = post(client, flow_id, form_of(client, flow_id, **fields))

    assert refused.status_code == 422
    assert said in field_html(refused.get_data(as_text=True), field)
    assert rows(runtime_engine, "request") == 0


def test_a_problem_in_the_json_box_or_a_missing_key_is_said_beside_the_box(
    api: Api, runtime_engine: Engine
) -> None:
    keyed = decommission(dataSchema={"type": "object", "properties": {"note": {"type": "string"}}})
    keyed["transitions"][0]["concurrency"] = {"key": "/data/machineId"}
    flow_id = api.publish(keyed)["id"]
    client = signed_in(api, scopes=STARTER)
    base = {"csrf": csrf_of(client, f"/ui/flows/{flow_id}"), "transition": "power-off"}

    bad_json = post(client, flow_id, {**base, "data": "[1, 2"})
    no_key = post(client, flow_id, {**base, "data": "{}"})

    assert bad_json.status_code == 422
    assert 'id="start-data-problem">This is not valid JSON' in bad_json.get_data(as_text=True)
    assert no_key.status_code == 422
    html = no_key.get_data(as_text=True)
    assert "concurrency key that the request data does not give" in html
    assert 'id="start-data-problem">/machineId: the transition&#39;s concurrency key' in html
    assert rows(runtime_engine, "request") == 0


def test_the_form_needs_requests_write_the_session_token_and_the_same_origin(
    api: Api, flow_id: str, runtime_engine: Engine
) -> None:
    reader = signed_in(api, scopes=["requests:read", "flows:admin"])
    page = reader.get(f"/ui/flows/{flow_id}").get_data(as_text=True)
    starter = signed_in(api, scopes=STARTER)
    form = form_of(starter, flow_id)

    without_scope = post(reader, flow_id, {**form, "csrf": csrf_of(reader, f"/ui/flows/{flow_id}")})
    forged = post(starter, flow_id, {**form, "csrf": ""})
    cross_site = starter.post(
        f"/ui/flows/{flow_id}/runs", data=form, headers={"Origin": "https://evil.example"}
    )
    foreign = post(starter, str(uuid.uuid4()), form)

    assert "Start a run" not in page
    assert without_scope.status_code == forged.status_code == cross_site.status_code == 403
    assert "requests:write" in without_scope.get_data(as_text=True)
    assert foreign.status_code == 404
    assert rows(runtime_engine, "request") == 0


def test_the_flow_page_says_which_states_continue_by_themselves(api: Api) -> None:
    chained = decommission(**{"continue": {"attention": "retry"}})
    flow_id = api.publish(chained)["id"]

    words = text_of(signed_in(api, scopes=STARTER).get(f"/ui/flows/{flow_id}").get_data(True))

    assert "Continues by itself in attention: with retry" in words
