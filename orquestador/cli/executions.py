"""`orquestador executions`: find, inspect, decide about and cancel executions over the HTTP API.

The command is a client of the API, never of the database: it sees what the token may
see, and every refusal is the server's. Exit status: 0 done, 1 refused by the server
(its problem printed), 2 usage or configuration (no URL or token, a server that does
not answer).
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from typing import Any

from orquestador.cli.api_commands import (
    ClientAction,
    CommandFactory,
    client_actions,
    with_client,
)
from orquestador.cli.output import (
    UsageProblem,
    cell,
    flow_filter,
    flow_name,
    json_argument,
    print_fields,
    print_json,
    print_table,
    print_wrapped,
    printable_line,
)
from orquestador.client import ApiError, Client
from orquestador.domain.statuses import ExecutionStatus, StepStatus, values
from orquestador.wording import duration_in_words

MAX_PAGE_SIZE = 200
# A short id: the first hex digits of an execution id (dashes ignored), at least this many.
SHORT_ID_DIGITS = 8
_HEX_ID = re.compile(r"[0-9a-fA-F-]+")


def add_executions_command(command: CommandFactory) -> ClientAction:
    """Register `executions` and its actions with the main parser's command factory; return
    the factory of its actions, with which other modules add theirs (`executions bulk`)."""
    action = client_actions(
        command, "executions", "find, inspect, reconcile and cancel executions through the HTTP API"
    )

    listing = action("list", "executions the token may see, newest first", _list)
    listing.add_argument("--status", choices=values(ExecutionStatus), help="only this status")
    listing.add_argument(
        "--flow",
        metavar="KEY|ID",
        help="only executions of this flow: a key (every version) or a version's id",
    )
    listing.add_argument("--request", metavar="ID", help="only executions of this request")
    listing.add_argument(
        "--machine", metavar="ID", help="only executions of requests on this machine"
    )
    listing.add_argument("--error-code", metavar="CODE", help="only executions with this errorCode")
    listing.add_argument(
        "--parent",
        metavar="ID",
        help="only the children this rollout's execution started (its id or short id)",
    )
    listing.add_argument(
        "--created-after",
        metavar="TIME",
        help="only executions created after this instant (RFC 3339 with its offset, or Z)",
    )
    listing.add_argument(
        "--created-before", metavar="TIME", help="only executions created before this instant"
    )
    listing.add_argument(
        "--limit",
        type=_page_size,
        metavar="N",
        help=f"page size, 1 to {MAX_PAGE_SIZE} (default: the server's, 50)",
    )
    listing.add_argument("--after", metavar="CURSOR", help="the next page, as the last one said")

    show = action("show", "one execution: status, outcome, steps and attempts", _show)
    show.add_argument("execution", metavar="ID", help=_ID_HELP)

    evidence = action(
        "evidence",
        "what an operator needs to decide: why it parked, the step in doubt, keys, audit "
        "(needs executions:reconcile)",
        _evidence,
    )
    evidence.add_argument("execution", metavar="ID", help=_ID_HELP)

    reconcile = action(
        "reconcile",
        "decide about a parked execution: confirm, retry or fail (needs executions:reconcile)",
        _reconcile,
    )
    reconcile.add_argument("execution", metavar="ID", help=_ID_HELP)
    reconcile.add_argument(
        "--action",
        metavar="A",
        help="the step in doubt, as the evidence names it; leave out when none is",
    )
    reconcile.add_argument("--decision", required=True, choices=("confirm", "retry", "fail"))
    reconcile.add_argument(
        "--reason", required=True, help="what you checked and with whom (kept in the audit)"
    )
    reconcile.add_argument(
        "--output",
        metavar="JSON",
        help="confirm: the step's output as the provider reports it (JSON, or @FILE)",
    )
    reconcile.add_argument(
        "--to-state",
        metavar="S",
        help="fail: where the request goes (default: the step's onError state, else it stays)",
    )
    reconcile.add_argument(
        "--correct",
        action="append",
        metavar="PATH=VALUE",
        help="retry: first set PATH of the request data (a JSON Pointer, as a flow's updates "
        "write it: /amount) to VALUE: for a text field the text as is (/plan=large), else "
        "JSON (/amount=950), or @FILE of JSON; repeat for more paths",
    )

    def reconcile_checked(args: argparse.Namespace) -> int:
        # argparse cannot tie one option to another's value: checked here, before any
        # setting is read or request sent, as the same usage error (exit 2).
        if args.decision == "confirm" and args.output is None:
            reconcile.error(
                "--output is required with --decision confirm: the step's output as the "
                "provider reports it (JSON, or @FILE), checked against the adapter's schema"
            )
        if args.correct and args.decision != "retry":
            reconcile.error("--correct goes only with --decision retry")
        return with_client(_reconcile, args)

    reconcile.set_defaults(handler=reconcile_checked)

    cancel = action(
        "cancel",
        "cancel an execution (executions:cancel, or requests:write on your own request); "
        "a running one stops when its step's call returns; after a write it is parked "
        "for reconciliation instead",
        _cancel,
    )
    cancel.add_argument("execution", metavar="ID", help=_ID_HELP)
    cancel.add_argument("--reason", required=True, help="why (kept in the audit)")
    return action


_ID_HELP = (
    f"the execution's id, or a short id: its first {SHORT_ID_DIGITS} or more hex digits "
    "(unique among the executions you may see)"
)


def _page_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number") from None
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_PAGE_SIZE}")
    return value


def resolve_execution_id(client: Client, text: str) -> str:
    """The id of the execution `text` names: a whole id, or a short one resolved by the
    server (`?id=`, within what the token may see, so a foreign execution is as missing
    as one that does not exist)."""
    text = text.strip()
    try:
        return str(uuid.UUID(text))
    except ValueError:
        pass
    if not _HEX_ID.fullmatch(text):
        return text
    digits = text.replace("-", "").lower()
    if len(digits) < SHORT_ID_DIGITS:
        raise UsageProblem(
            f"{text!r} is too short for an id: give the whole execution id or at least "
            f"{SHORT_ID_DIGITS} of its first hex digits"
        )
    found = [item["id"] for item in client.list_executions(id_prefix=digits, limit=2)["items"]]
    if not found:
        detail = f"No execution you may see has an id starting with {digits}."
        raise ApiError(404, {"code": "NOT_FOUND", "detail": detail}, detail)
    if len(found) > 1:
        raise UsageProblem(
            f"the short id {digits} is ambiguous: more than one execution starts with it "
            f"({', '.join(found)}); give more digits"
        )
    return found[0]


# --- actions ---------------------------------------------------------------------------


def _list(client: Client, args: argparse.Namespace) -> int:
    flow = dict([flow_filter(args.flow)]) if args.flow else {}
    page = client.list_executions(
        status=args.status,
        flow_id=flow.get("flowId"),
        flow_key=flow.get("flowKey"),
        request_id=args.request,
        machine_id=args.machine,
        error_code=args.error_code,
        parent_execution_id=(
            resolve_execution_id(client, args.parent) if args.parent is not None else None
        ),
        created_after=args.created_after,
        created_before=args.created_before,
        limit=args.limit,
        after=args.after,
    )
    if args.json:
        print_json(page)
        return 0
    items = page.get("items", [])
    if not items:
        print("no executions")
    else:
        print_table(
            ("ID", "STATUS", "TRANSITION", "ERROR", "FLOW", "MACHINE", "CREATED"),
            [
                (
                    item["id"],
                    item["status"],
                    item["transitionId"],
                    item.get("errorCode"),
                    flow_name(item),
                    item.get("machineId"),
                    item["createdAt"],
                )
                for item in items
            ],
        )
    if page.get("next"):
        print(f"more: add --after {page['next']}")
    return 0


def _show(client: Client, args: argparse.Namespace) -> int:
    view = client.get_execution(resolve_execution_id(client, args.execution))
    if args.json:
        print_json(view)
    else:
        print_execution(view)
        _print_decision(view)
        _print_then_and_now(view)
    return 0


def _evidence(client: Client, args: argparse.Namespace) -> int:
    found = client.get_execution_evidence(resolve_execution_id(client, args.execution))
    if args.json:
        print_json(found)
        return 0
    execution = found["execution"]
    print_fields(
        [
            ("execution", execution["id"]),
            ("status", execution["status"]),
            ("request", execution["requestId"]),
            ("transition", execution["transitionId"]),
            ("reason", found.get("reason")),
            ("in doubt", found.get("inDoubt")),
        ]
    )
    if execution["status"] == ExecutionStatus.RECONCILIATION_REQUIRED:
        action = f" --action {found['inDoubt']}" if found.get("inDoubt") else ""
        print(
            f"decide: orquestador executions reconcile {execution['id']}{action} "
            "--decision confirm|retry|fail --reason TEXT"
        )
    steps = found.get("steps", [])
    if steps:
        print()
        print_table(
            ("STEP", "CAPABILITY", "EFFECT", "STATUS", "ATTEMPT", "ERROR", "EXTERNAL KEY"),
            [
                (
                    step["actionId"],
                    f"{step['capability']}@{step['version']}",
                    step["effect"],
                    step["status"],
                    step["attempt"],
                    step.get("errorCode"),
                    step["externalKey"],
                )
                for step in steps
            ],
        )
    for step in steps:
        print(f"\nstep {step['actionId']}")
        fields = [
            ("input hash", step.get("inputHash")),
            ("message", step.get("message")),
            ("started", step.get("startedAt")),
            ("finished", step.get("finishedAt")),
        ]
        if "output" in step:
            fields.append(("output", json.dumps(step["output"], ensure_ascii=False)))
        print_fields(fields, indent="  ")
        for attempt in step.get("attempts", []):
            print(
                f"  attempt {attempt['attempt']}: {attempt['status']}"
                + (f" {attempt['errorCode']}" if attempt.get("errorCode") else "")
                + (f" - {attempt['message']}" if attempt.get("message") else "")
            )
    audit = found.get("audit", [])
    if audit:
        print("\naudit")
        for event in audit:
            print(f"  {event['at']}  {event['kind']}  {cell(event.get('actor'))}")
            print_wrapped(json.dumps(event.get("detail"), ensure_ascii=False), indent="    ")
    return 0


def _reconcile(client: Client, args: argparse.Namespace) -> int:
    output = None if args.output is None else json_argument(args.output, "--output")
    correction = [correction_argument(text) for text in args.correct or ()] or None
    view = client.reconcile_execution(
        resolve_execution_id(client, args.execution),
        action_id=args.action,
        decision=args.decision,
        reason=args.reason,
        output=output,
        to_state=args.to_state,
        correction=correction,
    )
    if args.json:
        print_json(view)
    else:
        print(f"decided: {args.decision}; the execution is {view['status']}")
        if args.correct:
            paths = ", ".join(entry["path"] for entry in correction or ())
            print(f"corrected: {paths} (the evidence's audit keeps each value before and after)")
        print_execution(view)
    return 0


def _cancel(client: Client, args: argparse.Namespace) -> int:
    view = client.cancel_execution(resolve_execution_id(client, args.execution), args.reason)
    if args.json:
        print_json(view)
    elif view.get("cancelRequested"):
        # Nothing cuts a call half way: the worker applies the cancel when it returns.
        print(
            "cancel requested: the step's call is running; the execution stops when the call"
            " returns (cancelled, or parked for reconciliation if it wrote); follow it with:"
            f" orquestador executions wait {view['id']}"
        )
        print_execution(view)
    elif view["status"] == ExecutionStatus.RECONCILIATION_REQUIRED:
        # The server kept the request busy: a write happened or may have, and only an
        # operator may decide what becomes of it. Saying "cancelled" here would mislead.
        print(f"not cancelled: parked for reconciliation after writes ({_writes_done(view)})")
        print(
            "the request stays busy until an operator decides; see: orquestador executions "
            f"evidence {view['id']}"
        )
        print_execution(view)
    else:
        print(f"cancelled; the execution is {view['status']}")
        print_execution(view)
    if not args.json:
        for line in _machine_commands_said(view.get("machineCommands") or {}):
            print(line)
    return 0


def _machine_commands_said(commands: dict[str, Any]) -> list[str]:
    """What the cancel did to the execution's machine commands, one line per command."""
    said = [
        f"machine command {c['command']} on {c['machineId']} ({c['id']}): {what}"
        for key, what in (
            ("cancelled", "cancelled, no agent will get it"),
            ("stopRequested", "already taken; its agent was asked to stop it"),
        )
        for c in commands.get(key) or []
    ]
    return said or ["no machine command was under way"]


