"""`orquestador quotas show --org ORG`: the organization's quotas and what is in use, over
the HTTP API (scope `org:admin` or `plans:admin`)."""

from __future__ import annotations

import argparse

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.output import print_json, print_table
from orquestador.client import Client


def add_quotas_command(command: CommandFactory) -> None:
    """Register `quotas` and its action with the main parser's command factory."""
    action = client_actions(
        command,
        "quotas",
        "an organization's quotas through the HTTP API (needs org:admin or plans:admin)",
    )
    show = action("show", "each quota's limit and what is in use", _show)
    show.add_argument("--org", required=True, help="the organization (your token's)")


def _show(client: Client, args: argparse.Namespace) -> int:
    answer = client.get_quotas(args.org)
    if args.json:
        print_json(answer)
        return 0
    rows = [
        (name, quota["limit"], quota.get("used", "")) for name, quota in answer["quotas"].items()
    ]
    print_table(("quota", "limit", "used"), rows)
    return 0
