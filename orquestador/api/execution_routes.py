"""Executions: the read-only ExecutionView of an accepted transition."""

from __future__ import annotations

import uuid

from flask import Blueprint, Response, jsonify

from orquestador.api.access import ResourceAccess
from orquestador.api.auth import SCOPE_REQUESTS_READ, current_caller, requires_scope
from orquestador.api.context import engine
from orquestador.api.problems import not_found
from orquestador.api.views import API_PREFIX, execution_view

blueprint = Blueprint("executions", __name__, url_prefix=f"{API_PREFIX}/executions")


@blueprint.get("/<uuid:execution_id>")
@requires_scope(SCOPE_REQUESTS_READ)
def read(execution_id: uuid.UUID) -> Response:
    access = ResourceAccess(current_caller())
    # One snapshot for the execution and its steps, so they agree with each other.
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            row = access.find_execution(connection, execution_id)
            if row is None:
                raise not_found()
            steps = access.execution_steps(connection, execution_id)
            attempts = access.execution_attempts(connection, execution_id)
    return jsonify(execution_view(row, steps, attempts))
