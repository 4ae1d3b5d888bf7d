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

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import requests

API_PATH = "/api/v1"
# (connect, read) seconds: a decision waits for a row lock another operator may hold.
DEFAULT_TIMEOUT = (5.0, 60.0)

Json = dict[str, Any]
Method = TypeVar("Method", bound=Callable[..., Any])


def operation(operation_id: str) -> Callable[[Method], Method]:
    """Tie a client method to the `operationId` it calls."""

    def tie(method: Method) -> Method:
        method.operation_id = operation_id  # type: ignore[attr-defined]
        return method

    return tie


def operation_methods() -> dict[str, list[str]]:
    """Every operationId the client calls, with the names of the methods that call it."""
    found: dict[str, list[str]] = {}
    for name in dir(Client):
        operation_id = getattr(getattr(Client, name), "operation_id", None)
        if operation_id is not None:
            found.setdefault(operation_id, []).append(name)
    return found


class ClientError(Exception):
    """A call of the API did not give an answer to use."""


class ApiError(ClientError):
    """The API answered with an error: its status, its problem document, its text."""

    def __init__(self, status: int, problem: Json | None, text: str) -> None:
        super().__init__(f"HTTP {status}" + (f" {problem['code']}" if problem else ""))
        self.status = status
        self.problem = problem
        self.text = text

    @property
    def code(self) -> str | None:
        """The problem's stable code (`NOT_FOUND`, `FLOW_INVALID`, ...), if it has one."""
        return (self.problem or {}).get("code")

    @property
    def detail(self) -> str | None:
        return (self.problem or {}).get("detail")