def _writes_done(view: dict[str, Any]) -> str:
    detail = view.get("errorDetail") or {}
    said = [
        f"{what} {', '.join(detail[key])}"
        for key, what in (("writesSucceeded", "written:"), ("writesInDoubt", "maybe written:"))
        if detail.get(key)
    ]
    return "; ".join(said) if said else "done or in doubt"


def correction_argument(text: str) -> dict[str, Any]:
    """`--correct PATH=VALUE` as a correction's `{path, text}` (the server reads the text by
    the flow's data schema: a text field takes it as is), or with `@FILE` its JSON as
    `{path, value}`; the path ends at the first `=`."""
    path, equals, value = text.partition("=")
    if not equals or not path:
        raise UsageProblem(
            f"--correct takes PATH=VALUE (say /amount=950 or /plan=large), not {text!r}"
        )
    if value.startswith("@"):
        return {"path": path, "value": json_argument(value, f"--correct {path}")}
    return {"path": path, "text": value}


def _cancel_requested(view: dict[str, Any]) -> str | None:
    if not view.get("cancelRequested"):
        return None
    return f"by {view.get('cancelRequestedBy')} at {view.get('cancelRequestedAt')}"


def print_execution(view: dict[str, Any]) -> None:
    """The execution's fields a person reads first, then its steps."""
    print_fields(
        [
            ("execution", view["id"]),
            ("status", view["status"]),
            ("request", view["requestId"]),
            ("flow", flow_name(view) or view["flowId"]),
            ("machine", view.get("machineId")),
            ("transition", view["transitionId"]),
            ("outcome", view.get("outcome")),
            ("to state", view.get("toState")),
            ("error", view.get("errorCode")),
            ("cancel requested", _cancel_requested(view)),
            ("next attempt", view.get("nextAttemptAt")),
            ("waits for", _blocked_by(view.get("blockedBy"))),
            ("attempts", view.get("attempts")),
            ("priority", view.get("priority")),
            ("created", view.get("createdAt")),
            ("updated", view.get("updatedAt")),
        ],
        skip_empty=True,
    )
    steps = view.get("steps", [])
    if steps:
        print()
        print_table(
            ("STEP", "STATUS", "ATTEMPTS", "ERROR", "STARTED", "FINISHED"),
            [
                (
                    step["actionId"],
                    step["status"],
                    len(step.get("attempts", [])),
                    step.get("errorCode"),
                    step.get("startedAt"),
                    step.get("finishedAt"),
                )
                for step in steps
            ],
        )


