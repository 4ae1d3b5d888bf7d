"""`orquestador rollouts`: show, pause, resume and cancel a rollout, retry its failed
children, over the HTTP API. A rollout is named by its execution's id (or a short one)."""

from __future__ import annotations

import argparse
from typing import Any

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.executions import resolve_execution_id
from orquestador.cli.output import print_json, print_table
from orquestador.client import Client

_ID_HELP = "the rollout's execution id (or its first characters)"


def add_rollouts_command(command: CommandFactory) -> None:
    """Register `rollouts` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "rollouts",
        "see and steer a rollout (rollout@1): pause, resume, cancel, retry the failed, "
        "through the HTTP API",
    )
    show = action("show", "the rollout's counts, budget, marks and children", _show)
    show.add_argument("execution", metavar="ID", help=_ID_HELP)
    for name, words in (
        ("pause", "no new child starts until it resumes (executions:cancel or requests:write)"),
        ("resume", "start children again (executions:cancel or requests:write)"),
    ):
        steer = action(name, words, _mark)
        steer.add_argument("execution", metavar="ID", help=_ID_HELP)
        steer.add_argument("--reason", default="", help="why (kept in the audit)")
        steer.set_defaults(mark=name)
    cancel = action(
        "cancel",
        "no new child, and the running ones cancelled under the write rule "
        "(executions:cancel or requests:write)",
        _mark,
    )
    cancel.add_argument("execution", metavar="ID", help=_ID_HELP)
    cancel.add_argument("--reason", required=True, help="why (kept in the audit)")
    cancel.set_defaults(mark="cancel")
    retry = action(
        "retry-failed",
        "a new run over just the failed children's items (executions:reconcile)",
        _retry,
    )
    retry.add_argument("execution", metavar="ID", help=_ID_HELP)


def _show(client: Client, args: argparse.Namespace) -> int:
    rollout = client.get_rollout(resolve_execution_id(client, args.execution))
    if args.json:
        print_json(rollout)
        return 0
    print(summary(rollout))
    print_table(
        ("#", "status", "item", "execution"),
        [
            (c["index"], c["status"], _item(c["item"]), c.get("executionId") or c.get("refusal"))
            for c in rollout["children"]
        ],
    )
    return 0


def _mark(client: Client, args: argparse.Namespace) -> int:
    execution_id = resolve_execution_id(client, args.execution)
    act = {
        "pause": client.pause_rollout,
        "resume": client.resume_rollout,
        "cancel": client.cancel_rollout,
    }[args.mark]
    rollout = act(execution_id, args.reason)
    if args.json:
        print_json(rollout)
        return 0
    print(summary(rollout))
    for child, fate in rollout.get("cancelledChildren", {}).items():
        print(f"  child {child}: {fate}")
    return 0


def _retry(client: Client, args: argparse.Namespace) -> int:
    retried = client.retry_failed_rollout(resolve_execution_id(client, args.execution))
    if args.json:
        print_json(retried)
        return 0
    print(
        f"retrying {retried['items']} failed item(s): execution {retried['executionId']} "
        f"(request {retried['requestId']})"
    )
    return 0


def summary(rollout: dict[str, Any]) -> str:
    """One line: where the rollout stands, its budget and its marks."""
    state = (
        "cancelled"
        if rollout["cancelRequested"]
        else "paused"
        if rollout["paused"]
        else "running"
        if rollout["live"]
        else "ended"
    )
    return (
        f"rollout {state}: {rollout['succeeded']} succeeded, {rollout['failed']} failed, "
        f"{rollout['cancelled']} cancelled, {rollout['running']} running, "
        f"{rollout['skipped']} skipped of {rollout['total']}; "
        f"failures {rollout['failed']} of {rollout['maxFailures']} allowed"
        + ("" if not rollout["budgetSpent"] else " (budget spent)")
    )


def _item(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("machineId", item))
    return str(item)
