"""Executions: the ExecutionView, the listing, an operator's evidence and decisions, and cancel."""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from flask.blueprints import BlueprintSetupState
from jsonschema import Draft202012Validator
from sqlalchemy import Connection, Row, func, select

from orquestador.api.access import ExecutionFilter, Reach, ResourceAccess
from orquestador.api.auth import Caller, current_caller, requires_scope
from orquestador.api.body import pointer, read_json_object, unstorable_text
from orquestador.api.capability_routes import ADAPTERS_EXTENSION as ADAPTERS_EXTENSION
from orquestador.api.capability_routes import app_adapters
from orquestador.api.claims import (
    SCOPE_EXECUTIONS_CANCEL,
    SCOPE_EXECUTIONS_RECONCILE,
    SCOPE_REQUESTS_READ,
    SCOPE_REQUESTS_WRITE,
)
from orquestador.api.context import EXTENSION_KEY, api_context, engine
from orquestador.api.execution_waits import (
    MAX_WAIT_SECONDS,
    WAIT_FOR_FINAL,
    WAIT_RETRY_AFTER_SECONDS,
    WaitShare,
    settled,
    wait_until_settled,
)
from orquestador.api.flow_store import find_flow
from orquestador.api.paging import cursor, query_problem, read_cursor
from orquestador.api.problems import ApiProblem, not_found
from orquestador.api.schemas import CANCEL_BODY, RECONCILIATION_BODY
from orquestador.api.views import (
    API_PREFIX,
    ExecutionFacts,
    command_ids,
    evidence_view,
    execution_view,
    execution_views,
    group_facts,
    wait_seconds,
)
from orquestador.db.schema import EXECUTION_STATUSES
from orquestador.domain.statuses import CheckpointStatus, ExecutionStatus
from orquestador.domain.typed_text import TextNotUnderstood, value_from_text
from orquestador.errors import (
    IntegrationUnavailable,
    Problem,
)
from orquestador.machines.liveness import agents_seen
from orquestador.queue.reconciliation import (
    Cancelled,
    Resolution,
    cancel,
    resolve,
    step_in_doubt,
)
from orquestador.queue.waits import NOT_READY

log = logging.getLogger(__name__)

blueprint = Blueprint("executions", __name__, url_prefix=f"{API_PREFIX}/executions")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200

# ADAPTERS_EXTENSION is imported above under its own name: tests and embedders have
# named it through this module.

F = TypeVar("F", bound=Callable[..., Any])


# --- reading -------------------------------------------------------------------------


@blueprint.get("")
@requires_scope(SCOPE_REQUESTS_READ)
def listing() -> Response:
    refuse_unknown_filters(request.args)
    page = execution_filter(request.args)
    access = ResourceAccess(current_caller())
    # One snapshot: the page, then the steps and attempts of its executions, one query each.
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            rows = access.list_executions(connection, page)
            more, rows = len(rows) > page.limit, rows[: page.limit]
            ids = [row.id for row in rows]
            steps = access.steps_of(connection, ids) if ids else []
            attempts = access.attempts_of(connection, ids) if ids else []
            facts = read_view_facts(connection, access, ids, steps)
    return jsonify(
        {
            "items": execution_views(rows, steps, attempts, facts),
            "next": cursor(rows[-1]) if more else None,
        }
    )


@blueprint.get("/<uuid:execution_id>")
@requires_scope(SCOPE_REQUESTS_READ)
def read(execution_id: uuid.UUID) -> Response:
    access = ResourceAccess(current_caller())
    seconds = _wait_seconds(request.args)
    if seconds is not None:
        _wait_for_settled(access, execution_id, seconds)
    return jsonify(_view_or_404(access, execution_id))


WAIT_SHARE_EXTENSION = "orquestador.execution_wait_share"


@blueprint.record_once
def _add_wait_share(state: BlueprintSetupState) -> None:
    # Per app, as the agents' poll share: gunicorn builds one app per worker process.
    settings = state.app.extensions[EXTENSION_KEY].settings
    state.app.extensions[WAIT_SHARE_EXTENSION] = WaitShare(
        settings.execution_wait_share, settings.agent_poll_share, settings.api_threads
    )


def size_wait_share(app: Flask, threads: int) -> None:
    """Bound the app's waits by the request threads its server runs (none: no such routes)."""
    share = app.extensions.get(WAIT_SHARE_EXTENSION)
    if isinstance(share, WaitShare):
        share.size_for(threads)


