"""`orquestador run FLOW TRANSITION` and `orquestador executions wait ID`: start a real run
and follow an execution until it settles, over the HTTP API.

`run` creates the request and accepts its transition in one call (`POST /runs`; FLOW is a
key, whose latest version starts, or a version's id). With `--wait`, and always for
`executions wait`, the command follows the execution through the server's waits
(`Client.wait_execution`), and through the executions its states continue into, until
it settles; its exit status then says how: 0 SUCCEEDED, 1 FAILED or CANCELLED, 3 it
waits for a person (parked for a decision, or on an approval), 4 the time was up, 2
refused or bad input.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Any

from orquestador.cli.api_commands import (
    CLIENT_SETTINGS,
    ClientAction,
    CommandFactory,
    with_client,
)
from orquestador.cli.executions import print_execution, resolve_execution_id
from orquestador.cli.output import (
    EXIT_PARKED,
    EXIT_REFUSED,
    EXIT_TIMED_OUT,
    EXIT_USAGE,
    UsageProblem,
    json_argument,
    print_json,
)
from orquestador.client import Client
from orquestador.client.operations import settled
from orquestador.domain.statuses import ExecutionStatus

DEFAULT_WAIT_SECONDS = 300.0
_FOLLOWED = (
    "0 it SUCCEEDED, 1 it FAILED or was CANCELLED, 3 it waits for a person (parked for a "
    "decision, or on an approval), 4 it had not settled within --timeout, 2 refused by the "
    "server (its problem is printed) or bad input."
)
EXIT_STATUSES = f"Exit status: {_FOLLOWED}"


def add_run_command(command: CommandFactory) -> None:
    """Register `run` with the main parser's command factory."""
    parser = command(
        "run",
        "start a real run of a flow: a new request and its transition, through the HTTP API "
        "(needs requests:write; requests:read to --wait)",
        CLIENT_SETTINGS,
    )
    parser.epilog = (
        "Exit status without --wait: 0 the run was accepted, 2 refused by the server (its "
        f"problem is printed) or bad input. With --wait: {_FOLLOWED}\n\n{parser.epilog}"
    )
    parser.add_argument("flow", metavar="FLOW", help="a flow key (its latest version) or id")
    parser.add_argument("transition", metavar="TRANSITION", help="the transition to start")
    parser.add_argument(
        "--data", required=True, metavar="JSON", help="the request's data (JSON, or @FILE)"
    )
    parser.add_argument(
        "--priority",
        type=_priority,
        metavar="N",
        help="0 to 9, higher first (default: the flow's, else 5)",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="follow the execution until it settles, and exit with how it did",
    )
    _timeout_option(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the API's JSON answer, for scripts"
    )
    parser.set_defaults(handler=_checked_run, refused_exit=EXIT_USAGE)


def add_wait_action(action: ClientAction) -> None:
    """Register `executions wait` with the `executions` command's factory of actions."""
    wait = action(
        "wait",
        "follow an execution until it settles (and the executions it continues into)",
        _wait,
        epilog=EXIT_STATUSES,
    )
    wait.add_argument("execution", metavar="ID", help="the execution's id, or a short id")
    wait.add_argument(
        "--json", action="store_true", help="print the execution's view as JSON, for scripts"
    )
    _timeout_option(wait)
    # Given an epilog, the action runs locally: the API's client comes in here, and a
    # refusal is the "refused or bad input" of the exit statuses above.
    wait.set_defaults(handler=functools.partial(with_client, _wait), refused_exit=EXIT_USAGE)


def _timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help=f"how long to follow it, in seconds (default: {DEFAULT_WAIT_SECONDS:g})",
    )


def _priority(text: str) -> int:
    if text not in tuple("0123456789"):
        raise argparse.ArgumentTypeError("expected a whole number from 0 to 9")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("expected a number of seconds, 0 or more")
    return value


def _checked_run(args: argparse.Namespace) -> int:
    if not args.wait and args.timeout is not None:
        print("orquestador: --timeout goes with --wait", file=sys.stderr)
        return EXIT_USAGE
    return with_client(_run, args)


def _run(client: Client, args: argparse.Namespace) -> int:
    data = json_argument(args.data, "--data")
    if not isinstance(data, dict):
        raise UsageProblem("--data must be a JSON object")
    started = client.start_run(args.flow, args.transition, data, priority=args.priority)
    execution_id = started["executionId"]
    if not args.wait:
        if args.json:
            print_json(started)
        else:
            print(
                f"started: execution {execution_id} of request {started['requestId']} "
                f"({started['flowKey']} v{started['flowVersion']}, {args.transition})"
            )
            print(f"follow it: orquestador executions wait {execution_id}")
        return 0
    if not args.json:
        print(
            f"started: execution {execution_id} of request {started['requestId']} "
            f"({started['flowKey']} v{started['flowVersion']}, {args.transition})"
        )
    return follow(client, execution_id, _timeout(args), as_json=args.json)


def _wait(client: Client, args: argparse.Namespace) -> int:
    execution_id = resolve_execution_id(client, args.execution)
    return follow(client, execution_id, _timeout(args), as_json=args.json)


def _timeout(args: argparse.Namespace) -> float:
    return DEFAULT_WAIT_SECONDS if args.timeout is None else args.timeout


def follow(client: Client, execution_id: str, timeout: float, *, as_json: bool) -> int:
    """Follow the execution, and each one its states continue into, until one settles or
    `timeout` seconds pass; print how it ended and return the exit status that says so."""
    give_up_at = time.monotonic() + timeout
    while True:
        view = client.wait_execution(execution_id, max(0.0, give_up_at - time.monotonic()))
        continued = view.get("continuedBy")
        if view["status"] == ExecutionStatus.SUCCEEDED and continued:
            if not as_json:
                print(
                    f"continued: execution {view['id']} ended in {view.get('toState')}, "
                    f"which continues as execution {continued}"
                )
            execution_id = continued
            continue
        break
    if as_json:
        print_json(view)
    else:
        print_execution(view)
        print(_how_it_settled(view, timeout))
    return exit_status(view)


def exit_status(view: dict[str, Any]) -> int:
    """The exit status that says how the execution settled, or that it has not."""
    status = view["status"]
    if status == ExecutionStatus.SUCCEEDED:
        return 0
    if status in (ExecutionStatus.FAILED, ExecutionStatus.CANCELLED):
        return EXIT_REFUSED
    if settled(view):
        return EXIT_PARKED
    return EXIT_TIMED_OUT


def _how_it_settled(view: dict[str, Any], timeout: float) -> str:
    execution_id, status = view["id"], view["status"]
    if status == ExecutionStatus.SUCCEEDED:
        return f"\nsucceeded: the request is now in state {view.get('toState')}"
    if status == ExecutionStatus.FAILED:
        return f"\nfailed: {view.get('errorCode')}" + (
            f"; the request is now in state {view['toState']}" if view.get("toState") else ""
        )
    if status == ExecutionStatus.CANCELLED:
        return "\ncancelled: the request is back in the state it was in"
    if status == ExecutionStatus.RECONCILIATION_REQUIRED:
        return (
            f"\nparked for a person ({view.get('errorCode')}): see "
            f"orquestador executions evidence {execution_id}"
        )
    if view.get("waitingForApproval"):
        return (
            "\nwaits for an approval: an approver decides with "
            f"orquestador approvals decide {view['waitingForApproval']} approve|reject"
        )
    return (
        f"\nstill {status} after {timeout:g} s: follow it with "
        f"orquestador executions wait {execution_id}"
    )
