"""`GET /orgs/{org}/quotas`: the organization's quotas, each limit with what is in use."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from orquestador.api.auth import current_caller, requires_scope
from orquestador.api.claims import SCOPE_ORG_ADMIN, SCOPE_PLANS_ADMIN
from orquestador.api.context import api_context, engine
from orquestador.api.problems import not_found
from orquestador.api.quota_checks import TRANSITIONS_BUCKET
from orquestador.api.views import API_PREFIX
from orquestador.db.schema import OPEN_EXECUTION

blueprint = Blueprint("quotas", __name__, url_prefix=API_PREFIX)

# What is in use, in one statement: the schedules held, the transition tokens the
# bucket holds now (refilled for the time since; a bucket never drawn on is full), and
# the executions not ended (from the partial index, counted no further than :open_up_to).
_USE = text(
    f"""
    SELECT
        (SELECT count(*) FROM schedule WHERE org_id = :org) AS schedules,
        (SELECT count(*) FROM (
            SELECT 1 FROM execution WHERE org_id = :org AND {OPEN_EXECUTION} LIMIT :open_up_to
         ) AS o) AS open_executions,
        (SELECT least(:burst, b.tokens + :per_second
                      * greatest(0, extract(epoch FROM now() - b.refilled_at)))
         FROM rate_bucket b WHERE b.name = :bucket) AS tokens
    """
)


@blueprint.get("/orgs/<org>/quotas")
@requires_scope(SCOPE_ORG_ADMIN, SCOPE_PLANS_ADMIN)
def read_quotas(org: str) -> Response:
    # Another organization's quotas answer like a path that does not exist.
    if org != current_caller().org:
        raise not_found()
    quotas = api_context().settings.quotas_for(org)
    with engine().connect() as conn:
        use = conn.execute(
            _USE,
            {
                "org": org,
                "burst": float(quotas.transitions_burst),
                "per_second": float(quotas.transitions_per_second),
                "bucket": f"{TRANSITIONS_BUCKET}{org}",
                # Acceptances at the same moment may go a little over the limit
                # (queue/open_executions.py): show by how much, within reason.
                "open_up_to": 2 * quotas.open_executions + 1,
            },
        ).one()
    available = quotas.transitions_burst if use.tokens is None else int(use.tokens)
    answer: dict[str, Any] = {
        "org": org,
        "quotas": {
            "schedules": {"limit": quotas.schedules, "used": use.schedules},
            "scheduleMinSeconds": {"limit": quotas.schedule_min_seconds},
            "transitionsPerSecond": {"limit": quotas.transitions_per_second},
            "transitionsBurst": {
                "limit": quotas.transitions_burst,
                "used": max(0, quotas.transitions_burst - available),
            },
            "openExecutions": {"limit": quotas.open_executions, "used": use.open_executions},
            "bulkItems": {"limit": quotas.bulk_items},
            "rolloutItems": {"limit": quotas.rollout_items},
        },
    }
    return jsonify(answer)