def _wait_seconds(args: Mapping[str, str]) -> float | None:
    """`waitFor=final` and its `timeout` (seconds, at most 30; default 30), or None."""
    wait_for, timeout = args.get("waitFor"), args.get("timeout")
    if wait_for is None:
        if timeout is not None:
            raise query_problem("timeout", "goes with waitFor=final")
        return None
    if wait_for != WAIT_FOR_FINAL:
        raise query_problem("waitFor", f"only {WAIT_FOR_FINAL!r}")
    if timeout is None:
        return MAX_WAIT_SECONDS
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT_SECONDS:  # NaN fails both comparisons
        raise query_problem("timeout", f"seconds from 0 to {MAX_WAIT_SECONDS:g}")
    return seconds


def _wait_for_settled(access: ResourceAccess, execution_id: uuid.UUID, seconds: float) -> None:
    """Hold the request until the execution settles or `seconds` pass (see execution_waits)."""

    def look() -> tuple[str, object | None] | None:
        with engine().connect() as connection:
            row = access.find_execution(connection, execution_id)
        return None if row is None else (row.status, row.open_approval_id)

    found = look()
    if found is None:
        raise not_found()
    if seconds == 0 or settled(*found):
        return
    share: WaitShare = current_app.extensions[WAIT_SHARE_EXTENSION]
    if not share.take():
        raise ApiProblem(
            429,
            "EXECUTION_WAITS_BUSY",
            "This API process holds as many waits as it allows; ask again after "
            "Retry-After seconds.",
            headers={"Retry-After": str(WAIT_RETRY_AFTER_SECONDS)},
        )
    try:
        wait_until_settled(look, seconds)
    finally:
        share.give_back()


@blueprint.get("/<uuid:execution_id>/evidence")
@requires_scope(SCOPE_EXECUTIONS_RECONCILE)
def evidence(execution_id: uuid.UUID) -> Response:
    found = read_evidence(current_caller(), execution_id)
    if found is None:
        raise not_found()
    return jsonify(found)


def read_evidence(caller: Caller, execution_id: uuid.UUID) -> dict[str, Any] | None:
    """The evidence an operator decides by (the API's and the pages' one read), or None."""
    access = ResourceAccess(caller, Reach.ORGANIZATION)
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            row = access.find_execution(connection, execution_id)
            if row is None:
                return None
            checkpoints = access.evidence_steps(connection, execution_id)
            attempts = access.execution_attempts(connection, execution_id)
            audit = access.execution_audit(connection, execution_id)
            facts = read_view_facts(connection, access, [execution_id])[execution_id]
    in_doubt = None
    if row.status == ExecutionStatus.RECONCILIATION_REQUIRED:
        # The same rule the decision is checked with, on the same ordering of checkpoints.
        step = step_in_doubt(checkpoints)
        in_doubt = step.action_id if step is not None else None
    return evidence_view(row, checkpoints, attempts, audit, in_doubt, facts)


# --- deciding ------------------------------------------------------------------------


@blueprint.post("/<uuid:execution_id>/reconciliation")
@requires_scope(SCOPE_EXECUTIONS_RECONCILE)
def reconcile(execution_id: uuid.UUID) -> Response:
    return jsonify(
        reconcile_as(current_caller(), execution_id, read_json_object(RECONCILIATION_BODY))
    )


def reconcile_as(caller: Caller, execution_id: uuid.UUID, body: dict[str, Any]) -> dict[str, Any]:
    """Record `caller`'s reconciliation decision (a body of RECONCILIATION_BODY's shape):
    the API's and the pages' one way. The view after it."""
    decision = body["decision"]
    misplaced = [
        Problem(f"/{name}", f"only a {needs} decision takes {name}")
        for name, needs in (("output", "confirm"), ("toState", "fail"), ("correction", "retry"))
        if name in body and decision != needs
    ]
    if misplaced:
        raise ApiProblem(
            422,
            "BODY_INVALID",
            "The body has fields this decision does not take.",
            problems=misplaced,
        )
    access = ResourceAccess(caller, Reach.ORGANIZATION)
    require_visible(access, execution_id)
    resolution = Resolution(
        execution_id=execution_id,
        org_id=caller.org,
        actor=caller.sub,
        decision=decision,
        reason=body["reason"],
        action_id=body["actionId"],
        output=body.get("output"),
        to_state=body.get("toState"),
        correction=_correction(access, execution_id, body.get("correction")),
    )
    try:
        with engine().connect() as connection:
            status = resolve(
                connection,
                resolution,
                output_problems=_output_problems,
                claims_budget=api_context().settings.execution_max_attempts,
            )
    except IntegrationUnavailable as missing:
        # Not the caller's refusal but the server's lack: said here, where it means
        # that the output cannot be checked.
        raise ApiProblem(
            422,
            missing.code,
            f"{missing.message}: the output cannot be checked, so it cannot be confirmed.",
            problems=[Problem("/output", "no adapter to check it against")],
        ) from None
    log.info(
        "reconciliation resolved: %s",
        decision,
        extra={"execution_id": str(execution_id), "decision": decision, "status": status},
    )
    return _view_or_404(access, execution_id)


