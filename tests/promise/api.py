"""What users and operators do, through the API's own routes (the Flask app, in process).

Flows are published, plans bound, requests started and transitions accepted by their
owner; cancels, evidence and decisions by an operator. While the database is away (a
restart) the API answers 503, and a call is tried again until it gets a real answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from flask import Flask

from orquestador.api.app import create_app
from orquestador.api.tokens import mint_token
from orquestador.config import Settings
from tests.promise.flows import EVENT_FLOW, FLOWS, MACHINE_FLOW, MOMENT, PLAN, definition

log = logging.getLogger(__name__)

ORG = "promise-org"
SECRET = "promise-checker-signing-key-" + "0123456789abcdef" * 2
OWNER_SCOPES = ["flows:admin", "requests:read", "requests:write", "plans:admin"]
OPERATOR_SCOPES = ["executions:reconcile", "executions:cancel", "requests:read-all"]
APPROVER_SCOPES = ["approvals:decide"]
AWAY_SECONDS = 30.0  # how long a call keeps trying while the API answers 503


class ApiError(Exception):
    """The API answered something the checker did not expect."""


class Api:
    """The product's HTTP routes, called as alice (an owner), carol (an operator) and dave
    (an approver)."""

    def __init__(self, runtime_url: str, max_attempts: int) -> None:
        self.settings = Settings.from_env(
            {},
            database_url=runtime_url,
            request_api_enabled=True,
            flow_admin_enabled=True,
            jwt_secret=SECRET,
            adapter_modules="tests.promise.adapters",
            execution_max_attempts=max_attempts,
            log_level="WARNING",
            # The checker's schedule fires every few seconds (the default quota is 60 s).
            schedule_min_seconds=1,
        )
        self.app: Flask = create_app(self.settings)
        self.owner = self._token("alice", OWNER_SCOPES)
        self.operator = self._token("carol", OPERATOR_SCOPES)
        self.approver = self._token("dave", APPROVER_SCOPES)
        self.flows: dict[str, str] = {}
        # Answers of 500 and up other than 503: the API promises never to give one.
        self.server_errors: list[str] = []

    def _token(self, sub: str, scopes: list[str]) -> str:
        return mint_token(self.settings, sub=sub, org=ORG, scopes=scopes, ttl_seconds=24 * 3600)

    def close(self) -> None:
        self.app.extensions["orquestador"].engine.dispose()

    def call(
        self,
        method: str,
        path: str,
        token: str,
        body: dict[str, Any] | None = None,
        *,
        again_on_503: bool = True,
    ) -> tuple[int, Any]:
        """(status, JSON body); a 503 (the database away) is tried again for a while, unless
        `again_on_503` is False."""
        deadline = time.monotonic() + AWAY_SECONDS if again_on_503 else 0.0
        while True:
            response = self.app.test_client().open(
                f"/api/v1{path}",
                method=method,
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            )
            if response.status_code != 503 or time.monotonic() > deadline:
                answer = response.get_json(silent=True)
                # A 503 not tried again is the answer an outage gives, not an anomaly.
                if response.status_code >= 500 and (again_on_503 or response.status_code != 503):
                    self.server_errors.append(f"{method} {path}: {response.status_code} {answer}")
                return response.status_code, answer
            time.sleep(0.25)

    def _expect(self, status: int, answer: tuple[int, Any], what: str) -> Any:
        if answer[0] != status:
            raise ApiError(f"{what}: {answer[0]} {answer[1]}")
        return answer[1]

    # --- the owner --------------------------------------------------------------------

    def set_up(self) -> None:
        """Publish every flow and bind the event flow to the plan's moment."""
        # The rollout's child flow (checkout) is published before the rollout names it.
        for name in (*FLOWS, MACHINE_FLOW):
            answer = self.call("POST", "/flows", self.owner, definition(name))
            self.flows[name] = self._expect(201, answer, f"publish {name}")["id"]
        answer = self.call("PUT", f"/plans/{PLAN}", self.owner, {"name": "promise"})
        if answer[0] not in (200, 201):
            raise ApiError(f"put plan: {answer}")
        body = {"flowId": self.flows[EVENT_FLOW]}
        self._expect(
            200, self.call("PUT", f"/plans/{PLAN}/bindings/{MOMENT}", self.owner, body), "bind"
        )

    def start(
        self, flow: str, case: str, more: dict[str, Any] | None = None
    ) -> tuple[uuid.UUID, uuid.UUID]:
        """Create the case's request and accept its transition: (request id, execution id)."""
        body = {"flowId": self.flows[flow], "data": {"case": case, **(more or {})}}
        created = self._expect(201, self.call("POST", "/requests", self.owner, body), "create")
        request_id = created["id"]
        accept = {"transition": "go", "expectedRevision": created["revision"]}
        status, answer = self.call(
            "POST", f"/requests/{request_id}/transitions", self.owner, accept
        )
        if status == 409:
            # An acceptance whose answer was lost to the outage may have committed.
            read = self._expect(
                200, self.call("GET", f"/requests/{request_id}", self.owner), "read"
            )
            if not read.get("executionId"):
                raise ApiError(f"accept {case}: {status} {answer}")
            return uuid.UUID(request_id), uuid.UUID(read["executionId"])
        self._expect(202, (status, answer), f"accept {case}")
        return uuid.UUID(request_id), uuid.UUID(answer["executionId"])

    # --- the operator -----------------------------------------------------------------

    def cancel(self, execution_id: uuid.UUID, reason: str) -> tuple[int, Any]:
        return self.call(
            "POST", f"/executions/{execution_id}/cancel", self.operator, {"reason": reason}
        )

    def evidence(self, execution_id: uuid.UUID) -> dict[str, Any]:
        answer = self.call("GET", f"/executions/{execution_id}/evidence", self.operator)
        return self._expect(200, answer, "evidence")

    def decide(
        self,
        execution_id: uuid.UUID,
        action_id: str | None,
        decision: str,
        reason: str,
        output: dict[str, Any] | None = None,
        correction: list[dict[str, Any]] | None = None,
    ) -> tuple[int, Any]:
        body: dict[str, Any] = {"actionId": action_id, "decision": decision, "reason": reason}
        if output is not None:
            body["output"] = output
        if correction is not None:
            body["correction"] = correction
        # An operator decides on the park they saw: a decision the database did not take
        # (503) is not sent again blindly, since by then the execution may have parked
        # anew (an earlier decision's re-run), and the same words would decide a park
        # nobody saw: a careful operator looks again, as the command line leaves them to.
        return self.call(
            "POST",
            f"/executions/{execution_id}/reconciliation",
            self.operator,
            body,
            again_on_503=False,
        )

    def bulk(self, action: str, reason: str, filter: dict[str, Any]) -> tuple[int, Any]:
        body = {"action": action, "reason": reason, "filter": filter}
        return self.call("POST", "/executions/bulk", self.operator, body)

    # --- an approver ------------------------------------------------------------------

    def decide_approval(self, approval_id: str, decision: str) -> tuple[int, Any]:
        body = {"decision": decision, "comment": "the promise checker decides"}
        return self.call("POST", f"/approvals/{approval_id}/decision", self.approver, body)

    # --- schedules (the owner) --------------------------------------------------------

    def put_schedule(
        self, name: str, flow: str, every: int, case: str, paused: bool = False
    ) -> tuple[int, Any]:
        body = {
            "flowId": self.flows[flow],
            "everySeconds": every,
            "data": {"case": case},
            "catchUp": "all",
            "transition": "go",
            "paused": paused,
        }
        return self.call("PUT", f"/schedules/{name}", self.owner, body)

    # --- a machine's agent ------------------------------------------------------------

    def agent_token(self, machine: str) -> str:
        return mint_token(
            self.settings, sub=f"machine:{machine}", org=ORG, scopes=["agent"], ttl_seconds=3600
        )

    def take_command(self, token: str) -> tuple[int, Any]:
        """One look for the machine's next command (no long poll)."""
        return self.call("POST", "/agent/commands/next?wait=0", token, {})

    def report_command(self, token: str, command_id: str, status: str) -> tuple[int, Any]:
        body: dict[str, Any] = {"status": status}
        if status != "running":
            body["exitCode"] = 0
        return self.call("POST", f"/agent/commands/{command_id}/status", token, body)
