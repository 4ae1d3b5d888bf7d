"""`orquestador notices preferences show | set`: an organization's e-mail recipients and the
categories it opted out of, over the HTTP API (scope `org:admin`).

`set` changes only what it is given: it reads the preferences, applies the options, and
puts them back whole, so the server checks the result as it checks any other.
"""

from __future__ import annotations

import argparse

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.output import UsageProblem, print_fields, print_json
from orquestador.client import Client
from orquestador.notices.vocabulary import CATEGORIES


def add_notices_command(command: CommandFactory) -> None:
    """Register `notices` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "notices",
        "an organization's notification preferences through the HTTP API (needs org:admin)",
    )
    preferences = action(
        "preferences",
        "show or set who is e-mailed and which categories are not: show, or set with options",
        _preferences,
    )
    preferences.add_argument("verb", choices=("show", "set"), help="show, or set what is given")
    preferences.add_argument("--org", required=True, help="the organization (your token's)")
    preferences.add_argument(
        "--recipient",
        action="append",
        metavar="ADDRESS",
        help="set: the recipients become these addresses (repeat for more)",
    )
    preferences.add_argument(
        "--no-recipients", action="store_true", help="set: e-mail nobody (notices stay on panel)"
    )
    preferences.add_argument(
        "--opt-out",
        action="append",
        choices=CATEGORIES,
        metavar="CATEGORY",
        help=f"set: send no e-mail of this category ({', '.join(CATEGORIES)})",
    )
    preferences.add_argument(
        "--opt-in",
        action="append",
        choices=CATEGORIES,
        metavar="CATEGORY",
        help="set: e-mail this category again",
    )


def _preferences(client: Client, args: argparse.Namespace) -> int:
    changes = (args.recipient, args.no_recipients, args.opt_out, args.opt_in)
    if args.verb == "show":
        if any(changes):
            raise UsageProblem("show takes only --org: give the options to set")
        saved = client.get_notification_preferences(args.org)
    else:
        if not any(changes):
            raise UsageProblem(
                "set needs something to change: --recipient, --no-recipients, --opt-out or --opt-in"
            )
        if args.recipient and args.no_recipients:
            raise UsageProblem("--recipient and --no-recipients say opposite things: give one")
        both = set(args.opt_out or ()) & set(args.opt_in or ())
        if both:
            raise UsageProblem(f"--opt-out and --opt-in both name {', '.join(sorted(both))}")
        current = client.get_notification_preferences(args.org)
        recipients = [] if args.no_recipients else (args.recipient or current["recipients"])
        opted_out = set(current["optOut"]) | set(args.opt_out or ())
        opted_out -= set(args.opt_in or ())
        saved = client.replace_notification_preferences(
            args.org, opt_out=sorted(opted_out), recipients=recipients
        )
    if args.json:
        print_json(saved)
        return 0
    print_fields(
        [
            ("organization", saved["org"]),
            ("recipients", ", ".join(saved["recipients"]) or "nobody: notices stay on the panel"),
            ("opted out", ", ".join(saved["optOut"]) or "nothing: every category is e-mailed"),
            ("updated", saved.get("updatedAt") or "never: the defaults"),
        ]
    )
    return 0
