"""The Python client and the OpenAPI document in step: one method per operation, each calling
the method and path its operation names; and how the client reads an answer."""

from __future__ import annotations

import inspect
import re
import typing
from typing import Any

import pytest
import requests

from orquestador.api.openapi.document import openapi_document
from orquestador.client import ApiError, Client, NotTheApi, operation_methods

# Public methods of the client that call no operation of their own: `wait_execution` is
# several calls of `get_execution` (getExecution with waitFor=final).
NOT_OPERATIONS = {"close", "wait_execution"}


def _operations() -> dict[str, tuple[str, str]]:
    """Each operationId with its (HTTP method, path template)."""
    return {
        spec["operationId"]: (method.upper(), path)
        for path, methods in openapi_document()["paths"].items()
        for method, spec in methods.items()
    }


def test_every_operation_has_exactly_one_client_method() -> None:
    tied = operation_methods()
    missing = sorted(set(_operations()) - set(tied))
    twice = {operation_id: names for operation_id, names in tied.items() if len(names) > 1}

    assert not missing, f"operations without a client method: {', '.join(missing)}"
    assert not twice, f"operations with more than one client method: {twice}"


def test_every_client_method_names_an_operation_of_the_document() -> None:
    unknown = {
        names[0]: operation_id
        for operation_id, names in operation_methods().items()
        if operation_id not in _operations()
    }
    untied = [
        name
        for name, member in inspect.getmembers(Client, inspect.isfunction)
        if not name.startswith("_")
        and not hasattr(member, "operation_id")
        and name not in NOT_OPERATIONS
    ]

    assert not unknown, f"client methods naming no operation of the document: {unknown}"
    assert not untied, f"public client methods without @operation: {', '.join(untied)}"


class RecordingSession(requests.Session):
    """Answers every call alike (200 and `{}` unless told), and keeps what was asked."""

    def __init__(self, status: int = 200, content: bytes = b"{}") -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.status = status
        self.content = content

    def request(self, method: str, url: str, **options: Any) -> requests.Response:  # type: ignore[override]
        self.calls.append((method, url))
        answer = requests.Response()
        answer.status_code = self.status
        answer._content = self.content
        return answer


def _example(name: str, annotation: Any) -> Any:
    """A value of the parameter's type; a string says whose it is, for the path."""
    text = str(annotation)
    if "Mapping" in text or "dict" in text:
        return {}
    if "list" in text:
        return []
    if text.startswith("int") or annotation is int:
        return 1
    return f"{name}-value"


@pytest.mark.parametrize("operation_id", sorted(operation_methods()))
def test_each_method_calls_the_method_and_path_of_its_operation(operation_id: str) -> None:
    method_name = operation_methods()[operation_id][0]
    method = getattr(Client, method_name)
    hints = typing.get_type_hints(method)
    required = [
        parameter
        for parameter in inspect.signature(method).parameters.values()
        if parameter.name != "self" and parameter.default is inspect.Parameter.empty
    ]
    positional = [_example(p.name, hints[p.name]) for p in required if p.kind != p.KEYWORD_ONLY]
    keywords = {
        p.name: _example(p.name, hints[p.name]) for p in required if p.kind == p.KEYWORD_ONLY
    }
    session = RecordingSession()

    getattr(Client("http://api.test", "token", session=session), method_name)(
        *positional, **keywords
    )

    http_method, template = _operations()[operation_id]
    [(called_method, url)] = session.calls
    pattern = re.sub(r"\\\{[^}]+\\\}", "[^/?]+", re.escape("http://api.test/api/v1" + template))
    assert called_method == http_method
    assert re.fullmatch(pattern, url), f"{method_name} called {url}, not {template}"


def test_path_segments_are_quoted() -> None:
    session = RecordingSession()

    Client("http://api.test/api/v1/", "token", session=session).get_schedule("nightly/../x y")

    assert session.calls == [("GET", "http://api.test/api/v1/schedules/nightly%2F..%2Fx%20y")]


def _client(status: int, content: bytes) -> Client:
    return Client("http://api.test", "token", session=RecordingSession(status, content))


def test_no_content_is_none_and_an_error_without_a_problem_keeps_its_text() -> None:
    assert _client(204, b"").delete_schedule("nightly") is None
    with pytest.raises(ApiError) as failed:
        _client(502, b"Bad Gateway").list_schedules()

    assert (failed.value.status, failed.value.problem, failed.value.code) == (502, None, None)
    assert (str(failed.value), failed.value.text) == ("HTTP 502", "Bad Gateway")


def test_a_success_without_json_is_not_the_api() -> None:
    with pytest.raises(NotTheApi) as answered:
        _client(200, b"<html>a web server</html>").list_schedules()

    assert str(answered.value) == "http://api.test/api/v1/schedules answered 200 without JSON"
