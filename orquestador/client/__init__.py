"""`Client`: the HTTP API from Python, one typed method per operation of its OpenAPI document.

    from orquestador.client import ApiError, Client

    client = Client("http://127.0.0.1:8080/api/v1", token)
    flow = client.publish_flow(definition)
    request = client.create_request(flow["id"], {"machineId": "vm-17", "diskGb": 250})
    try:
        client.request_transition(request["id"], "approve", expected_revision=1)
    except ApiError as error:
        print(error.status, error.code, error.detail)

Answers are the decoded JSON, as the document describes them; an error answer raises
`ApiError` with its problem, a server that does not answer raises `ApiUnreachable`.
Each method names its operation with `@operation`, so that a test can hold the client
and the document in step.
"""

from orquestador.client.errors import (
    ApiError,
    ApiUnreachable,
    ClientError,
    NotTheApi,
    RequestNotSent,
)
from orquestador.client.operations import Client, Json, operation, operation_methods
from orquestador.client.transport import API_PATH, Transport, api_base, segment

__all__ = [
    "API_PATH",
    "ApiError",
    "ApiUnreachable",
    "Client",
    "ClientError",
    "Json",
    "NotTheApi",
    "RequestNotSent",
    "Transport",
    "api_base",
    "operation",
    "operation_methods",
    "segment",
]
