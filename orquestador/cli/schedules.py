"""`orquestador schedules`: put, show, list, run now and delete schedules over the HTTP API.

A client of the API like `orquestador executions` (the same settings, the same exit
status: 0 done, 1 refused by the server with its problem printed, 2 usage or
configuration).
"""

from __future__ import annotations

import argparse
import json

from orquestador.cli.api_commands import CommandFactory, client_actions
from orquestador.cli.output import json_argument, print_fields, print_json, print_table
from orquestador.client import Client, Json
from orquestador.domain.schedule_times import CATCH_UP_POLICIES


def add_schedules_command(command: CommandFactory) -> None:
    """Register `schedules` and its actions with the main parser's command factory."""
    action = client_actions(
        command,
        "schedules",
        "put, show, list, run now and delete schedules through the HTTP API (needs plans:admin)",
    )

    put = action("put", "create a schedule, or replace it whole", _put)
    put.add_argument("schedule", metavar="ID", help="your id for the schedule")
    put.add_argument(
        "--flow",
        required=True,
        metavar="KEY|ID",
        help="a flow key (each fire starts its latest version) or a flow version's id",
    )
    put.add_argument(
        "--transition",
        metavar="T",
        help="the transition each fire starts (default: the flow's start)",
    )
    when = put.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='five fields, e.g. "30 2 * * *"')
    when.add_argument("--every", type=int, metavar="SECONDS", help="a fire every N seconds")
    put.add_argument("--timezone", default="UTC", help="an IANA time zone (default: UTC)")
    put.add_argument("--data", metavar="JSON", help="passed to each fire (JSON, or @FILE)")
    put.add_argument(
        "--catch-up",
        choices=CATCH_UP_POLICIES,
        default="skip",
        help="after downtime: skip the late fire times, start one, or all (default: skip)",
    )
    put.add_argument("--paused", action="store_true", help="put it paused: it never fires")

    show = action("show", "one schedule and where its firing stands", _show)
    show.add_argument("schedule", metavar="ID")

    action("list", "the organization's schedules", _list)

    run = action("run", "fire a schedule once, now (paused or not)", _run)
    run.add_argument("schedule", metavar="ID")

    delete = action("delete", "delete a schedule (what it started stays)", _delete)
    delete.add_argument("schedule", metavar="ID")


def _put(client: Client, args: argparse.Namespace) -> int:
    view = client.put_schedule(
        args.schedule,
        args.flow,
        transition=args.transition,
        cron=args.cron,
        every_seconds=args.every,
        timezone=args.timezone,
        data=None if args.data is None else json_argument(args.data, "--data"),
        catch_up=args.catch_up,
        paused=args.paused,
    )
    _print_schedule(view, as_json=args.json)
    return 0


def _show(client: Client, args: argparse.Namespace) -> int:
    _print_schedule(client.get_schedule(args.schedule), as_json=args.json)
    return 0


def _list(client: Client, args: argparse.Namespace) -> int:
    answer = client.list_schedules()
    if args.json:
        print_json(answer)
        return 0
    if not answer["items"]:
        print("no schedules")
        return 0
    rows = [
        (
            s["id"],
            s.get("cron") or f"every {s['everySeconds']}s",
            s["timezone"],
            s["catchUp"],
            "paused" if s["paused"] else s["nextFireAt"],
            s["lastFiredAt"],
            s["missed"],
        )
        for s in answer["items"]
    ]
    print_table(("ID", "WHEN", "TIMEZONE", "CATCH-UP", "NEXT FIRE", "LAST FIRED", "MISSED"), rows)
    return 0


def _run(client: Client, args: argparse.Namespace) -> int:
    fired = client.run_schedule(args.schedule)
    if args.json:
        print_json(fired)
        return 0
    print_fields(
        [
            ("schedule", fired["scheduleId"]),
            ("fire time", fired["fireTime"]),
            ("request", fired["requestId"]),
            ("execution", fired["executionId"]),
        ]
    )
    return 0


def _delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_schedule(args.schedule)
    if not args.json:
        print(f"schedule {args.schedule} deleted")
    return 0


def _print_schedule(view: Json, *, as_json: bool) -> None:
    if as_json:
        print_json(view)
        return
    when = view.get("cron") or f"every {view['everySeconds']} seconds"
    fields = [
        ("schedule", view["id"]),
        ("flow", view.get("flow") or view["flowId"]),
        ("version", view["flowId"]),
        ("transition", view.get("transition") or "the flow's start"),
        ("when", when),
        ("timezone", view["timezone"]),
        ("catch-up", view["catchUp"]),
        ("paused", "yes" if view["paused"] else "no"),
        ("next fire", view["nextFireAt"]),
        ("last fired", view["lastFiredAt"]),
        ("missed", view["missed"]),
        ("data", json.dumps(view["data"], ensure_ascii=False)),
    ]
    print_fields(fields)