@blueprint.post("/<uuid:execution_id>/cancel")
@requires_scope(SCOPE_EXECUTIONS_CANCEL, SCOPE_REQUESTS_WRITE)
def cancel_execution(execution_id: uuid.UUID) -> Response:
    body = read_json_object(CANCEL_BODY)
    view, cancelled = cancel_as(current_caller(), execution_id, body["reason"])
    # Which of its machine commands no agent will get, and which agents were asked to
    # stop: the view reads it from the cancel's audit row; this answer says it outright.
    return jsonify({**view, "machineCommands": cancelled.commands.as_json()})


def may_cancel(caller: Caller) -> bool:
    return caller.has_scope(SCOPE_EXECUTIONS_CANCEL) or caller.has_scope(SCOPE_REQUESTS_WRITE)


def cancel_as(
    caller: Caller, execution_id: uuid.UUID, reason: str
) -> tuple[dict[str, Any], Cancelled]:
    """Cancel for `caller` (the API's and the pages' one way): the view after, and what it did.

    executions:cancel reaches the whole organization; requests:write only the caller's
    own requests. 200 either way: the cancel was applied as the write rule allows. After
    a write done or in doubt the view says RECONCILIATION_REQUIRED, CANCELLED_AFTER_WRITES,
    and names the writes; the request stays busy until an operator decides. A RUNNING
    execution answers with `cancelRequested`: its holder applies the cancel when the
    step's call returns (a call is never cut).
    """
    operator = caller.has_scope(SCOPE_EXECUTIONS_CANCEL)
    access = ResourceAccess(caller, Reach.ORGANIZATION if operator else Reach.OWN)
    require_visible(access, execution_id, readable_by=None if operator else caller)
    with engine().connect() as connection:
        cancelled = cancel(
            connection, execution_id, org_id=caller.org, actor=caller.sub, reason=reason
        )
    if cancelled.requested:
        said = "cancel requested; the step's call is running"
    elif cancelled.status == ExecutionStatus.CANCELLED:
        said = "execution cancelled"
    else:
        said = "cancel parked the execution"
    log.info(said, extra={"execution_id": str(execution_id), "status": cancelled.status})
    return _view_or_404(access, execution_id), cancelled


# --- helpers -------------------------------------------------------------------------


def read_view_facts(
    connection: Connection,
    access: ResourceAccess,
    execution_ids: list[uuid.UUID],
    steps: Iterable[Row] = (),
) -> dict[uuid.UUID, ExecutionFacts]:
    """Then and now for visible executions: the frozen audit facts, and the current rows
    of the commands they name, read in the caller's snapshot, scoped by organization.

    `steps` (the executions' checkpoints) tell which waits are paused: what they wait
    for is looked up too."""
    if not execution_ids:
        return {}
    parsed = group_facts(execution_ids, access.view_audit_of(connection, execution_ids))
    wanted = {c for observed, *_ in parsed.values() for c in command_ids(observed)}
    waiting, read_at = _waits(connection, access, execution_ids, steps)
    wanted |= {c for _, commands in waiting.values() for c in commands}
    commands = access.commands_now(connection, sorted(wanted))
    agents = agents_seen(
        connection,
        org_id=access.caller.org,
        machine_ids=[row.machine_id for row in commands.values()],
        offline_seconds=api_context().settings.agent_offline_seconds,
    )
    key_waits = access.key_holders(connection, execution_ids)
    return {
        key: ExecutionFacts(
            observed=observed,
            commands=commands,
            decision=decision,
            would_have_done=simulated,
            wait_seconds=waiting.get(key, ({}, []))[0],
            read_at=read_at,
            machine_commands=machine_commands,
            key_wait=key_waits.get(key),
            agents=agents,
            interrupted=interrupted,
        )
        for key, (observed, decision, simulated, machine_commands, interrupted) in parsed.items()
    }


