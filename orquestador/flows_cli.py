"""`orquestador flows dry-run` and `flows lint`: a published flow's transition as a dry run,
every path included; a flow file checked before it is published.

A client of the HTTP API like `orquestador executions`: it starts the dry run (scope
`flows:admin`), follows it to its end (`requests:read`), and prints where it ended and
what a real run would have done. `--outcomes` makes steps answer a decision, an error, a
passed deadline or a given output, so error exits and rejections can be tried without
anyone's help.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from orquestador.api.body import parse_json
from orquestador.domain.lint import lint_definition
from orquestador.executions_cli import (
    ApiClient,
    CommandFactory,
    UsageProblem,
    client_actions,
    json_argument,
    path_id,
    print_fields,
    print_json,
    print_table,
)

# Statuses a dry run still moves on from.
LIVE_STATUSES = ("PENDING", "RUNNING", "RETRY_WAIT", "WAITING")
POLL_SECONDS = 0.2


def add_flows_command(command: CommandFactory) -> None:
    """Register `flows` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "flows",
        "try published flows through the HTTP API (needs flows:admin, and requests:read to "
        "follow the dry run)",
    )
    dry_run = action(
        "dry-run",
        "run a transition of a published flow as a dry run, nothing sent, and wait for its end",
        _dry_run,
    )
    dry_run.add_argument("flow", metavar="FLOW_ID", help="the flow version's id")
    dry_run.add_argument("--transition", required=True, help="the transition to run")
    dry_run.add_argument(
        "--data", required=True, metavar="JSON", help="the request's data (JSON, or @FILE)"
    )
    dry_run.add_argument("--state", help="the state to start in (default: initialState)")
    dry_run.add_argument(
        "--outcomes",
        metavar="JSON",
        help="per action id, the answer its step gives (JSON, or @FILE), e.g. "
        '\'{"ok": {"decision": "rejected"}}\'; also {"error": "CODE"}, {"deadline": true} '
        'and {"output": {...}}',
    )
    lint = action(
        "lint",
        "check a flow file without publishing it: what publishing refuses or warns about, "
        "states nothing reaches, transitions that can never run",
        _lint,
        epilog="Exit status: 0 clean, 1 findings (one line each: file, JSON path, what), "
        "2 the file cannot be read. Needs no server: capabilities are not checked.",
    )
    lint.add_argument("file", metavar="FLOW.json", help="the flow definition file")
    dry_run.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the end (default: 60)",
    )


def _lint(args: argparse.Namespace) -> int:
    """Every finding in the flow file, one line each: exit 1 when there is one."""
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"orquestador: {path}: cannot be read ({exc.__class__.__name__})", file=sys.stderr)
        return 2
    try:
        definition = parse_json(text)
    except ValueError as exc:
        print(f"{path}: not JSON: {exc}")
        return 1
    findings = lint_definition(definition)
    for finding in findings:
        print(f"{path}: {finding.path or '/'}: {finding.message}")
    return 1 if findings else 0


def _dry_run(client: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "transition": args.transition,
        "data": json_argument(args.data, "--data"),
    }
    if args.state is not None:
        body["state"] = args.state
    if args.outcomes is not None:
        body["outcomes"] = json_argument(args.outcomes, "--outcomes")
    accepted = client.post(f"/flows/{path_id(args.flow)}/dry-runs", body)
    execution_id = accepted["executionId"]
    deadline = time.monotonic() + args.timeout
    while True:
        view = client.get(f"/executions/{execution_id}")
        if view["status"] not in LIVE_STATUSES:
            break
        if time.monotonic() > deadline:
            raise UsageProblem(
                f"the dry run {execution_id} is still {view['status']} after {args.timeout:g} s;"
                f" 'orquestador executions show {execution_id}' follows it"
            )
        time.sleep(POLL_SECONDS)
    if args.json:
        print_json(view)
        return 0
    print_fields(
        [
            ("dry run", execution_id),
            ("status", view["status"]),
            ("to state", view.get("toState")),
            ("error", view.get("errorCode")),
        ]
    )
    done = view.get("wouldHaveDone") or []
    if done:
        print()
        print_table(
            ("ACTION", "CAPABILITY", "WOULD HAVE"),
            [(item["actionId"], item["capability"], item["summary"]) for item in done],
        )
    return 0
