"""HTTP behaviour around the endpoints: problems, limits, switches, probes, OpenAPI, the role."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from api_support import REGISTRY, Api, api_settings, problem, running_api
from db_support import RUNTIME_ROLE
from sqlalchemy import Engine, text

from orquestador.api.app import create_app
from orquestador.api.openapi.document import openapi_document


@pytest.fixture
def api(database) -> Iterator[Api]:
    with running_api(database.runtime_dsn, api_max_body_bytes=4096) as api:
        yield api


def test_problem_bodies_have_the_documented_fields(api: Api) -> None:
    response = api.client().post(
        "/api/v1/requests", data="{", content_type="application/json", headers=api.headers()
    )

    assert response.status_code == 400
    body = problem(response)
    assert set(body) == {"type", "title", "status", "code", "detail"}
    assert body["code"] == "MALFORMED_JSON"
    assert body["type"] == "https://orquestador.dev/problems/malformed-json"
    assert body["title"] == "Bad Request"


@pytest.mark.parametrize(
    "payload",
    ['{"flowId": NaN}', '{"a": 1e999}', "\xff\xfe", '{"a": 1,}', "", "[" * 3000],
)
def test_bodies_that_are_not_json_are_400(api: Api, payload: str) -> None:
    response = api.client().post(
        "/api/v1/requests",
        data=payload.encode("latin-1"),
        content_type="application/json",
        headers=api.headers(),
    )

    assert response.status_code == 400
    assert problem(response)["code"] == "MALFORMED_JSON"


@pytest.mark.parametrize(
    "body, path",
    [
        ('{"flowId": "x\\u0000", "data": {}}', "/flowId"),
        ('{"flowId": "x", "data": {"k": "\\ud800"}}', "/data/k"),
        ('{"flowId": "x", "data": {"\\u0000": 1}}', "/data/\u0000"),
    ],
)
def test_text_postgresql_cannot_store_is_422_not_500(api: Api, body: str, path: str) -> None:
    response = api.client().post(
        "/api/v1/requests", data=body, content_type="application/json", headers=api.headers()
    )

    assert response.status_code == 422
    assert [p["path"] for p in problem(response)["problems"]] == [path]


def test_nesting_beyond_the_limit_is_422(api: Api) -> None:
    deep = "[" * 100 + "]" * 100
    body = '{"flowId": "x", "data": {"deep": ' + deep + "}}"

    response = api.client().post(
        "/api/v1/requests", data=body, content_type="application/json", headers=api.headers()
    )

    assert response.status_code == 422
    assert problem(response)["code"] == "BODY_INVALID"


def test_a_body_that_is_not_an_object_is_422(api: Api) -> None:
    response = api.post("/requests", [1, 2])

    assert response.status_code == 422
    assert problem(response)["problems"] == [{"path": "", "message": "expected an object"}]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_non_json_content_types_are_415(api: Api, content_type: str | None) -> None:
    response = api.client().post(
        "/api/v1/requests", data='{"a": 1}', content_type=content_type, headers=api.headers()
    )

    assert response.status_code == 415
    assert problem(response)["code"] == "UNSUPPORTED_MEDIA_TYPE"


def test_json_with_a_charset_is_accepted(api: Api) -> None:
    response = api.client().post(
        "/api/v1/requests",
        data='{"flowId": "x", "data": {}}',
        content_type="application/json; charset=utf-8",
        headers=api.headers(),
    )

    assert response.status_code == 422  # read and checked, not refused for its media type


def test_a_body_over_the_limit_is_413(api: Api) -> None:
    body = '{"flowId": "x", "data": {"pad": "' + "x" * 5000 + '"}}'

    response = api.client().post(
        "/api/v1/requests", data=body, content_type="application/json", headers=api.headers()
    )

    assert response.status_code == 413
    assert problem(response)["code"] == "BODY_TOO_LARGE"


@pytest.mark.parametrize("over, status", [(0, 422), (1, 413)])
def test_a_body_at_the_limit_is_read_and_one_byte_more_is_413(
    api: Api, over: int, status: int
) -> None:
    head, tail = '{"flowId": "x", "data": {"pad": "', '"}}'
    body = head + "x" * (4096 - len(head) - len(tail) + over) + tail

    response = api.client().post(
        "/api/v1/requests", data=body, content_type="application/json", headers=api.headers()
    )

    assert response.status_code == status
    assert problem(response)["code"] == ("BODY_TOO_LARGE" if over else "FLOW_UNKNOWN")


def test_a_wrong_method_is_405_with_allow(api: Api) -> None:
    response = api.client().delete("/api/v1/requests", headers=api.headers())

    assert response.status_code == 405
    assert problem(response)["code"] == "METHOD_NOT_ALLOWED"
    assert "POST" in response.headers["Allow"]


def test_bad_ids_and_unknown_paths_are_the_same_404_as_a_missing_id(api: Api) -> None:
    missing = api.get(f"/requests/{uuid.uuid4()}")

    for path in ("/requests/42", "/executions/not-an-id", "/flows/%00", "/no/such/path"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.get_data() == missing.get_data(), path


def test_unexpected_errors_are_a_bare_500(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from orquestador.api import request_routes

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret detail /etc/passwd")

    monkeypatch.setattr(request_routes, "flow_by_reference", explode)

    response = api.post("/requests", {"flowId": str(uuid.uuid4()), "data": {}})

    assert response.status_code == 500
    body = problem(response)
    assert body == {
        "type": "https://orquestador.dev/problems/internal",
        "title": "Internal Server Error",
        "status": 500,
        "code": "INTERNAL",
        "detail": "An internal error occurred.",
    }


def test_the_bare_address_redirects_to_the_executions_page(api: Api) -> None:
    client = api.client()
    response = client.get("/")

    assert response.status_code == 302
    assert response.headers["Location"] == "/ui/executions"
    # The page itself is where a person without a session is sent on to sign in.
    page = client.get(response.headers["Location"])
    assert page.status_code == 303 and "/ui/login" in page.headers["Location"]


def test_without_the_pages_the_bare_address_is_the_usual_404(database) -> None:
    with running_api(database.runtime_dsn, request_api_enabled=False) as api:
        client = api.client()
        bare, missing = client.get("/"), client.get("/no-such-path")

    assert bare.status_code == 404
    assert bare.get_data() == missing.get_data()


@pytest.mark.parametrize(
    "flows, requests",
    [(False, False), (True, False), (False, True)],
)
def test_switches_turn_route_groups_off_independently(
    database, flows: bool, requests: bool
) -> None:
    # Without a token a route that exists answers 401; a switched-off one does not exist.
    with running_api(
        database.runtime_dsn, flow_admin_enabled=flows, request_api_enabled=requests
    ) as api:
        client = api.client()
        missing = client.get("/api/v1/no-such-path")
        flow_group = [
            client.post("/api/v1/flows", json={}),
            client.get(f"/api/v1/flows/{uuid.uuid4()}"),
        ]
        request_group = [
            client.post("/api/v1/requests", json={}),
            client.get(f"/api/v1/requests/{uuid.uuid4()}"),
            client.post(f"/api/v1/requests/{uuid.uuid4()}/transitions", json={}),
            client.get(f"/api/v1/executions/{uuid.uuid4()}"),
        ]
        health = client.get("/api/v1/healthz")

    for enabled, responses in ((flows, flow_group), (requests, request_group)):
        for response in responses:
            if enabled:
                assert response.status_code == 401
            else:
                assert response.status_code == 404
                assert response.get_data() == missing.get_data()
    assert health.status_code == 200


@pytest.mark.parametrize("path", ["/healthz", "/api/v1/healthz"])
def test_healthz_needs_no_database(path: str) -> None:
    app = create_app(api_settings("postgresql://nobody@127.0.0.1:1/none"), registry=REGISTRY)

    response = app.test_client().get(path)

    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/readyz", "/api/v1/readyz"])
def test_readyz_answers_200_when_the_database_does(api: Api, path: str) -> None:
    response = api.client().get(path)

    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_readyz_answers_503_when_the_database_does_not() -> None:
    app = create_app(api_settings("postgresql://nobody@127.0.0.1:1/none"), registry=REGISTRY)

    response = app.test_client().get("/api/v1/readyz")

    assert response.status_code == 503
    assert problem(response)["code"] == "DATABASE_UNAVAILABLE"


def test_the_app_connects_as_the_runtime_role(api: Api, database, owner_engine: Engine) -> None:
    assert api.get(f"/requests/{uuid.uuid4()}").status_code == 404

    with owner_engine.connect() as connection:
        users = (
            connection.execute(
                text(
                    "SELECT DISTINCT usename FROM pg_stat_activity"
                    " WHERE datname = :db AND application_name = 'orquestador-api'"
                ),
                {"db": database.name},
            )
            .scalars()
            .all()
        )
    assert users == [RUNTIME_ROLE]


def _normalised(path: str) -> str:
    return re.sub(r"<[^>]+>|\{[^}]+\}", "{}", path)


def test_openapi_lists_exactly_the_routes_under_the_prefix(api: Api) -> None:
    response = api.client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    document = response.get_json()
    assert document == openapi_document()
    assert document["openapi"].startswith("3.1")
    assert document["components"]["securitySchemes"]["bearerAuth"]["bearerFormat"] == "JWT"

    served = {
        (_normalised(rule.rule.removeprefix("/api/v1")), method.lower())
        for rule in api.app.url_map.iter_rules()
        if rule.rule.startswith("/api/v1/")
        for method in rule.methods or ()
        if method not in {"HEAD", "OPTIONS"}
    }
    documented = {
        (_normalised(path), method)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert served == documented


def test_openapi_is_served_when_both_groups_are_off(database) -> None:
    with running_api(
        database.runtime_dsn, flow_admin_enabled=False, request_api_enabled=False
    ) as api:
        response = api.client().get("/api/v1/openapi.json")

    assert response.status_code == 200
