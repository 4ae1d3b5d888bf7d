"""`orquestador approvals`: the approvals the token may decide, and deciding one, over the API.

Like `orquestador executions`, a client of the HTTP API: it sees what the token may see
(scope `approvals:decide`, and being an approver), and every refusal is the server's.
"""

from __future__ import annotations

import argparse

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.output import print_json, print_table
from orquestador.client import Client
from orquestador.domain.statuses import ApprovalListing, ApprovalStatus, values

# What a person types, and what the API calls it.
DECISIONS = {"approve": ApprovalStatus.APPROVED, "reject": ApprovalStatus.REJECTED}


def add_approvals_command(command: CommandFactory) -> None:
    """Register `approvals` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "approvals",
        "list the approvals you may decide, and approve or reject one, through the HTTP API "
        "(needs approvals:decide)",
    )

    listing = action("list", "the approvals that name you, oldest first", _list)
    listing.add_argument(
        "--status",
        choices=values(ApprovalListing),
        default=ApprovalListing.OPEN.value,
        help="open (the default): still to decide; closed: decided, expired or ended",
    )

    decide = action("decide", "approve or reject one approval: one decision, audited", _decide)
    decide.add_argument("approval", metavar="ID")
    decide.add_argument("decision", choices=tuple(DECISIONS))
    decide.add_argument("--comment", default="", help="kept with the decision and in the audit")


def _list(client: Client, args: argparse.Namespace) -> int:
    page = client.list_approvals(status=args.status)
    if args.json:
        print_json(page)
        return 0
    rows = [
        (
            item["id"],
            # Open in the row, yet past its deadline or with its execution ended.
            "lapsed"
            if item["status"] == ApprovalStatus.OPEN and not item["open"]
            else item["status"],
            item["deadlineAt"],
            f"{item['flowKey']} v{item['flowVersion']} {item['transitionId']}",
            item.get("machineId"),
            item.get("requestedBy"),
            item["title"],
        )
        for item in page["items"]
    ]
    if not rows:
        print(
            f"no {args.status} approvals name you"
            if args.status != ApprovalListing.ALL
            else "no approvals"
        )
        return 0
    print_table(
        ("ID", "STATUS", "DEADLINE", "FLOW AND TRANSITION", "MACHINE", "ASKED BY", "WHAT"), rows
    )
    return 0


def _decide(client: Client, args: argparse.Namespace) -> int:
    view = client.decide_approval(args.approval, DECISIONS[args.decision], args.comment)
    if args.json:
        print_json(view)
    else:
        print(f"{view['status']} by {view['decidedBy']}; execution {view['executionId']} goes on")
    return 0