def _blocked_by(blocked: dict[str, Any] | None) -> str | None:
    """A PENDING execution's turn under its concurrency key, in one line."""
    if not blocked:
        return None
    holders = ", ".join(blocked["heldBy"]) or "executions you may not read"
    return (
        f"its turn under key {blocked['key']} (at most {blocked['limit']} at a time;"
        f" {blocked['holders']} held by {holders})"
    )


def _print_decision(view: dict[str, Any]) -> None:
    """How the destination was chosen, in the page's words."""
    decision = view.get("decision")
    if decision is None:
        said = {
            ExecutionStatus.CANCELLED: "cancelled before anything was decided",
            ExecutionStatus.RECONCILIATION_REQUIRED: (
                "nothing decided yet: a person must first say what happened"
            ),
            ExecutionStatus.SUCCEEDED: "ended without a recorded decision",
            ExecutionStatus.FAILED: "ended without a recorded decision",
        }.get(view["status"], "not decided yet")
        print(f"\ndecision  {said}")
        return
    by = decision.get("by")
    if by == "operator":
        said = f"an operator gave up on it ({decision.get('errorCode')})"
    elif by == "errorExit":
        said = (
            f"step {decision.get('actionId')} failed ({decision.get('errorCode')}); "
            "its error exit chose"
        )
    elif decision.get("ruleIds"):
        said = f"rules {', '.join(decision['ruleIds'])} matched ({decision.get('hitPolicy')})"
    elif decision.get("hitPolicy"):
        said = f"no rule matched ({decision['hitPolicy']})"
    else:
        said = "a fixed destination: no decision table"
    print(f"\ndecision  {said}; to {cell(decision.get('toState'))}")