def _waits(
    connection: Connection,
    access: ResourceAccess,
    execution_ids: list[uuid.UUID],
    steps: Iterable[Row],
) -> tuple[dict[uuid.UUID, tuple[dict[str, float], list[uuid.UUID]]], datetime]:
    """Per WAITING execution, its waits' deadlines in seconds and the commands they wait
    for; and the database's clock, which time left counts from."""
    read_at = connection.execute(select(func.clock_timestamp())).scalar_one()
    contexts = access.waiting_contexts(connection, execution_ids)
    if not contexts:
        return {}, read_at
    paused: dict[uuid.UUID, list[Row]] = {}
    for step in steps:
        if step.status == CheckpointStatus.FAILED and step.error_code == NOT_READY:
            paused.setdefault(step.execution_id, []).append(step)
    found: dict[uuid.UUID, tuple[dict[str, float], list[uuid.UUID]]] = {}
    for context in contexts:
        waits = paused.get(context.id, [])
        seconds = wait_seconds(
            context.definition,
            context.transition_id,
            context.data,
            [w.action_id for w in waits],
        )
        found[context.id] = (seconds, command_ids({w.action_id: w.observed for w in waits}))
    return found, read_at


class ExecutionRead(NamedTuple):
    row: Any
    view: dict[str, Any]
    attempts: list[Row]
    # For the page only: the whole audit trail, oldest first, and the request as it is now.
    audit: list[Row]
    request: Row | None


def read_execution(
    access: ResourceAccess, execution_id: uuid.UUID, *, for_page: bool = False
) -> ExecutionRead | None:
    """The execution row and its ExecutionView, or None when the caller cannot see it.

    One snapshot for the execution, its steps, the commands it names and (for the page)
    its audit trail and request, so they agree with each other.
    """
    with engine().connect() as connection:
        connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            row = access.find_execution(connection, execution_id)
            if row is None:
                return None
            steps = access.execution_steps(connection, execution_id)
            attempts = access.execution_attempts(connection, execution_id)
            facts = read_view_facts(connection, access, [execution_id], steps)[execution_id]
            audit, now = [], None
            if for_page:
                audit = access.execution_audit(connection, execution_id)
                now = access.find_request(connection, row.request_id)
    view = execution_view(row, steps, attempts, facts)
    return ExecutionRead(row, view, attempts, audit, now)


def _view_or_404(access: ResourceAccess, execution_id: uuid.UUID) -> dict[str, Any]:
    found = read_execution(access, execution_id)
    if found is None:
        raise not_found()
    return found.view


def require_visible(
    access: ResourceAccess, execution_id: uuid.UUID, *, readable_by: Caller | None = None
) -> None:
    """404 unless `access` reaches the execution; 403 when the caller may read but not act.

    The protocol functions check only the organization; the owner and scope part of
    visibility is settled here, before them, so a foreign id is the same 404 as a
    missing one.
    """
    with engine().connect() as connection:
        if access.find_execution(connection, execution_id) is not None:
            return
        if readable_by is not None and (
            ResourceAccess(readable_by).find_execution(connection, execution_id) is not None
        ):
            raise ApiProblem(
                403,
                "INSUFFICIENT_SCOPE",
                "Cancelling an execution of a request you do not own needs the "
                f"{SCOPE_EXECUTIONS_CANCEL} scope.",
            )
    raise not_found()


def _output_problems(capability: str, version: int, output: Any) -> list[str]:
    """Where a confirmed output breaks the adapter's output schema, as JSON Pointers.

    The validator's words are kept for the answer (`g.output_messages`): the output is
    the operator's own, so they may see it quoted back.
    """
    adapter = app_adapters().get(capability, version)
    validator = Draft202012Validator(
        adapter.output_schema, format_checker=Draft202012Validator.FORMAT_CHECKER
    )
    messages: dict[str, str] = {}
    for error in validator.iter_errors(output):
        messages.setdefault(pointer(error.absolute_path), error.message)
    g.output_messages = messages
    return sorted(messages)


def _correction(
    access: ResourceAccess, execution_id: uuid.UUID, entries: list[dict[str, Any]] | None
) -> tuple[tuple[str, Any], ...] | None:
    """The body's `[{path, value} | {path, text}]` as the (path, value) pairs of a
    Resolution. A `text` is read by the flow's data schema at its path (the execution's
    pinned version: it never changes); 422 CORRECTION_INVALID when it cannot be read."""
    if entries is None:
        return None
    schema: Any = None
    if any("text" in entry for entry in entries):
        with engine().connect() as connection:
            row = access.find_execution(connection, execution_id)
            found = (
                find_flow(connection, org=access.caller.org, flow_id=row.flow_id)
                if row is not None
                else None
            )
        schema = found.data_schema if found is not None else None
    pairs: list[tuple[str, Any]] = []
    problems: list[Problem] = []
    for index, entry in enumerate(entries):
        if "value" in entry:
            pairs.append((entry["path"], entry["value"]))
            continue
        try:
            pairs.append((entry["path"], value_from_text(entry["text"], schema, entry["path"])))
        except TextNotUnderstood as unread:
            problems.append(Problem(f"/correction/{index}/text", unread.message))
    if problems:
        raise ApiProblem(
            422,
            "CORRECTION_INVALID",
            "A correction's text cannot be read as the value of its field.",
            problems=problems,
        )
    return tuple(pairs)