class ApiUnreachable(ClientError):
    """The API did not answer: no connection, or no answer in time."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RequestNotSent(ClientError):
    """The call could not be sent: the URL or the token is not one HTTP can carry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotTheApi(ClientError):
    """A success answer without JSON: the base URL is not the orquestador API."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"{url} answered {status} without JSON")
        self.url = url
        self.status = status


def api_base(url: str) -> str:
    """The API's base URL from a server's address, with or without its /api/v1."""
    base = url.rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def segment(value: str) -> str:
    # An id is one path segment, whatever it contains; the server answers 404 to nonsense.
    return quote(str(value), safe="")


def _present(**fields: Any) -> Json:
    """The fields that were given: a left-out option is left out of the body or query."""
    return {name: value for name, value in fields.items() if value is not None}


def _query(**fields: Any) -> Json:
    # The API reads booleans in a query as the JSON words.
    return {
        name: ("true" if value else "false") if isinstance(value, bool) else value
        for name, value in _present(**fields).items()
    }


class Client:
    """The API with one bearer token: JSON in, JSON out, problems raised as `ApiError`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        session: requests.Session | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> None:
        self.base_url = api_base(base_url)
        self.token = token
        self.session = session or requests.Session()
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout

    def close(self) -> None:
        self.session.close()

    # --- flows and capabilities -----------------------------------------------------------

    @operation("listFlows")
    def list_flows(self, key: str | None = None) -> Json:
        return self._call("GET", "/flows", params=_query(key=key))

    @operation("publishFlow")
    def publish_flow(self, definition: Mapping[str, Any]) -> Json:
        return self._call("POST", "/flows", json=definition)

    @operation("getFlow")
    def get_flow(self, flow_id: str) -> Json:
        return self._call("GET", f"/flows/{segment(flow_id)}")

    @operation("startDryRun")
    def start_dry_run(
        self,
        flow_id: str,
        transition: str,
        data: Mapping[str, Any],
        state: str | None = None,
        outcomes: Mapping[str, Any] | None = None,
    ) -> Json:
        body = _present(transition=transition, data=data, state=state, outcomes=outcomes)
        return self._call("POST", f"/flows/{segment(flow_id)}/dry-runs", json=body)

    @operation("listCapabilities")
    def list_capabilities(self) -> Json:
        return self._call("GET", "/capabilities")

    # --- requests and executions ----------------------------------------------------------

    @operation("createRequest")
    def create_request(
        self, flow_id: str, data: Mapping[str, Any], machine_id: str | None = None
    ) -> Json:
        body = _present(flowId=flow_id, data=data, machineId=machine_id)
        return self._call("POST", "/requests", json=body)

    @operation("getRequest")
    def get_request(self, request_id: str) -> Json:
        return self._call("GET", f"/requests/{segment(request_id)}")

    @operation("requestTransition")
    def request_transition(
        self,
        request_id: str,
        transition: str,
        expected_revision: int,
        priority: int | None = None,
    ) -> Json:
        body = _present(
            transition=transition, expectedRevision=expected_revision, priority=priority
        )
        return self._call("POST", f"/requests/{segment(request_id)}/transitions", json=body)

    @operation("listExecutions")
    def list_executions(
        self,
        *,
        status: str | None = None,
        flow_id: str | None = None,
        request_id: str | None = None,
        flow_key: str | None = None,
        error_code: str | None = None,
        machine_id: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        limit: int | None = None,
        after: str | None = None,
        simulation: bool | None = None,
        id_prefix: str | None = None,
    ) -> Json:
        """One page, `{items, next}`; `next` is the `after` of the following page."""
        params = _query(
            status=status,
            flowId=flow_id,
            requestId=request_id,
            flowKey=flow_key,
            errorCode=error_code,
            machineId=machine_id,
            createdAfter=created_after,
            createdBefore=created_before,
            limit=limit,
            after=after,
            simulation=simulation,
            id=id_prefix,
        )
        return self._call("GET", "/executions", params=params)

    @operation("getExecution")
    def get_execution(self, execution_id: str) -> Json:
        return self._call("GET", f"/executions/{segment(execution_id)}")

    @operation("getExecutionEvidence")
    def get_execution_evidence(self, execution_id: str) -> Json:
        return self._call("GET", f"/executions/{segment(execution_id)}/evidence")

    @operation("reconcileExecution")
    def reconcile_execution(
        self,
        execution_id: str,
        *,
        action_id: str | None,
        decision: str,
        reason: str,
        output: Mapping[str, Any] | None = None,
        to_state: str | None = None,
        correction: list[Json] | None = None,
    ) -> Json:
        body = {
            "actionId": action_id,  # null when no step is in doubt
            **_present(
                decision=decision,
                reason=reason,
                output=output,
                toState=to_state,
                correction=correction,
            ),
        }
        return self._call("POST", f"/executions/{segment(execution_id)}/reconciliation", json=body)

    @operation("cancelExecution")
    def cancel_execution(self, execution_id: str, reason: str) -> Json:
        return self._call(
            "POST", f"/executions/{segment(execution_id)}/cancel", json={"reason": reason}
        )

    @operation("startBulkAction")
    def start_bulk_action(
        self, filter: Mapping[str, Any], action: str, reason: str, *, preview: bool = False
    ) -> Json:
        """With `preview`, how many executions match and a sample; else the bulk started."""
        body: Json = {"filter": filter, "action": action, "reason": reason}
        if preview:
            body["preview"] = True
        return self._call("POST", "/executions/bulk", json=body)

    @operation("getBulkAction")
    def get_bulk_action(self, bulk_id: str) -> Json:
        return self._call("GET", f"/bulk/{segment(bulk_id)}")

    # --- approvals ------------------------------------------------------------------------

    @operation("listApprovals")
    def list_approvals(
        self, status: str | None = None, limit: int | None = None, after: str | None = None
    ) -> Json:
        params = _query(status=status, limit=limit, after=after)
        return self._call("GET", "/approvals", params=params)

    @operation("getApproval")
    def get_approval(self, approval_id: str) -> Json:
        return self._call("GET", f"/approvals/{segment(approval_id)}")

    @operation("decideApproval")
    def decide_approval(self, approval_id: str, decision: str, comment: str | None = None) -> Json:
        body = _present(decision=decision, comment=comment)
        return self._call("POST", f"/approvals/{segment(approval_id)}/decision", json=body)

    # --- schedules, plans and events ------------------------------------------------------

    @operation("listSchedules")
    def list_schedules(self) -> Json:
        return self._call("GET", "/schedules")

    @operation("getSchedule")
    def get_schedule(self, schedule_id: str) -> Json:
        return self._call("GET", f"/schedules/{segment(schedule_id)}")

    @operation("putSchedule")
    def put_schedule(
        self,
        schedule_id: str,
        flow_id: str,
        *,
        cron: str | None = None,
        every_seconds: int | None = None,
        timezone: str | None = None,
        data: Mapping[str, Any] | None = None,
        catch_up: str | None = None,
        paused: bool | None = None,
    ) -> Json:
        """Create the schedule, or replace it whole; exactly one of `cron`, `every_seconds`."""
        body = _present(
            flowId=flow_id,
            cron=cron,
            everySeconds=every_seconds,
            timezone=timezone,
            data=data,
            catchUp=catch_up,
            paused=paused,
        )
        return self._call("PUT", f"/schedules/{segment(schedule_id)}", json=body)

    @operation("deleteSchedule")
    def delete_schedule(self, schedule_id: str) -> None:
        self._call("DELETE", f"/schedules/{segment(schedule_id)}")

    @operation("getPlan")
    def get_plan(self, plan_id: str) -> Json:
        return self._call("GET", f"/plans/{segment(plan_id)}")

    @operation("putPlan")
    def put_plan(self, plan_id: str, name: str) -> Json:
        return self._call("PUT", f"/plans/{segment(plan_id)}", json={"name": name})

    @operation("bindPlanFlow")
    def bind_plan_flow(self, plan_id: str, moment: str, flow_id: str) -> Json:
        path = f"/plans/{segment(plan_id)}/bindings/{segment(moment)}"
        return self._call("PUT", path, json={"flowId": flow_id})

    @operation("unbindPlanFlow")
    def unbind_plan_flow(self, plan_id: str, moment: str) -> None:
        self._call("DELETE", f"/plans/{segment(plan_id)}/bindings/{segment(moment)}")

    @operation("postEvent")
    def post_event(
        self,
        event_id: str,
        moment: str,
        plan_id: str,
        machine_id: str,
        occurred_at: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> Json:
        body = _present(
            id=event_id,
            moment=moment,
            planId=plan_id,
            machineId=machine_id,
            occurredAt=occurred_at,
            data=data,
        )
        return self._call("POST", "/events", json=body)

    # --- machines and their agents --------------------------------------------------------

    @operation("revokeMachineCredentials")
    def revoke_machine_credentials(self, machine_id: str) -> Json:
        return self._call("DELETE", f"/machines/{segment(machine_id)}/credentials")

    @operation("takeNextCommand")
    def take_next_command(self, wait: float | None = None) -> Json | None:
        """The next command for the token's machine, or None when none came within `wait`."""
        return self._call("POST", "/agent/commands/next", params=_query(wait=wait))

    @operation("reportCommandStatus")
    def report_command_status(
        self,
        command_id: str,
        status: str,
        exit_code: int | None = None,
        output: str | None = None,
    ) -> Json:
        body = _present(status=status, exitCode=exit_code, output=output)
        return self._call("POST", f"/agent/commands/{segment(command_id)}/status", json=body)

    # --- notices and preferences ----------------------------------------------------------

    @operation("listNotices")
    def list_notices(
        self,
        include_dismissed: bool | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> Json:
        params = _query(includeDismissed=include_dismissed, limit=limit, after=after)
        return self._call("GET", "/notices", params=params)

    @operation("dismissNotice")
    def dismiss_notice(self, notice_id: str) -> Json:
        return self._call("POST", f"/notices/{segment(notice_id)}/dismiss")

    @operation("readNotificationPreferences")
    def get_notification_preferences(self, org: str) -> Json:
        return self._call("GET", f"/orgs/{segment(org)}/notification-preferences")

    @operation("replaceNotificationPreferences")
    def replace_notification_preferences(
        self, org: str, opt_out: list[str], recipients: list[str]
    ) -> Json:
        body = {"optOut": opt_out, "recipients": recipients}
        return self._call("PUT", f"/orgs/{segment(org)}/notification-preferences", json=body)

    # --- sign-in links and the service itself ---------------------------------------------

    @operation("createSignInLink")
    def create_sign_in_link(
        self, sub: str, org: str, scope: str, next_page: str | None = None
    ) -> Json:
        """A one-time sign-in link, `{url, ...}`, for `sub` with the space-separated `scope`."""
        body = _present(sub=sub, org=org, scope=scope, next=next_page)
        return self._call("POST", "/auth/links", json=body)

    @operation("healthz")
    def health(self) -> Json:
        return self._call("GET", "/healthz")

    @operation("readyz")
    def readiness(self) -> Json:
        return self._call("GET", "/readyz")

    @operation("openapi")
    def openapi_document(self) -> Json:
        return self._call("GET", "/openapi.json")

    # --- the one way every call is made ---------------------------------------------------

    def _call(self, method: str, path: str, **options: Any) -> Any:
        """The answer's JSON; None for 204. Raises a `ClientError` for anything else."""
        url = self.base_url + path
        try:
            response = self.session.request(
                method,
                url,
                headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
                timeout=self.timeout,
                **options,
            )
        except requests.ConnectionError as error:
            reason = connection_failure_reason(error)
            raise ApiUnreachable(
                f"cannot reach the API at {self.base_url}: {reason}", reason
            ) from None
        except requests.Timeout:
            waited = self.timeout[1] if isinstance(self.timeout, tuple) else self.timeout
            raise ApiUnreachable(
                f"the API at {self.base_url} did not answer within {waited:.0f} s",
                "timed out",
            ) from None
        except requests.RequestException as error:
            raise RequestNotSent(connection_failure_reason(error)) from None
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if not response.ok:
            raise ApiError(
                response.status_code, body if isinstance(body, dict) else None, response.text
            )
        if body is None:
            raise NotTheApi(url, response.status_code)
        return body


def connection_failure_reason(error: BaseException) -> str:
    """The operating system's words for a failed connection, else the error's first line."""
    seen: set[int] = set()
    pending: list[Any] = [error]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        # requests and urllib3 keep the cause in args, `reason` or the exception chain.
        pending += [*current.args, getattr(current, "reason", None)]
        pending += [current.__cause__, current.__context__]
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
