"""OpenAPI paths and schemas of bulk actions by query (/executions/bulk, /bulk/{bulkId})."""

from __future__ import annotations

from typing import Any

from orquestador.api import bulk_schemas
from orquestador.api.openapi.parts import (
    READ_ERRORS,
    SECURED,
    WRITE_ERRORS,
    body,
    id_parameter,
    json_response,
    problems,
    ref,
)

# Component schemas this area adds, by name (referenced as #/components/schemas/NAME).
SCHEMAS: dict[str, Any] = {
    "BulkActionRequest": bulk_schemas.BULK_BODY,
    "BulkPreview": bulk_schemas.BULK_PREVIEW,
    "BulkAccepted": bulk_schemas.BULK_ACCEPTED,
    "BulkProgress": bulk_schemas.BULK_PROGRESS,
}


def paths() -> dict[str, Any]:
    return {
        "/executions/bulk": {
            "post": {
                "operationId": "startBulkAction",
                "summary": "Cancel, retry or fail every execution a filter matches",
                "description": "Scope `executions:cancel` for `cancel`, `executions:reconcile` "
                "for `retry` and `fail`; the organization's real executions. With `preview: "
                "true`, 200 with how many match and the newest ten; nothing is recorded. "
                "Otherwise 202: the matching executions are fixed as the bulk's items in the "
                "accepting transaction, and the worker acts on them in chunks, one "
                "transaction per item, each under the rules of the single-execution route "
                "(cancel, or the decision with whichever step is in doubt) with the caller "
                "and the reason in its audit row and the bulk's id beside them. An item the "
                "rules refuse is recorded with its code and never forced; a worker that dies "
                "leaves the bulk for the next, which acts on no item twice. Progress at "
                "`GET /bulk/{bulkId}`.",
                "security": SECURED,
                "requestBody": body(ref("BulkActionRequest")),
                "responses": {
                    "200": json_response(ref("BulkPreview"), "The preview (preview: true)."),
                    "202": json_response(
                        ref("BulkAccepted"),
                        "Accepted; the worker acts on the items.",
                        Location="The bulk's progress.",
                    ),
                    **problems(
                        *WRITE_ERRORS,
                        s403="The token lacks the action's scope (`INSUFFICIENT_SCOPE`).",
                        s422="`BODY_INVALID`: an unknown action, an empty reason or filter, "
                        "an unknown field, a flowId that is no UUID, an instant without its "
                        "offset; `BULK_TOO_LARGE`: more than 100000 executions match.",
                    ),
                },
            },
        },
        "/bulk/{bulkId}": {
            "get": {
                "operationId": "getBulkAction",
                "summary": "A bulk action's progress and the items refused",
                "description": "Scope `executions:cancel` or `executions:reconcile`; a bulk "
                "of the caller's organization (another organization's answers 404, like a "
                "missing one). `done` counts the items with an outcome, `succeeded` those "
                "acted on; `refused` lists the others with their problem code.",
                "security": SECURED,
                "parameters": [id_parameter("bulkId")],
                "responses": {
                    "200": json_response(ref("BulkProgress"), "The bulk as it stands."),
                    **problems(*READ_ERRORS),
                },
            },
        },
    }
