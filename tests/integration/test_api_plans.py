"""Plans and their bindings: one flow per moment, trigger checked by the schema, org-scoped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_support import OTHER_ORG, Api, problem, running_api
from automation_support import AUTOMATION_SCOPES, moment_flow
from sqlalchemy import Engine, text


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn) as api:
        yield api


def _as(api: Api, **who):
    return {"scopes": AUTOMATION_SCOPES, **who}


def _put(api: Api, path: str, body, **who):
    return api.client().put(f"/api/v1{path}", json=body, headers=api.headers(**_as(api, **who)))


def _get(api: Api, path: str, **who):
    return api.client().get(f"/api/v1{path}", headers=api.headers(**_as(api, **who)))


def _delete(api: Api, path: str, **who):
    return api.client().delete(f"/api/v1{path}", headers=api.headers(**_as(api, **who)))


def _publish(api: Api, trigger: str, **who) -> str:
    return api.publish(moment_flow(trigger), **_as(api, **who))["id"]


def _bindings(engine: Engine) -> list[tuple]:
    with engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                text(
                    "SELECT p.org_id, p.key, b.moment, b.flow_id::text FROM plan_flow_binding b"
                    " JOIN hosting_plan p ON p.id = b.plan_id ORDER BY 1, 2, 3"
                )
            )
        ]


def test_a_plan_is_created_renamed_and_read_with_empty_bindings(api: Api) -> None:
    created = _put(api, "/plans/vps-small", {"name": "VPS small"})
    assert created.status_code == 201
    assert created.headers["Location"] == "/api/v1/plans/vps-small"
    empty = {"provisioned": None, "reinstalled": None, "deleted": None}
    assert created.get_json() == {"id": "vps-small", "name": "VPS small", "bindings": empty}

    renamed = _put(api, "/plans/vps-small", {"name": "VPS S"})
    assert renamed.status_code == 200
    assert _get(api, "/plans/vps-small").get_json()["name"] == "VPS S"


def test_binding_one_flow_per_moment_and_unbinding(api: Api, runtime_engine: Engine) -> None:
    _put(api, "/plans/vps", {"name": "VPS"})
    provisioned = _publish(api, "provisioned")
    deleted = _publish(api, "deleted")

    assert _put(api, "/plans/vps/bindings/provisioned", {"flowId": provisioned}).status_code == 200
    answer = _put(api, "/plans/vps/bindings/deleted", {"flowId": deleted})
    assert answer.status_code == 200
    assert answer.get_json()["bindings"] == {
        "provisioned": provisioned,
        "reinstalled": None,
        "deleted": deleted,
    }
    # Binding again replaces: still one flow per moment.
    newer = _publish(api, "provisioned")
    _put(api, "/plans/vps/bindings/provisioned", {"flowId": newer})
    assert _get(api, "/plans/vps").get_json()["bindings"]["provisioned"] == newer

    assert _delete(api, "/plans/vps/bindings/provisioned").status_code == 204
    assert _delete(api, "/plans/vps/bindings/provisioned").status_code == 204
    assert _get(api, "/plans/vps").get_json()["bindings"] == {
        "provisioned": None,
        "reinstalled": None,
        "deleted": deleted,
    }
    assert _bindings(runtime_engine) == [("org-a", "vps", "deleted", deleted)]


def test_a_flow_of_another_trigger_is_422_and_changes_nothing(
    api: Api, runtime_engine: Engine
) -> None:
    _put(api, "/plans/vps", {"name": "VPS"})
    provisioned = _publish(api, "provisioned")
    reinstalled = _publish(api, "reinstalled")
    manual = api.publish(
        moment_flow("manual", start=None, key="manual-one"), scopes=AUTOMATION_SCOPES
    )["id"]
    _put(api, "/plans/vps/bindings/provisioned", {"flowId": provisioned})
    before = _bindings(runtime_engine)

    for moment, flow_id in [("provisioned", reinstalled), ("provisioned", manual)]:
        refused = _put(api, f"/plans/vps/bindings/{moment}", {"flowId": flow_id})
        assert refused.status_code == 422
        body = problem(refused)
        assert body["code"] == "BINDING_TRIGGER_MISMATCH"
        assert [p["path"] for p in body["problems"]] == ["/flowId"]
    fresh = _put(api, "/plans/vps/bindings/deleted", {"flowId": reinstalled})
    assert problem(fresh)["code"] == "BINDING_TRIGGER_MISMATCH"

    assert _bindings(runtime_engine) == before


def test_unknown_moments_and_plans_are_404(api: Api) -> None:
    _put(api, "/plans/vps", {"name": "VPS"})
    flow_id = _publish(api, "provisioned")
    assert _put(api, "/plans/vps/bindings/manual", {"flowId": flow_id}).status_code == 404
    assert _delete(api, "/plans/vps/bindings/installed").status_code == 404
    assert _get(api, "/plans/nope").status_code == 404
    assert _put(api, "/plans/nope/bindings/provisioned", {"flowId": flow_id}).status_code == 404
    assert _delete(api, "/plans/nope/bindings/provisioned").status_code == 404


def test_another_organizations_plan_or_flow_is_the_same_404_as_a_missing_one(
    api: Api, runtime_engine: Engine
) -> None:
    _put(api, "/plans/theirs", {"name": "Theirs"}, org=OTHER_ORG)
    their_flow = _publish(api, "provisioned", org=OTHER_ORG)
    _put(api, "/plans/mine", {"name": "Mine"})
    my_flow = _publish(api, "provisioned")
    missing = "00000000-0000-4000-8000-000000000000"

    foreign_plan = _get(api, "/plans/theirs")
    missing_plan = _get(api, "/plans/nobody")
    assert foreign_plan.status_code == missing_plan.status_code == 404
    assert foreign_plan.get_data() == missing_plan.get_data()

    foreign_flow = _put(api, "/plans/mine/bindings/provisioned", {"flowId": their_flow})
    missing_flow = _put(api, "/plans/mine/bindings/provisioned", {"flowId": missing})
    assert foreign_flow.status_code == missing_flow.status_code == 404
    assert foreign_flow.get_data() == missing_flow.get_data()
    bind_foreign = _put(api, "/plans/theirs/bindings/provisioned", {"flowId": my_flow})
    assert bind_foreign.get_data() == missing_flow.get_data()
    assert _delete(api, "/plans/theirs/bindings/provisioned").status_code == 404

    # The same plan id in another organization is another plan.
    assert _put(api, "/plans/theirs", {"name": "Mine too"}).status_code == 201
    assert _get(api, "/plans/theirs", org=OTHER_ORG).get_json()["name"] == "Theirs"
    assert _bindings(runtime_engine) == []


def test_plans_need_the_plans_admin_scope(api: Api) -> None:
    response = api.client().put(
        "/api/v1/plans/vps", json={"name": "VPS"}, headers=api.headers(scopes=["flows:admin"])
    )
    assert response.status_code == 403
    assert problem(response)["code"] == "INSUFFICIENT_SCOPE"


def test_bad_bodies_and_plan_ids_are_clear_problems(api: Api) -> None:
    assert problem(_put(api, "/plans/vps", {"name": ""}))["code"] == "BODY_INVALID"
    assert problem(_put(api, "/plans/vps", {"name": "x", "extra": 1}))["code"] == "BODY_INVALID"
    assert problem(_put(api, "/plans/" + "p" * 201, {"name": "x"}))["code"] == "PLAN_ID_INVALID"
    _put(api, "/plans/vps", {"name": "VPS"})
    assert _put(api, "/plans/vps/bindings/provisioned", {"flowId": "nope"}).status_code == 404
    assert _put(api, "/plans/vps/bindings/provisioned", {}).status_code == 422
