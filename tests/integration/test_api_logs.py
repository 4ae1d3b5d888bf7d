"""API lines name the route and the ids in its path; JSON lines follow the same rules as text."""

from __future__ import annotations

import io
import json
import logging
import uuid

from orquestador.api.app import create_app
from orquestador.api.tokens import mint_token
from tests.integration.api_support import api_settings
from tests.integration.log_support import json_lines  # noqa: F401

SECRET_QUERY = "query-secret-5e5e5e5e"


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_a_line_logged_while_serving_names_the_route_and_the_execution(
    json_lines: io.StringIO,  # noqa: F811
) -> None:
    # Nothing listens on port 1: every database call fails, and the API says so.
    settings = api_settings("postgresql://orquestador@127.0.0.1:1/orquestador")
    app = create_app(settings)
    token = mint_token(settings, sub="alice", org="acme", scopes=["requests:read"])
    execution_id = uuid.uuid4()

    response = app.test_client().get(
        f"/api/v1/executions/{execution_id}?access_token={SECRET_QUERY}",
        headers={"Authorization": f"Bearer {token}"},
    )

    assert response.status_code == 503
    assert response.mimetype == "application/problem+json"
    (line,) = [r for r in _records(json_lines) if "database unavailable" in str(r["message"])]
    assert line["execution_id"] == str(execution_id)
    assert line["route"] == "/api/v1/executions/<uuid:execution_id>"
    assert line["method"] == "GET"
    assert line["level"] == "WARNING"
    text = json_lines.getvalue()
    assert token not in text and SECRET_QUERY not in text
    # The context ends with the request: a later line carries none of it.
    logging.getLogger("orquestador.test").info("after the request")
    assert "route" not in _records(json_lines)[-1]


def test_json_lines_name_the_exception_and_keep_tracebacks_for_errors(
    json_lines: io.StringIO,  # noqa: F811
) -> None:
    log = logging.getLogger("orquestador.test")
    execution_id = uuid.uuid4()
    for level in (logging.WARNING, logging.ERROR):
        try:
            raise TimeoutError("read timed out\nsecond line with an input value")
        except TimeoutError:
            log.log(
                level,
                "action outcome uncertain",
                exc_info=True,
                extra={"execution_id": execution_id, "action_id": "send", "attempt": 2},
            )
    warning, error = _records(json_lines)
    for record in (warning, error):
        assert record["execution_id"] == str(execution_id)
        assert (record["action_id"], record["attempt"]) == ("send", 2)
        assert record["exception"] == "TimeoutError"
        assert record["exception_message"] == "read timed out"
        assert "time" in record and record["logger"] == "orquestador.test"
    # An expected failure is one line; an error carries its traceback.
    assert "exc_info" not in warning
    assert "Traceback" in str(error["exc_info"])