# The listing's query parameters: a filter it does not know is refused, never ignored
# (a script that misspells one would otherwise read every execution as the match).
LIST_PARAMETERS = (
    "status",
    "flowId",
    "flowKey",
    "requestId",
    "errorCode",
    "machineId",
    "createdAfter",
    "createdBefore",
    "parentExecutionId",
    "simulation",
    "id",
    "limit",
    "after",
)


def refuse_unknown_filters(args: Mapping[str, str]) -> None:
    """400 QUERY_INVALID naming each parameter the listing does not take."""
    unknown = sorted(name for name in args if name not in LIST_PARAMETERS)
    if unknown:
        raise ApiProblem(
            400,
            "QUERY_INVALID",
            f"Unknown filter {', '.join(unknown)}: the listing takes {', '.join(LIST_PARAMETERS)}.",
            problems=[Problem(f"/{name}", "not a filter of this listing") for name in unknown],
        )


def execution_filter(args: Mapping[str, str]) -> ExecutionFilter:
    status = args.get("status")
    if status is not None and status not in EXECUTION_STATUSES:
        raise query_problem("status", f"one of {', '.join(EXECUTION_STATUSES)}")
    limit_text = args.get("limit")
    limit = DEFAULT_PAGE_SIZE
    if limit_text is not None:
        if not re.fullmatch(r"[0-9]{1,4}", limit_text) or not (
            1 <= int(limit_text) <= MAX_PAGE_SIZE
        ):
            raise query_problem("limit", f"a whole number from 1 to {MAX_PAGE_SIZE}")
        limit = int(limit_text)
    after_text = args.get("after")
    simulation = args.get("simulation", "false")
    if simulation not in ("true", "false"):
        raise query_problem("simulation", "true or false")
    return ExecutionFilter(
        id_prefix=execution_id_prefix(args.get("id")),
        simulation=simulation == "true",
        limit=limit,
        status=status,
        flow_id=_uuid_argument(args, "flowId"),
        request_id=_uuid_argument(args, "requestId"),
        flow_key=_text_argument(args, "flowKey"),
        error_code=_text_argument(args, "errorCode"),
        machine_id=_text_argument(args, "machineId"),
        created_after=_instant_argument(args, "createdAfter"),
        created_before=_instant_argument(args, "createdBefore"),
        parent_execution_id=_uuid_argument(args, "parentExecutionId"),
        after=read_cursor(after_text) if after_text is not None else None,
    )


# A flow key, error code or machine id to search by is never longer than this.
MAX_SEARCH_CHARACTERS = 200


# A short id: at least 8 leading hex digits of an execution id; dashes are ignored.
SHORT_ID_DIGITS = 8
_ID_PREFIX = re.compile(rf"[0-9a-fA-F]{{{SHORT_ID_DIGITS},32}}")


def execution_id_prefix(text: str | None) -> str | None:
    """The hex digits an `id` search names (a whole id or a short one), lower case."""
    if text is None:
        return None
    digits = text.strip().replace("-", "")
    if not _ID_PREFIX.fullmatch(digits):
        raise query_problem(
            "id", f"an execution id, or at least {SHORT_ID_DIGITS} of its first hex digits"
        )
    return digits.lower()


def _uuid_argument(args: Mapping[str, str], name: str) -> uuid.UUID | None:
    text = args.get(name)
    if text is None:
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        raise query_problem(name, "a UUID") from None


def _text_argument(args: Mapping[str, str], name: str) -> str | None:
    text = args.get(name)
    if text is None:
        return None
    if not text or len(text) > MAX_SEARCH_CHARACTERS or unstorable_text(text):
        raise query_problem(name, f"text of 1 to {MAX_SEARCH_CHARACTERS} characters")
    return text


def _instant_argument(args: Mapping[str, str], name: str) -> datetime | None:
    text = args.get(name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise query_problem(name, "an RFC 3339 date-time with its offset (or Z)")
    return moment
