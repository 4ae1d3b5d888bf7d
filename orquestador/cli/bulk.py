"""`orquestador executions bulk`: preview a bulk action, ask, start it, and follow it to its end.

Like the rest of `orquestador executions`, a client of the HTTP API: the server chooses
the executions and the worker acts on them; this command shows the preview, asks before
anything changes, then polls the bulk's progress until it is DONE. Exit status: 0 every
item acted on (or nothing matched), 1 some item refused (listed), the server refused
the bulk, or the question was answered no; 2 usage (no filter, no terminal to ask on
and no --yes).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from orquestador.cli.output import (
    EXIT_REFUSED,
    UsageProblem,
    cell,
    flow_filter,
    flow_name,
    print_json,
    print_table,
)
from orquestador.client import Client
from orquestador.domain.statuses import BulkAction, BulkStatus, ExecutionStatus, values
from orquestador.wording import bulk_outcome_in_words

# How often the progress is asked for while the worker acts.
POLL_SECONDS = 0.5
BAR_WIDTH = 30
# The answer that starts the bulk; anything else leaves everything as it is.
YES = "yes"

_FILTER_OPTIONS = (
    ("status", "status"),
    ("error_code", "errorCode"),
    ("machine", "machineId"),
    ("created_after", "createdAfter"),
    ("created_before", "createdBefore"),
)

ActionFactory = Callable[[str, str, Callable[..., int]], argparse.ArgumentParser]


def add_bulk_action(action: ActionFactory) -> None:
    """Register `executions bulk` with the `executions` command's action factory."""
    bulk = action(
        "bulk",
        "cancel, retry or fail every execution a filter matches: shows how many and a "
        "sample, asks, then follows the worker's progress (cancel needs executions:cancel, "
        "retry and fail executions:reconcile)",
        run_bulk,
    )
    bulk.add_argument("--action", required=True, choices=values(BulkAction))
    bulk.add_argument(
        "--reason", required=True, help="why (kept in the audit of every execution acted on)"
    )
    criteria = bulk.add_argument_group("filter (at least one; an execution must match all)")
    criteria.add_argument("--status", choices=values(ExecutionStatus))
    criteria.add_argument(
        "--flow", metavar="KEY|ID", help="executions of this flow: a key (every version) or an id"
    )
    criteria.add_argument("--error-code", metavar="CODE", help="executions with this errorCode")
    criteria.add_argument("--machine", metavar="ID", help="executions of requests on this machine")
    criteria.add_argument(
        "--created-after", metavar="TIME", help="created after this instant (RFC 3339, with Z)"
    )
    criteria.add_argument(
        "--created-before", metavar="TIME", help="created before this instant (RFC 3339)"
    )
    bulk.add_argument(
        "--yes",
        action="store_true",
        help="do not ask (for scripts); without it the command asks on the terminal",
    )
    bulk.epilog = (
        "Exit status: 0 every execution acted on (or none matched), 1 some refused (listed "
        "with their codes), the bulk refused by the server, or the question answered no; "
        "2 usage or configuration, or no terminal to ask on without --yes. Settings: see "
        "'orquestador executions --help'."
    )


def run_bulk(client: Client, args: argparse.Namespace) -> int:
    criteria = {
        name: getattr(args, option)
        for option, name in _FILTER_OPTIONS
        if getattr(args, option) is not None
    }
    if args.flow is not None:
        criteria.update([flow_filter(args.flow)])
    if not criteria:
        raise UsageProblem(
            "a bulk action needs a filter: give at least one of --status, --flow, "
            "--error-code, --machine, --created-after, --created-before"
        )
    preview = client.start_bulk_action(criteria, args.action, args.reason, preview=True)
    if not args.json:
        _print_preview(preview, args.action)
    if preview["count"] == 0:
        if args.json:
            print_json({"preview": preview})
        return 0
    if not args.yes and not _confirmed(preview["count"], args.action):
        print("nothing done", file=sys.stderr)
        return EXIT_REFUSED
    accepted = client.start_bulk_action(criteria, args.action, args.reason)
    bulk_id = accepted["bulkId"]
    if not args.json:
        print(f"bulk {bulk_id}: {accepted['total']} executions, the worker acts on each")
    try:
        found = _follow(client, bulk_id, show_bar=not args.json and sys.stderr.isatty())
    except KeyboardInterrupt:
        print(
            f"\nstopped watching; the bulk goes on. Its progress: GET /bulk/{bulk_id}",
            file=sys.stderr,
        )
        return 130
    if args.json:
        print_json(found)
    else:
        _print_result(found)
    return EXIT_REFUSED if found["refused"] else 0


def _print_preview(preview: dict[str, Any], action: str) -> None:
    count = preview["count"]
    if count == 0:
        print("no execution matches: nothing to do")
        return
    print(f"{count} execution{'s' if count != 1 else ''} match; a bulk {action} acts on each")
    print_table(
        ("ID", "STATUS", "ERROR", "FLOW", "MACHINE", "CREATED", "CANCEL"),
        [
            (
                item["id"],
                item["status"],
                item.get("errorCode"),
                flow_name(item),
                item.get("machineId"),
                item["createdAt"],
                ("PARKS" if item["parks"] else "ends") if "parks" in item else None,
            )
            for item in preview["sample"]
        ],
    )
    if count > len(preview["sample"]):
        print(f"... and {count - len(preview['sample'])} more")
    parks = preview.get("parks", 0)
    if parks:
        print(
            f"warning: a cancel parks {parks} of them for a decision instead of ending "
            f"{'it' if parks == 1 else 'them'}: a write was done or may have been (PARKS above)"
        )


def _confirmed(count: int, action: str) -> bool:
    if not sys.stdin.isatty():
        raise UsageProblem(
            f"not asking without a terminal: add --yes to {action} these {count} executions"
        )
    print(
        f"{action} {count} execution{'s' if count != 1 else ''}? Type {YES} to go on: ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    answer = sys.stdin.readline()
    return answer.strip().lower() == YES


def _follow(client: Client, bulk_id: str, *, show_bar: bool) -> dict[str, Any]:
    """Ask for the bulk's progress until it is DONE; draw a bar on a terminal."""
    while True:
        found = client.get_bulk_action(bulk_id)
        if show_bar:
            _draw_bar(found)
        if found["status"] == BulkStatus.DONE:
            if show_bar:
                print(file=sys.stderr)
            return found
        time.sleep(POLL_SECONDS)


def _draw_bar(found: dict[str, Any]) -> None:
    total, done = found["total"], found["done"]
    filled = BAR_WIDTH if total == 0 else BAR_WIDTH * done // total
    print(
        f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}"
        f"  {bulk_outcome_in_words(found)}",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _print_result(found: dict[str, Any]) -> None:
    refused, parked = found["refused"], found.get("parked", [])
    print(f"done: {found['done']} of {found['total']}; {bulk_outcome_in_words(found)}")
    if parked:
        print()
        print("parked for a decision (decide each: orquestador executions evidence ID):")
        print_table(
            ("EXECUTION", "WHAT WAS DONE"),
            [(item["executionId"], cell(item.get("detail"))) for item in parked],
        )
    if refused:
        print()
        print_table(
            ("EXECUTION", "CODE", "WHY"),
            [(item["executionId"], item["code"], cell(item.get("detail"))) for item in refused],
        )