def _print_then_and_now(view: dict[str, Any]) -> None:
    """What each step waits for, and what it saw then beside what is true now."""
    for step in view.get("steps", []):
        lines: list[tuple[str, Any]] = []
        waiting = step.get("waitingFor")
        if waiting is not None:
            if waiting.get("purged"):
                what = f"command {waiting['commandId']} (no longer in the records)"
            else:
                what = f"command {waiting.get('command')} on machine {waiting.get('machineId')}"
            lines += [("waiting for", what), ("status now", waiting.get("status"))]
            if waiting.get("agent"):
                lines.append(("agent", waiting["agent"].get("words")))
            if "deadline" in waiting:
                left = waiting.get("secondsLeft")
                lines.append(
                    (
                        "deadline",
                        f"{waiting['deadline']} ({duration_in_words(left or 0)} left)"
                        if left
                        else f"{waiting['deadline']} (passed)",
                    )
                )
        if step.get("status") == StepStatus.STOPPED:
            lines.append(("stopped", "the wait stopped when the execution ended"))
        if "observed" in step:
            lines.append(("then", json.dumps(step["observed"], ensure_ascii=False)))
            now = step.get("current")
            if now is not None and now.get("purged"):
                lines.append(("now", "the command is no longer in the records"))
            elif now is not None:
                lines.append(("now", f"{now['status']} (updated {now['updatedAt']})"))
        if lines:
            print(f"\nstep {step['actionId']}")
            print_fields(lines, indent="  ", skip_empty=True)
        command = step.get("current") or step.get("waitingFor") or {}
        output = command.get("output")
        if output:
            dropped = (
                " (part of a long output was dropped)" if command.get("outputTruncated") else ""
            )
            print(f"  output, last 200 lines{dropped}:")
            for line in output.splitlines():
                print(f"    {printable_line(line)}")
