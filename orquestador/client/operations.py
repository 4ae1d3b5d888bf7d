"""`Client`: one typed method per operation of the OpenAPI document, tied by `@operation`."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import requests

from orquestador.client.errors import ApiError
from orquestador.client.transport import Transport, segment
from orquestador.domain.statuses import FINAL, ExecutionStatus

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


# The server holds one wait at most this long; a longer one is several calls.
MAX_WAIT_SECONDS = 30.0
# Kept between a call's wait and its read timeout, for the answer to travel.
_WAIT_MARGIN_SECONDS = 5.0


def settled(view: Mapping[str, Any]) -> bool:
    """Whether an ExecutionView will not move again without a person: it ended, it is
    parked for a decision (RECONCILIATION_REQUIRED), or it waits on an approval."""
    status = view.get("status")
    if status in FINAL or status == ExecutionStatus.RECONCILIATION_REQUIRED:
        return True
    return bool(view.get("waitingForApproval"))


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
        # `transport.call(method, path, ...)` reaches a path by hand, should one be missing.
        self.transport = Transport(base_url, token, session, timeout)

    def close(self) -> None:
        self.transport.close()

    # --- flows and capabilities -----------------------------------------------------------

    @operation("listFlows")
    def list_flows(self, key: str | None = None) -> Json:
        return self.transport.call("GET", "/flows", params=_query(key=key))

    @operation("publishFlow")
    def publish_flow(self, definition: Mapping[str, Any]) -> Json:
        return self.transport.call("POST", "/flows", json=definition)

    @operation("getFlow")
    def get_flow(self, flow_id: str) -> Json:
        return self.transport.call("GET", f"/flows/{segment(flow_id)}")

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
        return self.transport.call("POST", f"/flows/{segment(flow_id)}/dry-runs", json=body)

    @operation("listCapabilities")
    def list_capabilities(self) -> Json:
        return self.transport.call("GET", "/capabilities")

    # --- requests and executions ----------------------------------------------------------

    @operation("createRequest")
    def create_request(
        self, flow_id: str, data: Mapping[str, Any], machine_id: str | None = None
    ) -> Json:
        body = _present(flowId=flow_id, data=data, machineId=machine_id)
        return self.transport.call("POST", "/requests", json=body)

    @operation("getRequest")
    def get_request(self, request_id: str) -> Json:
        return self.transport.call("GET", f"/requests/{segment(request_id)}")

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
        return self.transport.call(
            "POST", f"/requests/{segment(request_id)}/transitions", json=body
        )

    @operation("startRun")
    def start_run(
        self,
        flow: str,
        transition: str,
        data: Mapping[str, Any],
        *,
        priority: int | None = None,
        machine_id: str | None = None,
    ) -> Json:
        """A new request on `flow` (a key: its latest version; or a version's id) and its
        `transition` accepted: `{requestId, executionId, flowId, flowKey, flowVersion}`."""
        body = _present(
            flow=flow, transition=transition, data=data, priority=priority, machineId=machine_id
        )
        return self.transport.call("POST", "/runs", json=body)

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
        parent_execution_id: str | None = None,
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
            parentExecutionId=parent_execution_id,
        )
        return self.transport.call("GET", "/executions", params=params)

    @operation("getExecution")
    def get_execution(
        self, execution_id: str, *, wait_for: str | None = None, timeout: float | None = None
    ) -> Json:
        """The ExecutionView; with `wait_for="final"` the server holds the answer until the
        execution settles or `timeout` seconds (at most 30) pass: see `wait_execution`."""
        params = _query(waitFor=wait_for, timeout=None if timeout is None else f"{timeout:.3f}")
        return self.transport.call("GET", f"/executions/{segment(execution_id)}", params=params)

    def wait_execution(self, execution_id: str, timeout: float) -> Json:
        """The execution once it has `settled` (ended, parked for a person, or waiting on
        an approval), or as it is after `timeout` seconds: check its `status`.

        The server holds each call until then, at most 30 s (`waitFor=final`); a longer
        wait is several calls, and a server with no place for one more wait is asked again
        after the Retry-After it sends.
        """
        give_up_at = time.monotonic() + max(0.0, timeout)
        read = self.transport.read_seconds
        # Each call's wait ends well before the transport gives up on its answer.
        longest = MAX_WAIT_SECONDS
        if read is not None:
            longest = min(longest, max(read - _WAIT_MARGIN_SECONDS, read / 2))
        while True:
            left = max(0.0, give_up_at - time.monotonic())
            try:
                view = self.get_execution(
                    execution_id, wait_for="final", timeout=min(longest, left)
                )
            except ApiError as busy:
                if busy.status != 429:
                    raise
                # No place for a wait now: a plain read, then ask again when told.
                view = self.get_execution(execution_id)
                if settled(view) or left <= 0:
                    return view
                time.sleep(min(busy.retry_after or 1.0, left))
                continue
            if settled(view) or time.monotonic() >= give_up_at:
                return view

    @operation("getExecutionEvidence")
    def get_execution_evidence(self, execution_id: str) -> Json:
        return self.transport.call("GET", f"/executions/{segment(execution_id)}/evidence")

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
        return self.transport.call(
            "POST", f"/executions/{segment(execution_id)}/reconciliation", json=body
        )

    @operation("cancelExecution")
    def cancel_execution(self, execution_id: str, reason: str) -> Json:
        """The execution after the cancel: CANCELLED, parked RECONCILIATION_REQUIRED after
        writes, or still RUNNING with `cancelRequested: true` (it stops when its step's
        call returns; `wait_execution` follows it to there). ApiError 409 once ended."""
        return self.transport.call(
            "POST", f"/executions/{segment(execution_id)}/cancel", json={"reason": reason}
        )

    @operation("getRollout")
    def get_rollout(self, execution_id: str) -> Json:
        """The execution's rollout: counts, budget, pause and cancel marks, children."""
        return self.transport.call("GET", f"/executions/{segment(execution_id)}/rollout")

    @operation("pauseRollout")
    def pause_rollout(self, execution_id: str, reason: str = "") -> Json:
        return self._rollout_mark(execution_id, "pause", reason)

    @operation("resumeRollout")
    def resume_rollout(self, execution_id: str, reason: str = "") -> Json:
        return self._rollout_mark(execution_id, "resume", reason)

    @operation("cancelRollout")
    def cancel_rollout(self, execution_id: str, reason: str) -> Json:
        return self._rollout_mark(execution_id, "cancel", reason)

    @operation("retryFailedRollout")
    def retry_failed_rollout(self, execution_id: str) -> Json:
        """A new run over the rollout's failed items: its request and execution ids."""
        return self.transport.call(
            "POST", f"/executions/{segment(execution_id)}/rollout/retry-failed", json={}
        )

    def _rollout_mark(self, execution_id: str, what: str, reason: str) -> Json:
        body: Json = {"reason": reason} if reason else {}
        return self.transport.call(
            "POST", f"/executions/{segment(execution_id)}/rollout/{what}", json=body
        )

    @operation("startBulkAction")
    def start_bulk_action(
        self, criteria: Mapping[str, Any], action: str, reason: str, *, preview: bool = False
    ) -> Json:
        """With `preview`, how many executions match and a sample; else the bulk started."""
        body: Json = {"filter": criteria, "action": action, "reason": reason}
        if preview:
            body["preview"] = True
        return self.transport.call("POST", "/executions/bulk", json=body)

    @operation("getBulkAction")
    def get_bulk_action(self, bulk_id: str) -> Json:
        return self.transport.call("GET", f"/bulk/{segment(bulk_id)}")

    # --- approvals ------------------------------------------------------------------------

    @operation("listApprovals")
    def list_approvals(
        self, status: str | None = None, limit: int | None = None, after: str | None = None
    ) -> Json:
        params = _query(status=status, limit=limit, after=after)
        return self.transport.call("GET", "/approvals", params=params)

    @operation("getApproval")
    def get_approval(self, approval_id: str) -> Json:
        return self.transport.call("GET", f"/approvals/{segment(approval_id)}")

    @operation("decideApproval")
    def decide_approval(self, approval_id: str, decision: str, comment: str | None = None) -> Json:
        body = _present(decision=decision, comment=comment)
        return self.transport.call("POST", f"/approvals/{segment(approval_id)}/decision", json=body)

    # --- schedules, plans and events ------------------------------------------------------

    @operation("listSchedules")
    def list_schedules(self) -> Json:
        return self.transport.call("GET", "/schedules")

    @operation("getSchedule")
    def get_schedule(self, schedule_id: str) -> Json:
        return self.transport.call("GET", f"/schedules/{segment(schedule_id)}")

    @operation("putSchedule")
    def put_schedule(
        self,
        schedule_id: str,
        flow: str,
        *,
        transition: str | None = None,
        cron: str | None = None,
        every_seconds: int | None = None,
        timezone: str | None = None,
        data: Mapping[str, Any] | None = None,
        catch_up: str | None = None,
        paused: bool | None = None,
    ) -> Json:
        """Create the schedule, or replace it whole; exactly one of `cron`, `every_seconds`.

        `flow` is a key (each fire starts its latest version) or a flow version's id."""
        body = _present(
            flow=flow,
            transition=transition,
            cron=cron,
            everySeconds=every_seconds,
            timezone=timezone,
            data=data,
            catchUp=catch_up,
            paused=paused,
        )
        return self.transport.call("PUT", f"/schedules/{segment(schedule_id)}", json=body)

    @operation("runSchedule")
    def run_schedule(self, schedule_id: str) -> Json:
        """Fire the schedule once, now: the request and execution it started."""
        return self.transport.call("POST", f"/schedules/{segment(schedule_id)}/runs")

    @operation("deleteSchedule")
    def delete_schedule(self, schedule_id: str) -> None:
        self.transport.call("DELETE", f"/schedules/{segment(schedule_id)}")

    @operation("getPlan")
    def get_plan(self, plan_id: str) -> Json:
        return self.transport.call("GET", f"/plans/{segment(plan_id)}")

    @operation("putPlan")
    def put_plan(self, plan_id: str, name: str) -> Json:
        return self.transport.call("PUT", f"/plans/{segment(plan_id)}", json={"name": name})

    @operation("bindPlanFlow")
    def bind_plan_flow(self, plan_id: str, moment: str, flow_id: str) -> Json:
        path = f"/plans/{segment(plan_id)}/bindings/{segment(moment)}"
        return self.transport.call("PUT", path, json={"flowId": flow_id})

    @operation("unbindPlanFlow")
    def unbind_plan_flow(self, plan_id: str, moment: str) -> None:
        self.transport.call("DELETE", f"/plans/{segment(plan_id)}/bindings/{segment(moment)}")

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
        return self.transport.call("POST", "/events", json=body)

    # --- machines and their agents --------------------------------------------------------

    @operation("revokeMachineCredentials")
    def revoke_machine_credentials(self, machine_id: str) -> Json:
        return self.transport.call("DELETE", f"/machines/{segment(machine_id)}/credentials")

    @operation("listMachines")
    def list_machines(self, limit: int | None = None, after: str | None = None) -> Json:
        """The organization's machines, each with its agent's liveness."""
        return self.transport.call("GET", "/machines", params=_query(limit=limit, after=after))

    @operation("getMachine")
    def get_machine(self, machine_id: str) -> Json:
        return self.transport.call("GET", f"/machines/{segment(machine_id)}")

    @operation("listMachineCommands")
    def list_machine_commands(self, machine_id: str, limit: int | None = None) -> Json:
        """A machine's newest commands."""
        return self.transport.call(
            "GET", f"/machines/{segment(machine_id)}/commands", params=_query(limit=limit)
        )

    @operation("getCommandOutput")
    def get_command_output(
        self, machine_id: str, command_id: str, after: int | None = None
    ) -> Json:
        """What was kept of a command's output past byte `after`, and where to ask next."""
        return self.transport.call(
            "GET",
            f"/machines/{segment(machine_id)}/commands/{segment(command_id)}/output",
            params=_query(after=after),
        )

    @operation("takeNextCommand")
    def take_next_command(self, wait: float | None = None) -> Json | None:
        """The next command for the token's machine, or None when none came within `wait`."""
        return self.transport.call("POST", "/agent/commands/next", params=_query(wait=wait))

    @operation("reportCommandStatus")
    def report_command_status(
        self,
        command_id: str,
        status: str,
        exit_code: int | None = None,
        output: str | None = None,
        output_offset: int | None = None,
    ) -> Json:
        body = _present(
            status=status, exitCode=exit_code, output=output, outputOffset=output_offset
        )
        return self.transport.call(
            "POST", f"/agent/commands/{segment(command_id)}/status", json=body
        )

    # --- notices and preferences ----------------------------------------------------------

    @operation("listNotices")
    def list_notices(
        self,
        include_dismissed: bool | None = None,
        limit: int | None = None,
        after: str | None = None,
        test: bool | None = None,
    ) -> Json:
        """One page of the panel; `test=True`: the dry runs' notices instead."""
        params = _query(includeDismissed=include_dismissed, limit=limit, after=after, test=test)
        return self.transport.call("GET", "/notices", params=params)

    @operation("dismissNotice")
    def dismiss_notice(self, notice_id: str) -> Json:
        return self.transport.call("POST", f"/notices/{segment(notice_id)}/dismiss")

    @operation("readQuotas")
    def get_quotas(self, org: str) -> Json:
        return self.transport.call("GET", f"/orgs/{segment(org)}/quotas")

    @operation("readNotificationPreferences")
    def get_notification_preferences(self, org: str) -> Json:
        return self.transport.call("GET", f"/orgs/{segment(org)}/notification-preferences")

    @operation("replaceNotificationPreferences")
    def replace_notification_preferences(
        self, org: str, opt_out: list[str], recipients: list[str]
    ) -> Json:
        body = {"optOut": opt_out, "recipients": recipients}
        return self.transport.call(
            "PUT", f"/orgs/{segment(org)}/notification-preferences", json=body
        )

    # --- sign-in links and the service itself ---------------------------------------------

    @operation("createSignInLink")
    def create_sign_in_link(
        self, sub: str, org: str, scope: str, next_page: str | None = None
    ) -> Json:
        """A one-time sign-in link, `{url, ...}`, for `sub` with the space-separated `scope`."""
        body = _present(sub=sub, org=org, scope=scope, next=next_page)
        return self.transport.call("POST", "/auth/links", json=body)

    @operation("healthz")
    def health(self) -> Json:
        return self.transport.call("GET", "/healthz")

    @operation("readyz")
    def readiness(self) -> Json:
        return self.transport.call("GET", "/readyz")

    @operation("openapi")
    def openapi_document(self) -> Json:
        return self.transport.call("GET", "/openapi.json")
